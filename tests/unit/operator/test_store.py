"""The operator's store never takes an object back in time, and its assumptions of writes in
flight hold exactly until those writes return: the next cycle neither decides a job twice nor
loses one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.operator.store import Store

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def job(version: int, *, uid: str = "uid-a", phase: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "uid": uid,
            "generation": 1,
            "resourceVersion": str(version),
            "creationTimestamp": "2026-03-01T11:00:00Z",
        },
        "spec": {
            "replicas": 1,
            "gpusPerReplica": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
        },
        "status": {"phase": phase} if phase else {},
    }


def pod(version: int, *, name: str = "a-1-0", uid: str = "pod-uid") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(version),
            "creationTimestamp": "2026-03-01T11:59:00Z",
            "labels": {
                keys.LABEL_JOB_NAME: "a",
                keys.LABEL_JOB_UID: "uid-a",
                keys.LABEL_REPLICA_INDEX: "0",
                keys.LABEL_ADMISSION: "1",
            },
        },
        "spec": {"containers": [{"name": "main", "image": "img"}]},
        "status": {"phase": "Pending"},
    }


def phase_of(store: Store) -> JobPhase | None:
    return store.world(NOW).jobs[0].status.phase


def test_an_older_watch_event_does_not_take_a_job_back() -> None:
    store = Store()
    store.upsert_job(job(7, phase="Admitted"))
    store.upsert_job(job(5, phase="Queued"))  # the watch catching up after our own write
    assert phase_of(store) is JobPhase.ADMITTED
    store.upsert_job(job(9, phase="Running"))
    assert phase_of(store) is JobPhase.RUNNING


def test_a_relist_keeps_the_newer_job_it_already_holds() -> None:
    store = Store()
    store.upsert_job(job(7, phase="Admitted"))
    store.replace_jobs([job(5, phase="Queued")])
    assert phase_of(store) is JobPhase.ADMITTED


def test_a_deleted_job_stays_deleted_when_a_late_write_answer_arrives() -> None:
    store = Store()
    store.upsert_job(job(5))
    store.delete_job(job(6))
    store.upsert_job(job(7, phase="Admitted"))  # our status write's answer, sent before
    assert store.world(NOW).jobs == ()


def test_a_job_recreated_under_the_same_name_is_a_new_job() -> None:
    store = Store()
    store.upsert_job(job(5, phase="Running"))
    store.delete_job(job(6))
    store.upsert_job(job(3, uid="uid-b"))
    (only,) = store.world(NOW).jobs
    assert only.uid == "uid-b"
    assert only.status.phase is None


def test_a_status_in_flight_overlays_the_job_until_its_write_returns() -> None:
    store = Store()
    store.upsert_job(job(5))
    writing = GpuJobStatus(phase=JobPhase.ADMITTED)
    store.assume_status("ns/a", writing)
    assert phase_of(store) is JobPhase.ADMITTED
    store.settle_status("ns/a", writing, None)  # the write failed: decided afresh
    assert phase_of(store) is None


def test_a_status_write_that_returned_is_what_the_server_answered() -> None:
    store = Store()
    store.upsert_job(job(5))
    writing = GpuJobStatus(phase=JobPhase.ADMITTED)
    store.assume_status("ns/a", writing)
    store.settle_status("ns/a", writing, job(6, phase="Admitted"))
    assert store.assumed == {}
    assert phase_of(store) is JobPhase.ADMITTED
    assert store.world(NOW).jobs[0].version == 6


def test_an_unwritten_admission_holds_until_a_status_write_lands_or_is_refused() -> None:
    store = Store()
    store.upsert_job(job(5, phase="Queued"))
    admitted = GpuJobStatus(phase=JobPhase.ADMITTED, admission=1)
    store.defer_status("ns/a", admitted, "5")
    facts = store.world(NOW).jobs[0]
    assert facts.status is admitted
    assert facts.unwritten is not None
    assert facts.written.phase is JobPhase.QUEUED  # what a write patches from
    assert facts.unwritten.resource_version == "5"
    # A write carrying it fails on the way (connection lost): still unwritten, written again.
    running = GpuJobStatus(phase=JobPhase.RUNNING, admission=1)
    store.assume_status("ns/a", running)
    store.settle_status("ns/a", running, None)
    assert store.world(NOW).jobs[0].status is admitted
    # A watch event of the job (someone else's write) does not drop it either.
    store.upsert_job(job(6, phase="Queued"))
    assert store.world(NOW).jobs[0].status is admitted
    # The write lands: the server's answer is the job's status from now on.
    store.assume_status("ns/a", running)
    store.settle_status("ns/a", running, job(7, phase="Running"))
    assert store.world(NOW).jobs[0].unwritten is None
    assert phase_of(store) is JobPhase.RUNNING


def test_an_unwritten_admission_refused_by_the_api_server_is_dropped() -> None:
    store = Store()
    store.upsert_job(job(5, phase="Queued"))
    admitted = GpuJobStatus(phase=JobPhase.ADMITTED, admission=1)
    store.defer_status("ns/a", admitted, "5")
    store.upsert_job(job(6, phase="Queued"))  # changed since the admission: the write is refused
    store.assume_status("ns/a", admitted)
    store.settle_status("ns/a", admitted, None, refused=True)
    assert store.world(NOW).jobs[0].unwritten is None
    assert phase_of(store) is JobPhase.QUEUED


def _changed(version: int, **meta: Any) -> dict[str, Any]:
    """The job at ``version`` with ``meta`` merged into its metadata."""
    raw = job(version, phase="Queued")
    raw["metadata"].update(meta)
    return raw


def test_an_unwritten_admission_is_written_over_a_change_of_metadata_alone() -> None:
    """A workload annotating its GpuJob (its checkpoint) or a label changed while the
    admission waits to be written does not undo it: the write's precondition follows."""
    store = Store()
    store.upsert_job(job(5, phase="Queued"))
    admitted = GpuJobStatus(phase=JobPhase.ADMITTED, admission=1)
    store.defer_status("ns/a", admitted, "5")
    store.upsert_job(_changed(6, annotations={keys.ANNOTATION_LAST_CHECKPOINT: NOW.isoformat()}))
    store.upsert_job(_changed(7, labels={"team": "x"}))
    facts = store.world(NOW).jobs[0]
    assert facts.status is admitted
    assert facts.unwritten is not None
    assert facts.unwritten.resource_version == "7"
    store.replace_jobs([_changed(8, labels={"team": "y"})])  # a relist after a missed event
    assert store.world(NOW).jobs[0].unwritten == replace(facts.unwritten, resource_version="8")


