"""What an ordinary user (the built-in ``edit`` role in one namespace) may not do to GPU
ownership, quotas and priorities, asked of the real API server under the chart's admission
policies: every attempt is refused when it is made, with a sentence naming what was refused.
The end-to-end version, with the components running and pods on real kubelets, is
``e2e/test_hostile_user.py``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.dev.chart import render
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.kube import api_client
from tests.cases.manifests import gpujob, tenantquota

G, V = keys.GROUP, keys.VERSION
_names = itertools.count()


def refused(call: Callable[[], Any]) -> str:
    """Run a request that must be refused; the server's message."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value
    return str(caught.value.body)


def gpu_pod(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}} if gpus else {},
                }
            ],
            **spec,
        },
    }


class User:
    """Clients of one namespace's editor."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def create_pod(self, body: dict[str, Any]) -> Any:
        return self.core.create_namespaced_pod(self.namespace, body)

    def create_job(self, body: dict[str, Any]) -> Any:
        return self.custom.create_namespaced_custom_object(G, V, self.namespace, "gpujobs", body)


@pytest.fixture
def tenant(local_cluster: LocalCluster, kube: Any) -> Iterator[tuple[User, str]]:
    """A namespace a TenantQuota owns, its editor, and the chart's admission policies."""
    identities.install(local_cluster, identities.ACCESS)
    n = next(_names)
    namespace, quota = f"hostile-{n}", f"hostile-tenant-{n}"
    config = identities.namespace_editor(local_cluster, namespace)
    custom = client.CustomObjectsApi(kube)
    body = tenantquota(quota, namespaces=[namespace], allowedPriorityClasses=["team-low"])
    custom.create_cluster_custom_object(G, V, "tenantquotas", body)
    api = api_client(config)
    _wait_for_params(User(api, namespace))
    yield User(api, namespace), quota
    api.close()
    custom.delete_cluster_custom_object(G, V, "tenantquotas", quota)
    client.CoreV1Api(kube).delete_namespace(namespace, grace_period_seconds=0)


def _wait_for_params(user: User, timeout: float = 30.0) -> None:
    """The policies read TenantQuotas from an informer: wait until the new one is seen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            user.core.create_namespaced_pod(user.namespace, gpu_pod("probe-params"), dry_run="All")
        except ApiException as err:
            if err.status == 403:
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError("the tenant-gpu-pods policy never saw the TenantQuota")
        time.sleep(0.3)


# --- 1. GPU ownership ---------------------------------------------------------------------


@pytest.mark.parametrize("key", keys.OWNERSHIP_ANNOTATIONS)
def test_a_user_cannot_create_a_pod_claiming_gpus(tenant: tuple[User, str], key: str) -> None:
    user, _ = tenant
    body = gpu_pod("claims", gpus=0, annotations={key: "0,1,2,3,4,5,6,7"}, nodeName="gpu-node")
    message = refused(lambda: user.create_pod(body))
    assert f"only gpusched writes {key}" in message


def test_a_user_cannot_rewrite_or_remove_the_gpus_of_a_running_pod(
    local_cluster: LocalCluster, kube: Any, tenant: tuple[User, str]
) -> None:
    """The extender wrote the pod's GPUs in its Binding; its owner may edit the pod (labels,
    other annotations) but not those."""
    user, _ = tenant
    admin = client.CoreV1Api(kube)
    admin.create_namespaced_pod(
        user.namespace, gpu_pod("mine", gpus=0, schedulerName="nobody")
    )  # an admin may create it: it asks no GPU, the tenant policy leaves it alone
    admin.create_namespaced_pod_binding(
        "mine",
        user.namespace,
        {
            "metadata": {"name": "mine", "annotations": {keys.ANNOTATION_GPU_INDICES: "0,1"}},
            "target": {"kind": "Node", "name": "some-node"},
        },
        _preload_content=False,
    )
    for change in ({keys.ANNOTATION_GPU_INDICES: "2,3"}, {keys.ANNOTATION_GPU_INDICES: None}):
        message = refused(
            lambda change=change: user.core.patch_namespaced_pod(
                "mine", user.namespace, {"metadata": {"annotations": change}}
            )
        )
        assert keys.ANNOTATION_GPU_INDICES in message
    user.core.patch_namespaced_pod(
        "mine", user.namespace, {"metadata": {"annotations": {"team.example/note": "ok"}}}
    )
    stored = admin.read_namespaced_pod("mine", user.namespace).metadata.annotations
    assert stored[keys.ANNOTATION_GPU_INDICES] == "0,1"


def test_even_a_cluster_admin_writes_no_gpu_ownership_on_a_pod(
    kube: Any, tenant: tuple[User, str]
) -> None:
    """Only gpusched's identities: an admin's hand-edit would be the same forgery."""
    user, _ = tenant
    body = gpu_pod("admin-claims", gpus=0, annotations={keys.ANNOTATION_PLANNED_NODE: "n1"})
    refused(lambda: client.CoreV1Api(kube).create_namespaced_pod(user.namespace, body))


# --- 2. quota escapes ---------------------------------------------------------------------


def _gangs_pod(
    local_cluster: LocalCluster, admin: Any, namespace: str, quota: str, **spec: Any
) -> tuple[str, str]:
    """A GpuJob and a pod of its gang as the operator makes it (labels, controller reference,
    made under the operator's identity: nobody else may give a pod those), without GPUs."""
    job = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        G, V, namespace, "gpujobs", gpujob("gang")
    )
    uid = job["metadata"]["uid"]
    pod = gpu_pod("gang-1-0", gpus=0, schedulerName=keys.SCHEDULER_NAME, **spec)
    pod["metadata"]["labels"] = _job_labels("gang", uid, quota)
    pod["metadata"]["ownerReferences"] = [_controller("gang", uid)]
    operator = api_client(identities.kubeconfig(local_cluster, identities.OPERATOR))
    try:
        client.CoreV1Api(operator).create_namespaced_pod(namespace, pod)
    finally:
        operator.close()
    return "gang-1-0", uid


