"""Invariants of the admission core over random workloads (hypothesis).

Each example builds a cluster, tenants and a stream of jobs, lets part of them settle (so some
tenants borrow), then submits the rest and replays the cycle on its own result with unchanged
demand (admitted jobs start at once, victims' pods vanish at once and they queue again) until
nothing changes. Along the way:

* no job ever preempts a job that earlier preempted it (no preemption cycles);
* a job of another tenant is only ever evicted for a job inside its own tenant's guarantee,
  from a tenant that was borrowing at the time;
* victims are preemptible, past their minimum runtime, and lower priority when of the same tenant;
* every admitted gang holds exactly its GPUs, none of them held by anyone else, on nodes of its
  model, meeting its required scope; tenants stay within their borrowing limits;
* the same snapshot, in any order, gives the same decisions;
* the replay settles: preemptions stop after a bounded number of cycles.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.admission import (
    CycleResult,
    Job,
    JobState,
    PreemptReason,
    Snapshot,
    Tenant,
    run_cycle,
)
from gpusched.core.admission.model import AdmitReason
from gpusched.core.admission.quota import Ledger
from tests.unit.core.admission_testdata import across, job, node, replay

MODELS = ("H100", "A100")
RACK = "rack"


@st.composite
def clusters(draw: Any) -> list[Any]:
    count = draw(st.integers(2, 6))
    nodes = []
    for i in range(count):
        kind = draw(st.sampled_from(["nvswitch", "dgx1", "count"]))
        model = draw(st.sampled_from(MODELS))
        nodes.append(node(f"n{i}", kind, model, labels={RACK: f"r{i % 2}"}))
    return nodes


@st.composite
def tenant_sets(draw: Any) -> list[Tenant]:
    tenants = []
    for i in range(draw(st.integers(2, 4))):
        # t0 always has a guarantee to come back for.
        guaranteed = draw(st.sampled_from([16, 24, 32] if i == 0 else [0, 4, 8, 16]))
        by_model = {}
        if guaranteed and draw(st.booleans()):
            by_model = {draw(st.sampled_from(MODELS)): draw(st.integers(1, guaranteed))}
        limit = draw(st.one_of(st.none(), st.integers(guaranteed, guaranteed + 24)))
        tenants.append(
            Tenant(
                f"t{i}",
                guaranteed=guaranteed,
                guaranteed_by_model=by_model,
                borrowing_limit=limit,
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                within_tenant=draw(st.sampled_from(list(WithinTenantPreemption))),
                reclaim=draw(st.sampled_from([*ReclaimPolicy, ReclaimPolicy.ANY])),
            )
        )
    return tenants


@st.composite
def workloads(draw: Any) -> tuple[list[Any], list[Tenant], list[Job], list[Job]]:
    nodes = draw(clusters())
    tenants = draw(tenant_sets())
    jobs = []
    count = draw(st.integers(2, 16))
    split = draw(st.integers(0, count))
    for i in range(count):
        late = i >= split
        owner_returns = late and draw(st.booleans())
        tenant = tenants[0].name if owner_returns else draw(st.sampled_from(tenants)).name
        replicas = draw(st.sampled_from([1, 1, 1, 2, 3]))
        scope = draw(st.sampled_from([*TopologyScope, TopologyScope.NODE, TopologyScope.NODE]))
        jobs.append(
            job(
                f"{tenant}/j{i}",
                tenant,
                draw(st.sampled_from([1, 2, 4, 8])),
                replicas,
                # Early jobs settle first; later ones (often higher priority) contend with them.
                priority=draw(st.integers(0, 3) if late else st.integers(0, 1)),
                submitted=float(i),
                scope=scope,
                mode=draw(st.sampled_from(list(TopologyMode))),
                gpu_model=draw(st.sampled_from([None, None, *MODELS])),
                preemptible=draw(st.sampled_from([True, True, True, False])),
                min_runtime_seconds=draw(st.sampled_from([0.0, 0.0, 0.0, 50.0, 1e9])),
                across=(
                    across(RACK, draw(st.booleans()))
                    if replicas > 1 and draw(st.booleans())
                    else None
                ),
            )
        )
    return nodes, tenants, jobs[:split], jobs[split:]


def _check_cycle(snapshot: Snapshot, result: CycleResult) -> None:
    jobs = {j.key: j for j in snapshot.jobs}
    tenants = {t.name: t for t in snapshot.tenants}
    nodes = {n.name: n for n in snapshot.nodes}
    ledgers = {
        name: Ledger(
            t, [j for j in snapshot.jobs if j.tenant == name and j.state is JobState.ADMITTED]
        )
        for name, t in tenants.items()
    }
    # GPUs held before the cycle, minus victims (their GPUs go to their preemptor).
    victims = {v.victim for v in result.preemptions}
    held: dict[tuple[str, int], str] = {}
    for j in snapshot.jobs:
        if j.state is not JobState.QUEUED and j.key not in victims:
            for a in j.placement:
                for g in a.gpus:
                    held[(a.node, g)] = j.key
    for n in snapshot.nodes:
        for g in n.busy:
            held[(n.name, g)] = "foreign"

    for admission in result.admissions:
        subject = jobs[admission.job]
        assert subject.state is JobState.QUEUED
        assert len(admission.placement) == subject.replicas
        for plan in admission.placement:
            assert len(plan.gpus) == subject.gpus_per_replica
            target = nodes[plan.node]
            if subject.gpu_model:
                assert target.model == subject.gpu_model
            if subject.policy.mode is TopologyMode.REQUIRED:
                order = list(TopologyScope)
                assert order.index(plan.topology_class) <= order.index(subject.policy.scope)
            for g in plan.gpus:
                if not target.count_only:
                    assert (plan.node, g) not in held, (
                        admission.job,
                        plan,
                        held.get((plan.node, g)),
                    )
                held[(plan.node, g)] = admission.job
        for v in admission.victims:
            victim = jobs[v.victim]
            assert victim.state is JobState.ADMITTED
            assert victim.preemptible
            assert victim.started_at is not None
            assert snapshot.now - victim.started_at >= victim.min_runtime_seconds
            assert victim.tenant is not None
            if v.reason is PreemptReason.HIGHER_PRIORITY:
                assert victim.tenant == subject.tenant
                assert victim.priority < subject.priority
            else:
                assert victim.tenant != subject.tenant
                # Never for a borrower, never from a tenant inside its guarantee (as the cycle
                # stood when it decided: decisions are listed in the order they were made).
                assert admission.reason is AdmitReason.WITHIN_GUARANTEE
                assert ledgers[victim.tenant].borrowed() > 0
            ledgers[victim.tenant].remove(victim)
        assert subject.tenant is not None
        ledgers[subject.tenant].add(subject)
    for usage in result.tenants:
        limit = tenants[usage.name].borrowing_limit
        if limit is not None:
            assert usage.used <= max(limit, ledgers[usage.name].used)


def _settle(snapshot: Snapshot, cycles: int, edges: set[tuple[str, str]] | None) -> Snapshot:
    quiet = 0
    for _ in range(cycles):
        result = run_cycle(snapshot)
        _check_cycle(snapshot, result)
        if edges is not None:
            for p in result.preemptions:
                assert (p.victim, p.preemptor) not in edges, (
                    f"{p.victim} preempted {p.preemptor} back"
                )
                edges.add((p.preemptor, p.victim))
        quiet = quiet + 1 if not result.preemptions else 0
        snapshot = replay(snapshot, result, dt=100.0)
        if quiet >= 2:
            return snapshot
    raise AssertionError(f"preemptions still happening after {cycles} cycles")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_replays_never_preempt_back_and_keep_every_invariant(
    workload: tuple[list[Any], list[Tenant], list[Job], list[Job]],
) -> None:
    nodes, tenants, early, late = workload
    snapshot = Snapshot(now=1000.0, tenants=tuple(tenants), jobs=tuple(early), nodes=tuple(nodes))
    snapshot = _settle(snapshot, 40, None)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, *late))
    _settle(snapshot, 4 * (len(early) + len(late)) + 4, set())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.randoms(use_true_random=False))
def test_decisions_are_deterministic_for_a_snapshot(
    workload: tuple[list[Any], list[Tenant], list[Job], list[Job]], rnd: Any
) -> None:
    nodes, tenants, early, late = workload
    snapshot = Snapshot(now=1000.0, tenants=tuple(tenants), jobs=tuple(early), nodes=tuple(nodes))
    snapshot = replay(snapshot, run_cycle(snapshot), dt=100.0)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, *late))
    expected = run_cycle(snapshot)
    for _ in range(2):
        jobs, ns, ts = list(snapshot.jobs), list(snapshot.nodes), list(snapshot.tenants)
        rnd.shuffle(jobs)
        rnd.shuffle(ns)
        rnd.shuffle(ts)
        again = run_cycle(replace(snapshot, jobs=tuple(jobs), nodes=tuple(ns), tenants=tuple(ts)))
        assert again.admissions == expected.admissions
        assert again.waiting == expected.waiting
        assert again.tenants == expected.tenants
