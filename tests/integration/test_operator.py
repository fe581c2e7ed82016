"""The operator against the real control plane: quotas, borrowing and reclaim, priority
preemption with grace periods, all-or-nothing gangs, completion, deletion, restarts in the middle
of admissions and preemptions, and jobs nobody owns.

The operator runs as a real process under the chart's operator identity, with the gpusched
extender and its kube-scheduler binding the pods onto simulated H100 nodes; kwok runs the pods
for the simulated runtime in their template.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.cli import main
from gpusched.dev.localcluster import LocalCluster
from tests.integration.operator_harness import OperatorProcess, Scenario, wait_for

#: Waiting jobs applied at once: several times the reports the operator sends at once.
BURST = 40


def test_job_over_its_tenants_limit_waits_with_quota_exceeded(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    sc.nodes(2)
    _, ns = sc.tenant("capped", guaranteed=8, borrowingLimit=8)
    sc.submit(ns, "first", 8)
    sc.wait_phase(ns, "first", "Running")
    sc.submit(ns, "second", 4)
    status = sc.wait_reason(ns, "second", "QuotaExceeded")
    assert status["phase"] == "Queued"
    assert status["queuePosition"] == 1
    assert "borrowing limit 8" in status["message"]
    reserved = sc.condition(ns, "second", "QuotaReserved")
    assert reserved is not None
    assert (reserved["status"], reserved["reason"]) == ("False", "QuotaExceeded")
    assert not sc.pods(ns, "second")

    # `gpusched explain` says the same, from the same cycle, and writes nothing.
    version = sc.job(ns, "second")["metadata"]["resourceVersion"]
    result = CliRunner().invoke(
        main, ["explain", f"{ns}/second", f"--kubeconfig={local_cluster.kubeconfig}"]
    )
    assert result.exit_code == 0, result.output
    assert "the next cycle leaves it waiting: QuotaExceeded" in result.output
    assert "queue: position 1 of 1" in result.output
    assert "using 8 (borrowed 0)" in result.output
    assert sc.job(ns, "second")["metadata"]["resourceVersion"] == version


def test_job_in_a_namespace_no_tenant_owns_waits_with_a_clear_reason(sc: Scenario) -> None:
    ns = sc.namespace("ownerless")
    sc.submit(ns, "lonely", 1)
    status = sc.wait_reason(ns, "lonely", "NoTenant")
    assert status["phase"] == "Queued"
    assert f"namespace {ns} is not owned by any TenantQuota" in status["message"]
    assert ("NoTenant", status["message"]) in sc.events(ns, "lonely")


def test_bad_pod_template_becomes_a_condition_instead_of_failing_pods(sc: Scenario) -> None:
    _, ns = sc.tenant("bad", guaranteed=8)
    body_spec = {
        "template": {
            "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "x"}]}
        }
    }
    sc.submit(ns, "broken", 1, **body_spec)
    status = sc.wait_reason(ns, "broken", "InvalidPodTemplate")
    assert "restartPolicy" in status["message"]
    assert not sc.pods(ns, "broken")


def test_borrowed_gpus_go_back_to_their_owner_by_preemption(sc: Scenario) -> None:
    sc.nodes(2)
    owner, owner_ns = sc.tenant("owner", guaranteed=16)
    borrower, borrower_ns = sc.tenant("borrower", guaranteed=0)
    for name in ("b1", "b2"):
        sc.submit(borrower_ns, name, 8, grace=2)
    for name in ("b1", "b2"):
        sc.wait_phase(borrower_ns, name, "Running")
        assert sc.condition(borrower_ns, name, "QuotaReserved")["reason"] == "Borrowing"  # type: ignore[index]
    wait_for(lambda: sc.quota_status(borrower).get("borrowedGpus") == 16, 30, "borrowed GPUs")

    sc.submit(owner_ns, "mine", 8)
    sc.wait_phase(owner_ns, "mine", "Running", timeout=90)
    statuses = {name: sc.status(borrower_ns, name) for name in ("b1", "b2")}
    victims = [n for n, s in statuses.items() if s.get("preemptionCount")]
    assert len(victims) == 1
    victim = statuses[victims[0]]
    record = victim["preemptions"][-1]
    assert record["preemptor"] == f"{owner_ns}/mine"
    assert record["reason"] == "ReclaimGuarantee"
    preempted = sc.condition(borrower_ns, victims[0], "Preempted")
    assert preempted is not None
    assert (preempted["status"], preempted["reason"]) == ("True", "ReclaimGuarantee")
    # The victim is back in the queue, not lost.
    sc.wait_phase(borrower_ns, victims[0], "Queued")
    mine = sc.status(owner_ns, "mine")
    assert sc.condition(owner_ns, "mine", "QuotaReserved")["reason"] == "WithinGuarantee"  # type: ignore[index]
    assert mine["placementQuality"] == "nvlink"
    usage = wait_for(
        lambda: q if (q := sc.quota_status(owner)).get("usedGpus") == 8 else None,
        30,
        "owner usage",
    )
    assert usage["borrowedGpus"] == 0


def test_a_returning_owner_gets_a_whole_nvlink_node_from_the_borrowers_that_lose_least(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    """One-GPU jobs of a borrower fill both nodes; those on one node have just checkpointed.
    The owner's 8-GPU NVLink gang comes back for its guarantee: it runs on that node, freed
    whole, and only that node's jobs are evicted (the least work lost), with events and
    `explain` saying so."""
    nodes = sc.nodes(2)
    _, owner_ns = sc.tenant("owner", guaranteed=8)
    _, borrower_ns = sc.tenant("borrower", guaranteed=0)
    small = [sc.submit(borrower_ns, f"s{i:02d}", 1, grace=2) for i in range(16)]
    for name in small:
        sc.wait_phase(borrower_ns, name, "Running", timeout=120)
    on = {name: sc.status(borrower_ns, name)["placement"][0]["node"] for name in small}
    assert sorted(on.values()).count(nodes[1]) == 8
    time.sleep(3)  # work the jobs on the other node would lose
    checkpoint = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cheap = sorted(n for n, node in on.items() if node == nodes[1])
    for name in cheap:
        sc.custom.patch_namespaced_custom_object(
            "gpusched.io",
            "v1alpha1",
            borrower_ns,
            "gpujobs",
            name,
            {"metadata": {"annotations": {keys.ANNOTATION_LAST_CHECKPOINT: checkpoint}}},
        )
    time.sleep(2)  # the operator's cache sees the checkpoints

    sc.submit(owner_ns, "gang", 8, topology={"scope": "nvlink", "mode": "required"})
    running = sc.wait_phase(owner_ns, "gang", "Running", timeout=90)
    assert {p["node"] for p in running["placement"]} == {nodes[1]}
    assert running["placementQuality"] == "nvlink"
    evicted = sorted(n for n in small if sc.status(borrower_ns, n).get("preemptionCount"))
    assert evicted == cheap
    for name in evicted:
        record = sc.status(borrower_ns, name)["preemptions"][-1]
        assert (record["preemptor"], record["reason"]) == (f"{owner_ns}/gang", "ReclaimGuarantee")
        assert any(reason == "PreemptedBy" for reason, _ in sc.events(borrower_ns, name))
    result = CliRunner().invoke(
        main, ["explain", f"{borrower_ns}/{evicted[0]}", f"--kubeconfig={local_cluster.kubeconfig}"]
    )
    assert result.exit_code == 0, result.output
    assert f"by {owner_ns}/gang (ReclaimGuarantee)" in result.output
    result = CliRunner().invoke(
        main, ["explain", f"{owner_ns}/gang", f"--kubeconfig={local_cluster.kubeconfig}"]
    )
    assert result.exit_code == 0, result.output
    assert f"replica 0: node {nodes[1]}" in result.output


def test_higher_priority_job_preempts_after_the_victims_grace_period(sc: Scenario) -> None:
    sc.nodes(1)
    low = sc.priority("low", 10)
    high = sc.priority("high", 1000)
    _, ns = sc.tenant("team", guaranteed=8, borrowingLimit=8)
    # A grace period far longer than the test: the victim leaves when the test lets it.
    sc.submit(ns, "sweep", 8, grace=600, priorityClassName=low)
    sc.wait_phase(ns, "sweep", "Running")
    sc.submit(ns, "deadline", 8, priorityClassName=high)

    status = sc.wait_reason(ns, "deadline", "WaitingForPreemption", timeout=30)
    assert status["phase"] == "Admitted"
    [pod] = sc.pods(ns, "sweep")
    wait_for(
        lambda: sc.pods(ns, "sweep")[0].metadata.deletion_timestamp is not None or None,
        30,
        "the victim's pod to be terminating",
    )
    [pod] = sc.pods(ns, "sweep")
    assert pod.metadata.deletion_grace_period_seconds == 600
    assert pod.metadata.annotations[keys.ANNOTATION_PREEMPTED_BY] == f"{ns}/deadline"
    assert not sc.pods(ns, "deadline")  # its GPUs are still taken: no pod yet
    assert sc.status(ns, "deadline")["reason"] == "WaitingForPreemption"
    assert sc.condition(ns, "deadline", "Admitted")["status"] == "False"  # type: ignore[index]

    # The victim's container exits within its grace period: then, and only then, the preemptor.
    sc.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    sc.wait_phase(ns, "deadline", "Running", timeout=60)
    assert sc.condition(ns, "deadline", "Admitted")["status"] == "True"  # type: ignore[index]
    sweep = sc.status(ns, "sweep")
    assert sweep["preemptions"][-1]["reason"] == "HigherPriority"
    assert sweep["phase"] == "Queued"
    assert any(reason == "PreemptedBy" for reason, _ in sc.events(ns, "sweep"))


def test_gang_of_four_eight_gpu_pods_is_admitted_all_or_nothing(sc: Scenario) -> None:
    sc.nodes(4)
    _, ns = sc.tenant("big", guaranteed=32)
    sc.submit(ns, "blocker", 1)
    sc.wait_phase(ns, "blocker", "Running")
    sc.submit(ns, "gang", 8, replicas=4)
    status = sc.wait_reason(ns, "gang", "WaitingForCapacity")
    assert not sc.pods(ns, "gang")  # never a partial gang
    assert "needs 4 x 8 GPUs" in status["message"]

    sc.finish(ns, "blocker")
    status = sc.wait_phase(ns, "gang", "Running", timeout=90)
    pods = sc.pods(ns, "gang")
    names = sorted(p.metadata.name for p in pods)
    assert names == [f"gang-1-{r}" for r in range(4)], (names, sc.events(ns, "gang"))
    assert len({p.spec.node_name for p in pods}) == 4
    assert all(p.spec.scheduler_name == keys.SCHEDULER_NAME for p in pods)
    assert all(p.metadata.owner_references[0].kind == "GpuJob" for p in pods)
    assert {p.metadata.labels[keys.LABEL_REPLICA_INDEX] for p in pods} == {"0", "1", "2", "3"}
    assert [r["replica"] for r in status["placement"]] == [0, 1, 2, 3]
    assert all(len(r["gpuIndices"]) == 8 for r in status["placement"])


def test_completion_frees_quota_and_admits_the_next_job(sc: Scenario) -> None:
    sc.nodes(2)
    quota, ns = sc.tenant("serial", guaranteed=8, borrowingLimit=8)
    sc.submit(ns, "first", 8)
    sc.wait_phase(ns, "first", "Running")
    sc.submit(ns, "second", 8, runtime="4s")
    sc.wait_reason(ns, "second", "QuotaExceeded")
    sc.finish(ns, "first")
    first = sc.wait_phase(ns, "first", "Succeeded", timeout=60)
    assert first["gpuSeconds"] > 0
    assert sc.condition(ns, "first", "Finished")["status"] == "True"  # type: ignore[index]
    second = sc.wait_phase(ns, "second", "Succeeded", timeout=90)
    assert second["startedAt"] >= first["finishedAt"]
    usage = wait_for(
        lambda: q if (q := sc.quota_status(quota)).get("usedGpus") == 0 else None,
        30,
        "the quota to be free again",
    )
    assert usage["gpuSeconds"] > 0
    assert usage["runningJobs"] == 0


def test_a_burst_of_waiting_jobs_is_reported_in_full_while_a_job_that_fits_starts(
    sc: Scenario,
) -> None:
    """At most a few waiting jobs' reports go out at once (admissions first); the others wait
    for later cycles and none is lost or sent twice."""
    sc.nodes(1)
    _, frozen = sc.tenant("burst", guaranteed=0, borrowingLimit=0)
    _, open_ns = sc.tenant("fits", guaranteed=8)
    names = [f"wait-{i:02d}" for i in range(BURST)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: sc.submit(frozen, name, 1), names))
    sc.submit(open_ns, "starts", 8)
    sc.wait_phase(open_ns, "starts", "Running", timeout=90)
    for name in names:
        status = sc.wait_reason(frozen, name, "QuotaExceeded", timeout=90)
        assert status["phase"] == "Queued"
    for name in names:
        reasons = [reason for reason, _ in sc.events(frozen, name)]
        assert reasons.count("QuotaExceeded") == 1, (name, reasons)


def test_deleting_a_job_removes_its_pods(sc: Scenario) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("del", guaranteed=8)
    sc.submit(ns, "doomed", 4, replicas=2)
    sc.wait_phase(ns, "doomed", "Running")
    assert len(sc.pods(ns, "doomed")) == 2
    sc.custom.delete_namespaced_custom_object("gpusched.io", "v1alpha1", ns, "gpujobs", "doomed")
    wait_for(lambda: not sc.pods(ns, "doomed"), 60, "pods of the deleted job to go")


def test_job_recreated_under_the_same_name_does_not_adopt_the_old_jobs_pods(sc: Scenario) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("again", guaranteed=8)
    # The old pod takes 20 s to terminate (its grace period: the job's checkpoint grace), so
    # it is still there when the new job of the same name wants pod name job-1-0.
    sc.submit(ns, "job", 4, grace=20)
    sc.wait_phase(ns, "job", "Running")
    old_uid = sc.job(ns, "job")["metadata"]["uid"]
    sc.custom.delete_namespaced_custom_object("gpusched.io", "v1alpha1", ns, "gpujobs", "job")
    wait_for(
        lambda: all(p.metadata.deletion_timestamp for p in sc.pods(ns, "job")) or None,
        30,
        "the old pod to be terminating",
    )
    wait_for(lambda: _gone(sc, ns, "job"), 30, "the old GpuJob to be deleted")
    sc.submit(ns, "job", 4)
    new_uid = sc.job(ns, "job")["metadata"]["uid"]
    assert new_uid != old_uid
    sc.wait_phase(ns, "job", "Running", timeout=90)
    pods = sc.pods(ns, "job")
    assert pods
    assert {p.metadata.labels[keys.LABEL_JOB_UID] for p in pods} == {new_uid}
    assert all(p.metadata.deletion_timestamp is None for p in pods)


def _gone(sc: Scenario, namespace: str, name: str) -> bool | None:
    try:
        sc.job(namespace, name)
    except ApiException as err:
        return err.status == 404 or None
    return None


@pytest.mark.parametrize(
    ("point", "pods_left"),
    [
        ("admission-after-status", set()),
        ("admission-after-first-pod", {"gang-1-0", "gang-1-1"}),
    ],
)
def test_restart_in_the_middle_of_an_admission_creates_no_duplicate(
    sc: Scenario, operator: OperatorProcess, point: str, pods_left: set[str]
) -> None:
    """The admission is written with the pods running: an operator stopped before that leaves
    at most pods the status does not name. The next one deletes them and admits the job again
    (under a new number while any of them is still there), so no two live pods ever serve one
    replica."""
    sc.nodes(2)
    _, ns = sc.tenant("crash", guaranteed=16)
    operator.kill()
    operator.start(failpoints=point)
    sc.submit(ns, "gang", 8, replicas=2)
    operator.wait_exit()
    assert sc.status(ns, "gang").get("admission", 0) == 0
    left = {p.metadata.name for p in sc.pods(ns, "gang")}
    assert left <= pods_left
    assert bool(left) == bool(pods_left)  # the first pod's create returned before the stop
    operator.start()
    sc.wait_phase(ns, "gang", "Running", timeout=60)
    admission = sc.status(ns, "gang")["admission"]
    live = [p for p in sc.pods(ns, "gang") if p.metadata.deletion_timestamp is None]
    assert sorted(p.metadata.name for p in live) == [f"gang-{admission}-0", f"gang-{admission}-1"]
    assert {p.metadata.labels[keys.LABEL_ADMISSION] for p in live} == {str(admission)}
    if not pods_left:
        assert admission == 1


@pytest.mark.parametrize("point", ["preemption-after-victims-marked", "preemption-after-evict"])
def test_restart_in_the_middle_of_a_preemption_loses_no_job(
    sc: Scenario, operator: OperatorProcess, point: str
) -> None:
    sc.nodes(1)
    low = sc.priority("low", 1)
    high = sc.priority("high", 100)
    _, ns = sc.tenant("crash", guaranteed=8, borrowingLimit=8)
    sc.submit(ns, "victim", 8, grace=1, priorityClassName=low)
    sc.wait_phase(ns, "victim", "Running")
    operator.kill()
    operator.start(failpoints=point)
    sc.submit(ns, "winner", 8, priorityClassName=high)
    operator.wait_exit()
    assert sc.status(ns, "victim")["phase"] == "Preempted"
    operator.start()
    sc.wait_phase(ns, "winner", "Running", timeout=60)
    victim = sc.wait_phase(ns, "victim", "Queued", timeout=30)
    assert victim["preemptionCount"] == 1
    assert victim["preemptions"][-1]["preemptor"] == f"{ns}/winner"
    assert [p.metadata.name for p in sc.pods(ns, "winner")] == ["winner-1-0"]
    assert all(p.metadata.deletion_timestamp for p in sc.pods(ns, "victim"))


def test_failed_pod_fails_the_job_and_suspend_releases_and_requeues(sc: Scenario) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("life", guaranteed=8)
    sc.submit(
        ns,
        "crash",
        2,
        template={
            "metadata": {"annotations": {keys.SIM_RUNTIME: "2s", keys.SIM_EXIT_CODE: "3"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    failed = sc.wait_phase(ns, "crash", "Failed", timeout=60)
    assert failed["reason"] == "PodFailed"
    assert "exited with code 3" in failed["message"]
    assert sc.condition(ns, "crash", "Finished")["status"] == "True"  # type: ignore[index]

    sc.submit(ns, "pausable", 4)
    sc.wait_phase(ns, "pausable", "Running")
    sc.custom.patch_namespaced_custom_object(
        "gpusched.io", "v1alpha1", ns, "gpujobs", "pausable", {"spec": {"suspend": True}}
    )
    sc.wait_phase(ns, "pausable", "Suspended")
    wait_for(lambda: not sc.pods(ns, "pausable"), 30, "the suspended job's pods to go")
    sc.custom.patch_namespaced_custom_object(
        "gpusched.io", "v1alpha1", ns, "gpujobs", "pausable", {"spec": {"suspend": False}}
    )
    status = sc.wait_phase(ns, "pausable", "Running", timeout=60)
    assert status["admission"] == 2
    assert [p.metadata.name for p in sc.pods(ns, "pausable")] == ["pausable-2-0"]


def test_gang_whose_pods_cannot_run_is_released_and_requeued_with_backoff(
    sc: Scenario, operator: OperatorProcess
) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("stuck", guaranteed=8)
    operator.kill()
    # A backoff far longer than the test: the job stays in it once released.
    operator.start(pods_ready_timeout=3, backoff_base=600)
    try:
        # GPUs are free, so the gang is admitted; no node has the CPUs it asks for, so the
        # scheduler never binds its pod.
        sc.submit(
            ns,
            "greedy",
            8,
            template={
                "spec": {
                    "containers": [
                        {"name": "main", "image": "x", "resources": {"requests": {"cpu": "4096"}}}
                    ]
                }
            },
        )
        status = sc.wait_reason(ns, "greedy", "RequeueBackoff", timeout=60)
        assert status["phase"] == "Queued"
        assert status["requeueCount"] == 1
        assert status["requeueAt"]
        assert "next attempt in" in status["message"]
        assert not status.get("placement")
        ready = sc.condition(ns, "greedy", "PodsReady")
        assert ready is not None
        assert ready["reason"] == "PodsReadyTimeout"
        assert any(reason == "PodsReadyTimeout" for reason, _ in sc.events(ns, "greedy"))
        wait_for(lambda: not sc.pods(ns, "greedy"), 30, "the released gang's pods to go")
    finally:
        operator.kill()
        operator.start()
