"""The operator's side of reservations and run-time limits: ``spec.maxRuntimeSeconds`` ends a
job, the status carries the expected start and the reservation (written at once when the
reservation is made, moved or released, with an event), and the next cycle reads them back."""

from __future__ import annotations

from datetime import timedelta

from gpusched.api.gpujob import JobPhase
from gpusched.core.admission import (
    Assignment,
    CycleResult,
    JobState,
    ReplicaPlan,
    Reservation,
    Waiting,
    WaitReason,
)
from gpusched.core.lifecycle import (
    Action,
    DeletePod,
    Event,
    JobContext,
    Verdict,
    WriteStatus,
    core_job,
    plan,
    settle,
)
from gpusched.core.lifecycle.facts import JobFacts
from gpusched.core.placement import TopologyScope
from tests.unit.core.lifecycle_testdata import (
    CONFIG,
    NOW,
    admitted_status,
    job,
    pod,
    stamp,
    with_pods,
)

OK = JobContext(tenant="t", verdict=Verdict())


def _running(seconds: float, **spec: object) -> JobFacts:
    started = NOW - timedelta(seconds=seconds)
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(started)), **spec)
    return with_pods(facts, pod(facts, 0), pod(facts, 1, node="n1"))


def test_a_job_that_runs_for_its_declared_limit_fails_and_its_pods_go() -> None:
    done = settle(_running(600, maxRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.FAILED
    assert done.status.reason == "MaxRuntimeExceeded"
    assert len([a for a in done.actions if isinstance(a, DeletePod)]) == 2
    assert [e.reason for e in done.actions if isinstance(e, Event)] == ["MaxRuntimeExceeded"]
    assert done.state is JobState.TERMINATING


def test_a_job_within_its_declared_limit_runs_on_and_wakes_the_cycle_at_the_limit() -> None:
    done = settle(_running(100, maxRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.RUNNING
    assert done.state is JobState.ADMITTED
    assert done.wake_at == NOW + timedelta(seconds=500)


def _first_seen_running(seconds: float, **spec: object) -> JobFacts:
    """Admitted, its pods' containers running for ``seconds``: the run is not recorded yet."""
    started = NOW - timedelta(seconds=seconds)
    facts = job(status=admitted_status(admitted_at=started - timedelta(seconds=10)), **spec)
    running = {
        "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": stamp(started)}}}]
    }
    made = started - timedelta(seconds=5)
    return with_pods(
        facts,
        pod(facts, 0, created=made, status_extra=running),
        pod(facts, 1, node="n1", created=made, status_extra=running),
    )


