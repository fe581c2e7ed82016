"""Invariants of the admission core over random workloads (hypothesis), each checked against
truth computed here, independently of the core's own bookkeeping.

Each example builds a cluster, tenants and a stream of jobs, lets part of them settle (so some
tenants borrow), then submits the rest and replays the cycle on its own result with unchanged
demand (admitted jobs start at once, victims' pods vanish at once and they queue again) until
nothing changes. Along the way:

* preemptions never form a cycle of any length, in either phase (A evicts B, B evicts C, C evicts
  A is thrash however long the chain);
* every victim set is minimal: with any one victim spared, the preemptor could not be admitted
  (checked by running the cycle again without the other victims and without preemption);
* a job of another tenant is only ever evicted for a job inside its own tenant's guarantee, from a
  tenant that was borrowing at the time;
* victims are preemptible, past their minimum runtime, and lower priority when of the same tenant;
* every admitted gang holds exactly its GPUs: no GPU held twice, on count-only nodes no more GPUs
  held than the node has; on nodes of its model, meeting its required scope;
* a tenant that is admitted anything stays within its borrowing limit, and the usage the cycle
  reports is the sum of its admitted jobs' GPUs;
* the same snapshot, in any order, gives the same decisions;
* the replay settles: preemptions stop after a bounded number of cycles.

Each check was seen to fail on a bug planted in the core (see docs/development.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.admission import (
    Assignment,
    CycleConfig,
    CycleResult,
    Job,
    JobState,
    PreemptReason,
    Snapshot,
    Tenant,
    run_cycle,
)
from gpusched.core.admission.model import AdmitReason, GuaranteeRounding
from gpusched.core.admission.quota import Ledger
from tests.examples import examples
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


def _usage(jobs: list[Job]) -> dict[str, int]:
    """GPUs held per tenant by admitted jobs, summed from the jobs themselves."""
    out: dict[str, int] = {}
    for j in jobs:
        if j.state is JobState.ADMITTED and j.tenant is not None:
            out[j.tenant] = out.get(j.tenant, 0) + j.total_gpus
    return out


def _check_holdings(snapshot: Snapshot, result: CycleResult) -> None:
    """No GPU is held twice, counting count-only nodes by number."""
    jobs = {j.key: j for j in snapshot.jobs}
    nodes = {n.name: n for n in snapshot.nodes}
    victims = {v.victim for v in result.preemptions}
    held: dict[tuple[str, int], str] = {}
    counted: dict[str, int] = {n.name: n.busy_count + len(n.busy) for n in snapshot.nodes}
    holdings = [
        (j.key, a)
        for j in snapshot.jobs
        if j.state is not JobState.QUEUED and j.key not in victims
        for a in j.placement
    ]
    for n in snapshot.nodes:
        for g in n.busy:
            held[(n.name, g)] = "foreign"
    for key, a in holdings:
        if a.node not in nodes:
            continue
        counted[a.node] += a.size
        for g in a.gpus:
            assert (a.node, g) not in held, (key, a, held[(a.node, g)])
            held[(a.node, g)] = key
    for admission in result.admissions:
        subject = jobs[admission.job]
        for plan in admission.placement:
            target = nodes[plan.node]
            counted[plan.node] += len(plan.gpus)
            if not target.count_only:
                for g in plan.gpus:
                    assert (plan.node, g) not in held, (admission.job, plan, held[(plan.node, g)])
                    held[(plan.node, g)] = admission.job
        assert len(admission.placement) == subject.replicas
    for name, count in counted.items():
        assert count <= nodes[name].topology.wiring.n, (name, count)


def _check_cycle(snapshot: Snapshot, result: CycleResult) -> None:
    jobs = {j.key: j for j in snapshot.jobs}
    tenants = {t.name: t for t in snapshot.tenants}
    nodes = {n.name: n for n in snapshot.nodes}
    # The core's own ledger only to know who borrowed when a reclaim was decided; limits and
    # usage are checked against sums computed here.
    ledgers = {
        name: Ledger(
            t, [j for j in snapshot.jobs if j.tenant == name and j.state is JobState.ADMITTED]
        )
        for name, t in tenants.items()
    }
    _check_holdings(snapshot, result)
    running = {
        name: [j for j in snapshot.jobs if j.tenant == name and j.state is JobState.ADMITTED]
        for name in tenants
    }
    for admission in result.admissions:
        subject = jobs[admission.job]
        # Whether it may reclaim is judged on its tenant's jobs before it (the next call adds it).
        for v in admission.victims:
            if v.reason is not PreemptReason.HIGHER_PRIORITY:
                assert _may_reclaim(snapshot, tenants, running, subject, admission.reason)
        _check_lenders_keep_their_guarantee(
            tenants, running, admission, jobs, snapshot.config.guarantee_rounding
        )
        assert subject.state is JobState.QUEUED
        for plan in admission.placement:
            assert len(plan.gpus) == subject.gpus_per_replica
            if subject.gpu_model:
                assert nodes[plan.node].model == subject.gpu_model
            if subject.policy.mode is TopologyMode.REQUIRED:
                order = list(TopologyScope)
                assert order.index(plan.topology_class) <= order.index(subject.policy.scope)
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
                assert ledgers[victim.tenant].borrowed() > 0
            ledgers[victim.tenant].remove(victim)
        assert subject.tenant is not None
        ledgers[subject.tenant].add(subject)
    # Usage after the cycle, from the jobs: what ran, minus victims, plus admissions.
    victims = {v.victim for v in result.preemptions}
    after = _usage([j for j in snapshot.jobs if j.key not in victims])
    for admission in result.admissions:
        after[admission.tenant] = after.get(admission.tenant, 0) + jobs[admission.job].total_gpus
    admitted_tenants = {a.tenant for a in result.admissions}
    for usage in result.tenants:
        assert usage.used == after.get(usage.name, 0), (usage.name, usage.used, after)
        limit = tenants[usage.name].borrowing_limit
        if limit is not None and usage.name in admitted_tenants:
            assert after.get(usage.name, 0) <= limit, (usage.name, after, limit)
    _check_minimal_victims(snapshot, result)


def _may_reclaim(
    snapshot: Snapshot,
    tenants: dict[str, Tenant],
    running: dict[str, list[Job]],
    subject: Job,
    reason: AdmitReason,
) -> bool:
    """Whether a job admitted for ``reason`` could take GPUs back from another tenant: when it
    runs inside its tenant's guarantee, or, with guarantees rounded up to whole jobs, when its
    tenant (without guarantees by model) held less than its guarantee before it (``running``:
    the tenant's jobs as the cycle stood at the decision)."""
    if reason is AdmitReason.WITHIN_GUARANTEE:
        return True
    assert subject.tenant is not None
    tenant = tenants[subject.tenant]
    return (
        snapshot.config.guarantee_rounding == "up"
        and subject.preemptible
        and not tenant.guaranteed_by_model
        and sum(j.total_gpus for j in running[subject.tenant]) < tenant.guaranteed
    )


def _least_covering(guarantee: int, jobs: list[Job]) -> int:
    """The fewest GPUs some subset of ``jobs`` holds that is at least ``guarantee`` (all of
    them when they hold less)."""
    total = sum(j.total_gpus for j in jobs)
    if total <= guarantee:
        return total
    sums = {0}
    for j in jobs:
        sums |= {t + j.total_gpus for t in sums}
    return min(t for t in sums if t >= guarantee)


def _most_inside(guarantee: int, jobs: list[Job]) -> int:
    """The most GPUs some subset of ``jobs`` holds within ``guarantee`` (the sums every subset
    can reach, built one job at a time)."""
    sums = {0}
    for j in jobs:
        sums |= {t + j.total_gpus for t in sums if t + j.total_gpus <= guarantee}
    return max(sums)


def _check_lenders_keep_their_guarantee(
    tenants: dict[str, Tenant],
    running: dict[str, list[Job]],
    admission: Any,
    jobs: dict[str, Job],
    rounding: GuaranteeRounding,
) -> None:
    """However many of a tenant's jobs one reclaim takes, what it keeps fills its guarantee as
    much as what it held did, in the shape of its jobs (tenants with per-model guarantees are
    left out: the sums here know no buckets). ``running`` is kept current across the cycle's
    decisions."""
    taken: dict[str, set[str]] = {}
    for v in admission.victims:
        if v.reason is PreemptReason.RECLAIM_GUARANTEE and v.victim_tenant is not None:
            taken.setdefault(v.victim_tenant, set()).add(v.victim)
    for name, keys in taken.items():
        tenant = tenants[name]
        if tenant.guaranteed_by_model:
            continue
        before = running[name]
        kept = [j for j in before if j.key not in keys]
        keeps = _least_covering if rounding == "up" else _most_inside
        assert keeps(tenant.guaranteed, kept) >= keeps(tenant.guaranteed, before), (
            f"{admission.job} took {sorted(keys)} from {name}, below its guarantee"
        )
    for v in admission.victims:
        if v.victim_tenant is not None:
            running[v.victim_tenant] = [j for j in running[v.victim_tenant] if j.key != v.victim]
    subject = jobs[admission.job]
    if subject.tenant is not None:
        running[subject.tenant] = [*running[subject.tenant], subject]


def _check_minimal_victims(snapshot: Snapshot, result: CycleResult) -> None:
    """With any one victim spared, the preemptor could not have been admitted: run the cycle
    again over the cluster as it stood at that decision (earlier victims still terminating on
    what their preemptors did not take), without the other victims, with the preemptor alone
    in the queue and no preemption allowed."""
    held = {j.key: j for j in snapshot.jobs if j.state in (JobState.ADMITTED, JobState.TERMINATING)}
    jobs = {j.key: j for j in snapshot.jobs}
    no_preemption = replace(snapshot.config, max_preemption_searches=0)
    tenants = {t.name: t for t in snapshot.tenants}
    for admission in result.admissions:
        preemptor = jobs[admission.job]
        names = [v.victim for v in admission.victims]
        reclaimed = {
            v.victim for v in admission.victims if v.reason is not PreemptReason.HIGHER_PRIORITY
        }
        # The preemptor's tenant's jobs as the cluster stood at this decision.
        before = {
            preemptor.tenant: [
                j
                for j in held.values()
                if j.tenant == preemptor.tenant and j.state is JobState.ADMITTED
            ]
        }
        for spared in names:
            others = set(names) - {spared}
            trial = replace(
                snapshot,
                jobs=(*(j for k, j in held.items() if k not in others), preemptor),
                config=no_preemption,
            )
            alternative = run_cycle(trial).admission_of(admission.job)
            # Reclaiming another tenant's GPUs is only for a job inside its guarantee (or, with
            # guarantees rounded up, taking what is left of it): without the spared victim the
            # others would not all be allowed.
            allowed = alternative is not None and (
                not (others & reclaimed)
                or _may_reclaim(snapshot, tenants, before, preemptor, alternative.reason)
            )
            assert not allowed, f"{admission.job} evicted {spared} for nothing: {names}"
        for name in names:
            # Evicted, but still on the GPUs its preemptor does not take (terminating).
            held[name] = replace(held[name], state=JobState.TERMINATING, reserved_for=None)
        placed = tuple(
            Assignment(p.node, (), len(p.gpus)) if p.count_only else Assignment(p.node, p.gpus)
            for p in admission.placement
        )
        held[admission.job] = replace(
            preemptor, state=JobState.ADMITTED, placement=placed, started_at=snapshot.now
        )


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen = {start}
    todo = [start]
    while todo:
        current = todo.pop()
        if current == goal:
            return True
        for nxt in edges.get(current, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _settle(snapshot: Snapshot, cycles: int, edges: dict[str, set[str]]) -> Snapshot:
    """Replay until quiet; ``edges`` (preemptor -> victims) accumulates over the whole run and
    must stay acyclic."""
    quiet = 0
    for _ in range(cycles):
        result = run_cycle(snapshot)
        _check_cycle(snapshot, result)
        for p in result.preemptions:
            assert not _reaches(edges, p.victim, p.preemptor), (
                f"preemption cycle: {p.preemptor} evicts {p.victim}, which led to evicting "
                f"{p.preemptor} before"
            )
            edges.setdefault(p.preemptor, set()).add(p.victim)
        quiet = quiet + 1 if not result.preemptions else 0
        snapshot = replay(snapshot, result, dt=100.0)
        if quiet >= 2:
            return snapshot
    raise AssertionError(f"preemptions still happening after {cycles} cycles")


@pytest.mark.parametrize("rounding", ["down", "up"])
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_replays_never_preempt_back_and_keep_every_invariant(
    rounding: GuaranteeRounding,
    workload: tuple[list[Any], list[Tenant], list[Job], list[Job]],
) -> None:
    nodes, tenants, early, late = workload
    snapshot = Snapshot(
        now=1000.0,
        tenants=tuple(tenants),
        jobs=tuple(early),
        nodes=tuple(nodes),
        config=CycleConfig(guarantee_rounding=rounding),
    )
    edges: dict[str, set[str]] = {}
    snapshot = _settle(snapshot, 40, edges)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, *late))
    _settle(snapshot, 4 * (len(early) + len(late)) + 4, edges)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