def _job_labels(job: str, uid: str, quota: str) -> dict[str, str]:
    """The labels the operator gives the first pod of a job's first admission."""
    return {
        keys.LABEL_JOB_NAME: job,
        keys.LABEL_JOB_UID: uid,
        keys.LABEL_TENANT: quota,
        keys.LABEL_REPLICA_INDEX: "0",
        keys.LABEL_ADMISSION: "1",
    }


def _controller(job: str, uid: str) -> dict[str, Any]:
    """The controller reference the operator gives a job's pods."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "name": job,
        "uid": uid,
        "controller": True,
    }


@pytest.mark.parametrize(
    "change",
    [
        {"labels": {keys.LABEL_JOB_UID: None}},
        {"labels": {keys.LABEL_JOB_NAME: "another"}},
        {"labels": {keys.LABEL_ADMISSION: "2"}},
        {"ownerReferences": None},
    ],
    ids=["job-uid-removed", "job-name-changed", "admission-changed", "owner-removed"],
)
def test_a_user_cannot_take_a_pod_out_of_its_gpujob(
    local_cluster: LocalCluster, kube: Any, tenant: tuple[User, str], change: dict[str, Any]
) -> None:
    """A pod taken out of its job would keep its GPUs as a plain pod of the tenant: charged,
    but never preempted, reclaimed or stopped at the job's limit."""
    user, quota = tenant
    pod, uid = _gangs_pod(local_cluster, kube, user.namespace, quota)
    field = f"metadata.{next(iter(change))}"
    message = refused(
        lambda: user.core.patch_namespaced_pod(pod, user.namespace, {"metadata": change})
    )
    assert field in message
    user.core.patch_namespaced_pod(
        pod, user.namespace, {"metadata": {"labels": {"team.example/stage": "two"}}}
    )
    stored = client.CoreV1Api(kube).read_namespaced_pod(pod, user.namespace).metadata
    assert stored.labels[keys.LABEL_JOB_UID] == uid
    assert [o.uid for o in stored.owner_references] == [uid]


def test_a_user_cannot_give_a_gpujobs_pod_a_longer_grace_period_when_deleting_it(
    local_cluster: LocalCluster, kube: Any, tenant: tuple[User, str]
) -> None:
    """A pod that ignores SIGTERM keeps its GPUs through its grace period, and once its job is
    deleted nothing charges them: a deletion or an eviction may not ask longer than the pod's
    own (the job's checkpointGracePeriodSeconds), nor than its tenant allows."""
    user, quota = tenant
    # On a node with no kubelet, so that a deletion stays graceful for the test to look at.
    pod, _ = _gangs_pod(
        local_cluster,
        kube,
        user.namespace,
        quota,
        nodeName="no-kubelet",
        terminationGracePeriodSeconds=30,
    )
    admin = client.CoreV1Api(kube)
    try:
        message = refused(
            lambda: user.core.delete_namespaced_pod(pod, user.namespace, grace_period_seconds=10**8)
        )
        assert "gracePeriodSeconds" in message
        eviction = {"metadata": {"name": pod}, "deleteOptions": {"gracePeriodSeconds": 10**8}}
        message = refused(
            lambda: user.core.create_namespaced_pod_eviction(pod, user.namespace, eviction)
        )
        assert "deleteOptions.gracePeriodSeconds" in message
        assert admin.read_namespaced_pod(pod, user.namespace).metadata.deletion_timestamp is None
        user.core.delete_namespaced_pod(pod, user.namespace, grace_period_seconds=5)
        deleting = admin.read_namespaced_pod(pod, user.namespace).metadata
        assert deleting.deletion_grace_period_seconds == 5
    finally:
        admin.delete_namespaced_pod(pod, user.namespace, grace_period_seconds=0)


