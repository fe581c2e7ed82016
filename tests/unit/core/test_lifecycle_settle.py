"""``settle``: a job's lifecycle between cycles, transition by transition, failures included."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import JobPhase
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.admission import Assignment, JobState
from gpusched.core.lifecycle import (
    CreatePod,
    DeletePod,
    Event,
    JobContext,
    JobFacts,
    PatchPod,
    Protection,
    Refusal,
    Verdict,
    class_not_allowed,
    gone_by,
    leaving_deadlines,
    settle,
)
from tests.unit.core.lifecycle_testdata import (
    CONFIG,
    NOW,
    admitted_status,
    condition,
    job,
    pod,
    stamp,
    with_pods,
)

OK = JobContext(tenant="t", verdict=Verdict())


def _of(actions: tuple[object, ...], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


# --- new jobs -------------------------------------------------------------------------------


def test_new_job_waits_for_the_dry_run_of_its_pod() -> None:
    facts = job()
    done = settle(facts, JobContext(tenant="t"), NOW, CONFIG)
    assert done.needs_verdict
    assert done.state is None
    assert done.status is facts.status
    assert done.actions == ()


def test_new_job_with_a_valid_pod_is_queued_with_its_tenant_and_size() -> None:
    done = settle(job(), OK, NOW, CONFIG)
    assert done.state is JobState.QUEUED
    s = done.status
    assert (s.phase, s.tenant, s.gpus, s.submitted_at) == (JobPhase.QUEUED, "t", 8, NOW)
    assert condition(s, "QuotaReserved") == ("False", "Queued")


def test_new_job_whose_pod_the_server_refuses_fails_with_its_message() -> None:
    context = JobContext(tenant="t", verdict=Verdict("spec.restartPolicy: Unsupported value"))
    done = settle(job(), context, NOW, CONFIG)
    assert done.state is None
    assert done.status.phase is JobPhase.FAILED
    assert done.status.reason == "InvalidPodTemplate"
    assert "spec.restartPolicy: Unsupported value" in (done.status.message or "")
    [event] = _of(done.actions, Event)
    assert (event.reason, event.warning) == ("InvalidPodTemplate", True)


def test_job_naming_a_missing_priority_class_fails_without_a_dry_run() -> None:
    facts = job(priorityClassName="urgent")
    done = settle(facts, JobContext(tenant="t", priority_class_missing=True), NOW, CONFIG)
    assert done.status.reason == "PriorityClassNotFound"
    assert not done.needs_verdict
    # Named as apply names it: the field, the class, and where to look.
    assert done.status.message == (
        "spec.priorityClassName: PriorityClass 'urgent' does not exist "
        "(kubectl get priorityclasses lists those that do)"
    )


def test_a_class_its_tenant_does_not_allow_is_named_with_both_fields() -> None:
    quota = TenantQuota.model_validate(
        {
            "metadata": {"name": "t"},
            "spec": {"namespaces": ["ns"], "allowedPriorityClasses": ["low", "mid"]},
        }
    )
    assert class_not_allowed(quota, "high") == (
        "spec.priorityClassName: tenant t allows low, mid, not high "
        "(its spec.allowedPriorityClasses)"
    )


def test_invalid_job_is_checked_again_only_when_its_spec_changes() -> None:
    failed = {"phase": "Failed", "reason": "InvalidPodTemplate", "observedGeneration": 1}
    same = settle(job(status=failed, generation=1), OK, NOW, CONFIG)
    assert same.state is None
    assert same.status.phase is JobPhase.FAILED
    edited = job(status=failed, generation=2)
    assert settle(edited, JobContext(tenant="t"), NOW, CONFIG).needs_verdict
    fixed = settle(edited, OK, NOW, CONFIG)
    assert (fixed.state, fixed.status.phase) == (JobState.QUEUED, JobPhase.QUEUED)


def test_job_waiting_for_a_priority_class_is_queued_once_it_exists() -> None:
    missing = {"phase": "Failed", "reason": "PriorityClassNotFound", "observedGeneration": 1}
    facts = job(status=missing, priorityClassName="urgent")
    done = settle(facts, JobContext(tenant="t", priority=5, verdict=Verdict()), NOW, CONFIG)
    assert done.state is JobState.QUEUED


def test_unreadable_job_takes_no_part() -> None:
    facts = job()
    broken = type(facts)(**{**facts.__dict__, "job": None, "error": "spec: invalid"})
    assert settle(broken, OK, NOW, CONFIG).state is None


# --- admitted jobs --------------------------------------------------------------------------


def test_admitted_job_missing_pods_creates_exactly_those_on_its_plan() -> None:
    facts = job(status=admitted_status())
    facts = with_pods(facts, pod(facts, 0, phase="Pending"))
    done = settle(facts, OK, NOW, CONFIG)
    assert done.state is JobState.ADMITTED
    [create] = _of(done.actions, CreatePod)
    assert create.name == "train-1-1"
    assert create.manifest["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "n1"
    assert create.manifest["metadata"]["labels"][keys.LABEL_TENANT] == "t"
    assert done.placement == (Assignment("n0", (0, 1, 2, 3)), Assignment("n1", (0, 1, 2, 3)))


def test_missing_pods_get_the_jobs_grace_period_as_its_tenant_caps_it() -> None:
    template = {
        "spec": {
            "terminationGracePeriodSeconds": 365 * 86400,
            "containers": [{"name": "main", "image": "img"}],
        }
    }
    facts = job(status=admitted_status(), checkpointGracePeriodSeconds=7200, template=template)
    facts = with_pods(facts, pod(facts, 0, phase="Pending"))
    context = JobContext(tenant="t", verdict=Verdict(), protection=Protection(max_grace=600))
    [create] = _of(settle(facts, context, NOW, CONFIG).actions, CreatePod)
    assert create.manifest["spec"]["terminationGracePeriodSeconds"] == 600


def test_admitted_job_waits_while_the_victims_of_its_preemption_leave() -> None:
    status = admitted_status()
    status["conditions"][1] = {**status["conditions"][1], "status": "False"}
    facts = job(status=status)
    waiting = settle(facts, JobContext(tenant="t", leaving=True), NOW, CONFIG)
    assert waiting.state is JobState.ADMITTED
    assert waiting.actions == ()
    done = settle(facts, OK, NOW, CONFIG)
    assert len(_of(done.actions, CreatePod)) == 2
    assert condition(done.status, "Admitted") == ("True", "Placed")


def test_gang_all_running_records_the_gpus_the_extender_bound() -> None:
    facts = job(status=admitted_status())
    bound = {
        keys.ANNOTATION_GPU_INDICES: "4,5,6,7",
        keys.ANNOTATION_GPUS: "GPU-a,GPU-b,GPU-c,GPU-d",
        keys.ANNOTATION_TOPOLOGY_CLASS: "nvlink",
    }
    facts = with_pods(
        facts,
        pod(facts, 0, node="n0", annotations=bound),
        pod(facts, 1, node="n1", annotations=bound),
    )
    done = settle(facts, OK, NOW, CONFIG)
    s = done.status
    assert (s.phase, s.started_at, s.placement_quality) == (JobPhase.RUNNING, NOW, "nvlink")
    assert s.placement[0].gpu_indices == [4, 5, 6, 7]
    assert condition(s, "PodsReady") == ("True", "Running")
    assert done.placement[0] == Assignment("n0", (4, 5, 6, 7))
    assert done.actions == ()  # routine starts are in the status, not in events


def test_failed_pod_fails_the_job_and_releases_the_gang() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    facts = with_pods(facts, pod(facts, 0, phase="Failed", exit_code=3), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    assert done.state is JobState.TERMINATING  # its other pod still holds GPUs
    assert (done.status.phase, done.status.reason) == (JobPhase.FAILED, "PodFailed")
    assert "exited with code 3" in (done.status.message or "")
    assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-1"]
    assert condition(done.status, "Finished") == ("True", "PodFailed")


def test_all_pods_succeeded_is_success_and_meters_the_run() -> None:
    started = NOW - timedelta(seconds=100)
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(started)))
    facts = with_pods(facts, pod(facts, 0, phase="Succeeded"), pod(facts, 1, phase="Succeeded"))
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.finished_at) == (JobPhase.SUCCEEDED, NOW)
    assert done.status.gpu_seconds == 800.0
    assert done.state is None


def test_a_gang_whose_first_replica_finished_before_the_last_ran_is_running() -> None:
    """Replica 0 succeeded while replica 1 was still starting: the gang ran, it is not
    released at the pods-ready timeout."""
    facts = job(status=admitted_status())
    early = NOW - timedelta(seconds=400)  # past the 300 s pods-ready timeout
    facts = with_pods(
        facts,
        pod(facts, 0, phase="Succeeded", created=early),
        pod(facts, 1, created=early),
    )
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.started_at) == (JobPhase.RUNNING, NOW)
    assert done.requeued is None
    assert _of(done.actions, DeletePod) == []


def test_a_gang_that_ended_between_two_cycles_is_metered_from_its_pods_creation() -> None:
    facts = job(status=admitted_status())
    created = NOW - timedelta(seconds=100)
    facts = with_pods(
        facts,
        pod(facts, 0, phase="Succeeded", created=created),
        pod(facts, 1, phase="Succeeded", created=created + timedelta(seconds=5)),
    )
    done = settle(facts, OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.SUCCEEDED
    assert done.status.gpu_seconds == 800.0  # 2 replicas x 4 GPUs x 100 s
    failing = with_pods(
        facts,
        pod(facts, 0, phase="Failed", exit_code=1, created=created),
        pod(facts, 1, phase="Pending", created=created),
    )
    failed = settle(failing, OK, NOW, CONFIG)
    assert failed.status.phase is JobPhase.FAILED
    assert failed.status.gpu_seconds == 800.0


def test_running_gang_that_lost_a_pod_is_released_and_requeued() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    facts = with_pods(facts, pod(facts, 0))
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.reason) == (JobPhase.QUEUED, "PodsLost")
    assert done.requeued == "PodsLost"
    [delete] = _of(done.actions, DeletePod)
    assert (delete.name, delete.grace_seconds) == ("train-1-0", 30)
    assert done.state is JobState.TERMINATING  # its pod still holds GPUs
    assert done.placement == (Assignment("n0", (), 4),)


def test_gang_not_running_in_time_is_released_with_backoff() -> None:
    facts = job(status=admitted_status(requeueCount=2))
    created = NOW - timedelta(seconds=301)
    facts = with_pods(
        facts, pod(facts, 0, phase="Pending", node=None, created=created), pod(facts, 1)
    )
    done = settle(facts, OK, NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason, s.requeue_count) == (JobPhase.QUEUED, "PodsReadyTimeout", 3)
    assert s.requeue_at == NOW + timedelta(seconds=40)  # 10 s doubled twice
    assert not s.placement
    assert {d.grace_seconds for d in _of(done.actions, DeletePod)} == {0}
    assert condition(s, "PodsReady") == ("False", "PodsReadyTimeout")


def test_a_gang_released_for_a_pod_that_cannot_pull_its_image_says_so() -> None:
    # The released pods go, and `kubectl describe pod` with them: the release keeps their word.
    facts = job(status=admitted_status())
    created = NOW - timedelta(seconds=301)
    image = {
        "containerStatuses": [
            {
                "name": "main",
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "busybx"',
                    }
                },
            }
        ]
    }
    facts = with_pods(
        facts,
        pod(facts, 0, created=created),
        pod(facts, 1, phase="Pending", created=created, status_extra=image),
    )
    done = settle(facts, OK, NOW, CONFIG)
    said = 'pod train-1-1: container main: ImagePullBackOff: Back-off pulling image "busybx"'
    assert done.status.reason == "PodsReadyTimeout"
    assert said in (done.status.message or "")
    [event] = _of(done.actions, Event)
    assert said in event.message


def _unready(facts: JobFacts, status_extra: dict[str, Any]) -> JobFacts:
    """``facts`` with its second pod waiting past the pods-ready timeout as ``status_extra``
    says, its first running."""
    created = NOW - timedelta(seconds=301)
    return with_pods(
        facts,
        pod(facts, 0, created=created),
        pod(facts, 1, phase="Pending", created=created, status_extra=status_extra),
    )


IMAGE_PULL = {
    "containerStatuses": [
        {
            "name": "main",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "busybx: not found"}},
        }
    ]
}
UNSCHEDULABLE = {
    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
}


def test_releases_on_the_jobs_own_containers_fail_it_at_the_bound() -> None:
    # Each attempt holds the gang's GPUs (and may evict others) for the whole timeout, only
    # to meet the same image again: the fifth such release is the last.
    limit = CONFIG.max_unready_releases
    assert limit == 5
    before = _unready(job(status=admitted_status(unreadyReleases=limit - 2)), IMAGE_PULL)
    once_more = settle(before, OK, NOW, CONFIG).status
    assert (once_more.phase, once_more.unready_releases) == (JobPhase.QUEUED, limit - 1)
    assert f"({limit - 1} of at most {limit} for its own containers)" in (once_more.message or "")

    last = _unready(job(status=admitted_status(unreadyReleases=limit - 1)), IMAGE_PULL)
    done = settle(last, OK, NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason, s.unready_releases) == (JobPhase.FAILED, "PodsReadyTimeout", limit)
    assert "ImagePullBackOff: busybx: not found" in (s.message or "")
    assert "giving up" in (s.message or "")
    assert done.requeued is None
    assert {d.name for d in _of(done.actions, DeletePod)} == {"train-1-0", "train-1-1"}
    [event] = _of(done.actions, Event)
    assert (event.reason, event.warning) == ("PodsReadyTimeout", True)
    # Its pods go, but hold their GPUs until they are gone, as after every other release.
    assert done.state is JobState.TERMINATING
    assert {a.node for a in done.placement} == {"n0"}
    assert done.placement == settle(before, OK, NOW, CONFIG).placement


def test_releases_for_the_clusters_reasons_never_count_toward_failing() -> None:
    # A pod no node could take is the cluster's doing: released and queued, however often.
    facts = _unready(job(status=admitted_status(unreadyReleases=4)), UNSCHEDULABLE)
    s = settle(facts, OK, NOW, CONFIG).status
    assert (s.phase, s.reason, s.unready_releases) == (JobPhase.QUEUED, "PodsReadyTimeout", 4)
    assert "of at most" not in (s.message or "")


def test_without_a_bound_releases_on_own_containers_go_on() -> None:
    unbounded = replace(CONFIG, max_unready_releases=0)
    facts = _unready(job(status=admitted_status(unreadyReleases=99)), IMAGE_PULL)
    s = settle(facts, OK, NOW, unbounded).status
    assert (s.phase, s.unready_releases) == (JobPhase.QUEUED, 100)


def test_a_gang_that_runs_forgets_earlier_releases_on_its_containers() -> None:
    facts = job(status=admitted_status(unreadyReleases=4))
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.unready_releases) == (JobPhase.RUNNING, 0)


def test_a_gang_released_for_an_unschedulable_pod_quotes_the_scheduler() -> None:
    facts = job(status=admitted_status())
    created = NOW - timedelta(seconds=301)
    unscheduled = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) had untolerated taint",
            }
        ]
    }
    facts = with_pods(
        facts, pod(facts, 0, phase="Pending", node=None, created=created, status_extra=unscheduled)
    )
    done = settle(facts, OK, NOW, CONFIG)
    assert (
        "(pod train-1-0: not scheduled: Unschedulable: 0/3 nodes are available: 3 node(s) had "
        "untolerated taint)" in (done.status.message or "")
    )


def test_gang_still_starting_wakes_the_loop_at_its_deadline() -> None:
    facts = job(status=admitted_status())
    created = NOW - timedelta(seconds=100)
    facts = with_pods(facts, pod(facts, 0, phase="Pending", created=created), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    assert done.state is JobState.ADMITTED
    assert done.wake_at == created + timedelta(seconds=300)


def test_pods_refused_as_invalid_fail_the_job_with_the_servers_reason() -> None:
    facts = job(status=admitted_status())
    facts = with_pods(facts, pod(facts, 0, phase="Pending"))
    refusal = Refusal(1, 422, "denied by policy: team blocked")
    done = settle(facts, JobContext(tenant="t", refusal=refusal), NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason) == (JobPhase.FAILED, "InvalidPodTemplate")
    assert "denied by policy: team blocked" in (s.message or "")
    assert condition(s, "PodsReady") == ("False", "PodsRefused")
    assert condition(s, "QuotaReserved") == ("False", "InvalidPodTemplate")
    assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-0"]
    assert done.state is JobState.TERMINATING  # until its accepted pod is gone


def test_pods_refused_for_now_release_the_job_at_once_with_backoff() -> None:
    facts = job(status=admitted_status())
    refusal = Refusal(1, 403, "exceeded quota: no-gpus")
    done = settle(facts, JobContext(tenant="t", refusal=refusal), NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason, s.requeue_at) == (
        JobPhase.QUEUED,
        "PodsRefused",
        NOW + timedelta(seconds=10),
    )
    assert "exceeded quota: no-gpus" in (s.message or "")
    assert done.requeued == "PodsRefused"
    assert done.state is None  # no pod holds anything


def test_refusal_of_an_earlier_admission_is_ignored() -> None:
    facts = job(status=admitted_status(admission=2))
    refusal = Refusal(1, 422, "old")
    done = settle(facts, JobContext(tenant="t", refusal=refusal), NOW, CONFIG)
    assert done.state is JobState.ADMITTED
    assert done.status.phase is JobPhase.ADMITTED


def test_job_whose_namespace_changed_owner_relabels_its_pods() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW), tenant="old"))
    facts = with_pods(facts, pod(facts, 0, tenant="old"), pod(facts, 1, tenant="old"))
    done = settle(facts, JobContext(tenant="new"), NOW, CONFIG)
    assert done.status.tenant == "new"
    patches = _of(done.actions, PatchPod)
    assert {(p.name, p.labels[keys.LABEL_TENANT]) for p in patches} == {
        ("train-1-0", "new"),
        ("train-1-1", "new"),
    }


# --- suspension, preemption, the queue -------------------------------------------------------


def test_suspending_a_running_job_releases_its_pods_with_their_grace_period() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)), suspend=True)
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.reason) == (JobPhase.SUSPENDED, "Suspended")
    assert {d.grace_seconds for d in _of(done.actions, DeletePod)} == {30}
    assert done.state is JobState.TERMINATING
    resumed = job(status={"phase": "Suspended", "admission": 1})
    back = settle(resumed, OK, NOW, CONFIG)
    assert (back.state, back.status.phase) == (JobState.QUEUED, JobPhase.QUEUED)


def test_preempted_job_keeps_its_gpus_for_the_preemptor_until_its_pods_are_gone() -> None:
    status = {
        "phase": "Preempted",
        "admission": 1,
        "preemptions": [{"time": stamp(NOW), "preemptor": "ns/urgent", "reason": "HigherPriority"}],
    }
    facts = job(status=status)
    leaving = with_pods(facts, pod(facts, 0, deleting=True), pod(facts, 1))
    done = settle(leaving, OK, NOW, CONFIG)
    assert (done.state, done.reserved_for) == (JobState.TERMINATING, "ns/urgent")
    assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-1"]  # finish the eviction
    gone = settle(facts, OK, NOW, CONFIG)
    assert (gone.state, gone.status.phase, gone.status.reason) == (
        JobState.QUEUED,
        JobPhase.QUEUED,
        "Requeued",
    )


def test_victims_pods_that_outstay_their_deletion_release_the_preemptor_and_its_gpus() -> None:
    """A victim's pods stuck Terminating (a finalizer, a node that does not answer): once
    the pods-ready timeout has passed after their deletion was due, the preemptor is released
    and queued again, and the stuck pods' GPUs (still held) are no longer kept for it."""
    preemptor = job(status=admitted_status())
    due = NOW - timedelta(seconds=250)
    waiting = settle(preemptor, replace(OK, leaving=True, leaving_until=due), NOW, CONFIG)
    assert (waiting.state, waiting.status.phase) == (JobState.ADMITTED, JobPhase.ADMITTED)
    assert waiting.wake_at == due + timedelta(seconds=300)
    unknown = settle(preemptor, replace(OK, leaving=True), NOW, CONFIG)  # not deleted yet
    assert (unknown.status.phase, unknown.wake_at) == (JobPhase.ADMITTED, None)
    late = NOW - timedelta(seconds=301)
    released = settle(preemptor, replace(OK, leaving=True, leaving_until=late), NOW, CONFIG)
    assert (released.status.phase, released.status.reason) == (JobPhase.QUEUED, "PodsReadyTimeout")
    assert "victims were still there 301s after their grace period ended" in (
        released.status.message or ""
    )

    status = {
        "phase": "Preempted",
        "admission": 1,
        "preemptions": [{"time": stamp(NOW), "preemptor": "ns/urgent", "reason": "HigherPriority"}],
    }
    victim = job(status=status)
    for deleted, kept_for in ((due, "ns/urgent"), (late, None)):
        stuck = with_pods(
            victim,
            pod(victim, 0, deleting=True, due=deleted),
            pod(victim, 1, deleting=True, due=deleted),
        )
        done = settle(stuck, OK, NOW, CONFIG)
        assert (done.state, done.reserved_for) == (JobState.TERMINATING, kept_for)


