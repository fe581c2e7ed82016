"""Reservations, backfill and expected starts in the admission cycle (docs/quotas.md,
"Reservations and backfill")."""

from __future__ import annotations

from dataclasses import replace

from gpusched.core.admission import (
    Assignment,
    Cycle,
    CycleConfig,
    CycleResult,
    Job,
    PreemptReason,
    Snapshot,
    Tenant,
    WaitReason,
    run_cycle,
)
from tests.unit.core.admission_testdata import job, node

ALL = tuple(range(8))


def running(
    key: str,
    tenant: str,
    node_name: str,
    gpus: tuple[int, ...],
    end: float,
    **kwargs: object,
) -> Job:
    return job(key, tenant, len(gpus), running_on=[(node_name, gpus)], expected_end=end, **kwargs)


def queued(key: str, tenant: str, gpus: int, runtime: float | None, **kwargs: object) -> Job:
    return job(key, tenant, gpus, expected_runtime=runtime, **kwargs)


#: The setting reservations are built for (off by default).
ON = CycleConfig(reservations_per_tenant=1)


def snapshot(*jobs: Job, now: float = 0.0, tenants: tuple[Tenant, ...] | None = None) -> Snapshot:
    return Snapshot(
        now=now,
        tenants=tenants or (Tenant("t", guaranteed=32),),
        jobs=jobs,
        nodes=(node("a"), node("b")),
        config=ON,
    )


def test_a_blocked_gang_gets_the_gpus_that_come_free_soonest() -> None:
    result = run_cycle(
        snapshot(
            running("t/r1", "t", "a", (0, 1, 2, 3), end=1000.0),
            running("t/r2", "t", "b", (0, 1, 2, 3), end=200.0),
            queued("t/gang", "t", 8, 100.0, submitted=1.0),
        )
    )
    assert not result.admissions
    (reservation,) = result.reservations
    assert reservation.job == "t/gang"
    assert reservation.start == 200.0
    assert reservation.end == 300.0
    assert [(p.node, p.gpus) for p in reservation.placement] == [("b", ALL)]
    assert reservation.idle_gpus == 4
    waiting = result.waiting_of("t/gang")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY
    assert "GPUs reserved on b, expected to start in 3m" in waiting.message
    assert waiting.expected_start == 200.0


def _behind_a_reservation(*later: Job) -> Snapshot:
    # Node a is full until 1000; b frees GPUs 0-3 at 200: the gang reserves b.
    return snapshot(
        running("t/r1", "t", "a", ALL, end=1000.0),
        running("t/r2", "t", "b", (0, 1, 2, 3), end=200.0),
        queued("t/gang", "t", 8, 100.0, submitted=1.0),
        *later,
    )


def test_a_later_job_takes_reserved_gpus_only_if_it_ends_before_the_reservation() -> None:
    result = run_cycle(
        _behind_a_reservation(
            queued("t/short", "t", 1, 150.0, submitted=2.0),
            queued("t/long", "t", 1, 500.0, submitted=3.0),
            queued("t/unknown", "t", 1, None, submitted=4.0),
            queued("t/just-past", "t", 1, 201.0, submitted=5.0),
        )
    )
    (admission,) = result.admissions
    assert admission.job == "t/short"
    assert admission.backfill_until == 200.0
    assert admission.placement[0].node == "b"
    for key in ("t/long", "t/unknown", "t/just-past"):
        waiting = result.waiting_of(key)
        assert waiting is not None
        assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY


def test_a_non_preemptible_job_backfills_only_with_a_declared_limit_that_ends_in_time() -> None:
    result = run_cycle(
        _behind_a_reservation(
            queued("t/np", "t", 1, 50.0, submitted=2.0, preemptible=False),
            queued(
                "t/np-limited",
                "t",
                1,
                50.0,
                submitted=3.0,
                preemptible=False,
                max_runtime_seconds=180.0,
            ),
            queued("t/protected", "t", 1, 50.0, submitted=4.0, min_runtime_seconds=300.0),
        )
    )
    assert [a.job for a in result.admissions] == ["t/np-limited"]


