"""Figures of tiny hand-built replays, each expected value worked out by hand in the test."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

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
)
from gpusched.simulator.model import Link, Sample
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
    # j2 lost 400 GPU-s (100 contention, 300 avoidable); j3 400, all unavoidable.
    assert f.slow_gpu_hours == pytest.approx(800 / H)
    assert f.slow_unavoidable_gpu_hours == pytest.approx(400 / H)
    assert f.slow_contention_gpu_hours == pytest.approx(100 / H)
    assert f.slow_avoidable_gpu_hours == pytest.approx(300 / H)
    # GPU-seconds: nvlink j1 100 + j3 preempted 200 + j7 200; pcie 800; network 1200.
    assert f.gpu_hours == pytest.approx(2500 / H)
    assert f.link_share == pytest.approx(
        {
            "nvlink": 0.2,
            "pcie-switch": 0.32,
            "numa": 0,
            "socket": 0,
            "network": 0.48,
            "cross-leaf": 0,
            "cross-aggregation": 0,
        }
    )
    assert f.preemptions == 1
    assert f.preempted_attempts == 1
    assert f.preempted_gpu_hours == pytest.approx(200 / H)


def test_a_gang_larger_than_any_node_is_no_avoidable_loss() -> None:
    """The same network placement, once with a better set free at its start and once with
    none in the whole cluster: only the first is the policy's doing."""
    from tests.unit.simulator.sim_testdata import attempt, job

    def lost(best: float, floor: float) -> tuple[float, float, float]:
        gang = job("g", "A", 16, 0.0, attempt(0, 100, Link.NETWORK, 2.0, best=best, floor=floor))
        f = figures(run(jobs=(gang,)))
        return (
            f.slow_unavoidable_gpu_hours * H,
            f.slow_contention_gpu_hours * H,
            f.slow_avoidable_gpu_hours * H,
        )

    # Work 16 * 100 / 2 = 800 GPU-s at full speed, 800 lost against a well-wired run.
    assert lost(best=2.0, floor=2.0) == pytest.approx((800, 0, 0))
    assert lost(best=1.0, floor=1.0) == pytest.approx((0, 0, 800))
    assert lost(best=1.5, floor=1.0) == pytest.approx((0, 400, 400))


def test_makespan_is_last_completion_minus_first_submission() -> None:
    # j3 completes last at 510; j7 (unfinished, attempt until 600) does not count.
    assert figures(run()).makespan == 510


def test_entitlement_from_the_trace_and_the_tenants_shares() -> None:
    f = figures(run())
    a, b = tenant(f, "A"), tenant(f, "B")
    # Offered demand (each job from its submission for its 100 s): A 5 on [0, 80), 21 on
    # [80, 100), 16 to 180; B 4 from 50, 12 from 60, 52 from 70, 48, 40, 0 at 150, 160, 170.
    # 8 GPUs; A guaranteed 4 (weight 1), B 0 (weight 3): A 4 + 1 of the idle 4 (B takes 3)
    # wherever both want more; A alone before 50 (5) and on [170, 180) (8); nothing after.
    # Widths over the samples' [0, 200]: A 5 for 170 s, 8 for 10 s; B 3 for 120 s.
    assert a.mean_entitlement == pytest.approx((5 * 170 + 8 * 10) / (8 * 200))
    assert b.mean_entitlement == pytest.approx(3 * 120 / (8 * 200))
    assert a.share.values == pytest.approx((1 / 8, 5 / 8, 5 / 8, 4 / 8, 2 / 8, 0))
    assert a.mean_share == pytest.approx((10 + 200 + 250 + 200 + 100) / 1600)
    assert b.mean_share == pytest.approx((200 + 300) / 1600)
    assert (a.weight, a.guaranteed, b.weight, b.guaranteed) == (1, 4, 3, 0)
    assert (a.jobs, b.jobs) == (4, 3)
    assert a.gpu_hours == pytest.approx(1100 / H)
    assert b.gpu_hours == pytest.approx(1400 / H)
    assert a.queueing.mean == pytest.approx(10 / 3)
    assert b.queueing.mean == 50


