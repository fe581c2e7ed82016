"""``gpusched bench operator-cycle``: the operator's whole decision at scale, from its store.

The synthetic busy cluster of ``gpusched bench admission`` (1,000 nodes, 50 tenants, three
quarters of the GPUs held by running jobs, 10,000 queued jobs) is turned into the API objects the
operator's watches would deliver (GpuJobs with their status, the running jobs' pods, Nodes,
NodeGpuTopologies, TenantQuotas, PriorityClasses) and loaded into its store. Then
:func:`gpusched.operator.decide.decide` (settle every job, build the snapshot, run the admission
core, plan the writes) is timed three ways: cold (first cycle after a start: nothing settled
before), at steady state (the first cycle's writes landed, then nothing changed), and with one
job changed. Nodes without a NodeGpuTopology (the count-only ones of the core benchmark) are left
out of admission by the operator, as in a cluster, so this world has about 800 nodes.

That world never settles (the admitted jobs' pods are never created here, the victims never
leave), so every cycle decides every queued job again. A second world, :func:`quiet_world`,
holds its queue in a tenant that may not borrow: nothing can change, as at the steady state of
``gpusched bench admission-e2e --steady-jobs``, and its cycles are timed with nothing changed
and after one job arrived (what a cycle costs when its work follows what changed). Figures to
record, never assertions.
"""

from __future__ import annotations

import gc
import json
import random
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from gpusched.api import keys
from gpusched.core import parse_topo_matrix
from gpusched.core.admission import Job, JobState, Snapshot, Tenant
from gpusched.dev.bench.admission import (
    Workload,
    _nvswitch_matrix,
    build_snapshot,
    percentile_ms,
)
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX
from gpusched.operator.decide import Decision, Memo, OperatorConfig, decide
from gpusched.operator.heap import freeze_long_lived
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store, World

NOW = datetime(2026, 6, 1, tzinfo=UTC)

#: The tenant of :func:`quiet_world`'s queue.
WAITING = "waiting"

#: Cycles timed per world of :func:`run_quiet` (each kind).
QUIET_ROUNDS = 10


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(NOW.timestamp() - 40_000 + seconds, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def _topology(kind: str, name: str) -> dict[str, Any] | None:
    matrix = {"nvswitch": _nvswitch_matrix(), "dgx1": DGX1_LIKE_MATRIX}.get(kind)
    if matrix is None:
        return None
    spec, status = parse_topo_matrix(matrix, node_name=name).to_api()
    return {"metadata": {"name": name}, "spec": spec.to_k8s(), "status": status.to_k8s()}


def _job_object(job: Job, index: int) -> dict[str, Any]:
    namespace, name = job.key.split("/")
    topology: dict[str, Any] = {"scope": job.policy.scope.value, "mode": job.policy.mode.value}
    if job.across is not None:
        topology["acrossReplicas"] = {
            "nodeLabel": job.across.node_label,
            "mode": "required" if job.across.required else "preferred",
        }
    spec: dict[str, Any] = {
        "replicas": job.replicas,
        "gpusPerReplica": job.gpus_per_replica,
        "topology": topology,
        "preemptible": job.preemptible,
        "minRuntimeSeconds": int(job.min_runtime_seconds),
        "priorityClassName": f"p{job.priority}",
        "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
    }
    if job.gpu_model:
        spec["gpuModel"] = job.gpu_model
    status: dict[str, Any] = {"phase": "Queued", "tenant": job.tenant, "admission": 0}
    if job.state is JobState.ADMITTED:
        status = {
            "phase": "Running",
            "tenant": job.tenant,
            "admission": 1,
            "startedAt": _stamp(job.started_at or 0.0),
            "placement": [
                {"replica": r, "node": a.node, "gpuIndices": list(a.gpus)}
                for r, a in enumerate(job.placement)
            ],
        }
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{index}",
            "generation": 1,
            "resourceVersion": str(index + 1),
            "creationTimestamp": _stamp(job.submitted_at),
        },
        "spec": spec,
        "status": status,
    }


