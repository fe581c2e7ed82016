"""The operator as a kopf operator, on the real API server: kopf-fed kinds anchored and
reconciled (no object deleted while a watch was down survives in the store), and the liveness
endpoint kopf serves, which fails when the admission loop is stuck."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from kubernetes import client

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster
from gpusched.kubeasync import AsyncApi
from gpusched.operator import api as paths
from gpusched.operator.feeds import KindFeed
from gpusched.operator.store import Store
from tests.cases.manifests import tenantquota
from tests.integration.operator_harness import OperatorProcess, Scenario, wait_for

G, V = keys.GROUP, keys.VERSION


def _feed(store: Store, path: str = paths.TENANTQUOTAS, **options: Any) -> KindFeed:
    return KindFeed(
        "tenantquotas",
        path,
        store.replace_quotas,
        store.upsert_quota,
        store.delete_quota,
        **options,
    )


def test_a_reconcile_list_removes_what_was_deleted_while_no_event_came(kube: Any) -> None:
    """The anchor LIST fills the store; an object deleted with no event delivered (kopf's
    watch was down) goes at the next reconcile; one still there stays."""
    custom = client.CustomObjectsApi(kube)
    stamp = int(time.time() * 1000) % 10**8
    names = [f"feed-{stamp}-{i}" for i in range(2)]
    for name in names:
        body = tenantquota(name, namespaces=[name], guaranteedGpus=0)
        custom.create_cluster_custom_object(G, V, "tenantquotas", body)

    async def scenario() -> tuple[set[str], set[str], int]:
        api = AsyncApi(kube.configuration)
        store = Store()
        feed = _feed(store)
        try:
            await feed.anchor(api)
            anchored = set(store.quotas)
            custom.delete_cluster_custom_object(G, V, "tenantquotas", names[0])
            removed = await feed.reconcile(api)
            return anchored, set(store.quotas), removed
        finally:
            await api.close()

    try:
        anchored, after, removed = asyncio.run(scenario())
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(G, V, "tenantquotas", name)
    assert set(names) <= anchored
    assert names[0] not in after
    assert names[1] in after
    assert removed == 1


def test_an_optional_kind_whose_crd_is_not_installed_is_synced_and_empty(kube: Any) -> None:
    """A 404 on the anchor LIST of an optional kind (a chart upgrade adds no CRD) means no
    objects, so the admission loop is not held back; for other kinds it is retried."""

    async def scenario() -> tuple[bool, bool]:
        api = AsyncApi(kube.configuration)
        missing = f"/apis/{G}/{V}/nosuchkinds"
        try:
            optional = _feed(Store(), missing, optional=True)
            await asyncio.wait_for(optional.anchor(api), timeout=30)
            required = _feed(Store(), missing)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(required.anchor(api), timeout=3)
            return optional.synced, required.synced
        finally:
            await api.close()

    optional_synced, required_synced = asyncio.run(scenario())
    assert optional_synced
    assert not required_synced


def test_liveness_is_ok_while_the_admission_loop_comes_round(
    sc: Scenario, operator: OperatorProcess
) -> None:
    sc.nodes(1)
    # Right after a (re)start the probe answers 200 before the first cycle ("ready": false):
    # wait for the loop to come round, then check what the probe says.
    status, body = wait_for(
        lambda: found if '"ready": true' in (found := operator.health())[1] else None,
        60,
        "kopf's /healthz to report the admission loop ready",
    )
    assert status == 200
    assert '"admission"' in body
    assert '"ready": true' in body


def test_liveness_fails_when_the_admission_cycle_hangs(
    local_cluster: LocalCluster, sc: Scenario
) -> None:
    sc.nodes(1)
    stuck = OperatorProcess(local_cluster)
    stuck.start("cycle-hangs", extra=["--stuck-after=4s"])
    try:
        _status, _body = wait_for(
            lambda: found if (found := stuck.health())[0] == 500 else None,
            60,
            f"/healthz to fail once the cycle hangs (log: {stuck.log()[-2000:]})",
        )
        # The process is alive and its metrics thread still answers: only the probe tells.
        assert stuck.running()
        assert stuck.metrics() is not None
    finally:
        stuck.kill()


def _queued(operator: OperatorProcess, tenant: str) -> float:
    """GpuJobs of ``tenant`` the operator's store holds, by its jobs gauge."""
    return operator.total("gpusched_jobs", tenant=tenant)


def test_jobs_deleted_while_the_operator_was_frozen_are_gone_after_kopf_lists_again(
    local_cluster: LocalCluster, sc: Scenario, operator: OperatorProcess
) -> None:
    """The operator is frozen (SIGSTOP) while the API server restarts and two of three jobs
    are deleted: their DELETED events never reach it, and its watches resume from a version the
    new API server no longer has (410), so kopf lists again. No deleted job may survive in the
    store: the jobs gauge, published from the store each cycle, must come down to one."""
    sc.nodes(1)
    quota, ns = sc.tenant("ghosts", guaranteed=0, borrowingLimit=0)
    names = [sc.submit(ns, f"ghost-{i}", 1) for i in range(3)]
    for name in names:
        sc.wait_reason(ns, name, "QuotaExceeded")
    wait_for(lambda: _queued(operator, quota) == 3, 60, "the gauge to count 3 jobs")

    assert operator.record is not None
    os.killpg(operator.record.pid, signal.SIGSTOP)
    try:
        local_cluster.restart_apiserver()
        for name in names[:2]:
            sc.custom.delete_namespaced_custom_object(G, V, ns, "gpujobs", name)
    finally:
        os.killpg(operator.record.pid, signal.SIGCONT)
    wait_for(
        lambda: _queued(operator, quota) == 1 or None,
        120,
        f"the deleted jobs to leave the operator's store (gauge {_queued(operator, quota)})",
    )
    assert sc.status(ns, names[2]).get("reason") == "QuotaExceeded"


def test_kopf_leaves_no_annotation_or_finalizer_on_the_objects_it_watches(
    sc: Scenario, operator: OperatorProcess
) -> None:
    """kopf keeps handling progress and a diff base in annotations, and adds finalizers, for
    change handlers and daemons; the operator registers none, so the objects kopf watches carry
    nothing of kopf's (kopf's annotations live under its own domains, e.g. kopf.zalando.org)."""
    nodes = sc.nodes(1)
    quota, ns = sc.tenant("clean", guaranteed=8)
    sc.submit(ns, "runs", 1)
    sc.wait_phase(ns, "runs", "Running")
    objects = [
        sc.job(ns, "runs"),
        sc.custom.get_cluster_custom_object(G, V, "tenantquotas", quota),
        sc.core.read_node(nodes[0]).to_dict(),
    ]
    for obj in objects:
        meta = obj["metadata"]
        marks = [k for k in (meta.get("annotations") or {}) if "kopf" in k]
        marks += [f for f in (meta.get("finalizers") or []) if "kopf" in f]
        assert not marks, f"{meta['name']}: {marks}"