def _overrun(
    short_tenant: str = "t", priority: int = 0, tenants: tuple[Tenant, ...] | None = None
) -> CycleResult:
    """At 250 r1 still runs on a; a job of ``short_tenant`` at ``priority``, backfilled on b
    until the reservation of t's gang (priority 0) starts at 200, still holds b's GPU 4."""
    overrun = job(
        "s/short",
        short_tenant,
        1,
        priority=priority,
        running_on=[("b", (4,))],
        started=10.0,
        expected_end=400.0,
        backfill_until=200.0,
    )
    gang = queued(
        "t/gang",
        "t",
        8,
        100.0,
        submitted=1.0,
        reservation=(Assignment("b", ALL),),
        reservation_start=200.0,
    )
    return run_cycle(
        snapshot(
            running("t/r1", "t", "a", ALL, end=1000.0), overrun, gang, now=250.0, tenants=tenants
        )
    )


def test_a_backfilled_job_that_runs_past_the_reservation_is_evicted_for_it() -> None:
    (admission,) = _overrun().admissions
    assert admission.job == "t/gang"
    assert [(v.victim, v.reason) for v in admission.victims] == [
        ("s/short", PreemptReason.BACKFILL_OVERRUN)
    ]


def _overrun_case(short_tenant: str, priority: int, tenants: tuple[Tenant, ...]) -> list[str]:
    """The jobs the gang evicts in :func:`_overrun`."""
    result = _overrun(short_tenant, priority, tenants)
    return [v.victim for a in result.admissions for v in a.victims]


def test_an_overrun_is_evicted_only_as_any_eviction_may_be_so_no_two_jobs_evict_each_other() -> (
    None
):
    """quotas.md, "Why preemption never loops": of its own tenant, a reservation evicts an
    overrun of no higher priority (that job could evict it back); of another tenant, only one
    that runs on borrowed capacity (a tenant within its guarantee would reclaim it)."""
    one = (Tenant("t", guaranteed=32),)
    assert _overrun_case("t", 0, one) == ["s/short"]
    assert _overrun_case("t", 5, one) == []
    within = (Tenant("t", guaranteed=16), Tenant("s", guaranteed=8))
    assert _overrun_case("s", 0, within) == []
    borrowing = (Tenant("t", guaranteed=16), Tenant("s", guaranteed=0))
    assert _overrun_case("s", 0, borrowing) == ["s/short"]


def test_a_backfilled_job_within_its_deadline_is_not_evicted() -> None:
    short = job(
        "t/short",
        "t",
        1,
        running_on=[("b", (4,))],
        started=10.0,
        expected_end=180.0,
        backfill_until=200.0,
    )
    gang = queued(
        "t/gang",
        "t",
        8,
        100.0,
        submitted=1.0,
        reservation=(Assignment("b", ALL),),
        reservation_start=200.0,
    )
    result = run_cycle(snapshot(running("t/r1", "t", "a", ALL, end=1000.0), short, gang, now=150.0))
    assert not result.admissions
    (reservation,) = result.reservations
    assert reservation.start == 180.0
    assert reservation.kept


def _carried(hint: bool) -> Snapshot:
    # Tenant x's job is first in the order (earlier submission, both inside their guarantee);
    # node b has 7 GPUs free and frees the eighth at 100; node a is full. Tenant z's jobs
    # cannot be preempted.
    gang = queued(
        "y/gang",
        "y",
        8,
        100.0,
        submitted=5.0,
        reservation=(Assignment("b", ALL),) if hint else (),
        reservation_start=100.0 if hint else None,
    )
    return Snapshot(
        now=0.0,
        tenants=(Tenant("x", guaranteed=8), Tenant("y", guaranteed=8), Tenant("z")),
        jobs=(
            running("z/r1", "z", "a", ALL, end=1000.0, preemptible=False),
            running("z/r2", "z", "b", (7,), end=100.0, preemptible=False),
            queued("x/first", "x", 1, 5000.0, submitted=1.0),
            gang,
        ),
        nodes=(node("a"), node("b")),
        config=ON,
    )