def test_pods_are_due_gone_at_their_latest_deletion_deadline_once_all_are_deleted() -> None:
    victim = job(status={"phase": "Preempted", "admission": 1})
    early, later = NOW - timedelta(seconds=60), NOW + timedelta(seconds=30)
    both = [pod(victim, 0, deleting=True, due=early), pod(victim, 1, deleting=True, due=later)]
    assert gone_by(both) == later
    assert gone_by([both[0], pod(victim, 1)]) is None  # one not deleted yet
    assert gone_by([both[0], pod(victim, 1, phase="Succeeded")]) == early  # only live pods
    jobs = {"ns/train": with_pods(victim, *both)}
    assert leaving_deadlines({"ns/urgent": ["ns/train"]}, jobs) == {"ns/urgent": later}
    assert leaving_deadlines({"ns/urgent": ["ns/train", "ns/gone"]}, jobs) == {"ns/urgent": None}


def test_queued_job_waits_for_the_pods_of_its_released_gang() -> None:
    facts = job(status={"phase": "Queued", "admission": 1})
    facts = with_pods(facts, pod(facts, 0))
    done = settle(facts, OK, NOW, CONFIG)
    assert done.state is JobState.TERMINATING
    assert [(d.name, d.grace_seconds) for d in _of(done.actions, DeletePod)] == [("train-1-0", 0)]


