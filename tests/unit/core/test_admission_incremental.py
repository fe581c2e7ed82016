"""Cycles on a kept pool (:class:`gpusched.core.admission.Cycles`) must decide exactly what a
cycle from scratch decides, cycle after cycle, whatever happened in between.

Truth is a new :class:`Cycle` over the same snapshot, which builds its pool from nothing; the
two run side by side over generated histories in which jobs arrive, start, are evicted, end,
hold GPUs while terminating, and nodes change. Besides every decision (admissions, victims,
reasons, reservations, expected starts), the kept pool's free and held GPUs are compared with a
new pool's as each cycle starts, so a stale node shows even where no decision reads it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.tenantquota import ReclaimPolicy
from gpusched.core.admission import (
    Assignment,
    Cycle,
    CycleConfig,
    CycleResult,
    Cycles,
    Job,
    JobState,
    Level,
    Snapshot,
    Tenant,
    incremental,
)
from gpusched.core.admission.pool import Pool
from tests.unit.core.admission_testdata import job, node, replay
from tests.unit.core.test_admission_properties import tenant_sets

KINDS = ["nvswitch", "dgx1", "count"]


@st.composite
def histories(draw: Any) -> tuple[Snapshot, int]:
    """A cluster, tenants and a queue, plus a seed for what happens between cycles."""
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(draw(st.integers(1, 4)))]
    nodes = tuple(
        node(f"n{i}", kind, "H100", labels={"rack": f"r{i // 2}"}) for i, kind in enumerate(kinds)
    )
    tenants: list[Tenant] = draw(tenant_sets())
    jobs = [_arrival(draw, tenants, i) for i in range(draw(st.integers(2, 20)))]
    config = CycleConfig(reservations_per_tenant=draw(st.integers(0, 2)))
    # With a rack level, nodes ranked equal are ordered by their racks' free GPUs, which the
    # kept pool keeps as nodes change.
    levels = (Level("rack", "rack"),) if draw(st.booleans()) else ()
    snapshot = Snapshot(
        now=1000.0,
        tenants=tuple(tenants),
        jobs=tuple(jobs),
        nodes=nodes,
        config=config,
        levels=levels,
    )
    return snapshot, draw(st.integers(0, 2**32))


def _arrival(draw: Any, tenants: list[Tenant], i: int) -> Job:
    tenant = draw(st.sampled_from(tenants)).name
    replicas = draw(st.sampled_from([1, 1, 1, 2]))
    gpus = draw(st.sampled_from([1, 2, 4, 8] if replicas == 1 else [4, 8]))
    return job(
        f"{tenant}/j{i}",
        tenant,
        gpus,
        replicas,
        priority=draw(st.integers(0, 2)),
        preemptible=draw(st.booleans()),
        submitted=float(i),
        expected_runtime=draw(st.sampled_from([None, 600.0, 3600.0])),
    )


def _happen(snapshot: Snapshot, rng: random.Random, step: int) -> Snapshot:
    """What changes between two cycles besides their own decisions: running jobs end or
    start terminating, terminating ones go, new jobs arrive, now and then a node changes."""
    jobs: list[Job] = []
    for old in snapshot.jobs:
        roll = rng.random()
        if old.state is JobState.TERMINATING and roll < 0.6:
            continue
        if old.state is JobState.ADMITTED and roll < 0.2:
            continue
        new = old
        if old.state is JobState.ADMITTED and roll < 0.3:
            new = replace(old, state=JobState.TERMINATING)
        elif old.state is JobState.ADMITTED and old.expected_end is None and roll < 0.8:
            # Predicted ends let blocked jobs reserve GPUs and others backfill them.
            new = replace(old, expected_end=snapshot.now + rng.choice([300.0, 5000.0]))
        jobs.append(new)
    names = [t.name for t in snapshot.tenants]
    for i in range(rng.randint(0, 4)):
        tenant = rng.choice(names)
        jobs.append(
            job(
                f"{tenant}/s{step}-{i}",
                tenant,
                rng.choice([1, 2, 4, 8]),
                priority=rng.randint(0, 2),
                submitted=snapshot.now + i,
                expected_runtime=rng.choice([None, 900.0]),
            )
        )
    nodes = snapshot.nodes
    if rng.random() < 0.15:
        # A pod outside any GpuJob takes a GPU, or leaves: the node changes.
        at = rng.randrange(len(nodes))
        changed = replace(nodes[at], busy_count=rng.choice([0, 1]))
        nodes = (*nodes[:at], changed, *nodes[at + 1 :])
    return replace(snapshot, jobs=tuple(jobs), nodes=nodes)


def _keep_reservations(snapshot: Snapshot, result: CycleResult) -> Snapshot:
    """Queued jobs carry the reservation the last cycle made for them (as the operator keeps
    it in their status)."""
    held = {r.job: r for r in result.reservations}
    jobs = []
    for old in snapshot.jobs:
        found = held.get(old.key)
        if old.state is not JobState.QUEUED or found is None:
            jobs.append(old)
            continue
        jobs.append(
            replace(
                old,
                reservation=tuple(Assignment(p.node, p.gpus) for p in found.placement),
                reservation_start=found.start,
            )
        )
    return replace(snapshot, jobs=tuple(jobs))


def _pool_state(pool: Pool) -> dict[str, tuple[int, int, dict[str, int], tuple[int, ...]]]:
    return {
        name: (s.free, s.foreign, dict(s.held), pool.fullness(name))
        for name, s in pool.slots.items()
    }


def _held_lists(pool: Pool, keys: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Each job's holdings in the order the pool lists them."""
    return {k: list(pool.holdings(k).items()) for k in keys}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_cycles_on_a_kept_pool_decide_what_cycles_from_scratch_decide(
    drawn: tuple[Snapshot, int],
) -> None:
    snapshot, seed = drawn
    rng = random.Random(seed)
    cycles = Cycles()
    for step in range(8):
        kept = cycles.cycle(snapshot)
        scratch = Cycle(snapshot)
        # Both pools as the cycles start (reservations carried over from the last cycle held).
        assert _pool_state(kept.pool) == _pool_state(scratch.pool)
        keys = sorted(j.key for j in snapshot.jobs)
        assert _held_lists(kept.pool, keys) == _held_lists(scratch.pool, keys)
        ours, truth = kept.run(), scratch.run()
        assert ours == truth
        assert kept.forecast() == scratch.forecast()
        snapshot = replay(snapshot, truth, dt=rng.choice([0.0, 60.0, 900.0]))
        snapshot = _happen(_keep_reservations(snapshot, truth), rng, step)


