"""A user with ``edit`` rights in one tenant's namespace tries, against gpusched running under
the chart's identities and access policies (operator, kube-scheduler and extender), to take GPUs
held by another tenant, to escape quota and to jump the queue with a priority class; every
attempt is refused when it is made, or charged."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.components import SchedulerProcesses
from gpusched.kube import api_client
from tests.integration.operator_harness import (
    G,
    OperatorProcess,
    Scenario,
    V,
    job_template,
    scenario,
    wait_for,
)


@pytest.fixture
def world(
    local_cluster: LocalCluster,
    kube: Any,
    gpu_nodes: Callable[..., list[str]],
    gpusched_scheduler: SchedulerProcesses,
) -> Iterator[tuple[Scenario, OperatorProcess]]:
    operator = OperatorProcess(local_cluster)
    operator.start()
    with scenario(kube, gpu_nodes) as s:
        yield s, operator
    operator.kill()


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value
    return str(caught.value.body)


def _user(local_cluster: LocalCluster, namespace: str) -> tuple[Any, Any]:
    api = api_client(identities.namespace_editor(local_cluster, namespace, "mallory"))
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def _plain_pod(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
                }
            ],
            **spec,
        },
    }


def test_a_hostile_tenant_member_takes_no_gpu_escapes_no_quota_and_jumps_no_queue(
    local_cluster: LocalCluster, kube: Any, world: tuple[Scenario, OperatorProcess]
) -> None:
    s, _ = world
    nodes = s.nodes(2)
    victim_quota, victim = s.tenant("victim", guaranteed=8)
    hostile_quota, hostile = s.tenant(
        "hostile",
        guaranteed=0,
        allowedPriorityClasses=[low := s.priority("low", 10)],
        preemption={"borrowedProtectionSeconds": 5},
    )
    high = s.priority("high", 1000)
    core, custom = _user(local_cluster, hostile)

    def submit(name: str, gpus: int, **spec: Any) -> Any:
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": name},
            "spec": {"gpusPerReplica": gpus, "template": job_template(), **spec},
        }
        return custom.create_namespaced_custom_object(G, V, hostile, "gpujobs", body)

    # The victim's job holds 2 GPUs somewhere.
    s.submit(victim, "victim-small", 2)
    s.wait_phase(victim, "victim-small", "Running", timeout=120)
    (victim_pod,) = s.pods(victim, "victim-small")
    their_gpus = victim_pod.metadata.annotations[keys.ANNOTATION_GPUS]
    their_node = victim_pod.spec.node_name

    # 1. GPU ownership: no pod of theirs, however made, may claim GPUs.
    submit("mine", 1, priorityClassName=low)
    s.wait_phase(hostile, "mine", "Running", timeout=120)
    (own,) = s.pods(hostile, "mine")
    for forged in (
        {keys.ANNOTATION_GPU_INDICES: "0,1,2,3,4,5,6,7"},
        {keys.ANNOTATION_GPUS: their_gpus},
        {keys.ANNOTATION_ALLOCATED_GPU_INDICES: "0"},
    ):
        refused(
            lambda forged=forged: core.patch_namespaced_pod(
                own.metadata.name, hostile, {"metadata": {"annotations": forged}}
            )
        )
    for attempt in (
        _plain_pod("thief", 2, nodeName=their_node, annotations={keys.ANNOTATION_GPUS: their_gpus}),
        _plain_pod(
            "steered",
            1,
            schedulerName=keys.SCHEDULER_NAME,
            annotations={keys.ANNOTATION_PLANNED_NODE: their_node},
        ),
        _plain_pod("blocker", 1, nodeName=nodes[1]),
    ):
        refused(lambda attempt=attempt: core.create_namespaced_pod(hostile, attempt))
    assert {p.metadata.name for p in s.core.list_namespaced_pod(hostile).items} == {
        own.metadata.name
    }

    # 2. Quota: no GPU beyond what its GpuJobs are charged.
    sidecar = job_template()
    sidecar["spec"]["containers"].append(
        {"name": "side", "image": "busybox", "resources": {"limits": {keys.GPU_RESOURCE: "8"}}}
    )
    assert "containers" in refused(lambda: submit("sidecar", 1, template=sidecar))
    wait_for(
        lambda: s.quota_status(hostile_quota).get("usedGpus") == 1,
        timeout=60,
        what="the hostile tenant charged its one GPU",
    )

    # A week of minRuntime and a day of grace on borrowed GPUs do not keep the victim's
    # guarantee away: the borrower's tenant lets them protect for 5 s.
    submit(
        "squat",
        6,
        priorityClassName=low,
        minRuntimeSeconds=7 * 24 * 3600,
        checkpointGracePeriodSeconds=24 * 3600,
        topology={"scope": "node", "mode": "required"},
    )
    s.wait_phase(hostile, "squat", "Running", timeout=120)
    squatted = s.pods(hostile, "squat")[0].spec.node_name
    s.submit(
        victim,
        "victim-big",
        6,
        template={
            **job_template(),
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": squatted},
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
    )
    try:
        s.wait_phase(victim, "victim-big", "Running", timeout=120)
    except AssertionError as err:
        raise AssertionError(f"{err}: {s.status(victim, 'victim-big')}") from None
    preempted = s.status(hostile, "squat")
    assert preempted["preemptions"][-1]["reason"] == "ReclaimGuarantee"

    # 5. Priority: no system class, only the tenant's, and the pods carry it.
    assert "spec.priorityClassName" in refused(
        lambda: submit("urgent", 1, priorityClassName="system-node-critical")
    )
    assert f"allows {low}, not {high}" in refused(
        lambda: submit("jumper", 1, priorityClassName=high)
    )
    assert (own.spec.priority_class_name, own.spec.priority) == (low, 10)
    assert victim_quota


def test_a_gpu_pod_made_before_its_namespace_had_a_tenant_is_charged(
    local_cluster: LocalCluster, kube: Any, world: tuple[Scenario, OperatorProcess]
) -> None:
    """The policy refuses new GPU pods in a tenant's namespace; one that was there first is
    counted against the tenant that takes the namespace over, and its owner cannot make it
    pass for a GpuJob's pod: with the job's uid and controller reference the operator would
    stop charging it, with the job's name and current admission it would count it nowhere."""
    s, _ = world
    (node,) = s.nodes(1)
    legacy = s.namespace("legacy")
    s.core.create_namespaced_pod(legacy, _plain_pod("old-notebook", 3, nodeName=node))
    wait_for(
        lambda: s.core.read_namespaced_pod("old-notebook", legacy).status.phase == "Running",
        timeout=60,
        what="the old pod running",
    )
    quota = s.quota("legacy", [legacy], guaranteed=4, borrowingLimit=4)
    wait_for(
        lambda: s.quota_status(quota).get("usedGpus") == 3,
        timeout=60,
        what="the tenant charged the pod's 3 GPUs",
    )
    s.submit(legacy, "two", 2)
    s.wait_reason(legacy, "two", "QuotaExceeded", timeout=60)

    core, _ = _user(local_cluster, legacy)
    uid = s.custom.get_namespaced_custom_object(G, V, legacy, "gpujobs", "two")["metadata"]["uid"]
    owner = {"apiVersion": keys.API_VERSION, "kind": "GpuJob", "name": "two", "uid": uid}
    for claim in (
        {"labels": {keys.LABEL_JOB_UID: uid}, "ownerReferences": [{**owner, "controller": True}]},
        {"labels": {keys.LABEL_JOB_NAME: "two", keys.LABEL_ADMISSION: "0"}},
    ):
        refused(
            lambda claim=claim: core.patch_namespaced_pod(
                "old-notebook", legacy, {"metadata": claim}
            )
        )
    time.sleep(5)  # a few admission cycles
    assert s.quota_status(quota).get("usedGpus") == 3
    assert s.status(legacy, "two").get("reason") == "QuotaExceeded"