def test_queued_job_in_backoff_wakes_the_loop_when_it_ends() -> None:
    later = NOW + timedelta(seconds=30)
    facts = job(status={"phase": "Queued", "admission": 1, "requeueAt": stamp(later)})
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.state, done.wake_at) == (JobState.QUEUED, later)


def test_pods_of_earlier_admissions_are_deleted_at_once() -> None:
    facts = job(status=admitted_status(admission=2))
    facts = with_pods(facts, pod(facts, 0, admission=1), pod(facts, 0, admission=2))
    done = settle(facts, OK, NOW, CONFIG)
    assert [(d.name, d.grace_seconds) for d in _of(done.actions, DeletePod)] == [("train-1-0", 0)]


def test_deleted_job_deletes_its_live_pods() -> None:
    facts = job(status=admitted_status(), deleting=True)
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1, phase="Succeeded"))
    done = settle(facts, OK, NOW, CONFIG)
    assert done.state is None
    assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-0"]


def test_finished_job_deletes_pods_left_running() -> None:
    facts = job(status={"phase": "Succeeded", "admission": 1})
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1, deleting=True))
    done = settle(facts, OK, NOW, CONFIG)
    assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-0"]
    assert done.state is JobState.TERMINATING
    assert settle(job(status={"phase": "Succeeded"}), OK, NOW, CONFIG).state is None