def test_an_unwritten_admission_keeps_its_precondition_over_a_change_of_spec_or_status() -> None:
    """A new spec (the generation), another writer's status or a deletion under way: the
    write on the version the admission was decided on is refused, as it must be."""
    for change in (
        _changed(6, generation=2),
        job(6, phase="Failed"),
        _changed(6, deletionTimestamp="2026-03-01T12:00:00Z"),
    ):
        store = Store()
        store.upsert_job(job(5, phase="Queued"))
        store.defer_status("ns/a", GpuJobStatus(phase=JobPhase.ADMITTED, admission=1), "5")
        store.upsert_job(change)
        unwritten = store.world(NOW).jobs[0].unwritten
        assert unwritten is not None
        assert unwritten.resource_version == "5", change["metadata"]


def test_a_job_created_again_while_the_watch_was_away_inherits_nothing_of_the_old_one() -> None:
    deleted: list[str] = []
    store = Store(on_job_deleted=lambda old: deleted.append(old.uid))
    store.upsert_job(job(5, phase="Queued"))
    store.defer_status("ns/a", GpuJobStatus(phase=JobPhase.ADMITTED, admission=1), "5")
    store.upsert_job(job(9, uid="uid-b"))  # the delete and the create of uid-b were missed
    (only,) = store.world(NOW).jobs
    assert only.uid == "uid-b"
    assert only.unwritten is None
    assert only.status.phase is None
    assert deleted == ["uid-a"]  # its pods are deleted
    store.upsert_job(job(6, phase="Queued"))  # a late event of the old job is no news
    assert store.world(NOW).jobs[0].uid == "uid-b"
    # The same through a relist.
    store.defer_status("ns/a", GpuJobStatus(phase=JobPhase.ADMITTED, admission=1), "9")
    store.replace_jobs([job(12, uid="uid-c")])
    assert store.world(NOW).jobs[0].unwritten is None
    assert deleted == ["uid-a", "uid-b"]