def _pods(job: Job, index: int) -> list[dict[str, Any]]:
    namespace, name = job.key.split("/")
    out = []
    for replica, assignment in enumerate(job.placement):
        out.append(
            {
                "metadata": {
                    "name": f"{name}-1-{replica}",
                    "namespace": namespace,
                    "uid": f"pod-{index}-{replica}",
                    "resourceVersion": str(10**7 + index),
                    "creationTimestamp": _stamp(job.started_at or 0.0),
                    "labels": {
                        keys.LABEL_JOB_NAME: name,
                        keys.LABEL_JOB_UID: f"uid-{index}",
                        keys.LABEL_TENANT: job.tenant or "",
                        keys.LABEL_REPLICA_INDEX: str(replica),
                        keys.LABEL_ADMISSION: "1",
                    },
                    "annotations": {
                        keys.ANNOTATION_GPU_INDICES: ",".join(map(str, assignment.gpus))
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": keys.API_VERSION,
                            "kind": "GpuJob",
                            "name": name,
                            "uid": f"uid-{index}",
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "nodeName": assignment.node,
                    "schedulerName": keys.SCHEDULER_NAME,
                    "containers": [
                        {
                            "name": "main",
                            "resources": {"limits": {keys.GPU_RESOURCE: str(job.gpus_per_replica)}},
                        }
                    ],
                },
                "status": {"phase": "Running"},
            }
        )
    return out


def load_store(snapshot: Snapshot, kinds: dict[str, str]) -> Store:
    """The store as the operator's watches would fill it for this snapshot."""
    store = Store()
    nodes = []
    topologies = []
    for node in snapshot.nodes:
        nodes.append(
            {
                "metadata": {
                    "name": node.name,
                    "labels": {keys.GFD_PRODUCT: node.model or "", **dict(node.labels)},
                },
                "spec": {},
                "status": {
                    "allocatable": {keys.GPU_RESOURCE: "8"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
        topology = _topology(kinds[node.name], node.name)
        if topology is not None:
            topology["metadata"]["resourceVersion"] = "1"
            topologies.append(topology)
    jobs = [_job_object(job, i) for i, job in enumerate(snapshot.jobs)]
    pods = [
        pod
        for i, job in enumerate(snapshot.jobs)
        if job.state is JobState.ADMITTED
        for pod in _pods(job, i)
    ]
    quotas = [
        {
            "apiVersion": keys.API_VERSION,
            "kind": "TenantQuota",
            "metadata": {"name": t.name, "creationTimestamp": _stamp(0)},
            "spec": {
                "namespaces": [t.name],
                "guaranteedGpus": t.guaranteed,
                "guaranteedGpusByModel": dict(t.guaranteed_by_model),
                **({"borrowingLimit": t.borrowing_limit} if t.borrowing_limit is not None else {}),
                "weight": t.weight,
                "preemption": {
                    "withinTenant": t.within_tenant.value,
                    "reclaimBorrowed": t.reclaim.value,
                },
            },
        }
        for t in snapshot.tenants
    ]
    store.replace_nodes(nodes)
    store.replace_topologies(topologies)
    store.replace_jobs(jobs)
    store.replace_job_pods(pods)
    store.replace_gpu_pods([])
    store.replace_quotas(quotas)
    store.replace_priorities([{"metadata": {"name": f"p{p}"}, "value": p} for p in range(4)])
    store.replace_network([])
    return store


def _written(world: World, decision: Decision) -> World:
    """The world once the decision's status writes are in (as the watch would bring them)."""
    statuses = dict(decision.final)
    return replace(
        world,
        jobs=tuple(
            replace(j, status=statuses[j.key], version=j.version + 1) if j.key in statuses else j
            for j in world.jobs
        ),
    )


class _Timed:
    """Wall and CPU seconds of one decision with the garbage collector off, and a full
    collection of the heap after it, timed apart.

    With the collector on, a full collection over the store's heap (about a second at 12,000
    jobs) lands in whichever timed decision happens to cross the collector's threshold, so
    figures moved between decisions with every change of allocations. Timed apart, each
    decision is its own work; the full collection, which the operator pays whenever its oldest
    generation comes due, is reported beside it."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.collect: list[float] = []

    def __call__(
        self, world: World, config: OperatorConfig, reader: NodeReader, memo: Memo
    ) -> Decision:
        gc.collect()
        gc.disable()
        try:
            started, cpu = time.perf_counter(), time.process_time()
            found = decide(world, {}, config, reader, memo=memo)
            self.wall.append(time.perf_counter() - started)
            self.cpu.append(time.process_time() - cpu)
        finally:
            gc.enable()
        started = time.perf_counter()
        gc.collect()
        self.collect.append(time.perf_counter() - started)
        return found


def quiet_world(workload: Workload, seed: int) -> Snapshot:
    """The busy cluster with every queued job in one more tenant, ``waiting``, that is
    guaranteed nothing and may not borrow: each waits (QuotaExceeded), no cycle can admit or
    evict anything, as in a cluster whose queue waits for a quota to grow."""
    snapshot = build_snapshot(workload, seed)
    waiting = Tenant(WAITING, guaranteed=0, borrowing_limit=0)
    return replace(
        snapshot,
        tenants=(*snapshot.tenants, waiting),
        jobs=tuple(
            job
            if job.state is JobState.ADMITTED
            else replace(job, key=f"{WAITING}/{job.key.split('/')[1]}", tenant=WAITING)
            for job in snapshot.jobs
        ),
    )


def _arrival(index: int, at: float) -> dict[str, Any]:
    """A new one-GPU GpuJob of the ``waiting`` tenant, as its watch delivers it."""
    raw = _job_object(
        Job(key=f"{WAITING}/arrival-{index}", tenant=WAITING, replicas=1, gpus_per_replica=1),
        1_000_000 + index,
    )
    raw["metadata"]["creationTimestamp"] = _stamp(at)
    del raw["status"]
    return raw


def _assumed(store: Store, decision: Decision, now: datetime) -> World:
    """The store's world once the decision's status writes are on their way (the operator's
    store assumes each write it sends)."""
    for key, status in decision.final.items():
        store.assume_status(key, status)
    return store.world(now)


def run_quiet(workload: Workload, trials: int, seed: int) -> dict[str, Any]:
    """Cycles over :func:`quiet_world` once both kept pools have had their first cycles: with
    nothing changed, and after one job arrived (created in the store as its watch would, the
    store's read of the world timed apart)."""
    quiet, arrival = _Timed(), _Timed()
    world_reads: list[float] = []
    stages: dict[str, dict[str, list[float]]] = {"quiet": {}, "one_arrival": {}}
    config = OperatorConfig()
    for trial in range(trials):
        snapshot = quiet_world(workload, seed + trial)
        kinds = {
            n.name: ("count" if n.count_only else "nvswitch" if n.model == "H100" else "dgx1")
            for n in snapshot.nodes
        }
        store = load_store(snapshot, kinds)
        reader, memo = NodeReader(), Memo()
        now = NOW
        world = store.world(now)
        first = decide(world, {}, config, reader, memo=memo)
        freeze_long_lived()
        world = _assumed(store, first, now)
        # Each pool's first cycle is a whole one; the ones after find nothing changed.
        for _ in range(3):
            now += timedelta(seconds=1)
            world = replace(world, now=now)
            decide(world, {}, config, reader, memo=memo)
        for index in range(QUIET_ROUNDS):
            now += timedelta(seconds=1)
            found = quiet(replace(world, now=now), config, reader, memo)
            for stage, seconds in found.seconds.items():
                stages["quiet"].setdefault(stage, []).append(seconds)
            store.upsert_job(
                _arrival(trial * QUIET_ROUNDS + index, now.timestamp() - NOW.timestamp() + 40_000)
            )
            started = time.perf_counter()
            world = store.world(now)
            world_reads.append(time.perf_counter() - started)
            found = arrival(world, config, reader, memo)
            for stage, seconds in found.seconds.items():
                stages["one_arrival"].setdefault(stage, []).append(seconds)
            world = _assumed(store, found, now)
        gc.unfreeze()
    return {
        "quiet_queued_jobs": workload.queued,
        "quiet_p50_ms": percentile_ms(quiet.wall, 0.5),
        "quiet_p99_ms": percentile_ms(quiet.wall, 0.99),
        "quiet_cpu_p50_ms": percentile_ms(quiet.cpu, 0.5),
        "one_arrival_p50_ms": percentile_ms(arrival.wall, 0.5),
        "one_arrival_p99_ms": percentile_ms(arrival.wall, 0.99),
        "one_arrival_cpu_p50_ms": percentile_ms(arrival.cpu, 0.5),
        "store_world_read_p50_ms": percentile_ms(world_reads, 0.5),
        "quiet_stages_p50_ms": {k: percentile_ms(v, 0.5) for k, v in stages["quiet"].items()},
        "one_arrival_stages_p50_ms": {
            k: percentile_ms(v, 0.5) for k, v in stages["one_arrival"].items()
        },
    }


def run(workload: Workload, trials: int, seed: int) -> dict[str, Any]:
    """Time ``trials`` decisions of each kind over fresh worlds."""
    cold, steady, one_changed = _Timed(), _Timed(), _Timed()
    frozen: list[int] = []
    stages: dict[str, list[float]] = {}
    config = OperatorConfig()
    admissions: list[int] = []
    for trial in range(trials):
        rng = random.Random(seed + trial)
        snapshot = build_snapshot(workload, seed + trial)
        kinds = {
            n.name: ("count" if n.count_only else "nvswitch" if n.model == "H100" else "dgx1")
            for n in snapshot.nodes
        }
        store = load_store(snapshot, kinds)
        world = store.world(NOW)
        reader = NodeReader()
        memo = Memo()
        first = cold(world, config, reader, memo)
        admissions.append(len(first.plan.admitted))
        # As the operator does after its first cycle (gpusched.operator.heap).
        frozen.append(freeze_long_lived())
        # The writes of that cycle land (each written job is a new object), then a cycle in
        # which nothing changed.
        world = _written(world, first)
        decide(world, {}, config, reader, memo=memo)
        again = steady(world, config, reader, memo)
        for stage, seconds in again.seconds.items():
            stages.setdefault(stage, []).append(seconds)
        # One queued job edited (a new object in the store), everything else as it was.
        key = rng.choice([j.key for j in world.jobs if j.status.phase is not None])
        changed = replace(store.job(key), generation=2)
        world = replace(world, jobs=tuple(changed if j.key == key else j for j in world.jobs))
        one_changed(world, config, reader, memo)
        gc.unfreeze()  # this world's objects back to the collector before the next one

    return {
        "nodes": workload.nodes,
        "tenants": workload.tenants,
        "queued_jobs": workload.queued,
        "jobs_in_store": len(world.jobs),
        "trials": trials,
        "cold_p50_ms": percentile_ms(cold.wall, 0.5),
        "cold_p99_ms": percentile_ms(cold.wall, 0.99),
        "steady_p50_ms": percentile_ms(steady.wall, 0.5),
        "steady_p99_ms": percentile_ms(steady.wall, 0.99),
        "steady_cpu_p50_ms": percentile_ms(steady.cpu, 0.5),
        "steady_cpu_p99_ms": percentile_ms(steady.cpu, 0.99),
        "one_job_changed_p50_ms": percentile_ms(one_changed.wall, 0.5),
        "one_job_changed_p99_ms": percentile_ms(one_changed.wall, 0.99),
        "objects_frozen_after_cold": round(sum(frozen) / max(1, len(frozen))),
        "full_collection_after_cold_p50_ms": percentile_ms(cold.collect, 0.5),
        "full_collection_after_steady_p50_ms": percentile_ms(steady.collect, 0.5),
        "full_collection_after_one_job_changed_p50_ms": percentile_ms(one_changed.collect, 0.5),
        "steady_stages_p50_ms": {k: percentile_ms(v, 0.5) for k, v in stages.items()},
        "admissions_per_cycle": round(sum(admissions) / max(1, len(admissions)), 1),
    }


@click.command("operator-cycle")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", default=1000, show_default=True)
@click.option("--tenants", default=50, show_default=True)
@click.option("--jobs", "queued", default=10_000, show_default=True, help="Queued jobs.")
@click.option("--fill", default=0.75, show_default=True, help="Share of GPUs already held.")
@click.option("--trials", default=5, show_default=True, help="Worlds (three decisions each).")
@click.option("--seed", default=1, show_default=True)
def operator_cycle(
    *, as_json: bool, nodes: int, tenants: int, queued: int, fill: float, trials: int, seed: int
) -> None:
    """The operator's whole cycle (settle, snapshot, admission, plan) over its store at scale."""
    workload = Workload(nodes, tenants, queued, fill)
    result = {**run(workload, trials, seed), **run_quiet(workload, trials, seed)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{result['jobs_in_store']} GpuJobs ({result['queued_jobs']} queued), "
        f"{result['tenants']} tenants, {result['nodes']} nodes, {trials} worlds"
    )
    for name in ("cold", "steady", "one_job_changed"):
        click.echo(
            f"{name.replace('_', ' ')}: p50 {result[name + '_p50_ms']} ms, "
            f"p99 {result[name + '_p99_ms']} ms"
        )
    click.echo(f"steady-state stages (p50 ms): {result['steady_stages_p50_ms']}")
    for name in ("quiet", "one_arrival"):
        click.echo(
            f"queue that waits for quota, {name.replace('_', ' ')}: "
            f"p50 {result[name + '_p50_ms']} ms, p99 {result[name + '_p99_ms']} ms, "
            f"stages (p50 ms) {result[name + '_stages_p50_ms']}"
        )