def test_gpus_reserved_last_cycle_stay_free_for_the_job_against_jobs_decided_before_it() -> None:
    without = run_cycle(_carried(hint=False))
    assert [a.job for a in without.admissions] == ["x/first"]
    held = run_cycle(_carried(hint=True))
    assert not held.admissions
    gang = {r.job: r for r in held.reservations}["y/gang"]
    assert (gang.start, gang.kept, gang.idle_gpus) == (100.0, True, 7)


def test_a_job_decided_later_does_not_preempt_its_way_onto_reserved_gpus() -> None:
    # Node a frees at 500 (t2/low); b is held for good. t0 is furthest below its share, so its
    # gang is decided first and reserves a; t2/high outranks t2/low inside t2 but comes later.
    # (No lending hold: t0 asked for GPUs a moment ago, and t2/high, which would borrow, would
    # wait for it before any victim search.)
    result = run_cycle(
        Snapshot(
            now=0.0,
            tenants=(Tenant("t0", guaranteed=8), Tenant("t2", guaranteed=16)),
            jobs=(
                running("t2/low", "t2", "a", ALL, end=500.0),
                job("t2/other", "t2", 8, running_on=[("b", ALL)], preemptible=False),
                queued("t0/gang", "t0", 8, 100.0, submitted=1.0),
                queued("t2/high", "t2", 8, None, submitted=2.0, priority=1),
            ),
            nodes=(node("a"), node("b")),
            config=CycleConfig(reservations_per_tenant=1, lending_hold_seconds=0),
        )
    )
    assert not result.admissions
    waiting = result.waiting_of("t2/high")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY
    starts = {r.job: r.start for r in result.reservations}
    assert starts["t0/gang"] == 500.0


def test_gpus_a_dropped_reservation_held_stay_reserved_for_the_next_one_claiming_them() -> None:
    # u/c carried a hint on all of node a but is now past its guarantee, so its reservation is
    # dropped when its turn comes; v/gang (decided first) reserved a from when u/c's would have
    # ended. Its free GPUs must not fall to u/small, decided after u/c and with no known end.
    result = run_cycle(
        Snapshot(
            now=0.0,
            tenants=(
                Tenant("u", guaranteed=4),
                Tenant("v", guaranteed=8),
                Tenant("w", guaranteed=4),
            ),
            jobs=(
                running("u/r", "u", "a", (0, 1), end=100.0, preemptible=False),
                job("w/b", "w", 8, running_on=[("b", ALL)], preemptible=False),
                queued(
                    "u/c",
                    "u",
                    8,
                    50.0,
                    preemptible=False,
                    reservation=(Assignment("a", ALL),),
                    reservation_start=100.0,
                ),
                queued("v/gang", "v", 8, 100.0, submitted=1.0),
                queued("u/small", "u", 1, None, submitted=3.0),
            ),
            nodes=(node("a"), node("b")),
            config=ON,
        )
    )
    assert not result.admissions
    assert "v/gang" in {r.job for r in result.reservations}


def test_one_reservation_per_tenant_goes_to_its_first_blocked_job() -> None:
    result = run_cycle(
        snapshot(
            running("t/r1", "t", "a", (0, 1, 2, 3), end=1000.0),
            running("t/r2", "t", "b", (0, 1, 2, 3), end=200.0),
            queued("t/first", "t", 8, 100.0, submitted=1.0),
            queued("t/second", "t", 8, 100.0, submitted=2.0),
        )
    )
    assert [r.job for r in result.reservations] == ["t/first"]


