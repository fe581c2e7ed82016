"""``gpusched bench admission``: how long one admission cycle of the pure core takes at scale.

A synthetic busy cluster (default 1,000 nodes of three wirings in racks, 50 tenants with
guarantees, weights and limits, three quarters of the GPUs held by running jobs, some of them
borrowed) and a long queue (default 10,000 jobs: 1-8 GPUs, multi-node gangs, topology scopes,
priorities, GPU models) go through :func:`gpusched.core.admission.run_cycle`. Each trial draws a
new random snapshot and times one cycle with a cold placement memo (as after an operator restart)
and one with the memo warm (the steady state: the operator runs cycles back to back). Figures to
record, never assertions.
"""

from __future__ import annotations

import gc
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import click

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core import Policy, clear_placement_cache, parse_topo_matrix, prepare
from gpusched.core.admission import (
    AcrossReplicas,
    Assignment,
    CycleResult,
    Cycles,
    Job,
    JobState,
    Node,
    Snapshot,
    Tenant,
    count_only_topology,
    run_cycle,
)
from gpusched.core.prepared import PreparedNode
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX

RACK_LABEL = "topology.kubernetes.io/rack"
NODES_PER_RACK = 20
#: (model, wiring, share of nodes)
NODE_TYPES = (("H100", "nvswitch", 0.5), ("V100", "dgx1", 0.3), ("L40S", "count", 0.2))
SIZES = (1, 2, 4, 8)
#: Snapshots whose cycles are followed until one changes nothing (each round a whole cycle).
QUIET_TRIALS = 5
QUIET_ROUNDS = 12
SIZE_WEIGHTS = (0.3, 0.25, 0.25, 0.2)


@dataclass(frozen=True)
class Workload:
    """Sizes of one benchmark snapshot."""

    nodes: int = 1000
    tenants: int = 50
    queued: int = 10_000
    fill: float = 0.75
    """Share of GPUs held by running jobs."""
    runtimes: bool = False
    """Running jobs have predicted ends and queued jobs predicted run times (up to 10 h), as
    in a cluster with run-time history: reservations and forecasts have work to do."""


def _nvswitch_matrix() -> str:
    """An 8-GPU NVSwitch board (every pair NV18), two NUMA nodes."""
    lines = ["\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tNUMA Affinity"]
    for a in range(8):
        row = [" X " if a == b else "NV18" for b in range(8)]
        lines.append(f"GPU{a}\t" + "\t".join(row) + f"\t{0 if a < 4 else 1}")
    return "\n".join(lines) + "\n"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def percentile_ms(values: list[float], q: float) -> float:
    """The ``q`` percentile of ``values`` (seconds) in milliseconds, to 0.1 ms."""
    return round(_percentile(values, q) * 1000, 1)


def _prepared(kind: str, name: str, model: str) -> PreparedNode:
    if kind == "nvswitch":
        return prepare(replace(parse_topo_matrix(_nvswitch_matrix()), node_name=name))
    if kind == "dgx1":
        return prepare(replace(parse_topo_matrix(DGX1_LIKE_MATRIX), node_name=name))
    return prepare(count_only_topology(name, 8, model))


