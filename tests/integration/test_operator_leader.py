"""Leader election of operator replicas over a real coordination.k8s.io Lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpusched.kubeasync import AsyncApi
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
    async def scenario() -> None:
        api = AsyncApi(kube.configuration)
        try:
            first = LeaderElector(api, lease_namespace, "replica-a", duration=2)
            second = LeaderElector(api, lease_namespace, "replica-b", duration=2)
            assert await first.ensure()
            assert not await second.ensure()
            assert await first.ensure()  # renewing keeps it
            assert not await second.ensure()
            deadline = time.monotonic() + 10
            while not await second.ensure():  # first stops renewing (as if it died)
                assert time.monotonic() < deadline, "lease never expired"
                await asyncio.sleep(0.3)
            assert not await first.ensure()
            assert not first.leading
            lease = await api.request("GET", first.path)
            assert lease["spec"]["holderIdentity"] == "replica-b"
            assert lease["spec"]["leaseTransitions"] == 1
        finally:
            await api.close()

    asyncio.run(scenario())


def test_a_replica_stops_leading_when_it_cannot_renew_in_time(
    kube: Any, lease_namespace: str
) -> None:
    """Leadership lapses on the replica's own clock, before any other replica may take over,
    whether or not the API server answers."""
    now = [1000.0]

    async def scenario() -> None:
        api = AsyncApi(kube.configuration)
        try:
            elector = LeaderElector(
                api, lease_namespace, "replica-a", duration=15, clock=lambda: now[0]
            )
            assert await elector.ensure()
            now[0] += elector.renew_deadline - 0.5
            assert elector.leading  # renewed recently enough
            now[0] += 1.0
            assert not elector.leading  # no renewal for the renew deadline: stop writing
            assert await elector.ensure()  # renewed again
            assert elector.leading
        finally:
            await api.close()

    asyncio.run(scenario())
