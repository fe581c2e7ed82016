"""The operator's pure parts: pod manifests, status transitions, merge patches, tenant ownership
of namespaces and the translation of Node / NodeGpuTopology objects into core nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob, GpuJobStatus, JobPhase, ReplicaPlacement
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.admission import (
    Admission,
    AdmitReason,
    Preemption,
    PreemptReason,
    ReplicaPlan,
)
from gpusched.core.lifecycle import JobFacts, PodFacts, merge_patch, tenant_map
from gpusched.core.lifecycle import status as st
from gpusched.core.lifecycle.pods import pod_manifest, pod_name
from gpusched.core.placement import TopologyScope
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.operator.nodes import NodeReader

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gpujob(name: str = "train", **spec: Any) -> GpuJob:
    return GpuJob.model_validate(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 1},
            "spec": {
                "replicas": 2,
                "gpusPerReplica": 4,
                "topology": {"scope": "nvlink", "mode": "required"},
                "template": {
                    "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                    "spec": {
                        "nodeSelector": {"pool": "p"},
                        "containers": [
                            {"name": "main", "image": "img", "resources": {"limits": {"cpu": "1"}}},
                            {"name": "side", "image": "img"},
                        ],
                    },
                },
                **spec,
            },
        }
    )


def test_pod_of_a_replica_carries_identity_plan_and_gpu_limit() -> None:
    plan = ReplicaPlacement(replica=1, node="node-a", gpu_indices=[4, 5, 6, 7])
    pod = pod_manifest(gpujob(), tenant="t", admission=3, replica=1, placement=plan)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "train-3-1"
    assert meta["labels"] == {
        "app": "x",
        keys.LABEL_JOB_NAME: "train",
        keys.LABEL_JOB_UID: "uid-1",
        keys.LABEL_TENANT: "t",
        keys.LABEL_REPLICA_INDEX: "1",
        keys.LABEL_ADMISSION: "3",
    }
    assert meta["annotations"]["a"] == "b"
    assert meta["annotations"][keys.ANNOTATION_TOPOLOGY_SCOPE] == "nvlink"
    assert meta["annotations"][keys.ANNOTATION_TOPOLOGY_MODE] == "required"
    assert meta["annotations"][keys.ANNOTATION_PLANNED_NODE] == "node-a"
    assert meta["annotations"][keys.ANNOTATION_PLANNED_GPU_INDICES] == "4,5,6,7"
    assert meta["annotations"][keys.ANNOTATION_GANG_SIZE] == "2"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "GpuJob",
        "train",
        "uid-1",
        True,
    )
    assert spec["schedulerName"] == keys.SCHEDULER_NAME
    assert spec["nodeSelector"] == {"pool": "p", "kubernetes.io/hostname": "node-a"}
    assert spec["containers"][0]["resources"]["limits"] == {"cpu": "1", keys.GPU_RESOURCE: "4"}
    assert "resources" not in spec["containers"][1]


def test_dry_run_pod_is_unnamed_and_unpinned() -> None:
    pod = pod_manifest(gpujob(), tenant="t", admission=0, replica=0, placement=None, dry_run=True)
    assert "name" not in pod["metadata"]
    assert pod["metadata"]["generateName"].startswith("train-")
    assert pod["spec"]["nodeSelector"] == {"pool": "p"}


def test_pod_names_stay_valid_for_long_job_names() -> None:
    long = "j" * 250
    name = pod_name(long, 12, 3)
    assert len(name) <= 253
    assert name.endswith("-12-3")
    assert name != pod_name("j" * 249 + "k", 12, 3)


def test_merge_patch_nulls_what_disappeared() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": True}
    new = {"a": 1, "b": {"x": 1, "z": 3}, "c": [2]}
    assert merge_patch(old, new) == {"b": {"y": None, "z": 3}, "c": [2], "gone": None}
    assert merge_patch(new, new) is None


def _quota(name: str, namespaces: list[str], age: int) -> TenantQuota:
    return TenantQuota.model_validate(
        {
            "metadata": {
                "name": name,
                "creationTimestamp": (NOW + timedelta(seconds=age)).isoformat(),
            },
            "spec": {"namespaces": namespaces},
        }
    )


def test_oldest_tenant_quota_owns_a_contested_namespace() -> None:
    mapping = tenant_map([_quota("new", ["shared", "b"], 10), _quota("old", ["shared", "a"], 0)])
    assert mapping.owner == {"shared": "old", "a": "old", "b": "new"}
    assert mapping.conflicts == {"new": ["shared"]}


def _admission(victims: tuple[Preemption, ...] = ()) -> Admission:
    plans = (
        ReplicaPlan(0, "n0", (0, 1, 2, 3), TopologyScope.NVLINK, 90.0),
        ReplicaPlan(1, "n1", (0, 1, 2, 3), TopologyScope.NUMA, 60.0),
    )
    return Admission("ns/train", "t", AdmitReason.BORROWING, "placed", plans, victims)


def test_admission_reserves_the_plan_and_names_the_gang() -> None:
    t = st.admitted(st.Transition(GpuJobStatus(admission=2), NOW, 1), _admission(), "t", set())
    s = t.status
    assert s.phase is JobPhase.ADMITTED
    assert s.admission == 3
    assert [(p.node, p.gpu_indices) for p in s.placement] == [
        ("n0", [0, 1, 2, 3]),
        ("n1", [0, 1, 2, 3]),
    ]
    assert s.placement_quality == "numa"
    conditions = {c.type: (c.status.value, c.reason) for c in s.conditions}
    assert conditions["QuotaReserved"] == ("True", "Borrowing")
    assert conditions["Admitted"] == ("True", "Placed")
    # Written before any pod exists: nothing in it may say pods were created.
    assert conditions["PodsReady"] == ("False", "WaitingForPods")
    assert all("created" not in c.message for c in s.conditions)


def test_admission_with_victims_waits_for_them() -> None:
    victim = Preemption("ns/old", "t", "ns/train", PreemptReason.HIGHER_PRIORITY, "why", 8, 10.0)
    t = st.admitted(st.Transition(GpuJobStatus(), NOW, 1), _admission((victim,)), "t", set())
    assert t.status.reason == "WaitingForPreemption"
    conditions = {c.type: (c.status.value, c.reason) for c in t.status.conditions}
    assert conditions["Admitted"] == ("False", "WaitingForPreemption")


def test_preemption_is_recorded_with_who_and_why_and_meters_the_run() -> None:
    victim = Preemption("ns/old", "t", "ns/new", PreemptReason.RECLAIM_GUARANTEE, "lent", 8, 1.0)
    running = GpuJobStatus(phase=JobPhase.RUNNING, started_at=NOW - timedelta(seconds=100))
    s = st.preempted(st.Transition(running, NOW, 1), victim, 8).status
    assert s.phase is JobPhase.PREEMPTED
    assert s.reason == "PreemptedBy"
    assert s.preemption_count == 1
    assert (s.preemptions[-1].preemptor, s.preemptions[-1].reason) == ("ns/new", "ReclaimGuarantee")
    assert s.gpu_seconds == 800.0
    assert s.started_at is None
    preempted = next(c for c in s.conditions if c.type == "Preempted")
    assert (preempted.status.value, preempted.reason) == ("True", "ReclaimGuarantee")


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    t = st.Transition(GpuJobStatus(), NOW, 1)
    t.cond(st.Cond.QUOTA_RESERVED, False, "QuotaExceeded", "a")
    later = st.Transition(t.status, NOW + timedelta(minutes=5), 1)
    later.cond(st.Cond.QUOTA_RESERVED, False, "WaitingForCapacity", "b")
    c = later.status.conditions[0]
    assert c.last_transition_time == NOW
    assert c.reason == "WaitingForCapacity"
    later.cond(st.Cond.QUOTA_RESERVED, True, "WithinGuarantee", "c")
    assert later.status.conditions[0].last_transition_time == NOW + timedelta(minutes=5)


def test_running_records_the_gpus_the_extender_bound() -> None:
    status = GpuJobStatus(
        phase=JobPhase.ADMITTED,
        placement=[ReplicaPlacement(replica=0, node="n0", gpu_indices=[0, 1])],
    )
    pod = PodFacts(
        name="train-1-0",
        namespace="ns",
        phase="Running",
        node="n0",
        deleting=False,
        created=NOW,
        labels={keys.LABEL_REPLICA_INDEX: "0"},
        annotations={
            keys.ANNOTATION_GPU_INDICES: "2,3",
            keys.ANNOTATION_GPUS: "GPU-a,GPU-b",
            keys.ANNOTATION_TOPOLOGY_CLASS: "nvlink",
        },
        gpus=2,
        scheduler=keys.SCHEDULER_NAME,
    )
    s = st.running(st.Transition(status, NOW, 1), 1, [pod]).status
    assert s.phase is JobPhase.RUNNING
    assert s.started_at == NOW
    assert s.placement[0].gpu_indices == [2, 3]
    assert s.placement[0].gpu_uuids == ["GPU-a", "GPU-b"]
    assert s.placement_quality == "nvlink"


def test_running_ignores_a_gpu_set_the_extender_cannot_have_written() -> None:
    """A set on a pod of another scheduler, or naming more GPUs than the pod requests, is not
    recorded as bound: the plan stays."""
    status = GpuJobStatus(
        phase=JobPhase.ADMITTED,
        placement=[ReplicaPlacement(replica=0, node="n0", gpu_indices=[0, 1])],
    )
    for scheduler, indices in (("default-scheduler", "2,3"), (keys.SCHEDULER_NAME, "0,1,2,3")):
        pod = PodFacts(
            name="train-1-0",
            namespace="ns",
            phase="Running",
            node="n0",
            deleting=False,
            created=NOW,
            labels={keys.LABEL_REPLICA_INDEX: "0"},
            annotations={keys.ANNOTATION_GPU_INDICES: indices},
            gpus=2,
            scheduler=scheduler,
        )
        s = st.running(st.Transition(status, NOW, 1), 1, [pod]).status
        assert s.placement[0].gpu_indices == [0, 1], scheduler
        assert pod.claim.ignored, scheduler


def _node(name: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {keys.GFD_PRODUCT: "H100"}},
        "spec": {},
        "status": {
            "allocatable": {keys.GPU_RESOURCE: "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for key, value in extra.items():
        body[key].update(value)
    return body


def test_only_ready_schedulable_gpu_nodes_with_a_topology_are_admission_candidates() -> None:
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", "wired")
    topology = {
        "metadata": {"name": "wired", "resourceVersion": "1"},
        "spec": spec.to_k8s(),
        "status": status.to_k8s(),
    }
    raw = [
        _node("wired"),
        _node("plain"),  # no NodeGpuTopology: the extender would refuse it
        _node("cordoned", spec={"unschedulable": True}),
        _node("down", status={"conditions": [{"type": "Ready", "status": "False"}]}),
        _node("cpu", status={"allocatable": {}}),
    ]
    busy = {"wired": ({1}, 2)}
    nodes = {n.name: n for n in NodeReader().nodes(raw, {"wired": topology}, busy)}
    assert set(nodes) == {"wired"}
    assert not nodes["wired"].count_only
    assert nodes["wired"].topology.wiring.n == 8
    assert (nodes["wired"].busy, nodes["wired"].busy_count) == (frozenset({1}), 2)
    only_pool = NodeReader({"pool": "x"}).nodes(raw, {}, {})
    assert only_pool == []


def test_operator_metrics_have_the_documented_names() -> None:
    from pathlib import Path

    from prometheus_client import generate_latest

    from gpusched.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.jobs.labels("t", "Queued").set(1)
    metrics.queue_wait.labels("t", "0").observe(3)
    metrics.admissions.labels("t", "Borrowing").inc()
    metrics.preemptions.labels("t", "HigherPriority").inc()
    metrics.preempted_gpu_seconds.labels("t", "HigherPriority").inc(3600)
    metrics.requeues.labels("t", "PodsLost").inc()
    for gauge in (
        metrics.gpus_used,
        metrics.gpus_guaranteed,
        metrics.gpus_borrowed,
        metrics.fair_share,
        metrics.gpu_seconds,
        metrics.gpus_pending,
        metrics.oldest_wait,
        metrics.reservations,
        metrics.reserved_idle_gpus,
        metrics.lending_hold_gpus,
        metrics.below_guarantee,
    ):
        gauge.labels("t").set(1)
    metrics.largest_free_domain.labels("clique").set(8)
    metrics.tenant_recent_borrowed.labels("t").set(2)
    metrics.tenant_cost.labels("t", "period").set(10)
    metrics.tenant_gpu_hours.labels("t", "7d").set(5)
    metrics.tenant_budget_cap.labels("t", "soft").set(100)
    metrics.user_gpus.labels("t", "alice").set(4)
    metrics.user_cost.labels("t", "alice").set(3)
    metrics.expected_start_error.labels("late").observe(60)
    metrics.runtime_history_kinds.set(3)
    metrics.cycle_seconds.labels("decide").observe(0.1)
    metrics.explain_seconds.labels("explain").observe(0.01)
    metrics.api_errors.labels("job-status").inc()
    metrics.webhook_reviews.labels("gpujobs", "allowed").inc()
    metrics.count_request("GET", "/api/v1/pods", 200)
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    docs = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    docs = docs.split("\n## Operator", 1)[1].split("\n## ", 1)[0]
    documented = {
        cell.strip("` ")
        for line in docs.splitlines()
        if line.startswith("| `gpusched_")
        for cell in [line.split("|")[1]]
    }
    assert documented
    histogram_parts = {"_bucket", "_count", "_sum"}
    for name in documented:
        assert name in exported or {name + p for p in histogram_parts} <= exported, name


def test_pods_run_at_the_jobs_priority_class() -> None:
    pod = pod_manifest(
        gpujob(priorityClassName="team-high"), tenant="t", admission=1, replica=0, placement=None
    )
    assert pod["spec"]["priorityClassName"] == "team-high"
    plain = pod_manifest(gpujob(), tenant="t", admission=1, replica=0, placement=None)
    assert "priorityClassName" not in plain["spec"]


def test_a_template_never_passes_gpu_ownership_annotations_to_its_pods() -> None:
    """A job stored before the CRD refused them: the pods still carry none of them (only the
    operator's own plan)."""
    job = gpujob()
    job.spec.template["metadata"]["annotations"].update(
        {keys.ANNOTATION_GPU_INDICES: "0,1,2,3", keys.ANNOTATION_PLANNED_NODE: "elsewhere"}
    )
    plan = ReplicaPlacement(replica=0, node="node-a", gpu_indices=[0, 1, 2, 3])
    pod = pod_manifest(job, tenant="t", admission=1, replica=0, placement=plan)
    annotations = pod["metadata"]["annotations"]
    assert keys.ANNOTATION_GPU_INDICES not in annotations
    assert annotations[keys.ANNOTATION_PLANNED_NODE] == "node-a"
    assert annotations["a"] == "b"


def test_pods_run_to_completion_unless_the_template_restarts_failed_containers() -> None:
    """Kubernetes' default restartPolicy (Always) would restart a finished trainer for ever:
    a pod that does not say is made Never; OnFailure is kept; Always (refused by the CRD, so only
    from a job stored before that rule) becomes Never too."""

    def restart_policy(template_policy: str | None) -> str:
        job = gpujob()
        if template_policy is not None:
            job.spec.template["spec"]["restartPolicy"] = template_policy
        pod = pod_manifest(job, tenant="t", admission=1, replica=0, placement=None)
        return str(pod["spec"]["restartPolicy"])

    assert restart_policy(None) == "Never"
    assert restart_policy("OnFailure") == "OnFailure"
    assert restart_policy("Never") == "Never"
    assert restart_policy("Always") == "Never"


def test_a_gpu_pod_outside_gpujobs_is_charged_to_the_tenant_of_its_namespace() -> None:
    """A pod asking nvidia.com/gpu directly in a tenant's namespace (made before the chart's
    admission policy, or without it) counts against the tenant: its usage and its borrowing
    limit; elsewhere it only keeps its GPUs out of placement."""
    from gpusched.api.tenantquota import TenantQuota
    from gpusched.operator.decide import OperatorConfig, decide
    from gpusched.operator.store import World

    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", "wired")
    topology = {"metadata": {"name": "wired", "resourceVersion": "1"}, "spec": spec.to_k8s()}
    topology["status"] = status.to_k8s()
    quota = TenantQuota.model_validate(
        {
            "metadata": {"name": "team", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"namespaces": ["team"], "guaranteedGpus": 4, "borrowingLimit": 6},
        }
    )

    def plain_pod(namespace: str, name: str, gpus: int) -> PodFacts:
        return PodFacts.from_api(
            {
                "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}"},
                "spec": {
                    "nodeName": "wired",
                    "containers": [
                        {"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: gpus}}}
                    ],
                },
                "status": {"phase": "Running"},
            }
        )

    queued = JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": "train", "namespace": "team", "uid": "j", "generation": 1},
            "spec": {
                "gpusPerReplica": 4,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": {"phase": "Queued", "tenant": "team"},
        }
    )
    world = World(
        now=NOW,
        jobs=(queued,),
        quotas=(quota,),
        nodes=(_node("wired"),),
        topologies={"wired": topology},
        priorities={},
        default_priority=0,
        pods=(plain_pod("team", "sneaky", 3), plain_pod("other", "elsewhere", 1)),
    )
    decision = decide(world, {}, OperatorConfig(), NodeReader())
    (usage,) = decision.result.tenants
    assert usage.used == 3
    waiting = decision.result.waiting_of("team/train")
    assert waiting is not None
    assert waiting.reason.value == "QuotaExceeded"  # 3 + 4 > 6
    # The pod in a namespace no tenant owns is held, not charged.
    (node,) = decision.snapshot.nodes
    assert node.busy_count == 1
