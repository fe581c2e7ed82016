"""Figures of tiny hand-built replays, each expected value worked out by hand in the test."""

from __future__ import annotations

import json

import pytest

from gpusched.simulator.figures import (
    Figures,
    Series,
    SizeFigures,
    TenantFigures,
    cdf,
    figures,
    nearest_rank,
    size_bucket,
    step_series,
    water_fill,
)
from gpusched.simulator.model import Sample
from tests.unit.simulator.sim_testdata import JOBS, run

H = 3600.0


def by_size(f: Figures, bucket: str) -> SizeFigures:
    return next(s for s in f.by_size if s.bucket == bucket)


def tenant(f: Figures, name: str) -> TenantFigures:
    return next(t for t in f.tenants if t.name == name)


def test_nearest_rank_is_a_value_at_rank_ceil_p_n_over_100() -> None:
    assert nearest_rank([4, 1, 3, 2], 50) == 2  # rank ceil(2) = 2
    assert nearest_rank([5, 1, 3], 50) == 3  # rank ceil(1.5) = 2
    assert nearest_rank(range(1, 101), 99) == 99
    assert nearest_rank(range(1, 11), 99) == 10  # rank ceil(9.9) = 10
    assert nearest_rank([7, 9], 0) == 7
    assert nearest_rank([7, 9], 100) == 9
    assert nearest_rank([], 50) is None


def test_size_buckets() -> None:
    assert [size_bucket(g) for g in (1, 2, 4, 5, 8, 9, 32, 33, 1024)] == [
        "1", "2-4", "2-4", "5-8", "5-8", "9-32", "9-32", ">32", ">32",
    ]  # fmt: skip


def test_jct_and_queueing_delay_overall() -> None:
    f = figures(run())
    # Finished: j1 100, j2 210, j3 460.
    assert f.jct.count == 3
    assert f.jct.mean == pytest.approx(770 / 3)
    assert f.jct.p50 == 210
    assert f.jct.p99 == 460
    # Started: j1 0, j2 10, j3 50, j7 0 -> sorted 0 0 10 50.
    assert f.queueing.count == 4
    assert f.queueing.mean == pytest.approx(15)
    assert f.queueing.p50 == 0
    assert f.queueing.p99 == 50


def test_by_job_size() -> None:
    f = figures(run())
    one = by_size(f, "1")
    assert (one.jobs, one.jct.mean, one.queueing.mean) == (1, 100, 0)
    small = by_size(f, "2-4")  # j2, j3 finished; j7 started only
    assert small.jobs == 3
    assert (small.jct.count, small.jct.mean, small.jct.p50, small.jct.p99) == (2, 335, 210, 460)
    assert small.queueing.mean == pytest.approx(20)  # (10 + 50 + 0) / 3
    assert (small.queueing.p50, small.queueing.p99) == (10, 50)
    for bucket in ("5-8", "9-32", ">32"):  # j4, j6, j5: never started
        b = by_size(f, bucket)
        assert (b.jobs, b.jct.count, b.queueing.count, b.jct.mean) == (1, 0, 0, None)


def test_job_counts_and_reasons() -> None:
    c = figures(run()).jobs
    assert (c.total, c.finished, c.unfinished, c.never_started) == (7, 3, 1, 3)
    assert dict(c.top_reasons) == {"waiting for quota": 2, "unknown": 1}
    assert list(c.top_reasons) == ["waiting for quota", "unknown"]  # most frequent first


def test_allocation_queue_and_fragmentation_are_time_weighted() -> None:
    f = figures(run())
    # Allocated 1, 5, 5, 8, 8 for 10, 40, 50, 50, 50 s of 200 s, of 8 GPUs.
    assert f.allocation_mean == pytest.approx((10 + 200 + 250 + 400 + 400) / (8 * 200))
    assert f.allocation.times == (0, 10, 50, 100, 150, 200)
    assert f.allocation.values == pytest.approx((1 / 8, 5 / 8, 5 / 8, 1, 1, 0))
    # Queued jobs 1, 0, 1, 3, 3.
    assert f.queue_length_mean == pytest.approx((10 + 50 + 150 + 150) / 200)
    # 3 stranded GPUs for 50 of 200 s.
    assert f.stranded_mean == pytest.approx(0.75)
    assert f.stranded_pct == pytest.approx(100 * 0.75 / 8)


