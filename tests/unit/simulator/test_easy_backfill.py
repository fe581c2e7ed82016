"""The EASY backfill baseline: reservations at the shadow time from oracle ends, backfill that
ends before it or uses only the GPUs it leaves spare; every expected time worked out by hand."""

from __future__ import annotations

import math
import random

import pytest

from gpusched.core.admission import Tenant
from gpusched.simulator.cluster import from_mix
from gpusched.simulator.engine import replay
from gpusched.simulator.model import Cluster, Link, RunResult, TraceJob, Workload
from gpusched.simulator.policies import POLICIES, build
from gpusched.simulator.policies.easy_backfill import EasyBackfillPolicy
from gpusched.simulator.speed import DEFAULT
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
RTX = "pcie-8x-rtx4090-2socket-allsys-2nic"  # every pair across sockets: x1.5 in simdata


def _run(jobs: Workload, nodes: Cluster) -> RunResult:
    """Replay under EASY backfill whose oracle uses the replay's own speed model."""
    return replay(jobs, nodes, EasyBackfillPolicy(nodes.nodes, speed=speed), speed=speed)


def _times(result: RunResult) -> dict[str, tuple[float, float] | None]:
    return {
        j.id: (j.attempts[0].start, j.attempts[-1].end) if j.attempts else None for j in result.jobs
    }


def _estimates(result: RunResult) -> dict[str, tuple[float, float]]:
    return {
        j.id: (j.estimated_at, j.estimate)
        for j in result.jobs
        if j.estimated_at is not None and j.estimate is not None
    }


def test_the_head_is_reserved_at_its_shadow_time_a_short_job_backfills_a_long_one_waits() -> None:
    # One 8-GPU board. a holds 6 GPUs until 100. big (8 GPUs) cannot fit: its shadow time is
    # 100, when a ends, and it needs the whole board (no extra GPUs). short (1 GPU, 90 s)
    # fits in the 2 free GPUs and ends at 92 <= 100: it backfills. long (1 GPU, 200 s) fits in
    # the last free GPU but would end at 203 > 100 on a GPU the reservation needs: it waits,
    # and starts after big (100..150), at 150.
    nodes = cluster((H100, "h1"))
    jobs = workload(
        trace_job("a", 0, 6, 100),
        trace_job("big", 1, 8, 50),
        trace_job("short", 2, 1, 90),
        trace_job("long", 3, 1, 200),
    )
    result = _run(jobs, nodes)
    assert _times(result) == {
        "a": (0, 100),
        "big": (100, 150),
        "short": (2, 92),
        "long": (150, 350),
    }
    # Each was told its shadow time when it first became the head: big at 1, long at 100 (big
    # then holds the board until 150).
    assert _estimates(result) == {"big": (1, 100), "long": (100, 150)}


def test_best_fit_without_reservations_lets_the_long_job_delay_the_head() -> None:
    # The same workload under best fit: long takes the last GPU at 3 and big waits for it, so
    # the reservation is what keeps big at 100.
    nodes = cluster((H100, "h1"))
    jobs = workload(
        trace_job("a", 0, 6, 100),
        trace_job("big", 1, 8, 50),
        trace_job("short", 2, 1, 90),
        trace_job("long", 3, 1, 200),
    )
    result = replay(jobs, nodes, build("best-fit", nodes.nodes, jobs.tenants, 0), speed=speed)
    assert _times(result)["long"] == (3, 203)
    assert _times(result)["big"] == (203, 253)


def test_a_long_job_may_start_on_gpus_the_reservation_leaves_spare() -> None:
    # Two boards. a fills h1 until 100; b takes 4 GPUs of h2 until 200. big (8 GPUs) is reserved
    # h1 at 100 (h2 will not be empty before 200). long (4 GPUs, 1000 s) ends long after 100 but
    # fits in h2's 4 free GPUs, which the reservation does not need: it starts at 2. long2 (1
    # GPU) then finds no free GPU; at 100 big takes all of h1, long2 becomes the head, reserved
    # at 150 when big ends, and starts then.
    nodes = cluster((H100, "h1"), (H100, "h2"))
    jobs = workload(
        trace_job("a", 0, 8, 100),
        trace_job("b", 0, 4, 200),
        trace_job("big", 1, 8, 50),
        trace_job("long", 2, 4, 1000),
        trace_job("long2", 3, 1, 1000),
    )
    result = _run(jobs, nodes)
    times = _times(result)
    assert times["big"] == (100, 150)
    assert times["long"] == (2, 1002)
    assert times["long2"] == (150, 1150)
    placed = {j.id: j.attempts[0].nodes for j in result.jobs}
    assert placed["big"] == ("h1",)
    assert placed["long"] == ("h2",)
    assert _estimates(result) == {"big": (1, 100), "long2": (100, 150)}