def test_jain_index_of_share_over_entitlement() -> None:
    # x = share / entitlement over tenants entitled to something, at every breakpoint of either:
    # [0, 10) A 1/5 alone -> 1; [10, 50) A 1 -> 1; [50, 100) A 1, B 0 -> 0.5 (50 s);
    # [100, 150) A 4/5, B 4/3; [150, 170) A 2/5, B 6/3; [170, 180) A alone -> 1; after: none.
    def jain(*x: float) -> float:
        return sum(x) ** 2 / (len(x) * sum(v * v for v in x))

    expected = (10 + 40 + 50 * 0.5 + 50 * jain(0.8, 4 / 3) + 20 * jain(0.4, 2.0) + 10) / 180
    assert figures(run()).jain == pytest.approx(expected)


def test_weighted_jain_would_call_a_tenant_at_its_guarantee_a_hog() -> None:
    """A tenant guaranteed 75 % of the cluster holding exactly that is fair against its
    entitlement; water-filling by weight alone (the old figure) would call it a hog."""
    from gpusched.core.admission import Tenant
    from tests.unit.simulator.sim_testdata import attempt, job, sample

    tenants = (Tenant("A", guaranteed=6, weight=1.0), Tenant("B", guaranteed=2, weight=1.0))
    jobs = (
        job("a", "A", 6, 0.0, attempt(0, 100), finished=True),
        job("b", "B", 2, 0.0, attempt(0, 100), finished=True),
        job("b2", "B", 4, 0.0, attempt(100, 200), finished=True),
    )
    samples = (
        sample(0, (6, 2), (0, 4), 1),
        sample(100, (0, 4), (0, 0), 0),
        sample(200, (0, 0), (0, 0), 0),
    )
    f = figures(replace(run(jobs=jobs, samples=samples), tenants=tenants))
    # [0, 100): entitled A 6, B 2 (demands 6 and 6: guarantees first) -> x 1, 1 -> 1.
    # [100, 200): only B wants (4): entitled 4 -> 1. Water-filling by weight alone would give
    # 4 and 4 on [0, 100): x 1.5 and 0.5, Jain 0.8 there.
    assert f.jain == pytest.approx(1.0)


def test_finish_time_fairness_against_the_jobs_fair_slice() -> None:
    f = figures(run())
    # j1 and j2 arrive at 0 with A entitled to 5 over its 2 offered jobs: 2.5 each. j1 (1 GPU)
    # alone 100 s -> rho 1; j2 (4 GPUs) 100 * 4 / 2.5 = 160 -> 210 / 160. j3 arrives at 50,
    # B entitled to 3 for its one job: 100 * 4 / 3 -> 460 / (400 / 3).
    values = [1.0, 210 / 160, 460 * 3 / 400]
    assert (f.rho.count, f.rho.p50, f.rho.max) == (3, pytest.approx(210 / 160), pytest.approx(3.45))
    assert f.rho.mean == pytest.approx(sum(values) / 3)
    assert f.rho.above_one == pytest.approx(2 / 3)


def test_below_guarantee_only_while_another_tenant_borrows() -> None:
    f = figures(run())
    # A (guarantee 4) holds 1 < min(4, 5) at t0 but nobody borrows then; at t150 it holds
    # 2 < min(4, 18) while B holds 6 > 0: 50 s, 2 GPUs short. B's guarantee is 0.
    a = tenant(f, "A")
    assert a.below_guarantee_hours == pytest.approx(50 / H)
    assert a.longest_below_hours == pytest.approx(50 / H)
    assert a.unmet_guarantee_gpu_hours == pytest.approx(100 / H)
    assert tenant(f, "B").below_guarantee_hours == 0
    assert not a.never_started


def test_the_longest_stretch_below_guarantee_breaks_when_the_tenant_is_served() -> None:
    from tests.unit.simulator.sim_testdata import sample

    # A below (1 < 4, B borrows) for 10 s, served for 10 s, below again for 30 s.
    samples = (
        sample(0, (1, 6), (3, 0), 1),
        sample(10, (4, 4), (0, 0), 0),
        sample(20, (2, 6), (2, 0), 1),
        sample(50, (0, 0), (0, 0), 0),
    )
    a = tenant(figures(run(samples=samples)), "A")
    assert a.below_guarantee_hours == pytest.approx(40 / H)
    assert a.longest_below_hours == pytest.approx(30 / H)
    assert a.unmet_guarantee_gpu_hours == pytest.approx((10 * 3 + 30 * 2) / H)