def test_a_cycle_after_one_arrival_rebuilds_no_node() -> None:
    nodes = tuple(node(f"n{i}") for i in range(6))
    tenants = (Tenant("a", 16), Tenant("b", 16))
    running = [
        job(f"a/r{i}", "a", 4, running_on=[(f"n{i}", (0, 1, 2, 3))], started=0.0) for i in range(6)
    ]
    snapshot = Snapshot(now=100.0, tenants=tenants, jobs=tuple(running), nodes=nodes)
    cycles = Cycles()
    cycles.cycle(snapshot).run()
    assert cycles.rebuilt_nodes == 6
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("b/new", "b", 8, submitted=50.0)))
    result = cycles.cycle(arrived).run()
    assert cycles.rebuilt_nodes == 0
    assert result == Cycle(arrived).run()
    ended = replace(arrived, jobs=tuple(j for j in arrived.jobs if j.key != "a/r2"))
    result = cycles.cycle(ended).run()
    assert cycles.rebuilt_nodes == 1
    assert result == Cycle(ended).run()


def test_a_kept_pool_whose_memos_grew_too_large_starts_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = tuple(node(f"n{i}") for i in range(3))
    snapshot = Snapshot(
        now=100.0,
        tenants=(Tenant("a", 16),),
        jobs=tuple(job(f"a/q{i}", "a", 1 + i % 4, submitted=float(i)) for i in range(6)),
        nodes=nodes,
    )
    cycles = Cycles()
    cycles.cycle(snapshot).run()
    cycles.cycle(snapshot).run()
    assert cycles.rebuilt_nodes == 0
    monkeypatch.setattr(incremental, "MAX_MEMO_ENTRIES", 1)
    result = cycles.cycle(snapshot).run()
    assert cycles.rebuilt_nodes == 3
    assert result == Cycle(snapshot).run()