def test_a_long_job_may_use_extra_gpus_on_the_reserved_node() -> None:
    # One board. a holds 4 GPUs until 100, c 3 GPUs until 50; 1 GPU is free. A head of 4 GPUs
    # is reserved at 50 (c's 3 GPUs + the free one) and needs all 4 then: no extra GPU, so long
    # (1 GPU, 500 s, would end after 50) waits. A head of 3 GPUs is reserved at 50 too but
    # leaves 1 of the 4 spare: long takes the free GPU at 2 and the head still starts at 50.
    nodes = cluster((H100, "h1"))

    def jobs(head_gpus: int) -> Workload:
        return workload(
            trace_job("a", 0, 4, 100),
            trace_job("c", 0, 3, 50),
            trace_job("head", 1, head_gpus, 10),
            trace_job("long", 2, 1, 500),
        )

    # Head of 4: long waits until the head (50..60) ends.
    no_extra = _times(_run(jobs(4), nodes))
    assert no_extra["head"] == (50, 60)
    assert no_extra["long"] == (60, 560)
    extra = _times(_run(jobs(3), nodes))
    assert extra["long"] == (2, 502)
    assert extra["head"] == (50, 60)


def test_the_oracle_end_includes_the_speed_models_slowdown() -> None:
    # One RTX board (every pair across sockets: x1.5). a (4 GPUs, 100 s) runs 0..150, so the
    # head (8 GPUs) is reserved at 150, not 100; a 1-GPU job of 140 s (ends 142 <= 150)
    # backfills, one of 160 s does not.
    nodes = cluster((RTX, "r1"))
    jobs = workload(
        trace_job("a", 0, 4, 100),
        trace_job("head", 1, 8, 10),
        trace_job("fits", 2, 1, 140),
        trace_job("late", 3, 1, 160),
    )
    result = _run(jobs, nodes)
    # late becomes the head when head starts at 150; head ends at 165.
    assert _estimates(result) == {"head": (1, 150), "late": (150, 165)}
    times = _times(result)
    assert times["a"] == (0, 150)
    assert times["fits"] == (2, 142)
    assert times["head"] == (150, 165)  # 10 s x 1.5
    assert times["late"] == (165, 325)


def test_the_policy_asks_to_be_woken_at_the_shadow_time() -> None:
    nodes = cluster((H100, "h1"))
    policy = EasyBackfillPolicy(nodes.nodes, speed=speed)
    policy.replay_started(nodes, speed, {"a": 100, "big": 50, "tiny": 500})
    policy.submit(trace_job("a", 0, 6, 100), 0)
    first = policy.schedule(0)
    assert [s.job for s in first.starts] == ["a"]
    assert first.wake_at is None
    policy.submit(trace_job("big", 5, 8, 50), 5)
    second = policy.schedule(5)
    assert second.starts == ()
    assert second.estimates == (("big", 100.0),)
    assert second.wake_at == 100.0
    assert policy.reservation is not None
    assert policy.reservation.gpus == {"h1": 8}
    assert policy.reservation.extra == {"h1": 0}
    assert "expected free at 100 s" in (policy.reason("big") or "")
    # Told once: a later pass with the same head tells nothing new.
    policy.submit(trace_job("tiny", 6, 1, 500), 6)
    third = policy.schedule(6)
    assert third.starts == ()
    assert third.estimates == ()
    assert "would delay big's reservation at 100 s" in (policy.reason("tiny") or "")


