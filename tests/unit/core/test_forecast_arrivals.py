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


def _hourly(tenant: str, priority: int = 0, hours: int = 12) -> list[Job]:
    """One job an hour over the last ``hours``, alternately of 1 and 2 GPUs."""
    return [
        job(
            f"{tenant}/p{priority}-{h}",
            tenant,
            1 + h % 2,
            priority=priority,
            submitted=-h * HOUR - 1,
        )
        for h in range(hours)
    ]


def test_each_tenants_steady_rate_at_each_priority_is_expected_again_over_the_window_ahead() -> (
    None
):
    # t submits a job an hour at priority 0 and a burst of six at once; u one job an hour at
    # priority 1 for the last six hours, and one lone job; the rest is outside the window.
    t_steady = _hourly("t")
    burst = [job(f"t/burst{i}", "t", 8, submitted=-3.5 * HOUR) for i in range(6)]
    u_steady = _hourly("u", priority=1, hours=6)
    lone = job("u/lone", "u", 4, submitted=-HOUR / 2)
    outside = [
        job("t/old", "t", 1, submitted=-13 * HOUR),
        job("t/later", "t", 1, submitted=1.0),
    ]
    running = job("t/running", "t", 4, submitted=-HOUR / 2, running_on=[("n", (0, 1, 2, 3))])
    submitted = [*t_steady, *burst, *u_steady, lone, *outside, running]
    arrivals = expected_arrivals(submitted, 0.0, 12 * HOUR)
    by_group: dict[tuple[str | None, int], list[Job]] = {}
    for arrival in arrivals:
        by_group.setdefault((arrival.tenant, arrival.priority), []).append(arrival)
    # t at priority 0: twelve one-hour slices saw 1, 1, 1, 8 (the burst), 1, ...: the median is
    # one an hour, so twelve, one every hour from half an hour on, shaped as t's jobs in the
    # order they came (the oldest first); the burst is not expected again.
    t_jobs = by_group[("t", 0)]
    assert [j.submitted_at for j in t_jobs] == [(h + 0.5) * HOUR for h in range(12)]
    oldest_first = sorted([*t_steady, *burst, running], key=lambda j: (j.submitted_at, j.key))
    assert [j.total_gpus for j in t_jobs] == [j.total_gpus for j in oldest_first[:12]]
    # u at priority 1: six slices of twelve saw a job: the median is half a job an hour.
    assert [j.submitted_at for j in by_group[("u", 1)]] == [(h + 0.5) * 2 * HOUR for h in range(6)]
    # u at priority 0: one job is no rate.
    assert ("u", 0) not in by_group
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
    submitted = _hourly("t")
    assert expected_arrivals(submitted, 0.0, 0.0) == ()
    soonest = expected_arrivals(submitted, 0.0, 12 * HOUR, most=3)
    assert [j.submitted_at for j in soonest] == [0.5 * HOUR, 1.5 * HOUR, 2.5 * HOUR]


def arriving(template: Job, at: float) -> Job:
    """``template`` expected to be submitted at ``at``."""
    return replace(template, key=f"{ARRIVAL_NAMESPACE}/{template.key}", submitted_at=at)


def _expected_start_of_waiting(*expected: Job) -> float | None:
    """Node a is busy until 60 min; W (tenant t, priority 0, 8 GPUs, 60 min) waits; each job
    ``expected`` arrives at 60 min, just as the node frees."""
    jobs = (
        job("t/r", "t", 8, running_on=[("a", (0, 1, 2, 3, 4, 5, 6, 7))], expected_end=HOUR),
        job("t/W", "t", 8, expected_runtime=HOUR, submitted=-2 * MINUTE),
    )
    snapshot = Snapshot(
        now=0.0,
        tenants=(Tenant("t", guaranteed=8), Tenant("u", guaranteed=8)),
        jobs=jobs,
        nodes=(node("a"),),
        arrivals=tuple(arriving(j, HOUR) for j in expected),
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
    arrival = arriving(job("u/x", "u", 8, expected_runtime=HOUR), HOUR)
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


def test_an_arrival_of_a_tenant_waiting_beyond_the_forecasts_limit_comes_after_the_rest() -> None:
    # The forecast covers the first job in the order only (limit 1): u/W. t's job waits beyond
    # it, so t's expected arrival takes its turn after u/W, not ahead of it as the arrival of a
    # tenant with nothing waiting would.
    jobs = (
        job("t/r", "t", 8, running_on=[("a", (0, 1, 2, 3, 4, 5, 6, 7))], expected_end=HOUR),
        job("u/W", "u", 8, expected_runtime=HOUR, submitted=-3 * MINUTE),
        job("t/X", "t", 8, expected_runtime=HOUR, submitted=-2 * MINUTE),
    )
    tenants = (Tenant("t", guaranteed=8), Tenant("u", guaranteed=8))
    arrival = arriving(job("t/y", "t", 8, expected_runtime=HOUR), HOUR)
    cycle = Cycle(
        Snapshot(now=0.0, tenants=tenants, jobs=jobs, nodes=(node("a"),), arrivals=(arrival,))
    )
    cycle.run()
    assert cycle.order[0] == "u/W"
    assert cycle.forecast(1) == {"u/W": HOUR}