# --- a node's kubelet refusing a pod ------------------------------------------------------------


def test_a_pod_the_kubelet_refused_requeues_the_gang_instead_of_failing_it() -> None:
    """An admission refusal by the kubelet (a restart found the pod unadmitted, a device plugin
    refused) is not the workload failing: release, requeue with backoff, say why."""
    facts = job(status=admitted_status())
    facts = with_pods(facts, pod(facts, 0, rejected="UnexpectedAdmissionError"), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason, s.node_rejections) == (JobPhase.QUEUED, "PodsRejectedByNode", 1)
    assert s.requeue_at == NOW + timedelta(seconds=10)
    assert "UnexpectedAdmissionError" in (s.message or "")
    assert "train-1-0" in (s.message or "")
    assert done.requeued == "PodsRejectedByNode"
    assert {d.name for d in _of(done.actions, DeletePod)} == {"train-1-1"}  # the other is done


def test_a_pod_whose_container_ran_and_failed_still_fails_the_job() -> None:
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    facts = with_pods(facts, pod(facts, 0, phase="Failed", exit_code=1), pod(facts, 1))
    assert settle(facts, OK, NOW, CONFIG).status.phase is JobPhase.FAILED


def test_a_pod_the_cluster_stopped_requeues_the_gang_instead_of_failing_it() -> None:
    """A drain or the eviction API (the pod deleted: its container exits on SIGTERM), the
    kubelet's eviction under node pressure, a graceful node shutdown: the work did not fail,
    the gang is released and queued again. A container that failed by itself still fails the
    job (test above)."""
    shutdown = {
        "reason": "Terminated",
        "message": "Pod was terminated in response to imminent node shutdown.",
    }
    marked = {"conditions": [{"type": "DisruptionTarget", "status": "True"}]}
    pressure = {
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
        ],
    }
    for stopped in (
        {"deleting": True},
        {"status_extra": pressure},
        {"status_extra": shutdown},
        {"status_extra": marked},
    ):
        facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
        facts = with_pods(
            facts, pod(facts, 0, phase="Failed", exit_code=143, **stopped), pod(facts, 1)
        )
        done = settle(facts, OK, NOW, CONFIG)
        assert (done.status.phase, done.status.reason) == (JobPhase.QUEUED, "PodsLost"), stopped
        assert done.requeued == "PodsLost"
        assert "train-1-0 was stopped on n0" in (done.status.message or "")
        assert [d.name for d in _of(done.actions, DeletePod)] == ["train-1-1"]