def _arrive_only(snapshot: Snapshot, rng: random.Random, step: int) -> Snapshot:
    """Only new jobs, at the same instant: mostly at the back of their tenant's queue (the
    lowest priority, submitted last), now and then ahead of others or without a tenant."""
    names = [t.name for t in snapshot.tenants]
    jobs = list(snapshot.jobs)
    for i in range(rng.randint(1, 3)):
        tenant = rng.choice([*names, *names, *names, "nobody"])
        jobs.append(
            job(
                f"{tenant}/a{step}-{i}",
                tenant,
                rng.choice([1, 2, 4, 8, 16]),
                priority=rng.choice([0, 0, 0, 2]),
                submitted=snapshot.now + 10.0 + i,
                preemptible=rng.random() < 0.7,
                expected_runtime=rng.choice([None, 900.0]),
            )
        )
    return replace(snapshot, jobs=tuple(jobs))


def _arrivals_history(snapshot: Snapshot, seed: int) -> int:
    """Ten cycles on a kept pool, each compared with a cycle from scratch; after a cycle that
    changed nothing, mostly only new jobs come. Returns how many took the arrivals on top."""
    rng = random.Random(seed)
    # Few victim searches a cycle, so that arrivals meet a spent budget.
    searches = rng.choice([0, 1, 2, 32])
    snapshot = replace(snapshot, config=replace(snapshot.config, max_preemption_searches=searches))
    cycles = Cycles()
    for step in range(10):
        kept = cycles.cycle(snapshot)
        truth = Cycle(snapshot).run()
        assert kept.run() == truth
        if truth.admissions or truth.reservations or rng.random() < 0.2:
            snapshot = replay(snapshot, truth, dt=rng.choice([0.0, 60.0]))
            snapshot = _happen(_keep_reservations(snapshot, truth), rng, step)
        else:
            snapshot = _arrive_only(snapshot, rng, step)
    return cycles.extended


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_jobs_arriving_after_a_cycle_that_changed_nothing_are_decided_as_from_scratch(
    drawn: tuple[Snapshot, int],
) -> None:
    _arrivals_history(*drawn)


def test_histories_of_arrivals_take_some_cycles_on_top_of_the_last() -> None:
    """The property above is only worth its examples if histories like them take the short
    way: behind a queue that waits for GPUs, most arrivals do."""
    assert sum(_arrivals_history(_waiting_queue(), seed) for seed in range(5)) > 0


def _waiting_queue() -> Snapshot:
    """Tenant a's 16 GPUs are all held; its queue waits for them and nothing can be evicted."""
    nodes = tuple(node(f"n{i}") for i in range(2))
    running = [
        job(f"a/r{i}", "a", 8, running_on=[(f"n{i}", ())], preemptible=False) for i in range(2)
    ]
    queued = [job(f"a/q{i}", "a", 4, submitted=float(i)) for i in range(5)]
    return Snapshot(
        now=100.0,
        tenants=(Tenant("a", 16), Tenant("b", 0)),
        jobs=(*running, *queued),
        nodes=nodes,
    )


def test_a_job_arriving_behind_a_waiting_queue_is_decided_on_top_of_the_last_cycle() -> None:
    snapshot = _waiting_queue()
    cycles = Cycles()
    first = cycles.cycle(snapshot).run()
    assert not first.admissions
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("a/late", "a", 2, submitted=50.0)))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 1
    assert result == Cycle(arrived).run()
    assert result.wait_reasons["a/late"] is not None