def test_a_gang_is_reserved_the_nodes_best_fit_would_give_it_then() -> None:
    # Three boards. a fills h1 until 100, b fills h2 until 300, c holds 6 of h3 until 200.
    # gang (2 x 8) fits when two boards are empty: h1 at 100, h3 at 200, so it is reserved h1
    # and h3 (whole) at 200. long (2 GPUs, 1000 s) fits in h3's 2 free GPUs but they are
    # reserved: it waits; short (2 GPUs, ends 153 <= 200) backfills there.
    nodes = cluster((H100, "h1"), (H100, "h2"), (H100, "h3"))
    jobs = workload(
        trace_job("a", 0, 8, 100),
        trace_job("b", 0, 8, 300),
        trace_job("c", 0, 6, 200),
        trace_job("gang", 1, 8, 50, replicas=2),
        trace_job("long", 2, 2, 1000),
        trace_job("short", 3, 2, 150),
    )
    result = _run(jobs, nodes)
    times = _times(result)
    # long becomes the head at 200, when the gang started; b and the gang end at 300.
    assert _estimates(result) == {"gang": (1, 200), "long": (200, 300)}
    # Across nodes: x2 in simdata's model, 50 s -> 100 s.
    assert times["gang"] == (200, 300)
    assert sorted(next(j for j in result.jobs if j.id == "gang").attempts[0].nodes) == [
        "h1",
        "h3",
    ]
    assert times["short"] == (3, 153)
    # long: h1 frees at 100 but is reserved whole.
    assert times["long"] == (300, 1300)


def test_a_job_no_node_can_hold_blocks_nobody() -> None:
    nodes = cluster((H100, "h1"))
    jobs = workload(trace_job("huge", 0, 16, 10), trace_job("small", 1, 2, 10))
    result = _run(jobs, nodes)
    assert _times(result) == {"huge": None, "small": (1, 11)}
    assert _estimates(result) == {}
    never = next(j for j in result.jobs if j.id == "huge")
    assert never.reason == "no node with 16 free GPUs for each of 1 replicas"


def test_the_reason_of_a_wait_behind_the_reservation_is_recorded() -> None:
    # a holds 6 GPUs of h1 and c all of h2 until 100; big is reserved h1 at 100 (the tie broken
    # by name), long (2 GPUs) would take h1's 2 free GPUs past 100 and waits; at 100 big gets
    # h1, long h2.
    nodes = cluster((H100, "h1"), (H100, "h2"))
    jobs = workload(
        trace_job("a", 0, 6, 100),
        trace_job("c", 0, 8, 100),
        trace_job("big", 1, 8, 50),
        trace_job("long", 3, 2, 500),
    )
    result = _run(jobs, nodes)
    assert _times(result)["long"] == (100, 600)
    records = {j.id: j for j in result.jobs}
    assert records["big"].wait_reason == (
        "reserved (first in the queue that does not fit): its GPUs are expected free at 100 s "
        "(EASY shadow time)"
    )
    assert records["long"].wait_reason == (
        "would delay big's reservation at 100 s: ends after it, and the GPUs that reservation "
        "leaves spare are too few"
    )


@pytest.mark.parametrize("seed", range(6))
def test_with_exact_oracle_ends_every_reserved_job_starts_at_its_shadow_time(seed: int) -> None:
    # Mixed boards (x1.5 across sockets), gangs across nodes (x2): whatever is backfilled, the
    # reservation never moves, so each job told an expected start starts exactly then.
    nodes = cluster((H100, "h1"), (RTX, "r1"), (H100, "h2"), (RTX, "r2"))
    rnd = random.Random(seed)
    jobs = workload(
        *(
            trace_job(
                f"j{i:03d}",
                float(rnd.randrange(0, 2000, 10)),
                rnd.choice([1, 1, 1, 2, 4, 8]),
                float(rnd.randrange(10, 800)),
                replicas=rnd.choice([1, 1, 1, 1, 2]),
            )
            for i in range(120)
        ),
        tenants=(Tenant("t", guaranteed=32),),
    )
    result = _run(jobs, nodes)
    told = {j.id: j for j in result.jobs if j.estimate is not None}
    assert len(told) >= 5  # the check below checks something
    for j in told.values():
        assert j.first_start == pytest.approx(j.estimate, abs=1e-6), j.id
    assert all(j.finished for j in result.jobs)