def test_a_pod_evicted_for_outgrowing_its_own_storage_limit_fails_the_job() -> None:
    """The kubelet evicts a pod past its own ephemeral-storage or emptyDir limit with reason
    ``Evicted`` but no ``DisruptionTarget`` condition: the work's doing, which a requeue
    would only repeat (run, evicted, queued again, without end)."""
    limit = {
        "reason": "Evicted",
        "message": "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.",
    }
    facts = job(status=admitted_status(phase="Running", startedAt=stamp(NOW)))
    facts = with_pods(
        facts, pod(facts, 0, phase="Failed", exit_code=137, status_extra=limit), pod(facts, 1)
    )
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.reason) == (JobPhase.FAILED, "PodFailed")
    assert "exceeds the total limit" in (done.status.message or "")
    assert done.requeued is None


def test_kubelet_refusals_in_a_row_fail_the_job_at_the_bound() -> None:
    facts = job(status=admitted_status(nodeRejections=CONFIG.max_node_rejections - 1))
    facts = with_pods(facts, pod(facts, 0, rejected="OutOfnvidia.com/gpu"), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    s = done.status
    assert (s.phase, s.reason) == (JobPhase.FAILED, "PodFailed")
    assert s.node_rejections == CONFIG.max_node_rejections
    assert "refusals in a row" in (s.message or "")


def _planned(**extra: Any) -> dict[str, Any]:
    """An admitted status whose plan says which topology class each replica's set has."""
    status = admitted_status(**extra)
    status["placementQuality"] = "pcie-switch"
    for p in status["placement"]:
        p["topologyClass"] = "pcie-switch"
    return status


def test_a_job_failed_before_its_pods_all_ran_describes_no_placement() -> None:
    """Given up after PodsReadyTimeout releases or kubelet refusals, the job never ran on the
    GPUs it was planned on, and its pods are gone: its status says no placement (nor its
    quality), as for a gang released and queued again; its conditions keep the record."""
    limit = CONFIG.max_unready_releases
    unready = _unready(job(status=_planned(unreadyReleases=limit - 1)), IMAGE_PULL)
    refusals = job(status=_planned(nodeRejections=CONFIG.max_node_rejections - 1))
    refused = with_pods(refusals, pod(refusals, 0, rejected="OutOfnvidia.com/gpu"))
    for facts, reason in ((unready, "PodsReadyTimeout"), (refused, "PodFailed")):
        s = settle(facts, OK, NOW, CONFIG).status
        assert (s.phase, s.reason, s.started_at) == (JobPhase.FAILED, reason, None)
        assert (s.placement, s.placement_quality) == ([], None)
        assert condition(s, "Finished") == ("True", reason)
        assert condition(s, "QuotaReserved") == ("True", "WithinGuarantee")


def test_a_job_that_ran_and_failed_keeps_the_placement_it_ran_on() -> None:
    facts = job(status=_planned(phase="Running", startedAt=stamp(NOW - timedelta(seconds=60))))
    facts = with_pods(facts, pod(facts, 0, phase="Failed", exit_code=1), pod(facts, 1))
    s = settle(facts, OK, NOW, CONFIG).status
    assert s.phase is JobPhase.FAILED
    assert [(p.node, p.topology_class) for p in s.placement] == [
        ("n0", "pcie-switch"),
        ("n1", "pcie-switch"),
    ]
    assert s.placement_quality == "pcie-switch"


def test_a_gang_that_runs_forgets_earlier_kubelet_refusals() -> None:
    facts = job(status=admitted_status(nodeRejections=3))
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1))
    done = settle(facts, OK, NOW, CONFIG)
    assert (done.status.phase, done.status.node_rejections) == (JobPhase.RUNNING, 0)