def test_a_job_ahead_of_the_waiting_queue_gets_a_whole_cycle() -> None:
    snapshot = _waiting_queue()
    cycles = Cycles()
    cycles.cycle(snapshot).run()
    urgent = job("a/urgent", "a", 2, submitted=50.0, priority=5)
    arrived = replace(snapshot, jobs=(*snapshot.jobs, urgent))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 0
    assert result == Cycle(arrived).run()


def test_a_job_arriving_later_than_the_window_gets_a_whole_cycle() -> None:
    snapshot = _waiting_queue()
    cycles = Cycles(arrivals_within=30.0)
    cycles.cycle(snapshot).run()
    late = job("a/late", "a", 2, submitted=150.0)
    within = replace(snapshot, now=129.0, jobs=(*snapshot.jobs, late))
    cycles.cycle(within).run()
    assert cycles.extended == 1
    later = job("a/later", "a", 2, submitted=160.0)
    beyond = replace(within, now=131.0, jobs=(*within.jobs, later))
    assert cycles.cycle(beyond).run() == Cycle(beyond).run()
    assert cycles.extended == 1


def test_an_arrival_that_takes_the_rest_of_a_rounded_up_guarantee_gets_a_whole_cycle() -> None:
    """Guarantees rounded up: a's 4-GPU job, larger than the 1 GPU its guarantee of 7 leaves,
    claims that rest; a 1-GPU job arriving last fits it and takes the claim away, so the
    jobs decided before it would decide otherwise."""
    tenants = (
        Tenant("a", guaranteed=7, reclaim=ReclaimPolicy.LOWER_PRIORITY),
        Tenant("b", guaranteed=0),
        Tenant("h", guaranteed=4),
    )
    snapshot = Snapshot(
        now=1000.0,
        tenants=tenants,
        jobs=(
            job(
                "a/A",
                "a",
                6,
                priority=3,
                running_on=[("n0", (0, 1, 2, 3, 4, 5))],
                started=0.0,
                submitted=0.0,
            ),
            job("b/x", "b", 2, priority=1, running_on=[("n0", (6, 7))], started=0.0, submitted=1.0),
            job("a/B", "a", 4, priority=2, submitted=950.0),
            job("h/big", "h", 16, submitted=990.0),  # no node holds it; still asks GPUs of h
        ),
        nodes=(node("n0"),),
        config=CycleConfig(guarantee_rounding="up"),
    )
    cycles = Cycles()
    assert not cycles.cycle(snapshot).run().admissions
    small = job("a/C", "a", 1, priority=0, submitted=999.0)
    arrived = replace(snapshot, jobs=(*snapshot.jobs, small))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 0
    assert result == Cycle(arrived).run()


def _fragmented(tenants: tuple[Tenant, ...], queued: Job, searches: int = 32) -> Snapshot:
    """Two nodes half held by tenant b's jobs inside its guarantee, and a two-GPU borrower of
    b's: evicting it frees too little for an 8-GPU job anywhere."""
    nodes = tuple(node(f"n{i}") for i in range(2))
    running = [
        job("b/np0", "b", 4, running_on=[("n0", (0, 1, 2, 3))], preemptible=False),
        job("b/np1", "b", 4, running_on=[("n1", (0, 1, 2, 3))], preemptible=False),
        job("b/p0", "b", 2, running_on=[("n1", (4, 5))]),
    ]
    return Snapshot(
        now=100.0,
        tenants=tenants,
        jobs=(*running, queued),
        nodes=nodes,
        config=CycleConfig(lending_hold_seconds=0.0, max_preemption_searches=searches),
    )