def test_a_gpujob_deleted_with_cascade_orphan_leaves_no_pod_outside_it(
    local_cluster: LocalCluster, kube: Any, tenant: tuple[User, str]
) -> None:
    """The garbage collector orphaning the pods would take them out of the job as surely as a
    user's edit: it is refused (the operator deletes the pods of a job being deleted). A
    ConfigMap the job also owns shows when the collector has orphaned what it may."""
    user, quota = tenant
    pod, uid = _gangs_pod(local_cluster, kube, user.namespace, quota)
    core = client.CoreV1Api(kube)
    owner = {"apiVersion": keys.API_VERSION, "kind": "GpuJob", "name": "gang", "uid": uid}
    core.create_namespaced_config_map(
        user.namespace, {"metadata": {"name": "witness", "ownerReferences": [owner]}}
    )
    user.custom.delete_namespaced_custom_object(
        G, V, user.namespace, "gpujobs", "gang", propagation_policy="Orphan"
    )
    # The collector finds a new kind's objects at its next discovery (every 30 seconds).
    deadline = time.monotonic() + 120
    while core.read_namespaced_config_map("witness", user.namespace).metadata.owner_references:
        assert time.monotonic() < deadline, "the garbage collector never orphaned the ConfigMap"
        time.sleep(0.5)
    stored = core.read_namespaced_pod(pod, user.namespace).metadata
    assert [o.uid for o in stored.owner_references or []] == [uid]


@pytest.mark.parametrize(
    "claim",
    [
        {"labels": {keys.LABEL_JOB_UID: "UID"}, "ownerReferences": ["OWNER"]},
        {"labels": {keys.LABEL_JOB_NAME: "mine", keys.LABEL_ADMISSION: "0"}},
        {"ownerReferences": ["OWNER"]},
    ],
    ids=["uid-and-controller", "name-and-admission", "controller"],
)
def test_a_user_cannot_make_a_pod_of_their_own_pass_for_a_gpujobs(
    kube: Any, tenant: tuple[User, str], claim: dict[str, Any]
) -> None:
    """The operator counts a pod with a job's uid and controller reference as the job's (not
    charged to the tenant as a plain GPU pod), and one with a job's name and current
    admission as already counted with the job: a GPU pod of the namespace (one there before
    its tenant) given either would hold GPUs nothing charges. A pod gets them only from the
    operator, neither when it is created nor later; its other labels stay the user's."""
    user, _ = tenant
    uid = user.create_job(gpujob("mine"))["metadata"]["uid"]
    metadata: dict[str, Any] = {}
    if "labels" in claim:
        metadata["labels"] = {k: uid if v == "UID" else v for k, v in claim["labels"].items()}
    if "ownerReferences" in claim:
        metadata["ownerReferences"] = [_controller("mine", uid)]
    field = "metadata.labels" if "labels" in claim else "metadata.ownerReferences"

    born = gpu_pod("born-claiming", gpus=0)
    born["metadata"].update(metadata)
    assert field in refused(lambda: user.create_pod(born))

    user.create_pod(gpu_pod("plain", gpus=0))
    message = refused(
        lambda: user.core.patch_namespaced_pod("plain", user.namespace, {"metadata": metadata})
    )
    assert field in message
    assert "only the gpusched operator" in message
    user.core.patch_namespaced_pod(
        "plain", user.namespace, {"metadata": {"labels": {"team.example/stage": "two"}}}
    )
    stored = client.CoreV1Api(kube).read_namespaced_pod("plain", user.namespace).metadata
    assert not set(stored.labels) & set(keys.GPUJOB_POD_LABELS)
    assert not stored.owner_references