def test_a_run_first_seen_past_its_declared_limit_fails_at_once() -> None:
    # The operator was down while the pods started and ran past the limit: counted from their
    # start, the limit has passed when the run is first recorded.
    done = settle(_first_seen_running(3600, maxRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.FAILED
    assert done.status.reason == "MaxRuntimeExceeded"
    assert done.status.started_at == NOW - timedelta(seconds=3600)
    assert len([a for a in done.actions if isinstance(a, DeletePod)]) == 2


def test_a_run_first_seen_within_its_declared_limit_wakes_the_cycle_at_the_limit() -> None:
    done = settle(_first_seen_running(100, maxRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.RUNNING
    assert done.wake_at == NOW + timedelta(seconds=500)


def test_a_run_first_seen_within_its_minimum_runtime_wakes_the_cycle_when_it_ends() -> None:
    # Protected for 600 s from its pods' start 100 s ago: a preemption it blocks can happen in
    # 500 s, also when this pass is the one that records the run.
    done = settle(_first_seen_running(100, minRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.RUNNING
    assert done.wake_at == NOW + timedelta(seconds=500)


def test_a_run_first_seen_past_its_minimum_runtime_sets_no_wake_for_it() -> None:
    done = settle(_first_seen_running(3600, minRuntimeSeconds=600), OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.RUNNING
    assert done.wake_at is None


def test_a_running_job_is_expected_to_end_at_its_start_plus_its_predicted_run_time() -> None:
    facts = _running(100)
    context = JobContext(tenant="t", verdict=Verdict(), runtime=400.0)
    made = core_job(facts, settle(facts, context, NOW, CONFIG), context, NOW)
    assert made is not None
    assert made.expected_end == NOW.timestamp() + 300
    assert made.expected_runtime == 400.0
    # Past its prediction it is expected to run as long again as it has run.
    late = _running(1000)
    made = core_job(late, settle(late, context, NOW, CONFIG), context, NOW)
    assert made is not None
    assert made.expected_end == NOW.timestamp() + 1000


def _reservation(node: str, start: float) -> Reservation:
    plan_ = ReplicaPlan(0, node, (0, 1, 2, 3), TopologyScope.NVLINK, 90.0)
    return Reservation("ns/train", "t", start, start + 600, (plan_, plan_), 4, False)


def _waiting(expected: float | None) -> Waiting:
    return Waiting("ns/train", "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 1, expected)


def _plan(facts: JobFacts, reservation: Reservation | None, expected: float | None) -> list[Action]:
    settled = {facts.key: settle(facts, OK, NOW, CONFIG)}
    result = CycleResult(
        admissions=(),
        waiting=(_waiting(expected),),
        tenants=(),
        reservations=(reservation,) if reservation is not None else (),
    )
    planned = plan({facts.key: facts}, settled, result, NOW)
    return [a for g in planned.groups for a in g.actions()]


def test_a_reservation_is_written_into_the_status_with_an_event() -> None:
    facts = job(status={"phase": "Queued", "tenant": "t", "reason": "WaitingForCapacity"})
    start = NOW.timestamp() + 3600
    actions = _plan(facts, _reservation("n0", start), start)
    [write] = [a for a in actions if isinstance(a, WriteStatus)]
    status = write.status
    assert status.expected_start is not None
    assert status.expected_start.timestamp() == start
    assert status.first_expected_start == status.expected_start
    assert status.reservation is not None
    assert [p.node for p in status.reservation.placement] == ["n0", "n0"]
    assert status.reservation.idle_gpus == 4
    [event] = [e for e in actions if isinstance(e, Event)]
    assert event.reason == "Reserved"
    # As the status's message writes a wait (an hour: "1h 00m", not "60 min").
    assert event.message == "GPUs reserved on n0, expected free in about 1h 00m (4 idle until then)"
    # The next cycle starts from it: the core reads the reservation back.
    queued = job(status=status.to_k8s())
    made = core_job(queued, settle(queued, OK, NOW, CONFIG), OK, NOW)
    assert made is not None
    assert made.reservation == (Assignment("n0", (0, 1, 2, 3)), Assignment("n0", (0, 1, 2, 3)))
    assert made.reservation_start == start


def test_a_released_reservation_is_written_at_once_with_an_event() -> None:
    start = NOW.timestamp() + 3600
    held = _plan(
        job(status={"phase": "Queued", "tenant": "t", "reason": "WaitingForCapacity"}),
        _reservation("n0", start),
        start,
    )
    [write] = [a for a in held if isinstance(a, WriteStatus)]
    queued = job(status=write.status.to_k8s())
    actions = _plan(queued, None, start + 7200)
    [write] = [a for a in actions if isinstance(a, WriteStatus)]
    assert write.status.reservation is None
    assert [e.reason for e in actions if isinstance(e, Event)] == ["ReservationReleased"]
    # The first expected start of the wait is kept, to measure it against the real start.
    assert write.status.first_expected_start is not None
    assert write.status.first_expected_start.timestamp() == start


def test_an_expected_start_that_moves_a_little_is_not_rewritten() -> None:
    start = NOW.timestamp() + 3600
    held = _plan(
        job(status={"phase": "Queued", "tenant": "t", "reason": "WaitingForCapacity"}),
        _reservation("n0", start),
        start,
    )
    [write] = [a for a in held if isinstance(a, WriteStatus)]
    queued = job(status=write.status.to_k8s())
    # Two minutes later on an hour's wait: the same news.
    assert _plan(queued, _reservation("n0", start + 120), start + 120) == []
