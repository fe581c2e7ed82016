"""Expected starts play the cycle forward (docs/quotas.md "Expected start"): greedily in the
cycle's order at each time GPUs come free, under tenant limits, with reservations made as the
cycle makes them. Checked against an independent play that tries every waiting job at every
time anything changes, on busy intervals of its own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.admission import Cycle, CycleConfig, Job, Snapshot, Tenant
from gpusched.core.admission import cycle as cycle_module
from gpusched.core.admission.model import Node
from gpusched.core.admission.profile import NEVER, duration_class
from gpusched.core.placement import Placement, place
from gpusched.core.ranking import node_rank
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node

MINUTE = 60.0


def _cycle(
    jobs: list[Job], tenants: tuple[Tenant, ...], nodes: tuple[Node, ...], config: CycleConfig
) -> Cycle:
    cycle = Cycle(Snapshot(now=0.0, tenants=tenants, jobs=tuple(jobs), nodes=nodes, config=config))
    cycle.run()
    return cycle


def _behind_a_whole_node_job(*later: Job, reservations: int = 0) -> dict[str, float | None]:
    """Node a: GPUs 6-7 come free at 40 min, 0-5 at 100 min; the 8-GPU job A (50 min) is
    first in the order, ``later`` queue behind it."""
    jobs = [
        job("t/r1", "t", 6, running_on=[("a", (0, 1, 2, 3, 4, 5))], expected_end=100 * MINUTE),
        job("t/r2", "t", 2, running_on=[("a", (6, 7))], expected_end=40 * MINUTE),
        job("t/A", "t", 8, expected_runtime=50 * MINUTE, submitted=1.0),
        *later,
    ]
    config = CycleConfig(reservations_per_tenant=reservations)
    return _cycle(jobs, (Tenant("t", guaranteed=8),), (node("a"),), config).forecast()


B = job("t/B", "t", 2, expected_runtime=30 * MINUTE, submitted=2.0)
C = job("t/C", "t", 2, expected_runtime=100 * MINUTE, submitted=3.0)


def test_without_reservations_a_small_job_overtakes_a_blocked_gang_as_the_cycle_lets_it() -> None:
    # GPUs 6-7 come free at 40 min, 0-5 at 100 min. The 8-GPU job A is first in the order but
    # the cycle holds nothing for it: at 40 min B (2 GPUs, 30 min) starts, at 70 min C (2 GPUs,
    # 100 min) does, and A starts when C ends.
    assert _behind_a_whole_node_job(B, C) == {
        "t/A": 170 * MINUTE,
        "t/B": 40 * MINUTE,
        "t/C": 70 * MINUTE,
    }


def test_past_its_budget_the_play_plans_the_rest_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # With no tries at all, every job is planned where it fits soonest after those before it
    # (conservative backfill): A holds the whole node from 100 min, B goes into the gap it
    # leaves on GPUs 6-7, C (too long for the gap) after A.
    monkeypatch.setattr(cycle_module, "_PLAY_TRIES_PER_JOB", 0)
    monkeypatch.setattr(cycle_module, "_PLAY_TRIES", -1)
    assert _behind_a_whole_node_job(B, C) == {
        "t/A": 100 * MINUTE,
        "t/B": 40 * MINUTE,
        "t/C": 150 * MINUTE,
    }


def test_past_its_budget_the_jobs_planned_in_turn_keep_to_their_tenants_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cycle_module, "_PLAY_TRIES_PER_JOB", 0)
    monkeypatch.setattr(cycle_module, "_PLAY_TRIES", -1)
    jobs = [
        job("t/r", "t", 4, running_on=[("a", (0, 1, 2, 3))], expected_end=30 * MINUTE),
        job("t/q1", "t", 4, expected_runtime=10 * MINUTE, submitted=1.0),
        job("t/q2", "t", 4, expected_runtime=10 * MINUTE, submitted=2.0),
    ]
    cycle = _cycle(jobs, (Tenant("t", borrowing_limit=4),), (node("a"),), CycleConfig())
    assert cycle.forecast() == {"t/q1": 30 * MINUTE, "t/q2": 40 * MINUTE}


def test_a_reserved_gang_keeps_its_start_and_only_jobs_ending_before_it_go_first() -> None:
    assert _behind_a_whole_node_job(B, C, reservations=1) == {
        "t/A": 100 * MINUTE,
        "t/B": 40 * MINUTE,
        "t/C": 150 * MINUTE,
    }


def test_a_long_job_that_misses_a_gap_does_not_keep_a_shorter_one_of_its_shape_out() -> None:
    # C and B ask the same; at 40 min C (100 min, first in the order) does not fit the gap on
    # GPUs 6-7 before A's reservation, B (30 min) does.
    c_first = job("t/C", "t", 2, expected_runtime=100 * MINUTE, submitted=2.0)
    b_after = job("t/B", "t", 2, expected_runtime=30 * MINUTE, submitted=3.0)
    assert _behind_a_whole_node_job(c_first, b_after, reservations=1) == {
        "t/A": 100 * MINUTE,
        "t/B": 40 * MINUTE,
        "t/C": 150 * MINUTE,
    }


def test_a_job_that_cannot_be_evicted_never_starts_on_gpus_held_for_a_later_start() -> None:
    # B fits the 60 minutes before A's reservation but is not preemptible and declares no
    # limit: the cycle would not backfill it, so it waits for A.
    b = job("t/B", "t", 2, expected_runtime=30 * MINUTE, submitted=2.0, preemptible=False)
    assert _behind_a_whole_node_job(b, reservations=1) == {
        "t/A": 100 * MINUTE,
        "t/B": 150 * MINUTE,
    }


def test_when_a_reservation_starts_the_tenants_next_blocked_gang_reserves() -> None:
    # Tenant t's A and B need whole nodes; u's 1-GPU jobs (ordered after them) take every GPU
    # as it frees from 65 min. A reserves node a, free at 60 min. B may reserve only once A has
    # started (one reservation per tenant): at 60 min it reserves node b, whose GPUs free from
    # 70 to 140 min, and holds them against u's jobs, which wait for node a.
    jobs = [
        job("x/r", "x", 8, running_on=[("a", tuple(range(8)))], expected_end=60 * MINUTE),
        *(
            job(f"u/r{p}", "u", 1, running_on=[("b", (p,))], expected_end=(70 + 10 * p) * MINUTE)
            for p in range(8)
        ),
        job("t/A", "t", 8, expected_runtime=600 * MINUTE, submitted=1.0),
        job("t/B", "t", 8, expected_runtime=600 * MINUTE, submitted=2.0),
        *(
            job(f"u/q{i}", "u", 1, expected_runtime=1000 * MINUTE, not_before=65 * MINUTE)
            for i in range(8)
        ),
    ]
    tenants = (Tenant("t"), Tenant("u", borrowing_limit=16), Tenant("x"))
    config = CycleConfig(reservations_per_tenant=1, reserve_beyond_entitlement=True)
    cycle = _cycle(jobs, tenants, (node("a"), node("b")), config)
    expected = cycle.forecast()
    assert expected["t/A"] == 60 * MINUTE
    assert expected["t/B"] == 140 * MINUTE
    assert all(expected[f"u/q{i}"] == 660 * MINUTE for i in range(8))


def test_a_job_over_its_tenants_limit_starts_when_the_tenants_own_job_ends() -> None:
    jobs = [
        job("t/r", "t", 4, running_on=[("a", (0, 1, 2, 3))], expected_end=30 * MINUTE),
        job("t/q", "t", 4, expected_runtime=10 * MINUTE, submitted=1.0),
        job("u/q", "u", 2, expected_runtime=10 * MINUTE, submitted=2.0),
    ]
    tenants = (Tenant("t", borrowing_limit=4), Tenant("u", borrowing_limit=8))
    cycle = _cycle(jobs, tenants, (node("a"),), CycleConfig())
    assert cycle.forecast() == {"t/q": 30 * MINUTE}  # u/q started now


def test_a_job_over_its_tenants_limit_starts_at_the_first_end_that_makes_room() -> None:
    jobs = [
        job("t/r1", "t", 2, running_on=[("a", (0, 1))], expected_end=60 * MINUTE),
        job("t/r2", "t", 2, running_on=[("a", (2, 3))], expected_end=30 * MINUTE),
        job("t/r3", "t", 2, running_on=[("a", (4, 5))], expected_end=90 * MINUTE),
        job("t/q", "t", 2, expected_runtime=10 * MINUTE, submitted=1.0),
    ]
    cycle = _cycle(jobs, (Tenant("t", borrowing_limit=6),), (node("a"),), CycleConfig())
    assert cycle.forecast() == {"t/q": 30 * MINUTE}


# --- against an independent play ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kinds: tuple[str, ...]
    """Each node's wiring."""
    running: tuple[tuple[str, int, tuple[int, ...], int], ...]
    """(tenant, node, GPUs, minutes until it ends)."""
    queued: tuple[tuple[str, int, int | None, int, bool], ...]
    """(tenant, GPUs, run time in minutes or None, not before in minutes, preemptible)."""
    limits: tuple[int | None, int | None]
    """Borrowing limits of tenants a and b."""
    reservations: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kinds = tuple(draw(st.lists(st.sampled_from(("nvswitch", "dgx1")), min_size=1, max_size=3)))
    running = []
    for n in range(len(kinds)):
        gpus = sorted(draw(st.sets(st.integers(0, 7), max_size=8)))
        while gpus:
            size = draw(st.integers(1, len(gpus)))
            taken, gpus = gpus[:size], gpus[size:]
            running.append((draw(st.sampled_from("ab")), n, tuple(taken), draw(st.integers(1, 60))))
    queued = tuple(
        (
            draw(st.sampled_from("ab")),
            draw(st.sampled_from((1, 1, 2, 4, 8))),
            draw(st.one_of(st.none(), st.integers(1, 90))),
            draw(st.sampled_from((0, 0, 0, 15))),
            draw(st.booleans()) or draw(st.booleans()),
        )
        for _ in range(draw(st.integers(1, 10)))
    )
    limits = (
        draw(st.one_of(st.none(), st.integers(2, 16))),
        draw(st.one_of(st.none(), st.integers(2, 16))),
    )
    return Case(kinds, tuple(running), queued, limits, draw(st.sampled_from((0, 1))))


