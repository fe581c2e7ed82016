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


def _series(gauge: Any) -> list[Any]:
    return [s for family in gauge.collect() for s in family.samples]


def test_a_replica_that_loses_the_lease_drops_its_job_and_tenant_gauges(
    kube: Any, lease_namespace: str
) -> None:
    """Only the leader publishes what its last cycle saw: a replica that stops leading would
    otherwise keep reporting that cycle forever, and a sum over replicas would count it twice."""
    from gpusched.api import keys
    from gpusched.metrics import OperatorMetrics
    from gpusched.operator.api import OperatorApi
    from gpusched.operator.loop import AdmissionLoop
    from gpusched.operator.store import Store

    quota = client.CustomObjectsApi(kube).create_cluster_custom_object(
        keys.GROUP,
        keys.VERSION,
        "tenantquotas",
        {
            "apiVersion": keys.API_VERSION,
            "kind": "TenantQuota",
            "metadata": {"name": lease_namespace},
            "spec": {"namespaces": [lease_namespace], "guaranteedGpus": 8},
        },
    )
    now = [1000.0]

    async def scenario() -> None:
        api = AsyncApi(kube.configuration)
        metrics = OperatorMetrics()
        elector = LeaderElector(
            api, lease_namespace, "replica-a", duration=15, clock=lambda: now[0]
        )
        store = Store()
        for replace in (
            store.replace_jobs,
            store.replace_job_pods,
            store.replace_gpu_pods,
            store.replace_nodes,
            store.replace_topologies,
            store.replace_priorities,
            store.replace_network,
        ):
            replace([])
        store.replace_quotas([quota])
        loop = AdmissionLoop(OperatorApi(api), store, metrics=metrics, leader=elector, resync=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        try:
            assert await elector.ensure()
            elector.changed.set()
            deadline = time.monotonic() + 30
            while not (loop.cycles and _series(metrics.gpus_guaranteed)):
                assert time.monotonic() < deadline, "the leader never published its gauges"
                await asyncio.sleep(0.1)
            assert [s.value for s in _series(metrics.leading)] == [1]
            assert {s.labels["tenant"]: s.value for s in _series(metrics.gpus_guaranteed)} == {
                lease_namespace: 8
            }
            now[0] += elector.renew_deadline + 1  # no renewal in time: leadership lapses
            elector.changed.set()
            deadline = time.monotonic() + 30
            while _series(metrics.gpus_guaranteed):
                assert time.monotonic() < deadline, "the gauges stayed after the lease was lost"
                await asyncio.sleep(0.1)
            assert [s.value for s in _series(metrics.leading)] == [0]
            assert _series(metrics.jobs) == []
            assert _series(metrics.fair_share) == []
        finally:
            stop.set()
            await task
            await api.close()

    try:
        asyncio.run(scenario())
    finally:
        client.CustomObjectsApi(kube).delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, "tenantquotas", lease_namespace
        )