def test_a_deleted_job_forgets_its_unwritten_admission() -> None:
    store = Store()
    store.upsert_job(job(5, phase="Queued"))
    store.defer_status("ns/a", GpuJobStatus(phase=JobPhase.ADMITTED, admission=1), "5")
    store.delete_job(job(6, phase="Queued"))
    assert store.unwritten == {}


def test_a_pod_being_created_counts_and_survives_a_relist_until_its_create_returns() -> None:
    store = Store()
    store.upsert_job(job(5))
    assumed = store.assume_pod(pod(0), NOW)
    assert [p.name for p in store.world(NOW).jobs[0].pods] == ["a-1-0"]
    store.replace_job_pods([])  # a relist that ran before the create landed
    assert [p.name for p in store.world(NOW).jobs[0].pods] == ["a-1-0"]
    store.settle_pod(assumed, None)  # refused: the assumption goes
    assert store.world(NOW).jobs[0].pods == ()


def test_a_create_answered_after_the_watch_saw_the_pod_finish_does_not_turn_it_back() -> None:
    # A one-second pod: the watch delivers it created, running and succeeded before the
    # operator handles its own create's answer (the pod as created, Pending). The store keeps
    # the newest: the job is seen succeeded, not waiting for its pod until a timeout requeues it.
    store = Store()
    store.upsert_job(job(5))
    store.assume_pod(pod(0), NOW)
    store.upsert_job_pod(pod(10))
    running = pod(11)
    running["status"] = {"phase": "Running"}
    store.upsert_job_pod(running)
    done = pod(12)
    done["status"] = {"phase": "Succeeded"}
    store.upsert_job_pod(done)
    current = store.pod("ns", "a", "a-1-0")  # what the create's handler finds then
    assert current is not None
    store.settle_pod(current, pod(10))
    (seen,) = store.world(NOW).jobs[0].pods
    assert (seen.phase, seen.version) == ("Succeeded", 12)


def test_a_pod_being_deleted_is_terminating_at_once_and_a_deleted_pod_stays_gone() -> None:
    store = Store()
    store.upsert_job(job(5))
    store.upsert_job_pod(pod(8))
    deleting = store.assume_deleting("ns", "a", "a-1-0")
    assert deleting is not None
    (held,) = store.world(NOW).jobs[0].pods
    assert held.deleting
    store.delete_job_pod(pod(9))
    store.upsert_job_pod(pod(8))  # a late answer about the pod, after the watch said deleted
    assert store.world(NOW).jobs[0].pods == ()


def _network(name: str = "default", label: str = "nvidia.com/gpu.clique") -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "NetworkTopology",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"levels": [{"name": "clique", "nodeLabel": label, "wholeDomains": True}]},
    }


def test_only_the_network_topology_named_default_gives_the_levels() -> None:
    store = Store()
    store.replace_network([_network("racks"), _network()])
    assert "networktopologies" in store.synced
    assert store.network is not None
    assert [lv.name for lv in store.network.spec.levels] == ["clique"]
    store.upsert_network(_network("racks", "example.com/rack"))
    assert store.network.spec.levels[0].node_label == "nvidia.com/gpu.clique"
    store.upsert_network(_network(label="not a label"))  # refused by the model: no levels
    assert store.network is None
    store.upsert_network(_network())
    store.delete_network(_network())
    assert store.network is None


def test_a_pod_update_that_changes_nothing_a_cycle_reads_is_kept_without_waking_a_cycle() -> None:
    """A readiness flip or a probe's time moves a pod's resourceVersion and nothing else the
    cycle reads; a change of phase wakes it."""
    store = Store()
    store.upsert_job(job(1, phase="Running"))
    running = pod(2)
    running["status"] = {"phase": "Running"}
    store.upsert_job_pod(running)
    store.changed.clear()
    changes = store.changes

    probed = pod(3)
    probed["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False", "lastProbeTime": "t1"}],
    }
    store.upsert_job_pod(probed)
    assert not store.changed.is_set()
    assert store.changes == changes
    kept = store.pod("ns", "a", "a-1-0")
    assert kept is not None
    assert kept.version == 3

    done = pod(4)
    done["status"] = {"phase": "Succeeded"}
    store.upsert_job_pod(done)
    assert store.changed.is_set()
    assert store.world(NOW).jobs[0].pods[0].phase == "Succeeded"