def _one_arrives_on_top(snapshot: Snapshot) -> CycleResult:
    """Tenant a's 8-GPU job arrives after a cycle that changed nothing, and is decided on top
    of it exactly as a cycle from scratch decides it."""
    cycles = Cycles()
    assert not cycles.cycle(snapshot).run().admissions
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("a/one", "a", 8, submitted=60.0)))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 1
    assert result == Cycle(arrived).run()
    return result


def test_an_arriving_job_that_claims_its_guarantee_searches_as_from_scratch() -> None:
    """The tenant's claims were worked out before it came (its 16-GPU gang claims none of
    the guarantee); it claims the guarantee, so it may reclaim, and the search it makes counts."""
    gang = job("a/gang", "a", 8, 2, submitted=50.0)
    result = _one_arrives_on_top(_fragmented((Tenant("a", 8), Tenant("b", 8)), gang))
    assert result.preemption_searches == 1


def test_a_failed_search_of_an_arriving_job_counts_within_a_spent_budget() -> None:
    """The last cycle spent its one search (tenant b's own victim frees too little); the
    arriving job's reclaim fails too, and a cycle from scratch still counts one search."""
    big = job("b/big", "b", 8, priority=1, submitted=50.0)
    snapshot = _fragmented((Tenant("a", 8), Tenant("b", 8)), big, searches=1)
    assert Cycle(snapshot).run().preemption_searches == 1
    assert _one_arrives_on_top(snapshot).preemption_searches == 1


def test_an_arriving_job_that_claims_its_parents_guarantee_searches_as_from_scratch() -> None:
    """As above, one level up: the guarantee is the parent's, claimed below it in queue order."""
    gang = job("a/gang", "a", 8, 2, submitted=50.0)
    tenants = (Tenant("org", 8), Tenant("a", 0, parent="org"), Tenant("b", 8))
    assert _one_arrives_on_top(_fragmented(tenants, gang)).preemption_searches == 1


def test_an_arriving_job_over_its_submitters_cap_adds_nothing_to_its_tenants_demand() -> None:
    nodes = (node("n0"),)
    snapshot = Snapshot(
        now=100.0,
        tenants=(Tenant("a", 8, user_max_jobs=1),),
        jobs=(
            job("a/r0", "a", 4, running_on=[("n0", (0, 1, 2, 3))], submitter="u"),
            job("a/q0", "a", 2, submitted=50.0, submitter="u"),
        ),
        nodes=nodes,
    )
    cycles = Cycles()
    assert not cycles.cycle(snapshot).run().admissions
    late = job("a/late", "a", 2, submitted=60.0, submitter="u")
    arrived = replace(snapshot, jobs=(*snapshot.jobs, late))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 1
    assert result == Cycle(arrived).run()
    assert [t.demand for t in result.tenants] == [4]


def test_an_arriving_job_whose_reclaim_would_evict_gets_a_whole_cycle_past_a_spent_budget() -> None:
    """The last cycle spent its one search on a borrower's gang; the arriving job claims its
    guarantee, so a cycle from scratch decides it first and gives it the search, and its
    reclaim succeeds."""
    nodes = tuple(node(f"n{i}") for i in range(2))
    running = [
        job("b/p0", "b", 8, running_on=[("n0", ())]),
        job("c/r0", "c", 8, running_on=[("n1", ())]),
    ]
    gang = job("c/gang", "c", 8, 2, priority=1, submitted=50.0)
    snapshot = Snapshot(
        now=100.0,
        tenants=(Tenant("a", 8), Tenant("b", 0), Tenant("c", 8)),
        jobs=(*running, gang),
        nodes=nodes,
        config=CycleConfig(lending_hold_seconds=0.0, max_preemption_searches=1),
    )
    cycles = Cycles()
    first = cycles.cycle(snapshot).run()
    assert not first.admissions
    assert first.preemption_searches == 1
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("a/one", "a", 8, submitted=60.0)))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 0
    assert [a.job for a in result.admissions] == ["a/one"]
    assert result == Cycle(arrived).run()


