"""The replay engine: completion times worked out by hand, determinism, and the ground truth it
keeps against a policy that hands out a GPU twice."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

import gpusched.operator.decide as operator_decide
import gpusched.simulator.policies.gpusched as gpusched_policy
from gpusched.api.tenantquota import WithinTenantPreemption
from gpusched.core import admission
from gpusched.core.admission import Tenant, incremental
from gpusched.simulator import fgd
from gpusched.simulator.engine import PolicyError, replay
from gpusched.simulator.model import JobSpec, Link, RunResult
from gpusched.simulator.policies import POLICIES, build
from gpusched.simulator.policies.base import Decisions, Placed, Start
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
RTX = "pcie-8x-rtx4090-2socket-allsys-2nic"


def _times(result: RunResult) -> dict[str, list[tuple[float, float, bool]]]:
    return {j.id: [(a.start, a.end, a.preempted) for a in j.attempts] for j in result.jobs}


def test_gpusched_replay_gives_the_completion_times_worked_out_by_hand() -> None:
    # One NVSwitch H100 board and one PCIe board whose GPUs all talk across sockets (x1.5).
    nodes = cluster((H100, "h100"), (RTX, "rtx"))
    jobs = workload(
        trace_job("a", 0, 8, 100),  # the H100 board, 0..100
        trace_job("b", 10, 8, 50),  # H100 busy: the PCIe board, 50 s x 1.5 -> 10..85
        trace_job("c", 20, 4, 30),  # both full; the PCIe board frees at 85 -> 85..130
        trace_job("d", 90, 2, 20),  # 4 GPUs left on the PCIe board -> 90..120
        trace_job("e", 95, 8, 10),  # waits for the H100 board -> 100..110
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, jobs.tenants), speed=speed)
    assert _times(result) == {
        "a": [(0, 100, False)],
        "b": [(10, 85, False)],
        "c": [(85, 130, False)],
        "d": [(90, 120, False)],
        "e": [(100, 110, False)],
    }
    links = {j.id: j.attempts[0].link for j in result.jobs}
    assert links == {
        "a": Link.NVLINK,
        "b": Link.SOCKET,
        "c": Link.SOCKET,
        "d": Link.SOCKET,
        "e": Link.NVLINK,
    }
    assert all(j.finished for j in result.jobs)


def test_a_gang_across_nodes_runs_at_the_network_slowdown() -> None:
    nodes = cluster((H100, "h1"), (H100, "h2"))
    jobs = workload(trace_job("big", 0, 8, 100, replicas=2))
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, jobs.tenants), speed=speed)
    (attempt,) = result.jobs[0].attempts
    assert (attempt.link, attempt.start, attempt.end) == (Link.NETWORK, 0, 200)
    assert attempt.nodes == ("h1", "h2")


def test_a_duration_measured_across_nodes_is_not_stretched_again() -> None:
    """A trace that ran a gang across nodes recorded the network in its duration: placed
    across nodes again it runs exactly that long; only a better placement would be faster."""
    nodes = cluster((H100, "h1"), (H100, "h2"))
    measured = replace(trace_job("big", 0, 8, 100, replicas=2), measured_on=Link.NETWORK)
    result = replay(
        workload(measured),
        nodes,
        GpuschedPolicy(nodes.nodes, workload(measured).tenants),
        speed=speed,
    )
    (attempt,) = result.jobs[0].attempts
    assert (attempt.link, attempt.start, attempt.end) == (Link.NETWORK, 0, 100)
    assert (attempt.factor, attempt.floor_factor, attempt.slowdown) == (2.0, 2.0, 1.0)


class _Placing:
    """A policy that puts each job where the test says (job id -> replicas)."""

    name = "placing"
    assumptions: tuple[str, ...] = ()

    def __init__(self, where: dict[str, tuple[Placed, ...]]) -> None:
        self.where = where
        self.new: list[str] = []

    def submit(self, job: JobSpec, now: float) -> None:
        self.new.append(job.id)

    def finished(self, job: str, now: float) -> None:
        return None

    def schedule(self, now: float) -> Decisions:
        starts = tuple(Start(j, self.where[j]) for j in self.new)
        self.new = []
        return Decisions(starts=starts)

    def reason(self, job: str) -> str | None:
        return None

    def last_wait(self, job: str) -> str | None:
        return None


def test_a_placement_worse_than_a_free_set_is_avoidable_and_one_no_node_beats_is_not() -> None:
    # A PCIe board (all pairs across sockets, x1.5) and an NVSwitch board. "bad" takes 4 GPUs of
    # the PCIe board while the NVSwitch board is free: the best free set was NVLinked, the
    # empty cluster's too. "forced" comes while the NVSwitch board is full: only PCIe was free.
    nodes = cluster((RTX, "rtx"), (H100, "h100"))
    where = {
        "bad": (Placed("rtx", (0, 1, 2, 3)),),
        "full": (Placed("h100", tuple(range(8))),),
        "forced": (Placed("rtx", (4, 5, 6, 7)),),
    }
    jobs = workload(
        trace_job("bad", 0, 4, 100), trace_job("full", 10, 8, 1000), trace_job("forced", 20, 4, 100)
    )
    result = replay(jobs, nodes, _Placing(where), speed=speed)
    got = {j.id: j.attempts[0] for j in result.jobs}
    assert (got["bad"].factor, got["bad"].best_factor, got["bad"].floor_factor) == (1.5, 1.0, 1.0)
    assert (got["forced"].factor, got["forced"].best_factor) == (1.5, 1.5)
    assert got["forced"].floor_factor == 1.0


def test_gpusched_decides_again_in_the_instant_it_preempted() -> None:
    """After a cycle that preempted, the operator's next cycle follows at once (the victims'
    GPUs are free then): a job that fits what the preemptor left free starts in that instant,
    not at the next arrival or completion."""
    nodes = cluster((H100, "h100"))
    tenants = (Tenant("a", guaranteed=6), Tenant("b", guaranteed=2))
    jobs = workload(
        trace_job("borrower", 0, 4, 100, tenant="b"),
        trace_job("filler", 0, 4, 1000, tenant="b"),
        trace_job("tiny", 5, 2, 20, tenant="b"),  # waits: the board is full
        trace_job("owner", 10, 6, 50, tenant="a"),  # takes its guarantee back: both leave
        tenants=tenants,
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants), speed=speed)
    times = _times(result)
    assert times["owner"] == [(10, 60, False)]
    assert times["borrower"][0] == (0, 10, True)
    assert times["filler"][0] == (0, 10, True)
    assert times["tiny"] == [(10, 30, False)]  # the 2 GPUs the owner left, at once


def test_the_reason_of_the_longest_wait_is_recorded() -> None:
    nodes = cluster((H100, "h100"))
    jobs = workload(trace_job("first", 0, 8, 100), trace_job("second", 1, 8, 10))
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, jobs.tenants), speed=speed)
    second = next(j for j in result.jobs if j.id == "second")
    assert second.longest_wait == 99
    assert second.wait_reason == "WaitingForCapacity"
    first = next(j for j in result.jobs if j.id == "first")
    assert (first.longest_wait, first.wait_reason) == (0, None)


def test_kube_default_creates_a_small_pod_beside_a_large_one_the_quota_refuses() -> None:
    """Each Job is synced on its own: a later small job's pod is created when the quota's room
    takes it, though an earlier larger one of the tenant does not fit."""
    nodes = cluster((H100, "h100"))
    tenants = (Tenant("t", guaranteed=4),)
    jobs = workload(
        trace_job("running", 0, 2, 100),
        trace_job("large", 1, 4, 10),
        trace_job("small", 2, 2, 10),
        tenants=tenants,
    )
    result = replay(jobs, nodes, build("kube-default", nodes.nodes, tenants, 0), speed=speed)
    times = _times(result)
    assert times["small"] == [(2, 12, False)]
    assert times["large"][0][0] == 100


def test_a_reclaimed_job_loses_its_work_and_runs_again_when_gpus_free() -> None:
    # b borrows a's idle half; a's job inside its guarantee takes it back at t=10.
    nodes = cluster((H100, "h100"))
    tenants = (Tenant("a", guaranteed=4), Tenant("b", guaranteed=4))
    jobs = workload(
        trace_job("borrower", 0, 8, 100, tenant="b"),
        trace_job("owner", 10, 4, 50, tenant="a"),
        tenants=tenants,
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants), speed=speed)
    assert _times(result) == {
        "borrower": [(0, 10, True), (60, 160, False)],
        "owner": [(10, 60, False)],
    }
    assert result.preemptions == 1


def test_best_fit_packs_where_gpusched_keeps_the_wiring() -> None:
    # A 2-GPU job arrives first: best fit puts it on the first of two equal boards; a 4-GPU job
    # then goes to the fuller board. Hand-computed from the rule, GPUs the lowest free ones.
    nodes = cluster((H100, "h1"), (H100, "h2"))
    jobs = workload(trace_job("x", 0, 2, 10), trace_job("y", 1, 4, 10))
    result = replay(jobs, nodes, build("best-fit", nodes.nodes, jobs.tenants, 0), speed=speed)
    placed = {j.id: j.attempts[0].nodes for j in result.jobs}
    assert placed == {"x": ("h1",), "y": ("h1",)}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_replay_is_the_same_for_the_same_seed_whatever_the_input_order(name: str) -> None:
    nodes = cluster((H100, "h1"), (RTX, "r1"), (H100, "h2"))
    rnd = random.Random(7)
    jobs = [
        trace_job(
            f"j{i}",
            float(rnd.randrange(0, 400, 20)),  # shared submit times: order ties matter
            rnd.choice([1, 2, 4, 8]),
            float(rnd.randrange(10, 300)),
            tenant=rnd.choice(["t1", "t2"]),
            replicas=rnd.choice([1, 1, 2]),
            priority=rnd.choice([0, 1]),
        )
        for i in range(40)
    ]
    tenants = (Tenant("t1", guaranteed=12), Tenant("t2", guaranteed=12))
    first = workload(*jobs, tenants=tenants)
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    second = workload(*shuffled, tenants=tenants)
    runs = [
        replay(w, nodes, build(name, nodes.nodes, tenants, 3), speed=speed)
        for w in (first, second, first)
    ]
    assert _times(runs[0]) == _times(runs[1]) == _times(runs[2])
    assert runs[0].samples == runs[1].samples == runs[2].samples


class _Greedy:
    """A broken policy: every job gets GPU 0 of the first node."""

    name = "broken"
    assumptions: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.new: list[str] = []

    def submit(self, job: JobSpec, now: float) -> None:
        self.new.append(job.id)

    def finished(self, job: str, now: float) -> None:
        return None

    def schedule(self, now: float) -> Decisions:
        starts = tuple(Start(j, (Placed("h1", (0,)),)) for j in self.new)
        self.new = []
        return Decisions(starts=starts)

    def reason(self, job: str) -> str | None:
        return None

    def last_wait(self, job: str) -> str | None:
        return None


def test_the_replay_refuses_a_gpu_handed_out_twice() -> None:
    nodes = cluster((H100, "h1"))
    jobs = workload(trace_job("p", 0, 1, 100), trace_job("q", 5, 1, 100))
    with pytest.raises(PolicyError, match="some not free"):
        replay(jobs, nodes, _Greedy())


def test_the_simulator_runs_the_operators_admission_cycle_not_a_copy() -> None:
    assert gpusched_policy.Cycles is admission.Cycles
    assert incremental.Cycle is admission.Cycle
    assert operator_decide.Cycles is admission.Cycles


def test_gpusched_policy_decides_through_the_core_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class Counting(admission.Cycle):
        def run(self) -> admission.CycleResult:
            calls.append(self.now)
            return super().run()

    monkeypatch.setattr(incremental, "Cycle", Counting)
    nodes = cluster((H100, "h1"))
    jobs = workload(trace_job("p", 0, 1, 100), trace_job("q", 5, 1, 100))
    replay(jobs, nodes, GpuschedPolicy(nodes.nodes, jobs.tenants))
    assert calls == [0, 5]


@pytest.mark.parametrize("name", ["gpusched", "kube-default", "best-fit", "random"])
def test_pods_that_never_leave_are_placed_the_same_one_by_one_or_in_one_batch(name: str) -> None:
    # The FGD experiment decides all arrivals in one cycle; it must place what one cycle per
    # arrival places. Three boards, pods of mixed sizes arriving until 130 % of the GPUs.
    nodes = cluster((H100, "h1"), (RTX, "r1"), (H100, "h2"))
    sizes = [1, 2, 1, 4, 8, 1, 1, 2, 4, 1, 8, 2, 1, 1, 4]
    jobs = workload(
        *(trace_job(f"p{i:02d}", float(i), size, math.inf) for i, size in enumerate(sizes)),
        tenants=(Tenant("t", guaranteed=24),),
    )
    runs = [
        replay(jobs, nodes, build(name, nodes.nodes, jobs.tenants, 5), cycle_interval=interval)
        for interval in (0.0, math.inf)
    ]
    placed = [{j.id: j.attempts[0].nodes for j in run.jobs if j.attempts} for run in runs]
    assert placed[0] == placed[1]
    assert 0 < len(placed[0]) < len(sizes)
    assert fgd.allocation_curve(runs[0], jobs) == fgd.allocation_curve(runs[1], jobs)


@pytest.mark.parametrize("name", ["gpusched", "kueue-like"])
def test_within_tenant_never_keeps_a_higher_priority_job_waiting_for_its_own_tenant(
    name: str,
) -> None:
    # One board, one tenant: a priority-1 job arrives while a priority-0 job holds every GPU.
    nodes = cluster((H100, "h100"))
    never = (Tenant("t", guaranteed=8, within_tenant=WithinTenantPreemption.NEVER),)
    lower = (Tenant("t", guaranteed=8),)
    for tenants, expected in (
        (lower, {"low": [(0, 10, True), (60, 160, False)], "high": [(10, 60, False)]}),
        (never, {"low": [(0, 100, False)], "high": [(100, 150, False)]}),
    ):
        jobs = workload(
            trace_job("low", 0, 8, 100, tenant="t", priority=0),
            trace_job("high", 10, 8, 50, tenant="t", priority=1),
            tenants=tenants,
        )
        result = replay(jobs, nodes, build(name, nodes.nodes, tenants, 0), speed=speed)
        assert _times(result) == expected, tenants[0].within_tenant


def test_samples_name_each_tenants_smallest_waiting_job() -> None:
    nodes = cluster((H100, "h100"))
    jobs = workload(
        trace_job("a", 0, 8, 100),  # holds the board 0..100
        trace_job("b", 10, 4, 50),  # waits 10..100
        trace_job("c", 20, 2, 50),  # waits 20..100 beside b
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, jobs.tenants), speed=speed)
    smallest = {s.time: dict(s.smallest_queued_by_tenant) for s in result.samples}
    [tenant] = {j.tenant for j in jobs.jobs}
    assert smallest[10] == {tenant: 4}
    assert smallest[20] == {tenant: 2}
    assert smallest[100] == {}


def test_replicas_bound_while_the_rest_of_their_gang_waits_count_as_no_allocation() -> None:
    """A scheduler without gangs binds a replica of a two-node job and waits for room for the
    other: those GPUs are neither free nor running anything, so neither the cluster's
    allocation nor the tenant's share counts them; a job that runs does."""
    nodes = cluster((H100, "h1"), (H100, "h2"))
    where = {
        "half": (Placed("h1", tuple(range(8))),),  # one of its two replicas, for good
        "whole": (Placed("h2", tuple(range(8))),),
    }
    jobs = workload(
        trace_job("half", 0, 8, 100, replicas=2), trace_job("whole", 10, 8, 100, tenant="u")
    )
    result = replay(jobs, nodes, _Placing(where), speed=speed)
    by_time = {s.time: s for s in result.samples}
    assert (by_time[0].allocated, dict(by_time[0].by_tenant)) == (0, {})
    assert (by_time[10].allocated, dict(by_time[10].by_tenant)) == (8, {"u": 8})


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_is_told_a_jobs_run_time(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a policy is handed at submission is what a GpuJob says: its request. The trace's
    # run time is the future; only an oracle gets it, explicitly, and says so.
    nodes = cluster(("hgx-h100-sxm-8gpu-8nic", "h1"))
    jobs = workload(trace_job("a", 0, 4, 100), trace_job("b", 1, 8, 50))
    policy = build(name, nodes.nodes, jobs.tenants, 0)
    told: list[JobSpec] = []
    submit = policy.submit

    def spy(job: JobSpec, now: float) -> None:
        told.append(job)
        submit(job, now)

    monkeypatch.setattr(policy, "submit", spy)
    result = replay(jobs, nodes, policy, speed=speed)
    assert all(r.finished for r in result.jobs)
    assert [getattr(j, "id", None) for j in told] == ["a", "b"]
    assert not any(hasattr(j, "duration") for j in told), told
    assert ("ORACLE" in " ".join(policy.assumptions)) == (name == "easy-backfill")