# --- what the tenant allows -------------------------------------------------------------------


def test_a_priority_class_the_tenant_does_not_allow_keeps_the_job_out() -> None:
    refused = JobContext(
        tenant="t", verdict=Verdict(), class_not_allowed="tenant t allows low, not high"
    )
    new = settle(job(priorityClassName="high"), refused, NOW, CONFIG)
    assert (new.status.phase, new.status.reason) == (JobPhase.FAILED, "PriorityClassNotAllowed")
    assert new.state is None
    waiting = settle(job(status={"phase": "Queued", "admission": 0}), refused, NOW, CONFIG)
    assert (waiting.status.reason, waiting.state) == ("PriorityClassNotAllowed", None)
    # Allowed again (the TenantQuota changed): checked again and queued.
    again = settle(job(status=new.status.to_k8s()), OK, NOW, CONFIG)
    assert again.needs_verdict or again.state is JobState.QUEUED


def test_a_waiting_job_its_tenant_stops_allowing_shows_no_reservation_or_expected_start() -> None:
    """Failed, it will not start: the expected starts and GPUs held for it while it waited
    are gone from its status."""
    start = stamp(NOW + timedelta(minutes=30))
    status = {
        "phase": "Queued",
        "tenant": "t",
        "admission": 0,
        "expectedStart": start,
        "firstExpectedStart": stamp(NOW + timedelta(minutes=10)),
        "reservation": {
            "start": start,
            "placement": [{"replica": 0, "node": "n0", "gpuIndices": [0, 1, 2, 3]}],
            "idleGpus": 4,
        },
    }
    facts = job(status=status, priorityClassName="high")
    assert facts.status.reservation is not None
    refused = replace(OK, class_not_allowed="tenant t allows low, not high")
    failed = settle(facts, refused, NOW, CONFIG).status
    assert (failed.phase, failed.reason) == (JobPhase.FAILED, "PriorityClassNotAllowed")
    assert (failed.reservation, failed.expected_start, failed.first_expected_start) == (
        None,
        None,
        None,
    )


