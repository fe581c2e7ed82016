"""Parking the jobs that ask exactly what the job before them asked (``Cycle._wait_alike``)
must decide every job as deciding each one on its own would, and a cycle that keeps no waiting
records (``decisions_only``) must admit exactly what a full one admits.

Truth here is the cycle with the shortcut switched off: every queued job then goes through the
whole decision (quota, placement, preemption) itself. Workloads are drawn from few job shapes so
that long runs of alike jobs, borrowing tenants and preemption all occur.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.admission import (
    Cycle,
    CycleConfig,
    CycleResult,
    Job,
    Snapshot,
    Tenant,
)
from tests.unit.core.admission_testdata import job, node, replay
from tests.unit.core.test_admission_properties import tenant_sets


class _EachOnItsOwn(Cycle):
    """The cycle without the shortcut."""

    def _wait_alike(self, tenant: str, job: Job, any_before: bool = False) -> bool:
        return False


def _queued(tenant: str, i: int, shape: tuple[int, int, bool], **kw: Any) -> Job:
    """The ``i``-th job submitted, of ``tenant``: (GPUs, priority, preemptible)."""
    gpus, priority, preemptible = shape
    return job(
        f"{tenant}/j{i}",
        tenant,
        gpus,
        priority=priority,
        preemptible=preemptible,
        submitted=float(i),
        **kw,
    )


@st.composite
def crowded(draw: Any) -> tuple[Snapshot, list[Job]]:
    nodes = [
        node(f"n{i}", draw(st.sampled_from(["nvswitch", "dgx1", "count"])), "H100")
        for i in range(draw(st.integers(1, 3)))
    ]
    tenants: list[Tenant] = [
        # Some tenants cap one submitter, so alike jobs of different users end differently.
        replace(t, user_max_gpus=draw(st.sampled_from([None, 2, 8])))
        for t in draw(tenant_sets())
    ]
    shapes = [
        (draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(0, 2)), draw(st.booleans()))
        for _ in range(draw(st.integers(1, 3)))
    ]
    jobs = []
    for i in range(draw(st.integers(4, 30))):
        gpus, priority, preemptible = draw(st.sampled_from(shapes))
        tenant = draw(st.sampled_from(tenants)).name
        submitter = draw(st.sampled_from(["alice", "bob", ""]))
        jobs.append(_queued(tenant, i, (gpus, priority, preemptible), submitter=submitter))
    split = draw(st.integers(0, len(jobs)))
    snapshot = Snapshot(
        now=1000.0, tenants=tuple(tenants), jobs=tuple(jobs[:split]), nodes=tuple(nodes)
    )
    return snapshot, jobs[split:]


def _decisions(result: CycleResult) -> tuple[object, ...]:
    return (
        tuple((a.job, a.reason, a.placement, a.victims) for a in result.admissions),
        tuple((w.job, w.reason, w.message, w.queue_position) for w in result.waiting),
        result.tenants,
    )


def _history(
    snapshot: Snapshot, late: list[Job], settle: int
) -> Iterator[tuple[CycleResult, Snapshot]]:
    """Settle the early jobs so some tenants borrow, bring in the late ones, then three cycles:
    each one's result with the snapshot it decided."""
    for _ in range(settle):
        snapshot = replay(snapshot, Cycle(snapshot).run(), dt=100.0)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, *late))
    for _ in range(3):
        fast = Cycle(snapshot).run()
        yield fast, snapshot
        snapshot = replay(snapshot, fast, dt=100.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_alike_jobs_parked_together_get_the_decisions_each_would_get_alone(
    drawn: tuple[Snapshot, list[Job]],
) -> None:
    early, late = drawn
    for fast, snapshot in _history(early, late, settle=3):
        slow = _EachOnItsOwn(snapshot).run()
        assert _decisions(fast) == _decisions(slow)
        bare = Cycle(replace(snapshot, config=CycleConfig(decisions_only=True))).run()
        assert bare.admissions == fast.admissions
        assert (bare.waiting, bare.tenants) == ((), ())


def test_parking_a_run_never_lets_the_job_behind_it_jump_ahead_of_another_tenant() -> None:
    # Found by the property above: t2's second 2-GPU job is parked behind its first; its 1-GPU
    # job behind them must not compete before t0's next job would have had its turn, or it takes
    # the last GPU that t0's guarantee was entitled to.
    tenants = (Tenant("t0", 16, weight=0.5), Tenant("t1", 0, weight=0.5), Tenant("t2", 0))
    shapes = [("t0", 2, False)] * 7 + [("t2", 2, False), ("t0", 1, True), ("t0", 2, False)]
    shapes += [("t0", 1, True), ("t2", 2, False), ("t2", 1, True)]
    jobs = tuple(
        job(f"{t}/j{i}", t, gpus, preemptible=preemptible, submitted=float(i))
        for i, (t, gpus, preemptible) in enumerate(shapes)
    )
    snapshot = Snapshot(
        now=1000.0,
        tenants=tenants,
        jobs=jobs,
        nodes=(node("n0", "nvswitch", "H100"), node("n1", "nvswitch", "H100")),
    )
    fast = Cycle(snapshot).run()
    assert _decisions(fast) == _decisions(_EachOnItsOwn(snapshot).run())
    assert "t0/j10" in {a.job for a in fast.admissions}


class _CountingKinds(Cycle):
    """The cycle, counting the jobs parked with the reason of an earlier job of their kind
    that was not the job just before them."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__(snapshot)
        self.by_kind = 0

    def _wait_alike(self, tenant: str, job: Job, any_before: bool = False) -> bool:
        last = self._alike(tenant, job, self._failed.get(tenant))
        parked = super()._wait_alike(tenant, job, any_before)
        self.by_kind += parked and not last
        return parked


@st.composite
def interleaved(draw: Any) -> tuple[Snapshot, list[Job]]:
    """Queues that cycle through a few kinds of job (a small, a medium and a large class), with
    run times, sometimes reservations, sometimes reclaims weighed within a patience that older
    jobs have used up: jobs of a kind are rarely next to each other."""
    nodes = [
        node(f"n{i}", draw(st.sampled_from(["nvswitch", "dgx1", "count"])), "H100")
        for i in range(draw(st.integers(1, 3)))
    ]
    tenants = draw(tenant_sets())
    kinds = [
        (draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(0, 2)), draw(st.booleans()))
        for _ in range(draw(st.integers(2, 3)))
    ]
    turn = dict.fromkeys((t.name for t in tenants), 0)
    jobs = []
    for i in range(draw(st.integers(6, 40))):
        tenant = draw(st.sampled_from(tenants)).name
        gpus, priority, preemptible = kinds[turn[tenant] % len(kinds)]
        turn[tenant] += 1
        runtime = draw(st.sampled_from([None, 600.0, 7200.0]))
        queued = _queued(tenant, i, (gpus, priority, preemptible), expected_runtime=runtime)
        # Submitted 25 s apart (up to the first cycle), so jobs of one kind differ in age.
        jobs.append(replace(queued, submitted_at=25.0 * i))
    split = draw(st.integers(0, len(jobs)))
    # Reclaims weighed within a patience whose end falls among the queue's jobs (now is 1,000
    # to 1,400; jobs were submitted at 0 to 975), and victims that cost more than a short wait
    # is worth: alike jobs then differ in whether they may turn a reclaim down.
    config = CycleConfig(
        reservations_per_tenant=draw(st.sampled_from([0, 1])),
        reclaim_patience_seconds=draw(st.sampled_from([0.0, 1500.0, 2500.0])),
        restart_penalty_seconds=draw(st.sampled_from([300.0, 3600.0])),
    )
    snapshot = Snapshot(
        now=1000.0,
        tenants=tuple(tenants),
        jobs=tuple(jobs[:split]),
        nodes=tuple(nodes),
        config=config,
    )
    return snapshot, jobs[split:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleaved())
def test_jobs_parked_with_an_earlier_job_of_their_kind_get_the_decisions_each_would_get_alone(
    drawn: tuple[Snapshot, list[Job]],
) -> None:
    early, late = drawn
    for fast, snapshot in _history(early, late, settle=2):
        assert _decisions(fast) == _decisions(_EachOnItsOwn(snapshot).run())


def test_a_queue_of_interleaved_kinds_is_parked_kind_by_kind() -> None:
    # One node, full; t1 queues small, medium and large jobs in turn: after the first job of
    # each kind waited, the others of that kind wait for the same reason without deciding.
    tenants = (Tenant("t0", 8), Tenant("t1", 0))
    running = job("t0/run", "t0", 8, running_on=[("n0", tuple(range(8)))])
    queued = [
        job(f"t1/j{i}", "t1", gpus, submitted=float(i))
        for i, gpus in enumerate([1, 2, 4, 1, 2, 4, 1, 2, 4])
    ]
    snapshot = Snapshot(
        now=1000.0, tenants=tenants, jobs=(running, *queued), nodes=(node("n0", "nvswitch"),)
    )
    cycle = _CountingKinds(snapshot)
    fast = cycle.run()
    assert _decisions(fast) == _decisions(_EachOnItsOwn(snapshot).run())
    assert cycle.by_kind == 6
    assert {w.reason for w in fast.waiting} == {w.reason for w in fast.waiting[:3]}


def test_a_job_of_a_kind_is_decided_again_after_a_job_between_was_admitted() -> None:
    # t1's first 2-GPU job waits for capacity (one GPU free); its 1-GPU job takes that GPU;
    # its second 2-GPU job is then over t1's limit of 2 GPUs, not waiting for capacity.
    tenants = (Tenant("t0", 7), Tenant("t1", 0, borrowing_limit=2))
    running = job("t0/run", "t0", 7, running_on=[("n0", tuple(range(7)))])
    queued = [job(f"t1/j{i}", "t1", gpus, submitted=float(i)) for i, gpus in enumerate([2, 1, 2])]
    snapshot = Snapshot(
        now=1000.0, tenants=tenants, jobs=(running, *queued), nodes=(node("n0", "nvswitch"),)
    )
    fast = Cycle(snapshot).run()
    assert _decisions(fast) == _decisions(_EachOnItsOwn(snapshot).run())
    assert [a.job for a in fast.admissions] == ["t1/j1"]
    assert fast.wait_reasons["t1/j0"] != fast.wait_reasons["t1/j2"]


def test_alike_jobs_parked_behind_a_failed_reservation_use_up_the_attempts_each_would_use() -> None:
    # Found by the interleaved property: t1's 4-GPU jobs each try a reservation and fail (at
    # the earliest start its 1-GPU job still runs, 5 GPUs against an entitlement of 4); four
    # tries use up t1's attempts for the cycle, so its 1-GPU job behind them gets none. Parked
    # without trying, the 4-GPU jobs left attempts over and the 1-GPU job got a reservation.
    tenants = (
        Tenant("t0", 4),
        Tenant(
            "t1",
            4,
            within_tenant=WithinTenantPreemption.NEVER,
            reclaim=ReclaimPolicy.NEVER,
        ),
    )
    running = (
        job("t0/run", "t0", 7, running_on=[("n0", tuple(range(7)))], expected_end=1600.0),
        job("t1/run", "t1", 1, running_on=[("n0", (7,))], expected_end=8200.0),
    )
    queued = [
        *(job(f"t1/big{i}", "t1", 4, priority=1, submitted=float(i)) for i in range(4)),
        job("t1/small", "t1", 1, submitted=10.0),
    ]
    assert not _parked_as_each_alone(tenants, [*running, *queued]).reservations


def test_a_job_is_not_parked_behind_one_of_its_kind_after_another_tenant_reserved_since() -> None:
    # Found by a search over small clusters: b's first 2-GPU job waited with nothing to
    # reserve; c's job decided after it took a reservation, which moves the GPUs and starts
    # b's next 2-GPU job sees, so it gets a reservation of its own where the first did not.
    tenants = (Tenant("a", 2), Tenant("b", 2), Tenant("c", 4, weight=2))
    on_n0 = [("b/run0", 2, (0, 1), 1600.0), ("a/run1", 3, (2, 3, 4), 1300.0)]
    on_n0 += [("b/run2", 1, (5,), 4600.0), ("b/run3", 2, (6, 7), 9000.0)]
    running = [
        job(key, key[0], gpus, running_on=[("n0", held)], expected_end=end)
        for key, gpus, held, end in on_n0
    ]
    kinds = [("c", 4, 600.0), ("a", 4, None), ("b", 2, None), ("a", 2, None), ("c", 4, None)]
    kinds += [("c", 2, None), ("c", 3, 600.0), ("a", 2, 600.0), ("b", 2, None), ("c", 2, 600.0)]
    queued = [
        job(f"{t}/q{i}", t, gpus, submitted=float(i), expected_runtime=runtime)
        for i, (t, gpus, runtime) in enumerate(kinds)
    ]
    fast = _parked_as_each_alone(tenants, [*running, *queued])
    assert "b/q8" in {r.job for r in fast.reservations}


def _parked_as_each_alone(tenants: tuple[Tenant, ...], jobs: list[Job]) -> CycleResult:
    """A cycle on one NVSwitch node with one reservation per tenant, checked against deciding
    each job on its own."""
    snapshot = Snapshot(
        now=1000.0,
        tenants=tenants,
        jobs=tuple(jobs),
        nodes=(node("n0", "nvswitch"),),
        config=CycleConfig(reservations_per_tenant=1),
    )
    fast = Cycle(snapshot).run()
    assert _decisions(fast) == _decisions(_EachOnItsOwn(snapshot).run())
    return fast
