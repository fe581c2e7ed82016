"""``plan``: the ordered, conditional writes that carry out one cycle's decisions."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from gpusched.api import keys
from gpusched.api.gpujob import JobPhase
from gpusched.core.admission import (
    Admission,
    CycleResult,
    Preemption,
    PreemptReason,
    Waiting,
    WaitReason,
)
from gpusched.core.lifecycle import (
    CreatePod,
    DeletePod,
    Event,
    JobContext,
    JobFacts,
    PatchPod,
    Protection,
    Refresh,
    Stage,
    Urgency,
    Verdict,
    WriteStatus,
    plan,
    settle,
)
from tests.unit.core.lifecycle_testdata import (
    CONFIG,
    NOW,
    admission,
    admitted_status,
    job,
    pod,
    stamp,
    with_pods,
)

OK = JobContext(tenant="t", verdict=Verdict())


def _settled(*jobs: JobFacts) -> tuple[dict[str, JobFacts], dict]:  # type: ignore[type-arg]
    by_key = {j.key: j for j in jobs}
    return by_key, {k: settle(j, OK, NOW, CONFIG) for k, j in by_key.items()}


def _result(*admissions: Admission, waiting: tuple[Waiting, ...] = ()) -> CycleResult:
    return CycleResult(admissions=admissions, waiting=waiting, tenants=())


def test_admission_writes_the_plan_conditionally_then_creates_the_gang() -> None:
    queued = job(status={"phase": "Queued", "tenant": "t"}, version=42)
    jobs, settled = _settled(queued)
    planned = plan(jobs, settled, _result(admission("ns/train")), NOW)
    [group] = planned.groups
    assert [s.stage for s in group.steps] == [Stage.ADMIT, Stage.CREATE_PODS, Stage.PODS]
    [write] = group.steps[0].actions
    assert isinstance(write, WriteStatus)
    assert write.resource_version == "42"  # only if nobody changed the job since the read
    assert write.uid == "uid-train"
    assert write.status.phase is JobPhase.ADMITTED
    assert write.status.admission == 1
    assert write.patch["placement"][1] == {
        "replica": 1,
        "node": "n1",
        "gpuIndices": [4, 5, 6, 7],
        "gpuUuids": [],
        "topologyClass": "nvlink",
        "score": 90.0,
    }
    creates = group.steps[1].actions
    assert [c.name for c in creates if isinstance(c, CreatePod)] == ["train-1-0", "train-1-1"]
    assert group.steps[1].required
    assert [e.reason for e in group.steps[2].actions if isinstance(e, Event)] == ["Admitted"]
    assert planned.admitted[0].job == "ns/train"


def test_preemption_marks_victims_first_then_evicts_then_admits_without_pods() -> None:
    winner = job("urgent", status={"phase": "Queued", "tenant": "t"}, version=7)
    running = admitted_status(phase="Running", startedAt=stamp(NOW - timedelta(hours=1)))
    victim = job("sweep", status=running, version=9)
    victim = with_pods(victim, pod(victim, 0), pod(victim, 1, node="n1"))
    jobs, settled = _settled(winner, victim)
    preemption = Preemption(
        "ns/sweep", "t", "ns/urgent", PreemptReason.HIGHER_PRIORITY, "why", 8, 100.0
    )
    [group] = plan(jobs, settled, _result(admission("ns/urgent", (preemption,))), NOW).groups
    assert group.jobs == {"ns/urgent", "ns/sweep"}
    stages = [s.stage for s in group.steps]
    assert stages == [Stage.MARK_VICTIMS, Stage.EVICT, Stage.ADMIT, Stage.PODS]
    [mark] = group.steps[0].actions
    assert isinstance(mark, WriteStatus)
    assert (mark.key, mark.resource_version) == ("ns/sweep", "9")
    assert mark.status.phase is JobPhase.PREEMPTED
    assert mark.status.preemptions[-1].preemptor == "ns/urgent"
    evict = group.steps[1].actions
    deletes = [a for a in evict if isinstance(a, DeletePod)]
    assert {(d.name, d.grace_seconds, d.uid) for d in deletes} == {
        ("sweep-1-0", 30, "pod-sweep-1-0"),
        ("sweep-1-1", 30, "pod-sweep-1-1"),
    }
    notes = [a for a in evict if isinstance(a, PatchPod)]
    assert {n.annotations[keys.ANNOTATION_PREEMPTED_BY] for n in notes} == {"ns/urgent"}
    assert not group.steps[1].required  # evictions finish on the next cycle if cut short
    [admit] = group.steps[2].actions
    assert isinstance(admit, WriteStatus)
    assert admit.resource_version == "7"
    assert admit.status.reason == "WaitingForPreemption"


def test_no_pods_while_the_victims_of_an_earlier_preemption_still_leave() -> None:
    jobs, settled = _settled(job(status={"phase": "Queued", "tenant": "t"}))
    planned = plan(
        jobs, settled, _result(admission("ns/train")), NOW, leaving={"ns/train": ["ns/old"]}
    )
    [group] = planned.groups
    assert Stage.CREATE_PODS not in [s.stage for s in group.steps]


def test_nothing_is_planned_for_a_job_whose_writes_are_in_flight() -> None:
    jobs, settled = _settled(job(status={"phase": "Queued", "tenant": "t"}))
    planned = plan(jobs, settled, _result(admission("ns/train")), NOW, busy={"ns/train"})
    assert planned.groups == ()
    assert planned.admitted == ()


def test_a_new_reason_is_written_at_once_with_an_event() -> None:
    queued = job(status={"phase": "Queued", "tenant": "t", "reason": "Queued", "message": "x"})
    jobs, settled = _settled(queued)
    wait = Waiting("ns/train", None, WaitReason.NO_TENANT, "no TenantQuota owns ns", 1)
    [group] = plan(jobs, settled, _result(waiting=(wait,)), NOW).groups
    write, event = group.actions()
    assert isinstance(write, WriteStatus)
    assert write.patch["reason"] == "NoTenant"
    assert isinstance(event, Event)
    assert (event.reason, event.warning) == ("NoTenant", True)


def test_a_moved_queue_position_is_rewritten_only_as_the_refresh_allows() -> None:
    status = {
        "phase": "Queued",
        "tenant": "t",
        "reason": "WaitingForCapacity",
        "message": "needs 8 GPUs",
        "queuePosition": 3,
    }
    jobs, settled = _settled(job(status=status))
    same = Waiting("ns/train", "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 3)
    assert plan(jobs, settled, _result(waiting=(same,)), NOW).groups == ()
    moved = Waiting("ns/train", "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 2)
    [group] = plan(jobs, settled, _result(waiting=(moved,)), NOW).groups
    [write] = group.actions()
    assert isinstance(write, WriteStatus)
    assert write.patch["queuePosition"] == 2
    lately = Refresh(recent={"ns/train"})
    assert plan(jobs, settled, _result(waiting=(moved,)), NOW, refresh=lately).groups == ()
    spent = Refresh(budget=0)
    assert plan(jobs, settled, _result(waiting=(moved,)), NOW, refresh=spent).groups == ()
    # A new reason is written whatever the refresh says.
    other = Waiting("ns/train", "t", WaitReason.QUOTA_EXCEEDED, "over the limit", 2)
    [group] = plan(jobs, settled, _result(waiting=(other,)), NOW, refresh=spent).groups
    assert group.actions()[0].patch["reason"] == "QuotaExceeded"  # type: ignore[union-attr]


def test_settled_changes_are_one_write_followed_by_their_pod_operations() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    facts = with_pods(facts, pod(facts, 0))  # the gang lost a pod
    jobs, settled = _settled(facts)
    [group] = plan(jobs, settled, _result(), NOW).groups
    assert [s.stage for s in group.steps] == [Stage.SETTLE, Stage.PODS]
    [write] = group.steps[0].actions
    assert isinstance(write, WriteStatus)
    assert write.resource_version is None  # not a decision on what others may change
    assert write.patch["reason"] == "PodsLost"
    assert [type(a) for a in group.steps[1].actions] == [DeletePod, Event]


def test_urgency_puts_decisions_first_and_waiting_jobs_reports_last() -> None:
    """The executor holds back reports under load, so only a waiting job's own status and
    events may be one: an admission, a preemption, a released gang's requeue (its pods to
    delete) and a new job going from nothing to Queued each keep their place."""
    winner = job("urgent", status={"phase": "Queued", "tenant": "t"}, version=7)
    running = admitted_status(phase="Running", startedAt=stamp(NOW - timedelta(hours=1)))
    victim = with_pods(job("sweep", status=running), pod(job("sweep", status=running), 0))
    new = job("new")
    waits = job("waits", status={"phase": "Queued", "tenant": "t", "reason": "Queued"})
    lost = job("lost", status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    lost = with_pods(lost, pod(lost, 0))  # the gang lost a pod: released and requeued
    jobs, settled = _settled(winner, victim, new, waits, lost)
    preemption = Preemption(
        "ns/sweep", "t", "ns/urgent", PreemptReason.HIGHER_PRIORITY, "why", 8, 100.0
    )
    waiting = tuple(
        Waiting(key, "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 1)
        for key in ("ns/new", "ns/waits")
    )
    planned = plan(
        jobs, settled, _result(admission("ns/urgent", (preemption,)), waiting=waiting), NOW
    )
    urgency = {min(g.jobs): g.urgency for g in planned.groups}
    assert urgency == {
        "ns/sweep": Urgency.DECIDE,  # the preemption's group: victim and preemptor
        "ns/new": Urgency.REPORT,
        "ns/waits": Urgency.REPORT,
        "ns/lost": Urgency.SETTLE,
    }

    # A waiting job's group that also deletes pods is never held back as a report.
    leftover = DeletePod("ns", "waits-1-0", "pod-waits-1-0", 0)
    settled["ns/waits"] = replace(settled["ns/waits"], actions=(leftover,))
    planned = plan(jobs, settled, _result(waiting=waiting), NOW)
    urgency = {min(g.jobs): g.urgency for g in planned.groups}
    assert urgency["ns/waits"] is Urgency.SETTLE
    assert urgency["ns/new"] is Urgency.REPORT


def test_reports_beyond_the_cycles_room_wait_for_a_later_cycle_and_decisions_never_do() -> None:
    """Only waiting jobs' reports are bounded; the ones held back are counted, planned again
    once there is room, and leave their jobs free to be admitted."""
    winner = job("urgent", status={"phase": "Queued", "tenant": "t"}, version=7)
    lost = job("lost", status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    lost = with_pods(lost, pod(lost, 0))  # released and requeued: its pods to delete
    new = [job(f"new{i}") for i in range(3)]
    jobs, settled = _settled(winner, lost, *new)
    waiting = tuple(
        Waiting(j.key, "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 1) for j in new
    )
    result = _result(admission("ns/urgent"), waiting=waiting)
    planned = plan(jobs, settled, result, NOW, refresh=Refresh(reports=1))
    assert sorted(min(g.jobs) for g in planned.groups) == ["ns/lost", "ns/new0", "ns/urgent"]
    assert planned.deferred_reports == 2
    planned = plan(jobs, settled, result, NOW, refresh=Refresh(reports=0))
    assert sorted(min(g.jobs) for g in planned.groups) == ["ns/lost", "ns/urgent"]
    assert planned.deferred_reports == 3
    planned = plan(jobs, settled, result, NOW)
    assert len(planned.groups) == 5
    assert planned.deferred_reports == 0


def test_with_room_for_few_reports_jobs_not_written_lately_go_first() -> None:
    """A job whose reason moves every cycle (written lately) never keeps a new job from its
    first status."""
    flaps = job("flaps", status={"phase": "Queued", "tenant": "t", "reason": "QuotaExceeded"})
    jobs, settled = _settled(flaps, job("new"))
    waiting = tuple(
        Waiting(key, "t", WaitReason.WAITING_FOR_CAPACITY, "needs 8 GPUs", 1)
        for key in ("ns/flaps", "ns/new")
    )
    lately = Refresh(recent={"ns/flaps"}, reports=1)
    planned = plan(jobs, settled, _result(waiting=waiting), NOW, refresh=lately)
    assert [min(g.jobs) for g in planned.groups] == ["ns/new"]
    assert planned.deferred_reports == 1
    planned = plan(jobs, settled, _result(waiting=waiting), NOW, refresh=Refresh(reports=1))
    assert [min(g.jobs) for g in planned.groups] == ["ns/flaps"]


#: A template asking for a year's grace, in a job stored before the CRD refused it.
_LINGERING = {
    "spec": {
        "terminationGracePeriodSeconds": 365 * 86400,
        "containers": [{"name": "main", "image": "img"}],
    }
}


def test_the_gangs_pods_get_the_jobs_grace_period_as_its_tenant_caps_it() -> None:
    """Not the template's: a pod that ignores SIGTERM would otherwise hold its GPUs for as long
    as it asked once its job is deleted, when nothing charges them to the tenant any more."""
    queued = job(
        status={"phase": "Queued", "tenant": "t"},
        checkpointGracePeriodSeconds=7200,
        template=_LINGERING,
    )
    jobs, settled = _settled(queued)
    planned = plan(
        jobs,
        settled,
        _result(admission("ns/train")),
        NOW,
        protections={"ns/train": Protection(max_grace=600)},
    )
    creates = [a for g in planned.groups for s in g.steps for a in s.actions]
    graces = {
        c.manifest["spec"]["terminationGracePeriodSeconds"]
        for c in creates
        if isinstance(c, CreatePod)
    }
    assert graces == {600}