def test_slow_placements_links_and_preemption_losses() -> None:
    f = figures(run())
    # j2: 4 GPUs * 200 s * (1 - 1/2) = 400; j3: 4 * 300 * (1 - 1/1.5) = 400.
    assert f.slow_gpu_hours == pytest.approx(800 / H)
    # GPU-seconds: nvlink j1 100 + j3 preempted 200 + j7 200; pcie 800; network 1200.
    assert f.gpu_hours == pytest.approx(2500 / H)
    assert f.link_share == pytest.approx(
        {"nvlink": 0.2, "pcie-switch": 0.32, "numa": 0, "socket": 0, "network": 0.48}
    )
    assert f.preemptions == 1
    assert f.preempted_attempts == 1
    assert f.preempted_gpu_hours == pytest.approx(200 / H)


def test_makespan_is_last_completion_minus_first_submission() -> None:
    # j3 completes last at 510; j7 (unfinished, attempt until 600) does not count.
    assert figures(run()).makespan == 510


def test_water_fill_by_weight_up_to_demand() -> None:
    # a asks 1 (< 10/4): satisfied; 9 left split 1:2 between b and c.
    got = water_fill(10, {"a": 1, "b": 10, "c": 10}, {"a": 1, "b": 1, "c": 2})
    assert got == pytest.approx({"a": 1, "b": 3, "c": 6})
    # Enough for everyone: everyone gets its demand; no demand, nothing.
    assert water_fill(10, {"a": 2, "b": 3, "c": 0}, {}) == pytest.approx({"a": 2, "b": 3, "c": 0})
    # b is satisfied in the second round only: a gets 12/2 = 6 > 5 first, then b 7 of 7.
    got = water_fill(12, {"a": 5, "b": 7, "c": 20}, {"a": 1, "b": 1, "c": 0})
    assert got == pytest.approx({"a": 5, "b": 7, "c": 0})


def test_tenant_shares_against_water_filled_fair_share() -> None:
    f = figures(run())
    assert f.demand_known
    a, b = tenant(f, "A"), tenant(f, "B")
    # Demands (held + queued) A: 5, 5, 5, 20, 18, 0; B: 0, 0, 4, 52, 54, 0; weights 1:3, 8 GPUs.
    # Fair A: 5, 5, 4 (B takes its 4, 4 left), 2, 2; fair B: 0, 0, 4, 6, 6.
    assert a.fair_share.values == pytest.approx((5 / 8, 5 / 8, 4 / 8, 2 / 8, 2 / 8, 0))
    assert b.fair_share.values == pytest.approx((0, 0, 4 / 8, 6 / 8, 6 / 8, 0))
    assert a.share.values == pytest.approx((1 / 8, 5 / 8, 5 / 8, 4 / 8, 2 / 8, 0))
    assert a.mean_fair_share == pytest.approx((50 + 200 + 200 + 100 + 100) / 1600)
    assert b.mean_fair_share == pytest.approx((200 + 300 + 300) / 1600)
    assert a.mean_share == pytest.approx((10 + 200 + 250 + 200 + 100) / 1600)
    assert b.mean_share == pytest.approx((200 + 300) / 1600)
    assert (a.weight, a.guaranteed, b.weight, b.guaranteed) == (1, 4, 3, 0)
    assert (a.jobs, b.jobs) == (4, 3)
    assert a.gpu_hours == pytest.approx(1100 / H)
    assert b.gpu_hours == pytest.approx(1400 / H)
    assert a.queueing.mean == pytest.approx(10 / 3)
    assert b.queueing.mean == 50


def test_jain_index_of_share_over_fair_share() -> None:
    # x = share / fair over tenants with fair > 0:
    # t0 (A 1/5) -> 1; t10 (A 1) -> 1; t50 (1.25, 0) -> 0.5; t100 (2, 2/3) -> (8/3)^2 / (2 * 40/9)
    # = 0.8; t150 (1, 1) -> 1. Weighted by 10, 40, 50, 50, 50 s.
    assert figures(run()).jain == pytest.approx((10 + 40 + 25 + 40 + 50) / 200)