def test_a_mismatched_speed_model_still_runs_every_job() -> None:
    # The registry's oracle assumes the default speed model; replayed without one, jobs end
    # earlier or later than it thinks: decisions follow the real completions and nothing stalls.
    nodes = cluster((H100, "h1"), (RTX, "r1"))
    rnd = random.Random(3)
    jobs = workload(
        *(
            trace_job(
                f"j{i:02d}",
                float(rnd.randrange(0, 500, 10)),
                rnd.choice([1, 2, 4, 8]),
                float(rnd.randrange(10, 300)),
                replicas=rnd.choice([1, 1, 2]),
            )
            for i in range(60)
        )
    )
    for replay_speed in (None, speed):
        policy = build("easy-backfill", nodes.nodes, jobs.tenants, 0)
        result = replay(jobs, nodes, policy, speed=replay_speed)
        assert all(j.finished for j in result.jobs)


def test_the_registered_policy_uses_the_default_speed_model() -> None:
    nodes = cluster((RTX, "r1"))
    policy = POLICIES["easy-backfill"](nodes.nodes, (), 0)
    assert isinstance(policy, EasyBackfillPolicy)
    assert policy.speed == DEFAULT.slowdown
    job = TraceJob("x", 0, 100.0, 1, 4, "t")
    placed = EasyBackfillPolicy(nodes.nodes).book.place_gang(job.spec)
    assert placed is not None
    policy.run_times = {"x": job.duration}  # what the replay hands it when it starts
    # Four GPUs of the RTX board talk across sockets.
    assert policy.oracle_end(job.spec, placed, 10.0) == 10.0 + 100.0 * DEFAULT.factors[Link.SOCKET]


def test_jobs_that_never_end_leave_no_reservation() -> None:
    # The FGD experiment: nothing ever ends, so no job can be reserved a time; the head that
    # does not fit blocks nobody.
    nodes = cluster((H100, "h1"))
    jobs = workload(
        trace_job("a", 0, 6, math.inf), trace_job("b", 1, 4, math.inf), trace_job("c", 2, 2, 10)
    )
    result = _run(jobs, nodes)
    assert _times(result) == {"a": (0, math.inf), "b": None, "c": (2, 12)}
    assert _estimates(result) == {}


def test_the_oracle_reads_the_replays_network_levels() -> None:
    # One NVL72 rack: 18 trays of 4 GPUs in one NVLink clique (a network level whose link is
    # NVLink). A (16 trays) runs at full speed, 0..100, so H (the whole rack) is reserved 100;
    # C (one tray, 170 s) would end after that on GPUs H needs, so it waits for H. An oracle
    # that took A's trays to talk over the network would expect A to end later, and let C
    # delay H.
    nodes = from_mix("gb200-nvl72-rack=1")
    tenants = (Tenant("t", guaranteed=72),)
    jobs = Workload(
        "t",
        (
            TraceJob("A", 0, 100, 16, 4, "t"),
            TraceJob("H", 1, 100, 18, 4, "t"),
            TraceJob("C", 2, 170, 1, 4, "t"),
        ),
        tenants,
    )
    levels = tuple(level.level for level in nodes.levels)
    policy = build("easy-backfill", nodes.nodes, tenants, 0, levels)
    result = replay(jobs, nodes, policy, speed=DEFAULT.slowdown)
    assert _times(result) == {"A": (0, 100), "H": (100, 200), "C": (200, 370)}
    assert _estimates(result)["H"] == (1, 100)


def test_the_oracle_charges_no_slowdown_when_the_replay_has_no_speed_model() -> None:
    # The replay (openb, or --speed-model none) runs A for its 100 s as given: H, behind it on
    # the one node, is expected at 100, not at A's duration under the default speed model.
    nodes = cluster((H100, "h100"))
    tenants = (Tenant("t", guaranteed=8),)
    jobs = Workload(
        "t",
        (
            TraceJob("A", 0, 100, 1, 8, "t", measured_on=Link.SOCKET),
            TraceJob("H", 1, 100, 1, 8, "t", measured_on=Link.SOCKET),
        ),
        tenants,
    )
    result = replay(jobs, nodes, build("easy-backfill", nodes.nodes, tenants, 0), speed=None)
    assert _times(result) == {"A": (0, 100), "H": (100, 200)}
    assert _estimates(result)["H"] == (1, 100)