def test_a_tenant_past_its_entitlement_gets_no_reservation() -> None:
    # 16 GPUs, guarantees 8 + 8. Tenant a holds 12 and wants 8 more (entitled to 8); tenant b
    # holds 2 and wants 6 more (2 + 6 = 8, its entitlement). a/big fits soonest on node b at
    # 300, when a/r1 still runs: a would hold 16 then. (No lending hold: b asked for GPUs a
    # moment ago, and a/big, which borrows, would wait for it instead of reserving.)
    tenants = (Tenant("a", guaranteed=8), Tenant("b", guaranteed=8))
    result = run_cycle(
        Snapshot(
            now=0.0,
            tenants=tenants,
            jobs=(
                running("a/r1", "a", "a", ALL, end=500.0, preemptible=False),
                running("a/r2", "a", "b", (0, 1, 2, 3), end=300.0, preemptible=False),
                running("b/r1", "b", "b", (4, 5), end=100.0),
                queued("a/big", "a", 8, 100.0, submitted=1.0),
                queued("b/big", "b", 6, 100.0, submitted=2.0),
            ),
            nodes=(node("a"), node("b")),
            config=CycleConfig(reservations_per_tenant=1, lending_hold_seconds=0),
        )
    )
    assert [r.job for r in result.reservations] == ["b/big"]
    waiting = result.waiting_of("a/big")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY
    beyond = run_cycle(
        replace(
            Snapshot(
                now=0.0,
                tenants=tenants,
                jobs=(
                    running("a/r1", "a", "a", ALL, end=500.0),
                    running("a/r2", "a", "b", (0, 1, 2, 3), end=300.0),
                    running("b/r1", "b", "b", (4, 5), end=100.0),
                    queued("a/big", "a", 8, 100.0, submitted=1.0),
                ),
                nodes=(node("a"), node("b")),
                config=ON,
            ),
            # b asked for GPUs a moment ago (now = 0): with the lending hold its idle GPUs
            # would be kept from a/big, which borrows; this test is about the entitlement.
            config=CycleConfig(
                reservations_per_tenant=1, reserve_beyond_entitlement=True, lending_hold_seconds=0
            ),
        )
    )
    assert [r.job for r in beyond.reservations] == ["a/big"]


def test_a_tenant_whose_own_jobs_fill_its_share_reserves_what_they_free_for_its_gang() -> None:
    # One tenant entitled to all 16 GPUs, all held by its own one-GPU jobs: at the gang's start
    # the jobs on the reserved node have ended, so the tenant stays within its entitlement.
    small = [
        running(f"t/s{n}{g}", "t", n, (g,), end=300.0 if n == "b" else 900.0)
        for n in ("a", "b")
        for g in ALL
    ]
    result = run_cycle(
        snapshot(*small, queued("t/gang", "t", 8, 100.0), tenants=(Tenant("t", guaranteed=16),))
    )
    (reservation,) = result.reservations
    assert (reservation.job, reservation.start) == ("t/gang", 300.0)
    assert [p.node for p in reservation.placement] == ["b"]


def test_no_reservation_when_the_running_jobs_ends_are_unknown() -> None:
    result = run_cycle(
        snapshot(
            job("t/r1", "t", 4, running_on=[("a", (0, 1, 2, 3))]),
            job("t/r2", "t", 4, running_on=[("b", (0, 1, 2, 3))]),
            queued("t/gang", "t", 8, 100.0, submitted=1.0),
        )
    )
    assert not result.reservations


def test_reservations_switched_off_change_nothing() -> None:
    base = _behind_a_reservation(queued("t/short", "t", 1, 150.0, submitted=2.0))
    off = run_cycle(replace(base, config=CycleConfig(reservations_per_tenant=0)))
    assert not off.reservations
    # Without the reservation the short job takes a free GPU of b like any other.
    assert [a.job for a in off.admissions] == ["t/short"]
    assert off.admissions[0].backfill_until is None


