"""What keeps a preemptor's pods waiting: victims still leaving the GPUs planned for it, and
pods of GpuJobs deleted while their pods still terminate there; never pods that outstayed
their deletion before it was admitted, nor pods on other GPUs."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from gpusched.api import keys
from gpusched.api.gpujob import JobPhase, TopologyScope
from gpusched.core.admission import Admission, CycleResult, ReplicaPlan
from gpusched.core.lifecycle import (
    CreatePod,
    JobContext,
    JobFacts,
    PodFacts,
    Stage,
    Verdict,
    leaving_deadlines,
    leaving_victims,
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
TIMEOUT = CONFIG.pods_ready_timeout  # 300 s


def _victim(due: datetime) -> JobFacts:
    """``ns/train`` preempted by ``ns/urgent``: its two pods, on n0 and n1 GPUs 0-3, deleted
    and due gone at ``due``."""
    status = {
        "phase": "Preempted",
        "admission": 1,
        "tenant": "t",
        "preemptions": [
            {"time": stamp(NOW - timedelta(hours=1)), "preemptor": "ns/urgent", "reason": "x"}
        ],
    }
    facts = job("train", status=status)
    return with_pods(
        facts, *(_planned(pod(facts, r, node=n, deleting=True, due=due), n) for r, n in _NODES)
    )


_NODES = ((0, "n0"), (1, "n1"))


def _planned(facts: PodFacts, node: str) -> PodFacts:
    """The pod with the plan the operator writes on it: ``node``, GPUs 0-3."""
    planned = {keys.ANNOTATION_PLANNED_NODE: node, keys.ANNOTATION_PLANNED_GPU_INDICES: "0,1,2,3"}
    return replace(facts, annotations={**facts.annotations, **planned})


def _urgent(status: dict[str, object]) -> JobFacts:
    return job("urgent", status=status)


def _leaving(*jobs: JobFacts) -> dict[str, list[str]]:
    return leaving_victims(jobs, now=NOW, stuck_after=TIMEOUT)


def test_a_preemptor_admitted_after_its_victims_outstayed_their_deletion_does_not_wait() -> None:
    """Victims' pods due gone 400 s ago outstay by 100 s: the preemptor admitted before that
    still waits (and settling releases it); queued again, or admitted again after it, it does
    not, and its new pods are created."""
    stuck = _victim(NOW - timedelta(seconds=TIMEOUT + 100))
    due = NOW - timedelta(seconds=TIMEOUT + 100)
    first = _urgent(admitted_status(admitted_at=NOW - timedelta(seconds=600)))
    leaving = _leaving(stuck, first)
    assert leaving == {"ns/urgent": ["ns/train"]}
    assert leaving_deadlines(leaving, {"ns/train": stuck}) == {"ns/urgent": due}
    released = settle(first, replace(OK, leaving=True, leaving_until=due), NOW, CONFIG)
    assert (released.status.phase, released.requeued) == (JobPhase.QUEUED, "PodsReadyTimeout")
    queued = _urgent({"phase": "Queued", "tenant": "t", "admission": 1})
    assert _leaving(stuck, queued) == {}
    again = _urgent(admitted_status(2, admitted_at=NOW - timedelta(seconds=10)))
    assert _leaving(stuck, again) == {}
    done = settle(again, replace(OK, leaving=bool(_leaving(stuck, again))), NOW, CONFIG)
    assert (done.status.phase, done.requeued) == (JobPhase.ADMITTED, None)
    created = [a.manifest["metadata"]["name"] for a in done.actions if isinstance(a, CreatePod)]
    assert created == ["urgent-2-0", "urgent-2-1"]


def test_victims_count_for_a_preemptor_only_on_the_gpus_planned_for_it() -> None:
    """Within their grace period, victims on n0/n1 GPUs 0-3 keep a preemptor planned there
    waiting, not one planned on n0 GPUs 4-7 and n2."""
    leaving = _victim(NOW + timedelta(seconds=30))
    there = _urgent(admitted_status())
    assert _leaving(leaving, there) == {"ns/urgent": ["ns/train"]}
    status = admitted_status(admitted_at=NOW - timedelta(seconds=10))
    status["placement"] = [
        {"replica": 0, "node": "n0", "gpuIndices": [4, 5, 6, 7]},
        {"replica": 1, "node": "n2", "gpuIndices": [0, 1, 2, 3]},
    ]
    assert _leaving(leaving, _urgent(status)) == {}


def _plan_for(urgent: JobFacts, victim: JobFacts, placed: Admission) -> list[Stage]:
    """The stages of the queued ``urgent``'s admission, its victims still leaving."""
    jobs = {j.key: j for j in (urgent, victim)}
    settled = {k: settle(j, OK, NOW, CONFIG) for k, j in jobs.items()}
    result = CycleResult(admissions=(placed,), waiting=(), tenants=())
    planned = plan(jobs, settled, result, NOW, leaving=_leaving(urgent, victim))
    [group] = planned.groups
    return [step.stage for step in group.steps]