def _build(case: Case) -> Cycle:
    nodes = tuple(node(f"n{i}", kind) for i, kind in enumerate(case.kinds))
    jobs = [
        job(
            f"{tenant}/r{i}",
            tenant,
            len(gpus),
            running_on=[(f"n{n}", gpus)],
            expected_end=minutes * MINUTE,
            preemptible=False,
        )
        for i, (tenant, n, gpus, minutes) in enumerate(case.running)
    ]
    jobs += [
        job(
            f"{tenant}/q{i}",
            tenant,
            gpus,
            expected_runtime=None if runtime is None else runtime * MINUTE,
            not_before=after * MINUTE if after else None,
            preemptible=preemptible,
            submitted=float(i),
        )
        for i, (tenant, gpus, runtime, after, preemptible) in enumerate(case.queued)
    ]
    # Guarantees of 8 each: non-preemptible jobs may run; no reclaim (nobody is below its
    # guarantee while others borrow in a way this play would have to model).
    tenants = tuple(
        Tenant(name, guaranteed=8, borrowing_limit=limit)
        for name, limit in zip("ab", case.limits, strict=True)
    )
    config = CycleConfig(
        reservations_per_tenant=case.reservations,
        reserve_beyond_entitlement=True,
        max_preemption_searches=0,
    )
    return _cycle(jobs, tenants, nodes, config)