def test_expected_starts_follow_predicted_ends_in_queue_order() -> None:
    # One node, full until 100. Queue: A (8 GPUs, 50 s), B (8 GPUs, 10 s), C (4 GPUs, 30 s).
    cycle = Cycle(
        Snapshot(
            now=0.0,
            tenants=(Tenant("t", guaranteed=8),),
            jobs=(
                running("t/r", "t", "a", ALL, end=100.0),
                queued("t/A", "t", 8, 50.0, submitted=1.0),
                queued("t/B", "t", 8, 10.0, submitted=2.0),
                queued("t/C", "t", 4, 30.0, submitted=3.0),
            ),
            nodes=(node("a"),),
            config=ON,
        )
    )
    cycle.run()
    assert cycle.forecast() == {"t/A": 100.0, "t/B": 150.0, "t/C": 160.0}
    waiting = {w.job: w.expected_start for w in cycle.result().waiting}
    assert waiting == {"t/A": 100.0, "t/B": 150.0, "t/C": 160.0}


def test_expected_start_waits_for_the_tenants_borrowing_limit() -> None:
    # Two nodes; the tenant may hold 8 GPUs and holds 8 (on a) until 300; b is free.
    cycle = Cycle(
        Snapshot(
            now=0.0,
            tenants=(Tenant("t", guaranteed=8, borrowing_limit=8),),
            jobs=(
                running("t/r", "t", "a", ALL, end=300.0),
                queued("t/q", "t", 4, 60.0, submitted=1.0),
            ),
            nodes=(node("a"), node("b")),
            config=ON,
        )
    )
    result = cycle.run()
    assert result.waiting_of("t/q") is not None
    assert cycle.forecast() == {"t/q": 300.0}


def test_a_job_no_node_can_hold_has_no_expected_start() -> None:
    cycle = Cycle(snapshot(queued("t/huge", "t", 8, 60.0, replicas=3, submitted=1.0)))
    result = cycle.run()
    waiting = result.waiting_of("t/huge")
    assert waiting is not None
    assert waiting.reason is WaitReason.NO_FEASIBLE_NODES
    assert cycle.forecast() == {"t/huge": None}


def test_an_overrun_and_a_reclaim_together_leave_their_tenant_its_guarantee() -> None:
    """quotas.md, "Why preemption never loops": a lender loses only GPUs its guarantee does not
    cover. Tenant b holds 16 GPUs against a guarantee of 12 (8 on node b, two jobs of 4 on
    node a, one of them backfilled onto a's reservation and overrunning it). Each 4-GPU job
    alone is borrowed capacity, but evicting both leaves b 8 GPUs: a's gang must wait for
    them to end, not take node a."""
    jobs = (
        running("b/whole", "b", "b", ALL, end=5000.0, submitted=0.0),
        running("b/half", "b", "a", (4, 5, 6, 7), end=5000.0, submitted=1.0),
        running("b/over", "b", "a", (0, 1, 2, 3), end=5000.0, submitted=2.0, backfill_until=900.0),
        queued(
            "a/gang",
            "a",
            8,
            100.0,
            submitted=3.0,
            reservation=(Assignment("a", ALL),),
            reservation_start=900.0,
        ),
    )
    tenants = (Tenant("a", guaranteed=8), Tenant("b", guaranteed=12))
    result = run_cycle(snapshot(*jobs, now=1000.0, tenants=tenants))
    assert not result.admissions
    (reservation,) = result.reservations
    assert reservation.start == 5000.0


