"""Leader election of operator replicas over a real coordination.k8s.io Lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpusched.operator.leader import LeaderElector


@pytest.fixture
def lease_namespace(kube: Any) -> Iterator[str]:
    name = f"lease-{int(time.time() * 1000) % 10**8}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


def test_one_replica_leads_and_another_takes_over_when_it_stops_renewing(
    kube: Any, lease_namespace: str
) -> None:
    first = LeaderElector(kube, lease_namespace, "replica-a", duration=2)
    second = LeaderElector(kube, lease_namespace, "replica-b", duration=2)
    assert first.ensure()
    assert not second.ensure()
    assert first.ensure()  # renewing keeps it
    assert not second.ensure()
    deadline = time.monotonic() + 10
    while not second.ensure():  # first stops renewing (as if it died)
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.3)
    assert not first.ensure()
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(
        "gpusched-operator", lease_namespace
    )
    assert lease.spec.holder_identity == "replica-b"
    assert lease.spec.lease_transitions == 1