def test_a_pending_pods_image_pull_flapping_wakes_no_cycle_and_the_newest_word_is_kept() -> None:
    store = Store()
    store.upsert_job(job(1, phase="Admitted"))
    for version, reason in ((2, "ErrImagePull"), (3, "ImagePullBackOff"), (4, "ErrImagePull")):
        pending = pod(version)
        pending["status"] = {
            "phase": "Pending",
            "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": reason}}}],
        }
        store.upsert_job_pod(pending)
        if version == 2:
            store.changed.clear()
            changes = store.changes
    assert not store.changed.is_set()
    assert store.changes == changes
    kept = store.pod("ns", "a", "a-1-0")
    assert kept is not None
    assert kept.waiting == "container main: ErrImagePull"


def test_another_gpu_pods_update_that_changes_nothing_a_cycle_reads_wakes_no_cycle() -> None:
    store = Store()

    def gpu_pod(version: int, phase: str) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "x",
                "namespace": "other",
                "uid": "x-uid",
                "resourceVersion": str(version),
            },
            "spec": {
                "nodeName": "gpu-1",
                "containers": [
                    {"name": "m", "image": "i", "resources": {"limits": {keys.GPU_RESOURCE: "2"}}}
                ],
            },
            "status": {"phase": phase},
        }

    store.upsert_gpu_pod(gpu_pod(1, "Running"))
    assert store.changed.is_set()
    store.changed.clear()
    store.upsert_gpu_pod(gpu_pod(2, "Running"))
    assert not store.changed.is_set()
    assert store.gpu_pods["other/x"].version == 2


def _quota(version: int, gpu_seconds: float) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "TenantQuota",
        "metadata": {"name": "team", "uid": "q-uid", "resourceVersion": str(version)},
        "spec": {"namespaces": ["team"], "guaranteedGpus": 8},
        "status": {"gpuSeconds": gpu_seconds},
    }


def test_the_watch_echo_of_a_tenant_quota_write_changes_nothing_and_wakes_no_cycle() -> None:
    """The operator stores its TenantQuota status write's answer; the watch then brings the
    same version again (or an older one): the stored object stays, and no cycle is woken (a
    new object would also make every job's context be worked out again)."""
    store = Store()
    store.upsert_quota(_quota(5, 100.0))  # the write's answer
    stored = store.quotas["team"]
    store.changed.clear()
    store.upsert_quota(_quota(5, 100.0))  # its echo
    store.upsert_quota(_quota(4, 50.0))  # an older event, late
    assert store.quotas["team"] is stored
    assert not store.changed.is_set()
    store.upsert_quota(_quota(6, 150.0))
    assert store.quotas["team"].status.gpu_seconds == 150.0
    assert store.changed.is_set()


def _reachable(obj: Any, seen: set[int] | None = None) -> list[Any]:
    """Every object reachable from ``obj`` through dicts, lists, tuples and attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, int, float, bool, type(None))):
        return []
    seen.add(id(obj))
    found = [obj]
    children: list[Any] = []
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    for child in children:
        found.extend(_reachable(child, seen))
    return found


def test_the_store_does_not_keep_a_jobs_managed_fields() -> None:
    # The API server lists every field of the spec in managedFields (a dict per env entry):
    # kept, they would triple what a job costs the operator's memory.
    raw = {
        "apiVersion": "gpusched.io/v1alpha1",
        "kind": "GpuJob",
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "5",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"marker": {}}}}],
            "annotations": {keys.ANNOTATION_SUBMITTER: "alice"},
        },
        "spec": {"gpusPerReplica": 1, "template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    store = Store()
    store.upsert_job(raw)
    facts = store.jobs["ns/j"]
    assert facts.submitter == "alice"
    kept = _reachable(facts)
    assert not any(isinstance(o, dict) and ("marker" in o or "managedFields" in o) for o in kept)