def test_a_tenant_none_of_whose_jobs_started_is_flagged() -> None:
    from tests.unit.simulator.sim_testdata import JOBS

    f = figures(run(jobs=tuple(j for j in JOBS if j.id not in ("j3",))))
    assert tenant(f, "B").never_started  # j4, j5 never started
    assert not tenant(f, "A").never_started


def test_never_started_jobs_count_in_queueing_up_to_the_end() -> None:
    f = figures(run())
    # Started: 0, 10, 50, 0; never: j4, j5, j6 from 60, 70, 80 to the end at 600 (j7's end).
    assert f.queueing_all.mean == pytest.approx((0 + 10 + 50 + 0 + 540 + 530 + 520) / 7)
    assert [by_size(f, b).never_started for b in ("5-8", "9-32", ">32")] == [1, 1, 1]


def test_allocation_while_jobs_wait() -> None:
    f = figures(run())
    # Jobs wait at t0 (10 s, 1 GPU), t50, t100, t150 (50 s each: 5, 8, 8 GPUs) of 8.
    assert f.allocation_busy == pytest.approx((10 + 250 + 400 + 400) / (160 * 8))


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


def test_below_guarantee_with_a_fitting_job_counts_only_jobs_that_fit_what_is_left() -> None:
    """A (guarantee 4) holds 1 while B borrows. For 10 s its smallest waiting job asks 3 GPUs
    (1 + 3 fits 4), then for 30 s only a 4-GPU job waits (1 + 4 does not): below its guarantee
    40 s, with a job that fits it 10 s; the stretch breaks when the fitting job is gone."""

    def at(time: float, smallest: int | None, b: int = 6) -> Sample:
        return Sample(
            time,
            1 + b,
            1,
            smallest or 0,
            {"A": 1, "B": b},
            0,
            queued_by_tenant={"A": smallest} if smallest else {},
            smallest_queued_by_tenant={"A": smallest} if smallest else {},
        )

    samples = (at(0, 3), at(10, 4), at(40, 3), at(45, 3, b=0), at(60, None, b=0))
    a = tenant(figures(run(samples=samples)), "A")
    assert a.below_guarantee_hours == pytest.approx(45 / H)
    assert a.below_fitting_hours == pytest.approx(15 / H)
    assert a.longest_below_fitting_hours == pytest.approx(10 / H)


def test_a_job_that_ran_at_once_on_its_whole_slice_has_rho_one_whatever_the_clock_rounding() -> (
    None
):
    """Fractional times: 0.1 + 0.2 - 0.1 is not 0.2 in floating point, nor is a start late in a
    trace of epoch seconds plus a duration, minus that start. Each job below is alone in its
    tenant, gets the whole node at once and runs exactly its duration: rho is 1 for every one,
    so none is worse off than alone."""
    from gpusched.simulator.engine import replay
    from gpusched.simulator.policies import build
    from tests.unit.simulator.simdata import cluster, trace_job, workload

    nodes = cluster(("hgx-h100-sxm-8gpu-8nic", "h100"))
    jobs = workload(
        trace_job("a", 0.1, 8, 0.2, tenant="a"),
        trace_job("b", 10.3, 8, 12.345, tenant="b"),
        trace_job("c", 1_700_000_000.3, 8, 12.345, tenant="c"),
    )
    result = replay(jobs, nodes, build("best-fit", nodes.nodes, jobs.tenants, 0))
    # The clock really does round here (else this test could not fail).
    assert any(j.end is not None and j.end - j.submit != j.duration for j in result.jobs)
    rho = figures(result).rho
    assert rho.count == 3
    assert rho.above_one == 0
    assert (rho.mean, rho.max) == (1.0, 1.0)