def test_an_overrun_of_a_team_whose_organisation_is_at_its_guarantee_is_not_evicted() -> None:
    """quotas.md, "The tenant tree": an organisation at its guarantee loses nothing to another
    organisation, even when one of its teams borrows from a sibling. Team b of o holds both
    nodes (8 of them borrowed from its idle sibling a, o at its guarantee of 16); its job on
    p's reservation overran it. p's gang waits for it to end."""
    tenants = (
        Tenant("o", guaranteed=16),
        Tenant("a", guaranteed=8, parent="o"),
        Tenant("b", guaranteed=8, parent="o"),
        Tenant("p", guaranteed=8),
    )
    jobs = (
        running("b/first", "b", "a", ALL, end=9000.0, submitted=0.0),
        running("b/over", "b", "b", ALL, end=9000.0, submitted=1.0, backfill_until=900.0),
        queued(
            "p/gang",
            "p",
            8,
            100.0,
            submitted=5.0,
            reservation=(Assignment("b", ALL),),
            reservation_start=900.0,
        ),
    )
    result = run_cycle(snapshot(*jobs, now=1000.0, tenants=tenants))
    assert not result.admissions
    (reservation,) = result.reservations
    assert reservation.start == 9000.0


def test_a_job_is_evicted_as_an_overrun_only_for_the_reservation_it_was_backfilled_onto() -> None:
    """model.Job.backfill_until: past it the job may be evicted *for that reservation*. A job
    of tenant t backfilled until 200 onto GPUs of b that t/gang reserves is evicted for the
    gang at 250; the same job is no overrun for t/other, a gang of the same priority that
    reserved node a (its reservation was never delayed by it), and jobs of one tenant and one
    priority never evict each other."""
    overrun = job(
        "t/short",
        "t",
        1,
        running_on=[("b", (4,))],
        started=10.0,
        expected_end=400.0,
        backfill_until=200.0,
    )

    def gang(key: str, on: str, submitted: float) -> Job:
        return queued(
            key,
            "t",
            8,
            100.0,
            submitted=submitted,
            reservation=(Assignment(on, ALL),),
            reservation_start=200.0,
        )

    blocker = running("t/r1", "t", "a", ALL, end=1000.0)
    own = run_cycle(snapshot(blocker, overrun, gang("t/gang", "b", 1.0), now=250.0))
    assert [(a.job, [v.victim for v in a.victims]) for a in own.admissions] == [
        ("t/gang", ["t/short"])
    ]
    # t/other reserved node a (free at 1000); node b's GPU 4 is no GPU it reserved.
    other = run_cycle(snapshot(blocker, overrun, gang("t/other", "a", 1.0), now=250.0))
    assert not other.admissions


def test_a_reservation_behind_a_job_that_keeps_overrunning_moves_where_gpus_free_sooner() -> None:
    """quotas.md: a reservation keeps its GPUs while they are expected free about as early as
    before, so it does not hop between nodes; compared with the last cycle's start alone, one
    behind a job that runs on past its prediction would slip a few seconds each cycle for
    ever. At 1460 node a's job, 200 s past its prediction, is expected to end at 1820 (the
    gang's reservation said 1800 last cycle): node b frees at 1500, more than the 5 minutes'
    slack sooner, and the reservation moves there."""
    gang = queued(
        "t/gang",
        "t",
        8,
        1000.0,
        submitted=1.0,
        reservation=(Assignment("a", ALL),),
        reservation_start=1800.0,
    )
    result = run_cycle(
        snapshot(
            running("t/a1", "t", "a", ALL, end=1820.0, started=1100.0),
            running("t/b1", "t", "b", ALL, end=1500.0),
            gang,
            now=1460.0,
        )
    )
    (reservation,) = result.reservations
    assert [p.node for p in reservation.placement] == ["b"]
    assert reservation.start == 1500.0
    # Within the slack it stays: a's job expected to end at 1790 keeps the gang on a.
    result = run_cycle(
        snapshot(
            running("t/a1", "t", "a", ALL, end=1790.0, started=1100.0),
            running("t/b1", "t", "b", ALL, end=1500.0),
            gang,
            now=1460.0,
        )
    )
    (reservation,) = result.reservations
    assert [p.node for p in reservation.placement] == ["a"]