def test_the_tenant_caps_grace_periods_and_minimum_runtimes() -> None:
    capped = JobContext(tenant="t", verdict=Verdict(), protection=Protection(600, 60, 30))
    running = admitted_status(phase="Running", startedAt=stamp(NOW - timedelta(seconds=10)))
    facts = job(
        status=running,
        suspend=True,
        checkpointGracePeriodSeconds=86400,
        minRuntimeSeconds=7 * 86400,
    )
    facts = with_pods(facts, pod(facts, 0), pod(facts, 1))
    done = settle(facts, capped, NOW, CONFIG)
    assert {d.grace_seconds for d in _of(done.actions, DeletePod)} == {60}
    running_job = facts.job
    assert running_job is not None
    spec = running_job.spec.model_copy(update={"suspend": False})
    resumed = replace(facts, job=running_job.model_copy(update={"spec": spec}))
    protected = settle(resumed, capped, NOW, CONFIG)
    assert protected.wake_at == NOW - timedelta(seconds=10) + timedelta(seconds=600)


# --- when a job ran: its pods' clock, not the cycle's ---------------------------------------


def _ran(started: timedelta, ended: timedelta | None = None, code: int = 0) -> dict[str, object]:
    """A pod status whose container started ``started`` before NOW (and ended ``ended``
    before it)."""
    if ended is None:
        state: dict[str, object] = {"running": {"startedAt": stamp(NOW - started)}}
    else:
        state = {
            "terminated": {
                "exitCode": code,
                "startedAt": stamp(NOW - started),
                "finishedAt": stamp(NOW - ended),
            }
        }
    return {"containerStatuses": [{"name": "main", "state": state}]}