def test_below_guarantee_only_while_another_tenant_borrows() -> None:
    f = figures(run())
    # A (guarantee 4) holds 1 < min(4, 5) at t0 but nobody borrows then; at t150 it holds
    # 2 < min(4, 18) while B holds 6 > 0: 50 s. B's guarantee is 0: never below it.
    assert tenant(f, "A").below_guarantee_hours == pytest.approx(50 / H)
    assert tenant(f, "B").below_guarantee_hours == 0


def test_below_guarantee_counts_only_demand_the_tenant_has() -> None:
    def two(a: int, qa: int, b: int) -> tuple[Sample, ...]:
        by_tenant = {"A": a, "B": b}
        return (
            Sample(0, a + b, 1, qa, by_tenant, 0, queued_by_tenant={"A": qa}),
            Sample(100, 0, 0, 0, {}, 0),
        )

    def below(a: int, qa: int, b: int) -> float:
        return tenant(figures(run(samples=two(a, qa, b))), "A").below_guarantee_hours

    # A (guarantee 4) holds 2; B (guarantee 0) holds 6.
    assert below(2, 0, 6) == 0  # A wants no more than it holds
    assert below(2, 1, 6) == pytest.approx(100 / H)  # A wants 3 > 2
    assert below(2, 5, 0) == 0  # nobody borrows


def test_empty_run_has_undefined_means_not_errors() -> None:
    f = figures(run(jobs=(), samples=(), preemptions=0))
    assert (f.jct.mean, f.queueing.p99, f.allocation_mean, f.jain, f.makespan) == (
        None, None, None, None, None,
    )  # fmt: skip
    assert f.jobs.total == 0


def test_demand_unknown_when_samples_lack_queued_by_tenant() -> None:
    s = Sample(time=0, allocated=0, queued_jobs=1, queued_gpus=4, by_tenant={}, stranded=0)
    assert not figures(run(samples=(s,))).demand_known


def test_step_series_keeps_short_series_and_averages_long_ones_into_bins() -> None:
    assert step_series([0, 1], [3, 4], 5) == Series((0, 1), (3, 4))
    # Bins [0, 2] and [2, 4]: each (0 * 1 + 4 * 1) / 2 = 2; then the last value.
    got = step_series([0, 1, 2, 3, 4], [0, 4, 0, 4, 0], 3)
    assert got == Series((0, 2, 4), (2, 2, 0))


def test_cdf() -> None:
    assert cdf([3, 1, 2]) == Series((1, 2, 3), (1 / 3, 2 / 3, 1))
    thinned = cdf(list(range(1, 11)), max_points=5)  # ranks 2, 4, 6, 8, 10
    assert thinned == Series((2, 4, 6, 8, 10), (0.2, 0.4, 0.6, 0.8, 1.0))


def test_jct_cdf_of_the_run() -> None:
    assert figures(run()).jct_cdf == Series((100, 210, 460), (1 / 3, 2 / 3, 1))


def test_figures_round_trip_through_json() -> None:
    f = figures(run())
    text = json.dumps(f.to_json())
    assert Figures.from_json(json.loads(text)) == f


def test_long_runs_are_stored_as_at_most_series_points() -> None:
    from gpusched.simulator.figures import SERIES_POINTS

    samples = tuple(
        Sample(time=float(i), allocated=i % 2, queued_jobs=0, queued_gpus=0,
               by_tenant={"A": i % 2} if i % 2 else {}, stranded=0)
        for i in range(SERIES_POINTS * 3 + 1)
    )  # fmt: skip
    f = figures(run(jobs=JOBS, samples=samples))
    assert len(f.allocation.times) <= SERIES_POINTS
    assert len(tenant(f, "A").share.times) <= SERIES_POINTS
    # Half the time 1 GPU of 8: the mean is exact whatever the thinning.
    assert f.allocation_mean == pytest.approx(1 / 16)
    assert sum(
        v * (b - a)
        for v, a, b in zip(
            f.allocation.values, f.allocation.times, f.allocation.times[1:], strict=False
        )
    ) / (f.allocation.times[-1] - f.allocation.times[0]) == pytest.approx(1 / 16)