@pytest.mark.parametrize("scheduler", [keys.SCHEDULER_NAME, "default-scheduler"])
def test_a_gpu_pod_in_a_tenants_namespace_is_refused_whatever_its_scheduler(
    tenant: tuple[User, str], scheduler: str
) -> None:
    user, quota = tenant
    message = refused(lambda: user.create_pod(gpu_pod("bare", schedulerName=scheduler)))
    assert f"belongs to tenant {quota}" in message
    assert "GpuJob" in message
    init = gpu_pod("init-only", gpus=0)
    init["spec"]["initContainers"] = [
        {"name": "warm", "image": "i", "resources": {"requests": {keys.GPU_RESOURCE: "8"}}}
    ]
    refused(lambda: user.create_pod(init))
    user.create_pod(gpu_pod("cpu-only", gpus=0))  # pods without GPUs are the tenant's business


def test_a_deployment_of_gpu_pods_in_a_tenants_namespace_creates_none(
    tenant: tuple[User, str],
) -> None:
    """The ReplicaSet controller's creations are refused too; the reason is on the ReplicaSet."""
    user, quota = tenant
    template = {"metadata": {"labels": {"app": "sneaky"}}, "spec": gpu_pod("x")["spec"]}
    user.apps.create_namespaced_deployment(
        user.namespace,
        {
            "metadata": {"name": "sneaky"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "sneaky"}},
                "template": template,
            },
        },
    )
    deadline = time.monotonic() + 60
    while True:
        sets = user.apps.list_namespaced_replica_set(user.namespace).items
        failure = [
            c.message
            for rs in sets
            for c in (rs.status.conditions or [])
            if c.type == "ReplicaFailure"
        ]
        if failure:
            break
        assert time.monotonic() < deadline, "the ReplicaSet never reported its refused pods"
        time.sleep(0.5)
    assert f"belongs to tenant {quota}" in failure[0]
    assert not user.core.list_namespaced_pod(user.namespace, label_selector="app=sneaky").items


def test_a_gpu_pod_where_no_tenant_owns_the_namespace_is_allowed(
    local_cluster: LocalCluster, tenant: tuple[User, str]
) -> None:
    """Namespaces no TenantQuota names keep plain GPU pods (the extender alone places them)."""
    config = identities.namespace_editor(local_cluster, "no-tenant-here")
    api = api_client(config)
    try:
        client.CoreV1Api(api).create_namespaced_pod(
            "no-tenant-here", gpu_pod("plain", schedulerName=keys.SCHEDULER_NAME), dry_run="All"
        )
    finally:
        api.close()


# --- 5. priority classes ------------------------------------------------------------------


def test_a_gpujob_may_not_name_a_system_priority_class(tenant: tuple[User, str]) -> None:
    user, _ = tenant
    message = refused(
        lambda: user.create_job(gpujob("greedy", priorityClassName="system-node-critical"))
    )
    assert "spec.priorityClassName" in message


def test_a_gpujob_may_name_only_the_classes_its_tenant_allows(
    kube: Any, tenant: tuple[User, str]
) -> None:
    user, quota = tenant
    scheduling = client.SchedulingV1Api(kube)
    for name, value in (("team-low", 10), ("team-high", 1000)):
        try:
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        except ApiException as err:
            if err.status != 409:
                raise
    message = refused(lambda: user.create_job(gpujob("jumpy", priorityClassName="team-high")))
    assert f"tenant {quota} allows team-low, not team-high" in message
    user.create_job(gpujob("polite", priorityClassName="team-low"))
    user.create_job(gpujob("unnamed"))


def test_gpuscheds_own_priority_class_is_for_gpuscheds_pods_alone(
    kube: Any, tenant: tuple[User, str]
) -> None:
    """The class the chart makes for its components outranks every workload and preempts: a
    user's pod with it would have the default scheduler evict other tenants' pods for it, and
    a GpuJob naming it (any class goes where the tenant lists none) would outrank its
    tenant's every job. Both are refused outside the release's namespace."""
    user, quota = tenant
    chart_class = next(obj for obj in render.render() if obj["kind"] == "PriorityClass")
    name = chart_class["metadata"]["name"]
    # helm writes the value as 1e+09, a number to the API server's YAML, a string to PyYAML.
    chart_class["value"] = int(float(chart_class["value"]))
    try:
        client.SchedulingV1Api(kube).create_priority_class(chart_class)
    except ApiException as err:
        if err.status != 409:
            raise
    custom = client.CustomObjectsApi(kube)
    custom.patch_cluster_custom_object(
        G, V, "tenantquotas", quota, {"spec": {"allowedPriorityClasses": None}}
    )
    _wait_for_class_allowed(user, "team-high")

    message = refused(lambda: user.create_pod(gpu_pod("outranks", gpus=0, priorityClassName=name)))
    assert f"spec.priorityClassName: {name} is the class of gpusched's own pods" in message
    message = refused(lambda: user.create_job(gpujob("outranks", priorityClassName=name)))
    assert f"spec.priorityClassName: {name}" in message
    user.create_job(gpujob("ranked", priorityClassName="team-high"))
    message = refused(
        lambda: user.custom.patch_namespaced_custom_object(
            G, V, user.namespace, "gpujobs", "ranked", {"spec": {"priorityClassName": name}}
        )
    )
    assert f"spec.priorityClassName: {name}" in message
    # gpusched's own pods keep it.
    client.CoreV1Api(kube).create_namespaced_pod(
        identities.NAMESPACE, gpu_pod("component", gpus=0, priorityClassName=name), dry_run="All"
    )