def test_an_admission_on_free_gpus_creates_its_pods_while_victims_leave_others() -> None:
    """Queued again while its victims leave n0/n1 GPUs 0-3 (within their grace period): an
    admission there waits for them, one on n2 and n3 creates its pods at once."""
    urgent = _urgent({"phase": "Queued", "tenant": "t", "admission": 1})
    victim = _victim(NOW + timedelta(seconds=30))
    on_victims = replace(admission("ns/urgent"), placement=_plans("n0", "n1"))
    assert Stage.CREATE_PODS not in _plan_for(urgent, victim, on_victims)
    elsewhere = replace(on_victims, placement=_plans("n2", "n3"))
    assert Stage.CREATE_PODS in _plan_for(urgent, victim, elsewhere)


def _plans(*nodes: str) -> tuple[ReplicaPlan, ...]:
    return tuple(
        ReplicaPlan(r, n, (0, 1, 2, 3), TopologyScope.NVLINK, 90.0) for r, n in enumerate(nodes)
    )


def _orphan(due: datetime | None) -> PodFacts:
    """A pod of ``ns/train``, a GpuJob deleted since, on n0 GPUs 0-3 (deleted, due gone at
    ``due``; None: not deleted yet)."""
    gone = job("train")
    facts = pod(gone, 0, deleting=due is not None, due=due or NOW)
    return _planned(facts, "n0")


def test_pods_of_a_deleted_job_on_a_preemptors_gpus_keep_it_waiting_until_they_outstay() -> None:
    """The victim's GpuJob deleted mid-preemption: its pod still terminating on n0 GPUs 0-3
    (due gone 600 s from now) keeps the preemptor planned there from creating its pods, until
    the pods-ready timeout after that; a job planned on other GPUs does not wait."""
    due = NOW + timedelta(seconds=600)
    waiting = _urgent(
        admitted_status(reason="WaitingForPreemption", admitted_at=NOW - timedelta(seconds=5))
    )
    orphan = _orphan(due)
    leaving = leaving_victims([waiting], [orphan], now=NOW, stuck_after=TIMEOUT)
    assert leaving == {"ns/urgent": ["ns/pod/train-1-0"]}
    assert leaving_deadlines(leaving, {}, [orphan]) == {"ns/urgent": due}
    context = replace(OK, leaving=True, leaving_until=due)
    held = settle(waiting, context, NOW, CONFIG)
    assert (held.status.phase, held.wake_at) == (JobPhase.ADMITTED, due + timedelta(seconds=300))
    assert not [a for a in held.actions if isinstance(a, CreatePod)]
    late = due + timedelta(seconds=TIMEOUT + 1)
    released = settle(waiting, context, late, CONFIG)
    assert (released.status.phase, released.requeued) == (JobPhase.QUEUED, "PodsReadyTimeout")

    elsewhere = _urgent(admitted_status(nodes=("n2", "n3")))
    assert leaving_victims([elsewhere], [orphan], now=NOW, stuck_after=TIMEOUT) == {}
    not_deleted = _orphan(None)
    assert leaving_victims([waiting], [not_deleted]) == {"ns/urgent": ["ns/pod/train-1-0"]}
    assert leaving_deadlines({"ns/urgent": ["ns/pod/train-1-0"]}, {}, [not_deleted]) == {
        "ns/urgent": None
    }
    # The same pod while its job is there is that job's, not an orphan.
    assert leaving_victims([waiting, with_pods(job("train"), orphan)], [orphan]) == {}