Busy = dict[tuple[str, int], list[tuple[float, float]]]


def _free_mask(busy: Busy, name: str, start: float, length: float) -> int:
    """GPUs of ``name`` free from ``start`` for ``length`` (for good when infinite)."""
    mask = 0
    for p in range(8):
        if all(end <= start or begin >= start + length for begin, end in busy.get((name, p), [])):
            mask |= 1 << p
    return mask


def _best(
    cycle: Cycle, busy: Busy, j: Job, start: float, length: float
) -> tuple[str, Placement] | None:
    """The node the profile picks at ``start``: best ranked, then first by name."""
    chosen = None
    for name in sorted(cycle.pool.slots):
        topology = cycle.pool.slots[name].node.topology
        found = place(
            topology, j.gpus_per_replica, j.policy, free_mask=_free_mask(busy, name, start, length)
        )
        if not isinstance(found, Placement):
            continue
        rank = node_rank(found)
        if chosen is None or rank > chosen[0]:
            chosen = (rank, name, found)
    return None if chosen is None else (chosen[1], chosen[2])


def _play(cycle: Cycle) -> dict[str, float | None]:
    """Every waiting job tried in order at every time anything changes."""
    config = cycle.snapshot.config
    busy: Busy = {}
    held: list[tuple[str, float, float, int]] = []
    """(tenant, start, end, GPUs)."""
    events = {0.0}

    def occupy(
        tenant: str, node_name: str, gpus: tuple[int, ...], start: float, end: float
    ) -> None:
        for p in gpus:
            busy.setdefault((node_name, p), []).append((start, end))
        held.append((tenant, start, end, len(gpus)))
        events.update(x for x in (start, end) if x < NEVER)

    for j in cycle.jobs.values():
        if j.placement:
            (a,) = j.placement
            occupy(j.tenant or "", a.node, a.gpus, 0.0, j.expected_end or NEVER)
    for name in cycle.tenants:
        for key in cycle.admitted[name]:
            if not cycle.jobs[key].placement:  # admitted by this cycle
                (plan,) = cycle.pool.holding(key).items()
                gpus = cycle.pool.slots[plan[0]].node.topology.indices(plan[1])
                occupy(name, plan[0], gpus, 0.0, cycle.ends.get(key) or NEVER)
    starts: dict[str, float | None] = {}
    reserving: dict[str, list[float]] = {}
    for key, r in cycle.reserved.items():
        (plan,) = r.placement
        occupy(r.tenant, plan.node, plan.gpus, r.start, r.end)
        starts[key] = r.start
        reserving.setdefault(r.tenant, []).append(r.start)
    waiting = [k for k in cycle.order if k not in starts]
    events.update(cycle.jobs[k].not_before or 0.0 for k in waiting)

    def used(tenant: str, at: float) -> int:
        return sum(n for t, s, e, n in held if t == tenant and s <= at < e)

    now = 0.0
    while True:
        for key in waiting:
            if key in starts:
                continue
            j = cycle.jobs[key]
            tenant = cycle.tenants[j.tenant or ""]
            if (j.not_before or 0.0) > now:
                continue
            cap = tenant.borrowing_limit if j.preemptible else tenant.guaranteed
            if cap is not None and used(tenant.name, now) + j.total_gpus > cap:
                continue
            runtime = j.expected_runtime
            end = now + runtime if runtime is not None else NEVER
            may_backfill = runtime is not None and j.preemptible
            length = duration_class(runtime) if may_backfill else NEVER
            found = _best(cycle, busy, j, now, length)
            if found is not None:
                occupy(tenant.name, found[0], found[1].gpus, now, end)
                starts[key] = now
                continue
            ahead = [s for s in reserving.get(tenant.name, []) if s > now]
            if config.reservations_per_tenant <= len(ahead):
                continue
            for at in sorted(x for x in events | {now} if x >= now):
                spot = _best(cycle, busy, j, at, NEVER)
                if spot is not None:
                    reserve_end = at + runtime if runtime is not None else NEVER
                    occupy(tenant.name, spot[0], spot[1].gpus, at, reserve_end)
                    starts[key] = at
                    reserving.setdefault(tenant.name, []).append(at)
                    break
        later = [x for x in events if x > now]
        if not later or all(k in starts for k in waiting):
            break
        now = min(later)
    return {k: starts.get(k) for k in cycle.order}


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_expected_starts_are_those_of_trying_every_job_at_every_change(case: Case) -> None:
    cycle = _build(case)
    truth = _play(cycle)
    assert cycle.forecast() == truth
    # Played only until one job is decided (as explain asks), that job's answer is the same;
    # so are those of a set of jobs played until each is decided (as a replay asks).
    for key in list(truth)[-1:]:
        assert _build(case).forecast(until=key)[key] == truth[key]
    some = frozenset(list(truth)[::3])
    stopped = _build(case).forecast(until=some)
    assert {k: stopped[k] for k in some} == {k: truth[k] for k in some}


@settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(), st.integers(0, 12))
def test_a_play_stopped_at_some_jobs_answers_as_the_whole_play_past_its_budget_too(
    case: Case, tries: int
) -> None:
    """``explain`` plays only until its job is decided (a replay until the jobs it has not
    told yet are), under the budget of the whole play: a play that runs out of tries plans the
    rest in turn, and the answers are the same."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module, "_PLAY_TRIES_PER_JOB", 0)
        patch.setattr(cycle_module, "_PLAY_TRIES", tries)
        whole = _build(case).forecast()
        for key, start in whole.items():
            assert _build(case).forecast(until=key)[key] == start, key
        for first in range(3):
            some = frozenset(list(whole)[first::3])
            stopped = _build(case).forecast(until=some)
            assert {k: stopped[k] for k in some} == {k: whole[k] for k in some}


def test_a_forecast_stopped_at_one_job_cannot_then_answer_for_all() -> None:
    jobs = [
        job("t/r", "t", 8, running_on=[("a", tuple(range(8)))], expected_end=30 * MINUTE),
        job("t/q1", "t", 8, expected_runtime=10 * MINUTE, submitted=1.0),
        job("t/q2", "t", 8, expected_runtime=10 * MINUTE, submitted=2.0),
    ]
    cycle = _cycle(jobs, (Tenant("t"),), (node("a"),), CycleConfig())
    assert cycle.forecast(until="t/q1") == {"t/q1": 30 * MINUTE}
    with pytest.raises(RuntimeError):
        cycle.forecast()