def build_snapshot(workload: Workload, seed: int) -> Snapshot:
    """A random busy cluster with a long queue (deterministic for a seed)."""
    rng = random.Random(seed)
    templates: dict[str, PreparedNode] = {}
    nodes: list[Node] = []
    for i in range(workload.nodes):
        roll = rng.random()
        acc = 0.0
        model, kind = NODE_TYPES[-1][0], NODE_TYPES[-1][1]
        for m, wiring, share in NODE_TYPES:
            acc += share
            if roll < acc:
                model, kind = m, wiring
                break
        name = f"node-{i:05d}"
        if kind not in templates:
            templates[kind] = _prepared(kind, kind, model)
        prepared = replace(
            templates[kind], topology=replace(templates[kind].topology, node_name=name)
        )
        nodes.append(
            Node(
                name=name,
                topology=prepared,
                model=model,
                labels={RACK_LABEL: f"rack-{i // NODES_PER_RACK:03d}"},
                count_only=kind == "count",
            )
        )
    capacity = 8 * workload.nodes
    weights = [rng.choice([1.0, 1.0, 2.0, 3.0]) for _ in range(workload.tenants)]
    guaranteed_total = int(capacity * 0.8)
    tenants = []
    for i, w in enumerate(weights):
        g = int(guaranteed_total * w / sum(weights))
        limit = rng.choice([None, None, g * 2, g + 64])
        by_model = {"H100": g // 2} if rng.random() < 0.3 else {}
        tenants.append(
            Tenant(
                f"tenant-{i:02d}",
                guaranteed=g,
                guaranteed_by_model=by_model,
                borrowing_limit=limit,
                weight=w,
                within_tenant=WithinTenantPreemption.LOWER_PRIORITY,
                reclaim=rng.choice(
                    [ReclaimPolicy.ANY, ReclaimPolicy.ANY, ReclaimPolicy.LOWER_PRIORITY]
                ),
            )
        )
    jobs: list[Job] = []
    # Running jobs: fill nodes up to the target share, one random tenant per job; tenants with
    # small guarantees end up borrowing.
    target = int(capacity * workload.fill)
    held = 0
    for node in nodes:
        if held >= target:
            break
        free = list(range(8))
        while free and held < target:
            k = min(len(free), rng.choices(SIZES, SIZE_WEIGHTS)[0])
            gpus = tuple(free[:k])
            free = free[k:]
            tenant = rng.choice(tenants).name
            key = f"{tenant}/run-{len(jobs)}"
            assignment = (
                Assignment(node.name, (), k) if node.count_only else Assignment(node.name, gpus)
            )
            jobs.append(
                Job(
                    key=key,
                    tenant=tenant,
                    replicas=1,
                    gpus_per_replica=k,
                    priority=rng.randrange(3),
                    submitted_at=float(len(jobs)),
                    min_runtime_seconds=rng.choice([0.0, 0.0, 600.0]),
                    state=JobState.ADMITTED,
                    placement=(assignment,),
                    started_at=rng.uniform(0, 10_000),
                    last_checkpoint_at=rng.choice([None, rng.uniform(5_000, 10_000)]),
                    expected_end=30_000.0 + rng.uniform(60, 36_000) if workload.runtimes else None,
                )
            )
            held += k
    for q in range(workload.queued):
        tenant = rng.choice(tenants).name
        gang = rng.random() < 0.1
        replicas = rng.choice([2, 3, 4]) if gang else 1
        k = 8 if gang else rng.choices(SIZES, SIZE_WEIGHTS)[0]
        scope = rng.choice(
            [TopologyScope.NODE, TopologyScope.NODE, TopologyScope.NVLINK, TopologyScope.NUMA]
        )
        mode = TopologyMode.REQUIRED if rng.random() < 0.3 else TopologyMode.PREFERRED
        jobs.append(
            Job(
                key=f"{tenant}/job-{q}",
                tenant=tenant,
                replicas=replicas,
                gpus_per_replica=k,
                policy=Policy(scope, mode, multi_node=replicas > 1),
                gpu_model=rng.choice([None, None, None, "H100", "V100"]),
                across=AcrossReplicas(RACK_LABEL, rng.random() < 0.5) if gang else None,
                priority=rng.randrange(4),
                preemptible=rng.random() < 0.9,
                submitted_at=20_000.0 + q,
                expected_runtime=rng.uniform(600, 36_000) if workload.runtimes else None,
            )
        )
    return Snapshot(now=30_000.0, tenants=tuple(tenants), jobs=tuple(jobs), nodes=tuple(nodes))


def settled(snapshot: Snapshot, result: CycleResult, dt: float = 5.0) -> Snapshot:
    """The next snapshot once the cycle's writes landed: admitted jobs run where they were
    placed, victims are queued again (their pods gone), ``dt`` seconds later. Job objects that
    did not change are the same objects (as the operator's store hands them over)."""
    jobs = {j.key: j for j in snapshot.jobs}
    now = snapshot.now
    for admission in result.admissions:
        for victim in admission.victims:
            gone = jobs[victim.victim]
            jobs[victim.victim] = replace(
                gone,
                state=JobState.QUEUED,
                placement=(),
                started_at=None,
                expected_end=None,
                preemptions=gone.preemptions + 1,
            )
        jobs[admission.job] = replace(
            jobs[admission.job],
            state=JobState.ADMITTED,
            placement=tuple(
                Assignment(p.node, (), len(p.gpus)) if p.count_only else Assignment(p.node, p.gpus)
                for p in admission.placement
            ),
            started_at=now,
            expected_end=admission.expected_end,
            backfill_until=admission.backfill_until,
        )
    return replace(snapshot, now=now + dt, jobs=tuple(jobs.values()))


def _arrival(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    """The snapshot with one more queued job (a one-GPU job of a random tenant)."""
    tenant = rng.choice(snapshot.tenants).name
    new = Job(
        key=f"{tenant}/arrived-{rng.randrange(10**9)}",
        tenant=tenant,
        replicas=1,
        gpus_per_replica=1,
        submitted_at=snapshot.now,
    )
    return replace(snapshot, jobs=(*snapshot.jobs, new))


def _waiting_arrival(snapshot: Snapshot, result: CycleResult, rng: random.Random) -> Snapshot:
    """The snapshot with one more queued job, at the same instant, asking what a job that
    waited in ``result`` asked (a job like those already queued, behind them in the queue)."""
    waited = rng.choice(sorted(result.wait_reasons))
    like = next(j for j in snapshot.jobs if j.key == waited)
    assert like.tenant is not None
    new = replace(
        like,
        key=f"{like.tenant}/arrived-{rng.randrange(10**9)}",
        priority=min(j.priority for j in snapshot.jobs),
        submitted_at=snapshot.now,
    )
    return replace(snapshot, jobs=(*snapshot.jobs, new))


def _quiet(cycles: Cycles, snapshot: Snapshot, rounds: int) -> tuple[Snapshot, CycleResult]:
    """Cycles on a kept pool, each after the last one's decisions landed, until one changes
    nothing (or ``rounds`` did not get there)."""
    result = cycles.cycle(snapshot).run()
    for _ in range(rounds):
        if not result.admissions:
            break
        snapshot = settled(snapshot, result)
        result = cycles.cycle(snapshot).run()
    return snapshot, result


def _side_by_side(cycles: Cycles, snapshot: Snapshot) -> tuple[float, float, CycleResult]:
    """CPU seconds of a cycle over ``snapshot`` on the kept pool, then of one from scratch
    (CPU time: these are compared as a ratio on a machine that may be busy)."""
    started = time.process_time()
    kept = cycles.cycle(snapshot).run()
    middle = time.process_time()
    scratch = run_cycle(snapshot)
    ended = time.process_time()
    assert kept == scratch, "a cycle on a kept pool decided differently"
    return middle - started, ended - middle, scratch


def run(workload: Workload, trials: int, seed: int) -> dict[str, Any]:
    """Time ``trials`` cycles (cold and warm memo) over fresh snapshots, then the cycles that
    follow on a kept pool (:class:`~gpusched.core.admission.Cycles`): the next one once the
    first one's decisions landed, and one after a single job arrived, each beside a cycle from
    scratch over the same snapshot."""
    cold: list[float] = []
    warm: list[float] = []
    warm_cpu: list[float] = []
    builds: list[float] = []
    admitted: list[int] = []
    preempted: list[int] = []
    searches: list[int] = []
    kept_next: list[float] = []
    scratch_next: list[float] = []
    kept_arrival: list[float] = []
    scratch_arrival: list[float] = []
    kept_waiting: list[float] = []
    scratch_waiting: list[float] = []
    rng = random.Random(seed)
    gc.collect()
    for trial in range(trials):
        started = time.perf_counter()
        snapshot = build_snapshot(workload, seed + trial)
        builds.append(time.perf_counter() - started)
        clear_placement_cache()
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = run_cycle(snapshot)
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            cpu = time.process_time()
            again = run_cycle(snapshot)
            warm_cpu.append(time.process_time() - cpu)
            warm.append(time.perf_counter() - started)
            cycles = Cycles()
            cycles.cycle(snapshot).run()
            following = settled(snapshot, result)
            kept, scratch, decided = _side_by_side(cycles, following)
            kept_next.append(kept)
            scratch_next.append(scratch)
            after = settled(following, decided)
            cycles.cycle(after).run()
            kept, scratch, _ = _side_by_side(cycles, _arrival(after, rng))
            kept_arrival.append(kept)
            scratch_arrival.append(scratch)
            if trial < QUIET_TRIALS:
                quiet, done = _quiet(cycles, after, QUIET_ROUNDS)
                if not done.admissions:
                    extended = cycles.extended
                    kept, scratch, _ = _side_by_side(cycles, _waiting_arrival(quiet, done, rng))
                    assert cycles.extended == extended + 1, "the arrival took a whole cycle"
                    kept_waiting.append(kept)
                    scratch_waiting.append(scratch)
        finally:
            gc.enable()
        assert again.admissions == result.admissions, "cycle is not deterministic"
        admitted.append(len(result.admissions))
        preempted.append(len(result.preemptions))
        searches.append(result.preemption_searches)

    return {
        "nodes": workload.nodes,
        "gpus": workload.nodes * 8,
        "tenants": workload.tenants,
        "queued_jobs": workload.queued,
        "running_jobs_fill": workload.fill,
        "trials": trials,
        "cycle_p50_ms": percentile_ms(warm, 0.5),
        "cycle_p99_ms": percentile_ms(warm, 0.99),
        "cycle_cpu_p50_ms": percentile_ms(warm_cpu, 0.5),
        "cycle_cpu_p99_ms": percentile_ms(warm_cpu, 0.99),
        "cycle_cold_p50_ms": percentile_ms(cold, 0.5),
        "cycle_cold_p99_ms": percentile_ms(cold, 0.99),
        "snapshot_build_p50_ms": percentile_ms(builds, 0.5),
        "next_cycle_kept_pool_cpu_p50_ms": percentile_ms(kept_next, 0.5),
        "next_cycle_kept_pool_cpu_p99_ms": percentile_ms(kept_next, 0.99),
        "next_cycle_from_scratch_cpu_p50_ms": percentile_ms(scratch_next, 0.5),
        "next_cycle_from_scratch_cpu_p99_ms": percentile_ms(scratch_next, 0.99),
        "one_arrival_kept_pool_cpu_p50_ms": percentile_ms(kept_arrival, 0.5),
        "one_arrival_kept_pool_cpu_p99_ms": percentile_ms(kept_arrival, 0.99),
        "one_arrival_from_scratch_cpu_p50_ms": percentile_ms(scratch_arrival, 0.5),
        "one_arrival_from_scratch_cpu_p99_ms": percentile_ms(scratch_arrival, 0.99),
        "quiet_snapshots": len(kept_waiting),
        "one_waiting_arrival_kept_pool_cpu_p50_ms": percentile_ms(kept_waiting, 0.5),
        "one_waiting_arrival_kept_pool_cpu_p99_ms": percentile_ms(kept_waiting, 0.99),
        "one_waiting_arrival_from_scratch_cpu_p50_ms": percentile_ms(scratch_waiting, 0.5),
        "one_waiting_arrival_from_scratch_cpu_p99_ms": percentile_ms(scratch_waiting, 0.99),
        "admissions_per_cycle": round(statistics.mean(admitted), 1),
        "preemptions_per_cycle": round(statistics.mean(preempted), 1),
        "preemption_searches_per_cycle": round(statistics.mean(searches), 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


@click.command("admission")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", default=1000, show_default=True)
@click.option("--tenants", default=50, show_default=True)
@click.option("--jobs", "queued", default=10_000, show_default=True, help="Queued jobs.")
@click.option("--fill", default=0.75, show_default=True, help="Share of GPUs already held.")
@click.option("--trials", default=20, show_default=True, help="Snapshots (one cycle each).")
@click.option("--seed", default=1, show_default=True)
def admission(
    *, as_json: bool, nodes: int, tenants: int, queued: int, fill: float, trials: int, seed: int
) -> None:
    """One admission cycle over a busy cluster and a long queue: p50 / p99 milliseconds."""
    result = run(Workload(nodes, tenants, queued, fill), trials, seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{result['queued_jobs']} queued jobs, {result['tenants']} tenants, {result['nodes']} "
        f"nodes ({result['gpus']} GPUs, {fill:.0%} held), {trials} snapshots"
    )
    click.echo(
        f"cycle (warm placement memo): p50 {result['cycle_p50_ms']} ms, "
        f"p99 {result['cycle_p99_ms']} ms"
    )
    click.echo(
        f"  of it CPU time of this process: p50 {result['cycle_cpu_p50_ms']} ms, "
        f"p99 {result['cycle_cpu_p99_ms']} ms (wall minus CPU is time other processes took)"
    )
    click.echo(
        f"cycle (cold, after restart): p50 {result['cycle_cold_p50_ms']} ms, "
        f"p99 {result['cycle_cold_p99_ms']} ms"
    )
    for label, name in (
        ("the next cycle (the first one's decisions landed)", "next_cycle"),
        ("a cycle after one job arrived", "one_arrival"),
        (
            f"a cycle after a job like the waiting ones arrived, once a cycle changed nothing "
            f"({result['quiet_snapshots']} snapshots)",
            "one_waiting_arrival",
        ),
    ):
        click.echo(
            f"CPU time of {label}, kept pool: p50 {result[name + '_kept_pool_cpu_p50_ms']} ms, "
            f"p99 {result[name + '_kept_pool_cpu_p99_ms']} ms; from scratch: p50 "
            f"{result[name + '_from_scratch_cpu_p50_ms']} ms, p99 "
            f"{result[name + '_from_scratch_cpu_p99_ms']} ms"
        )
    click.echo(
        f"per cycle: {result['admissions_per_cycle']} admissions, "
        f"{result['preemptions_per_cycle']} preemptions, "
        f"{result['preemption_searches_per_cycle']} victim searches"
    )