@st.composite
def scattered_workloads(draw: Any) -> tuple[list[Any], list[Tenant], list[Job], list[Job]]:
    """HiveD's sharing anomaly: borrowers' small jobs fill every node, the owner of a guarantee
    (who also runs low-priority jobs of its own on the same nodes) comes back for whole-node
    gangs; lenders with guarantees of their own, so a reclaim can take some of a lender's jobs
    but not all."""
    nodes = [node(f"n{i}", "nvswitch", "H100") for i in range(draw(st.integers(2, 4)))]
    capacity = 8 * len(nodes)
    tenants = [
        Tenant(
            "t0",
            guaranteed=draw(st.sampled_from([8, 16])),
            within_tenant=draw(st.sampled_from(list(WithinTenantPreemption))),
        ),
        *(Tenant(f"t{i}", guaranteed=draw(st.sampled_from([0, 2, 4, 8]))) for i in (1, 2)),
    ]
    early = []
    used = 0
    for i in range(draw(st.integers(4, 24))):
        size = draw(st.sampled_from([1, 1, 1, 2, 4]))
        if used + size > capacity:
            break
        used += size
        tenant = draw(st.sampled_from(["t0", "t1", "t1", "t2", "t2"]))
        early.append(
            job(
                f"{tenant}/e{i}",
                tenant,
                size,
                priority=draw(st.integers(0, 1)),
                submitted=float(i),
                min_runtime_seconds=draw(st.sampled_from([0.0, 0.0, 150.0])),
            )
        )
    late = [
        job(
            f"t0/g{i}",
            "t0",
            draw(st.sampled_from([4, 8])),
            priority=draw(st.integers(0, 3)),
            submitted=100.0 + i,
            scope=draw(st.sampled_from([TopologyScope.NVLINK, TopologyScope.NODE])),
            mode=TopologyMode.REQUIRED,
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    return nodes, tenants, early, late


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scattered_workloads())
def test_reclaim_among_scattered_borrowers_keeps_every_invariant(
    workload: tuple[list[Any], list[Tenant], list[Job], list[Job]],
) -> None:
    nodes, tenants, early, late = workload
    snapshot = Snapshot(now=1000.0, tenants=tuple(tenants), jobs=tuple(early), nodes=tuple(nodes))
    edges: dict[str, set[str]] = {}
    snapshot = _settle(snapshot, 40, edges)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, *late))
    _settle(snapshot, 4 * (len(early) + len(late)) + 4, edges)