def _wait_for_class_allowed(user: User, class_name: str, timeout: float = 30.0) -> None:
    """The policy reads TenantQuotas from an informer: wait until it lets ``class_name``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            user.custom.create_namespaced_custom_object(
                G,
                V,
                user.namespace,
                "gpujobs",
                gpujob("probe-class", priorityClassName=class_name),
                dry_run="All",
            )
            return
        except ApiException as err:
            if err.status not in (403, 422) or time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def _wait_for_class_refused(user: User, class_name: str, timeout: float = 30.0) -> None:
    """The policy reads TenantQuotas from an informer: wait until it refuses ``class_name``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            user.custom.create_namespaced_custom_object(
                G,
                V,
                user.namespace,
                "gpujobs",
                gpujob("probe-class", priorityClassName=class_name),
                dry_run="All",
            )
        except ApiException as err:
            if err.status in (403, 422):
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the priority-class policy never refused {class_name}")
        time.sleep(0.3)


def test_a_gpujob_stays_editable_after_its_tenant_disallows_its_class(
    kube: Any, tenant: tuple[User, str]
) -> None:
    """Narrowing ``allowedPriorityClasses`` refuses new jobs and changes of class, never the
    updates an existing job keeps receiving: its workload's checkpoint annotation, a label, and
    the garbage collector removing ``foregroundDeletion`` when it is deleted."""
    user, quota = tenant
    scheduling = client.SchedulingV1Api(kube)
    for name, value in (("team-low", 10), ("team-high", 1000)):
        try:
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        except ApiException as err:
            if err.status != 409:
                raise
    user.create_job(gpujob("settled", priorityClassName="team-low"))
    client.CustomObjectsApi(kube).patch_cluster_custom_object(
        G, V, "tenantquotas", quota, {"spec": {"allowedPriorityClasses": ["team-high"]}}
    )
    _wait_for_class_refused(user, "team-low")

    edit = {
        "metadata": {
            "annotations": {keys.ANNOTATION_LAST_CHECKPOINT: "2030-01-01T00:00:00Z"},
            "labels": {"stage": "two"},
        }
    }
    user.custom.patch_namespaced_custom_object(G, V, user.namespace, "gpujobs", "settled", edit)
    stored = user.custom.get_namespaced_custom_object(G, V, user.namespace, "gpujobs", "settled")
    assert stored["metadata"]["annotations"][keys.ANNOTATION_LAST_CHECKPOINT] == (
        "2030-01-01T00:00:00Z"
    )
    assert stored["spec"]["priorityClassName"] == "team-low"

    message = refused(
        lambda: user.custom.patch_namespaced_custom_object(
            G, V, user.namespace, "gpujobs", "settled", {"spec": {"priorityClassName": "team-mid"}}
        )
    )
    assert f"tenant {quota} allows team-high, not team-mid" in message
    client.CustomObjectsApi(kube).patch_cluster_custom_object(
        G, V, "tenantquotas", quota, {"spec": {"allowedPriorityClasses": []}}
    )
    _wait_for_class_refused(user, "team-high")
    message = refused(
        lambda: user.custom.patch_namespaced_custom_object(
            G, V, user.namespace, "gpujobs", "settled", {"spec": {"priorityClassName": "team-mid"}}
        )
    )
    assert f"tenant {quota} allows no PriorityClass, not team-mid" in message

    user.custom.delete_namespaced_custom_object(
        G, V, user.namespace, "gpujobs", "settled", propagation_policy="Foreground"
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            user.custom.get_namespaced_custom_object(G, V, user.namespace, "gpujobs", "settled")
        except ApiException as err:
            if err.status == 404:
                break
            raise
        assert time.monotonic() < deadline, "the garbage collector never removed its finalizer"
        time.sleep(0.5)