def test_a_gang_runs_from_its_last_pods_start_not_from_when_a_cycle_saw_it() -> None:
    """After a gap in observation (an operator restart, a new leader) the start is the pods':
    the run is metered and its limit counted from then."""
    facts = job(status=admitted_status(admitted_at=NOW - timedelta(minutes=10)))
    created = NOW - timedelta(minutes=9)
    facts = with_pods(
        facts,
        pod(facts, 0, created=created, status_extra=_ran(timedelta(minutes=8))),
        pod(facts, 1, created=created, status_extra=_ran(timedelta(minutes=7))),
    )
    done = settle(facts, OK, NOW, CONFIG)
    assert done.status.phase is JobPhase.RUNNING
    assert done.status.started_at == NOW - timedelta(minutes=7)


def test_a_start_on_a_clock_ahead_or_behind_stays_between_the_pods_creation_and_now() -> None:
    facts = job(status=admitted_status(admitted_at=NOW - timedelta(minutes=10)))
    created = NOW - timedelta(minutes=9)
    ahead = with_pods(
        facts,
        pod(facts, 0, created=created, status_extra=_ran(-timedelta(minutes=3))),
        pod(facts, 1, created=created, status_extra=_ran(timedelta(minutes=1))),
    )
    assert settle(ahead, OK, NOW, CONFIG).status.started_at == NOW
    behind = with_pods(
        facts,
        pod(facts, 0, created=created, status_extra=_ran(timedelta(hours=3))),
        pod(facts, 1, created=created, status_extra=_ran(timedelta(hours=2))),
    )
    assert settle(behind, OK, NOW, CONFIG).status.started_at == created


def test_a_job_that_ended_unseen_finishes_when_its_pods_ended() -> None:
    """8 GPUs (two pods of 4) ran from 60 to 55 minutes ago; the cycle sees them only now:
    finished then, 8 x 300 GPU-seconds, not 8 x 3,600."""
    facts = job(status=admitted_status(admitted_at=NOW - timedelta(minutes=62)))
    created = NOW - timedelta(minutes=61)
    ended = _ran(timedelta(minutes=60), timedelta(minutes=55))
    facts = with_pods(
        facts,
        pod(facts, 0, phase="Succeeded", created=created, status_extra=ended),
        pod(facts, 1, phase="Succeeded", created=created, status_extra=ended),
    )
    done = settle(facts, OK, NOW, CONFIG)
    s = done.status
    assert s.phase is JobPhase.SUCCEEDED
    assert (s.started_at, s.finished_at) == (
        NOW - timedelta(minutes=60),
        NOW - timedelta(minutes=55),
    )
    assert s.gpu_seconds == 8 * 300


def test_a_failed_job_ends_when_its_last_pod_ended() -> None:
    """Its GPUs were held until the last pod of the gang stopped: until now while one runs."""
    running = admitted_status(phase="Running", startedAt=stamp(NOW - timedelta(minutes=30)))
    facts = job(status=running)
    failed = _ran(timedelta(minutes=30), timedelta(minutes=20), code=1)
    stopped = _ran(timedelta(minutes=30), timedelta(minutes=19), code=143)
    both = with_pods(
        facts,
        pod(facts, 0, phase="Failed", status_extra=failed),
        pod(facts, 1, phase="Failed", status_extra=stopped),
    )
    s = settle(both, OK, NOW, CONFIG).status
    assert (s.phase, s.finished_at) == (JobPhase.FAILED, NOW - timedelta(minutes=19))
    assert s.gpu_seconds == 8 * 660
    one = with_pods(facts, pod(facts, 0, phase="Failed", status_extra=failed), pod(facts, 1))
    s = settle(one, OK, NOW, CONFIG).status
    assert (s.phase, s.finished_at, s.gpu_seconds) == (JobPhase.FAILED, NOW, 8 * 1800)


def test_a_planned_set_naming_a_gpu_twice_is_no_plan() -> None:
    """It would hold fewer GPUs than it lists: no component believes it."""
    facts = job()
    planned = {keys.ANNOTATION_PLANNED_GPU_INDICES: "3,3"}
    assert pod(facts, 0, annotations=planned).planned_gpus is None
    fine = {keys.ANNOTATION_PLANNED_GPU_INDICES: "3,4"}
    assert pod(facts, 0, annotations=fine).planned_gpus == (3, 4)