def test_a_replay_decided_in_one_batch_measures_no_queueing_delay(tmp_path: Path) -> None:
    """Pods that never leave, decided one arrival at a time and all in one cycle (the FGD
    experiment): the same pods start, but in the batch every start is the cycle's time, the
    last arrival's. One at a time, each pod that started did so on arrival (delay 0); the batch
    has no such times, so it reports none rather than the cycle's lateness as waiting."""
    import math

    from gpusched.core.admission import Tenant
    from gpusched.simulator.engine import replay
    from gpusched.simulator.policies import build
    from gpusched.simulator.report import write_report
    from tests.unit.simulator.simdata import cluster, trace_job, workload

    nodes = cluster(("hgx-h100-sxm-8gpu-8nic", "h1"))
    sizes = [2, 4, 1, 4, 8, 1, 2]
    jobs = workload(
        *(trace_job(f"p{i}", float(i), size, math.inf) for i, size in enumerate(sizes)),
        tenants=(Tenant("t", guaranteed=8),),
    )
    one, batch = (
        figures(
            replay(jobs, nodes, build("best-fit", nodes.nodes, jobs.tenants, 0), cycle_interval=i)
        )
        for i in (0.0, math.inf)
    )
    # p0 2 + p1 4 + p2 1 start; p3 (4) does not fit in 1; p4 (8) neither; p5 takes the last GPU.
    assert (one.jobs.never_started, batch.jobs.never_started) == (3, 3)
    assert (one.queueing.count, one.queueing.mean) == (4, 0.0)
    assert (batch.queueing.count, batch.queueing.mean, batch.queueing_all.mean) == (0, None, None)
    assert all(s.queueing.count == 0 for s in batch.by_size)
    assert all(t.queueing.mean is None for t in batch.tenants)
    assert [s.never_started for s in batch.by_size] == [s.never_started for s in one.by_size]
    run = replay(
        jobs, nodes, build("best-fit", nodes.nodes, jobs.tenants, 0), cycle_interval=math.inf
    )
    report = write_report([run], tmp_path, command="x", title="t").read_text()
    assert "Not measured: the replay decided every job in one cycle" in report


def test_jain_is_undefined_not_zero_while_no_entitled_tenant_holds_a_gpu() -> None:
    """A and B are entitled 4 each on [0, 100) and hold nothing: 0/0, left out (not 0, below the
    index's floor of 1/n). On [100, 200) both are entitled 4 again and A holds 4, B nothing:
    x = 1, 0, Jain 0.5. With nothing ever held the index is n/a."""
    from gpusched.core.admission import Tenant
    from tests.unit.simulator.sim_testdata import attempt, job, sample

    tenants = (Tenant("A", guaranteed=4), Tenant("B", guaranteed=4))
    # Every job's recorded duration is 100 s: offered A 4, B 4 on [0, 100) and on [100, 200).
    jobs = (
        job("a", "A", 4, 0.0, attempt(100, 200), finished=True),
        job("b", "B", 4, 0.0),
        job("a2", "A", 4, 100.0),
        job("b2", "B", 4, 100.0),
    )
    samples = (
        sample(0, (0, 0), (4, 4), 2),
        sample(100, (4, 0), (4, 12), 3),
        sample(200, (0, 0), (8, 12), 4),
    )
    f = figures(replace(run(jobs=jobs, samples=samples), tenants=tenants))
    assert f.jain == pytest.approx(0.5)
    idle = (sample(0, (0, 0), (4, 4), 2), sample(100, (0, 0), (8, 8), 4))
    never = tuple(replace(j, attempts=(), finished=False) for j in jobs)
    assert figures(replace(run(jobs=never, samples=idle), tenants=tenants)).jain is None


def test_a_namespace_no_tenant_quota_lists_is_entitled_to_nothing() -> None:
    """--quotas names only A: B's jobs belong to no tenant (NoTenant in the admission core), so
    A alone is entitled, to its demand. A policy that runs A's 4 and leaves B's 4 waiting holds
    exactly what the quotas say: Jain 1, B's mean entitlement 0 and its job out of rho (the old
    figure gave B half the idle GPUs: Jain 0.5)."""
    from gpusched.core.admission import Tenant
    from tests.unit.simulator.sim_testdata import attempt, job, sample

    jobs = (
        job("a", "A", 4, 0.0, attempt(0, 100), finished=True),
        job("b", "B", 4, 0.0),
    )
    samples = (sample(0, (4, 0), (0, 4), 1), sample(100, (0, 0), (0, 4), 1))
    f = figures(replace(run(jobs=jobs, samples=samples), tenants=(Tenant("A", guaranteed=4),)))
    assert f.jain == pytest.approx(1.0)
    assert tenant(f, "A").mean_entitlement == pytest.approx(4 / 8)
    assert tenant(f, "B").mean_entitlement == 0
    assert (f.rho.count, f.rho.max) == (1, 1.0)