def _costly_borrower(tenants: tuple[Tenant, ...], queued: Job) -> Snapshot:
    """Tenant b's borrower has run 10,000 s on n0 and ends in ten minutes; d holds n1 inside
    its guarantee. One search a cycle, reclaims weighed for an hour after submission."""
    nodes = tuple(node(f"n{i}") for i in range(2))
    running = [
        job("b/p0", "b", 8, running_on=[("n0", ())], started=0.0, expected_end=10_600.0),
        job("d/np", "d", 8, running_on=[("n1", ())], started=0.0, preemptible=False),
    ]
    return Snapshot(
        now=10_000.0,
        tenants=(*tenants, Tenant("b", 0), Tenant("d", 8)),
        jobs=(*running, queued),
        nodes=nodes,
        config=CycleConfig(
            lending_hold_seconds=0.0, max_preemption_searches=1, reclaim_patience_seconds=3600
        ),
    )


def test_no_arrival_is_decided_on_top_of_a_cycle_that_turned_a_reclaim_down() -> None:
    """Tenant a's job turned down reclaiming b's long-running borrower (its GPUs free in ten
    minutes) and spent the one search; the arriving gang of c ranks ahead of it, so a cycle
    from scratch gives the search to the gang, and a's job waits without saying it turned
    anything down."""
    snapshot = _costly_borrower(
        (Tenant("a", 8), Tenant("c", 16)), job("a/x", "a", 8, submitted=9_940.0)
    )
    cycles = Cycles()
    first = cycles.cycle(snapshot).run()
    assert not first.admissions
    assert first.preemption_searches == 1
    assert first.wake_at is not None  # turned down: a's job decides again when patience ends
    gang = job("c/gang", "c", 8, 2, priority=5, submitted=0.0)
    arrived = replace(snapshot, jobs=(*snapshot.jobs, gang))
    truth = Cycle(arrived).run()
    assert truth.wake_at is None
    assert cycles.cycle(arrived).run() == truth
    assert cycles.extended == 0


def test_an_arrival_that_would_turn_a_reclaim_down_past_a_spent_budget_gets_a_whole_cycle() -> None:
    """Tenant a's gang spent the one search and found nothing; c's arriving job comes after
    it, so a cycle from scratch gives it no search, and it does not say it turned a reclaim
    down (on top of the cycle it would have searched, and turned b's borrower down)."""
    snapshot = _costly_borrower((Tenant("a", 16), Tenant("c", 8)), job("a/gang", "a", 8, 2))
    cycles = Cycles()
    first = cycles.cycle(snapshot).run()
    assert first.preemption_searches == 1
    assert first.wake_at is None
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("c/one", "c", 8, submitted=9_990.0)))
    truth = Cycle(arrived).run()
    assert cycles.cycle(arrived).run() == truth
    assert cycles.extended == 0


def test_a_whole_cycle_hands_out_the_last_ones_waiting_entries_where_it_says_the_same() -> None:
    """Readers keep things per waiting entry (the operator's plan skips a job whose entry is the
    one it saw): a whole cycle that says the same of a job gives the same object, and a new
    one where it says something else."""
    snapshot = _waiting_queue()
    cycles = Cycles()
    first = cycles.cycle(snapshot).run()
    later = replace(snapshot, now=snapshot.now + 60.0)
    again = cycles.cycle(later).run()
    assert cycles.extended == 0
    assert again.waiting
    assert all(a is b for a, b in zip(first.waiting, again.waiting, strict=True))
    # The head of the queue gone: every job behind it moves up one place.
    fewer = replace(
        later, now=later.now + 60.0, jobs=tuple(j for j in snapshot.jobs if j.key != "a/q0")
    )
    moved = {w.job: w for w in cycles.cycle(fewer).run().waiting}
    before = {w.job: w for w in again.waiting}
    assert any(moved[k] is not before[k] and moved[k] != before[k] for k in moved)
    assert all(moved[k] is before[k] for k in moved if moved[k] == before[k])
