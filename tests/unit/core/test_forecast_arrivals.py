"""Expected starts with jobs expected to arrive (docs/quotas.md "Expected start"): each tenant's
submissions of the last window are expected again over the next one, spread evenly, and the
forecast ranks them as the cycle would rank them."""

from __future__ import annotations

from dataclasses import replace

from gpusched.core.admission import Cycle, Job, JobState, Snapshot, Tenant
from gpusched.core.admission.arrivals import ARRIVAL_NAMESPACE, expected_arrivals, is_arrival
from tests.unit.core.admission_testdata import job, node

MINUTE = 60.0
HOUR = 3600.0


def test_each_tenants_submissions_at_each_priority_are_spread_evenly_over_the_window_ahead() -> (
    None
):
    submitted = [
        job("t/a", "t", 1, submitted=-50 * MINUTE),
        job("t/b", "t", 4, submitted=-20 * MINUTE, running_on=[("n", (0, 1, 2, 3))]),
        job("t/hi", "t", 2, priority=1, submitted=-40 * MINUTE),
        job("u/c", "u", 8, submitted=-10 * MINUTE),
        job("t/old", "t", 1, submitted=-61 * MINUTE),  # before the window
        job("t/later", "t", 1, submitted=1.0),  # after now
    ]
    arrivals = expected_arrivals(submitted, 0.0, HOUR)
    got = {(j.tenant, j.priority, j.total_gpus, j.submitted_at) for j in arrivals}
    assert got == {
        # t at priority 0 submitted two jobs within the hour: one each half hour ahead, in the
        # order they came (1 GPU, then 4).
        ("t", 0, 1, 15 * MINUTE),
        ("t", 0, 4, 45 * MINUTE),
        ("t", 1, 2, 30 * MINUTE),
        ("u", 0, 8, 30 * MINUTE),
    }
    assert [j.submitted_at for j in arrivals] == sorted(j.submitted_at for j in arrivals)
    for arrival in arrivals:
        assert is_arrival(arrival.key)
        assert arrival.key.startswith(ARRIVAL_NAMESPACE + "/")
        assert arrival.state is JobState.QUEUED
        assert arrival.placement == ()
        assert arrival.started_at is None
    assert len({j.key for j in arrivals}) == len(arrivals)
    assert not any(is_arrival(j.key) for j in submitted)


def test_no_window_means_nothing_arrives_and_most_keeps_the_soonest() -> None:
    submitted = [job(f"t/j{i}", "t", 1, submitted=-i * MINUTE) for i in range(10)]
    assert expected_arrivals(submitted, 0.0, 0.0) == ()
    soonest = expected_arrivals(submitted, 0.0, HOUR, most=3)
    assert [j.submitted_at for j in soonest] == [3 * MINUTE, 9 * MINUTE, 15 * MINUTE]


WINDOW = 2 * HOUR


def _expected_start_of_waiting(*submitted: Job, window: float = WINDOW) -> float | None:
    """Node a is busy until 60 min; W (tenant t, priority 0, 8 GPUs, 60 min) waits. The jobs
    ``submitted`` in the two hours before now are expected again over the two hours ahead
    (one job: at 60 min, just as the node frees)."""
    jobs = (
        job("t/r", "t", 8, running_on=[("a", (0, 1, 2, 3, 4, 5, 6, 7))], expected_end=HOUR),
        job("t/W", "t", 8, expected_runtime=HOUR, submitted=-2 * MINUTE),
    )
    snapshot = Snapshot(
        now=0.0,
        tenants=(Tenant("t", guaranteed=8), Tenant("u", guaranteed=8)),
        jobs=jobs,
        nodes=(node("a"),),
        arrivals=expected_arrivals(submitted, 0.0, window),
    )
    cycle = Cycle(snapshot)
    cycle.run()
    starts = cycle.forecast()
    assert set(starts) == {"t/W"}, "expected arrivals are never told a start"
    result = cycle.result()
    assert all(not is_arrival(w.job) for w in result.waiting)
    return starts["t/W"]


def test_a_waiting_job_starts_when_the_gpus_free_when_nothing_is_expected() -> None:
    assert _expected_start_of_waiting() == HOUR


def test_its_tenants_higher_priority_arrival_goes_ahead_of_it() -> None:
    hi = job("t/hi", "t", 8, priority=1, expected_runtime=HOUR, submitted=-HOUR)
    assert _expected_start_of_waiting(hi) == 2 * HOUR


def test_its_tenants_arrival_at_the_same_priority_comes_after_it() -> None:
    same = job("t/same", "t", 8, expected_runtime=HOUR, submitted=-HOUR)
    assert _expected_start_of_waiting(same) == HOUR


def test_an_arrival_of_a_tenant_with_nothing_waiting_goes_ahead_of_it() -> None:
    other = job("u/x", "u", 8, expected_runtime=HOUR, submitted=-HOUR)
    assert _expected_start_of_waiting(other) == 2 * HOUR


def test_arrivals_of_a_tenant_the_cycle_does_not_know_take_nothing() -> None:
    stranger = job("v/x", "v", 8, expected_runtime=HOUR, submitted=-HOUR)
    assert _expected_start_of_waiting(stranger) == HOUR


def test_an_arrival_due_by_now_takes_nothing() -> None:
    # Arrivals are worked out at one forecast and carried by later snapshots: one whose time
    # has passed did not come as expected (or is in the queue already) and plays no part.
    other = job("u/x", "u", 8, expected_runtime=HOUR, submitted=-HOUR)
    (arrival,) = expected_arrivals([other], 0.0, WINDOW)
    jobs = (
        job("t/r", "t", 8, running_on=[("a", (0, 1, 2, 3, 4, 5, 6, 7))], expected_end=2 * HOUR),
        job("t/W", "t", 8, expected_runtime=HOUR, submitted=-2 * MINUTE),
    )
    tenants = (Tenant("t", guaranteed=8), Tenant("u", guaranteed=8))

    def start(now: float, arrivals: tuple[Job, ...]) -> float | None:
        cycle = Cycle(
            Snapshot(now=now, tenants=tenants, jobs=jobs, nodes=(node("a"),), arrivals=arrivals)
        )
        cycle.run()
        return cycle.forecast()["t/W"]

    assert start(0.0, (arrival,)) == 3 * HOUR  # due at 1 h, the node frees at 2 h: it goes first
    assert start(HOUR, (arrival,)) == 2 * HOUR
    assert start(HOUR, (replace(arrival, submitted_at=HOUR + 1.0),)) == 3 * HOUR
