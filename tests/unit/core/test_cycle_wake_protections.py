"""The cycle's wake (``CycleResult.wake_at``) at the moment time alone lifts what blocks a
waiting job: a victim's protection ending (after an earlier preemption, or on borrowed GPUs
against a reclaim), a backfilled job passing the start it was expected to end by, a spent
budget's period ending. Each moment is checked against a cycle run then, which decides."""

from __future__ import annotations

from gpusched.core.admission import (
    Assignment,
    CycleConfig,
    CycleResult,
    Job,
    PreemptReason,
    Snapshot,
    Tenant,
    run_cycle,
)
from tests.unit.core.admission_testdata import job, node

NOW = 10_000.0
ALL = tuple(range(8))


def cycle_at(
    now: float, tenants: list[Tenant], jobs: list[Job], config: CycleConfig | None = None
) -> CycleResult:
    snapshot = Snapshot(
        now=now,
        tenants=tuple(tenants),
        jobs=tuple(jobs),
        nodes=(node("n0"),),
        config=config or CycleConfig(),
    )
    return run_cycle(snapshot)


def _admitted(result: CycleResult) -> list[str]:
    return [a.job for a in result.admissions]


def test_a_restarted_victims_longer_protection_wakes_the_cycle_when_it_ends() -> None:
    # Preempted once, restarted 60 s ago: no priority victim for 1800 s from its start.
    tenants = [Tenant("a", guaranteed=8)]
    restarted = job("a/low", "a", 8, running_on=[("n0", ALL)], started=NOW - 60, preemptions=1)
    high = job("a/high", "a", 8, priority=10, submitted=1)
    ends = NOW - 60 + 1800
    now = cycle_at(NOW, tenants, [restarted, high])
    assert _admitted(now) == []
    assert now.wake_at == ends
    assert _admitted(cycle_at(ends - 1, tenants, [restarted, high])) == []
    assert _admitted(cycle_at(ends, tenants, [restarted, high])) == ["a/high"]


def test_a_borrowed_jobs_protection_against_reclaim_wakes_the_cycle_when_it_ends() -> None:
    # Its minimum runtime is a week, but a tenant taking its guarantee back waits 300 s.
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower")]
    borrowed = job(
        "borrower/long",
        "borrower",
        8,
        running_on=[("n0", ALL)],
        started=NOW - 100,
        min_runtime_seconds=7 * 86400,
        reclaim_min_runtime_seconds=300,
    )
    owner = job("owner/train", "owner", 8, submitted=1)
    ends = NOW - 100 + 300
    now = cycle_at(NOW, tenants, [borrowed, owner])
    assert _admitted(now) == []
    assert now.wake_at == ends
    assert _admitted(cycle_at(ends - 1, tenants, [borrowed, owner])) == []
    later = cycle_at(ends, tenants, [borrowed, owner])
    assert _admitted(later) == ["owner/train"]
    assert [v.reason for v in later.preemptions] == [PreemptReason.RECLAIM_GUARANTEE]


def test_a_protected_job_no_waiting_job_may_evict_sets_no_wake() -> None:
    # The waiting job has no higher priority than the protected one: its protection ending
    # unblocks nothing.
    tenants = [Tenant("a", guaranteed=8)]
    restarted = job("a/low", "a", 8, running_on=[("n0", ALL)], started=NOW - 60, preemptions=1)
    same = job("a/same", "a", 8, submitted=1)
    assert cycle_at(NOW, tenants, [restarted, same]).wake_at is None


def test_a_backfill_deadline_a_reserved_job_waits_for_wakes_the_cycle() -> None:
    # Backfilled onto the gang's reserved node until 200; past it, it is evicted for the gang.
    config = CycleConfig(reservations_per_tenant=1)
    tenants = [Tenant("t", guaranteed=32)]
    short = job(
        "t/short",
        "t",
        1,
        running_on=[("n0", (4,))],
        started=10.0,
        expected_end=400.0,
        backfill_until=200.0,
    )
    gang = job(
        "t/gang",
        "t",
        8,
        expected_runtime=100.0,
        submitted=1.0,
        reservation=(Assignment("n0", ALL),),
        reservation_start=200.0,
    )
    now = cycle_at(150.0, tenants, [short, gang], config)
    assert _admitted(now) == []
    assert now.wake_at == 200.0
    assert _admitted(cycle_at(200.0, tenants, [short, gang], config)) == ["t/gang"]


def test_a_spent_budget_wakes_the_cycle_when_its_next_period_begins() -> None:
    tenants = [Tenant("a", guaranteed=8, budget_exhausted_until=NOW + 500)]
    waiting = job("a/j", "a", 1)
    now = cycle_at(NOW, tenants, [waiting])
    assert _admitted(now) == []
    assert now.wake_at == NOW + 500
    assert _admitted(cycle_at(NOW + 500, tenants, [waiting])) == ["a/j"]
