"""What each component's identity may do, asked of the real API server as that identity.

The local harness gives every component the credentials the Helm chart gives it in a cluster:
a token of the chart's ServiceAccount for that component (a probe's token bound to its Node, as
a DaemonSet pod's projected token is), under the RBAC and admission policies the chart renders.
Each check here is either a SelfSubjectAccessReview sent with that token (subresources asked as
subresources: ``kubectl auth can-i create pods/exec`` would ask about a pod named ``exec``) or a
real request whose refusal is the point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.components import start_extender_only
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.dev.localprobes import probe_kubeconfig
from gpusched.kube import api_client
from tests.integration.operator_harness import OperatorProcess

G, V = keys.GROUP, keys.VERSION
NGT = "nodegputopologies"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"


def allowed(
    api: Any,
    verb: str,
    resource: str,
    *,
    group: str = "",
    subresource: str = "",
    namespace: str = "",
    name: str = "",
) -> bool:
    """A SelfSubjectAccessReview: may the caller of ``api`` do this?"""
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                    "name": name,
                }
            },
        }
    )
    return bool(review.status.allowed)


def refused(call: Callable[[], Any]) -> str:
    """Run a request that must be refused; return the server's message."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value
    return str(caught.value.body)


@pytest.fixture
def as_identity() -> Iterator[Callable[[Path], Any]]:
    """Clients authenticated with a component kubeconfig, closed after the test."""
    opened: list[Any] = []

    def make(kubeconfig: Path) -> Any:
        api = api_client(kubeconfig)
        opened.append(api)
        return api

    yield make
    for api in opened:
        api.close()


# --- device probe: its own Node, and only what it owns there ---------------------------------


@pytest.fixture
def probe_nodes(
    local_cluster: LocalCluster, kube: Any, gpu_nodes: Callable[..., list[str]]
) -> tuple[str, str]:
    """Two GPU nodes with NodeGpuTopology objects: the probe's own and another one. The probe's
    identity is the chart's default (no node agent additions)."""
    identities.uninstall(local_cluster, identities.NODE_AGENT)
    own, other = gpu_nodes(2, gpus=4, prefix="confined")
    custom = client.CustomObjectsApi(kube)
    for node in (own, other):
        spec, status = fixture_objects(WORKSTATION, node)
        uid = client.CoreV1Api(kube).read_node(node).metadata.uid
        custom.create_cluster_custom_object(
            G,
            V,
            NGT,
            {
                "apiVersion": keys.API_VERSION,
                "kind": "NodeGpuTopology",
                "metadata": {
                    "name": node,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
                    ],
                },
                "spec": spec.to_k8s(),
            },
        )
        custom.patch_cluster_custom_object_status(G, V, NGT, node, {"status": status.to_k8s()})
    return own, other


def _probe_api(
    local_cluster: LocalCluster, node: str, as_identity: Callable[[Path], Any]
) -> tuple[client.CoreV1Api, client.CustomObjectsApi]:
    api = as_identity(probe_kubeconfig(local_cluster, node))
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def test_a_probe_cannot_cordon_taint_or_relabel_another_node(
    local_cluster: LocalCluster, probe_nodes: tuple[str, str], as_identity: Any, kube: Any
) -> None:
    own, other = probe_nodes
    core, _ = _probe_api(local_cluster, own, as_identity)
    for patch in (
        {"spec": {"unschedulable": True}},
        {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}},
        {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}},
        {"metadata": {"labels": {keys.LABEL_GPU_HEALTHY: "0"}}},
    ):
        refused(lambda patch=patch: core.patch_node(other, patch))
    node = client.CoreV1Api(kube).read_node(other)
    assert not node.spec.unschedulable
    assert node.metadata.labels["kubernetes.io/hostname"] == other
    assert keys.LABEL_GPU_HEALTHY not in node.metadata.labels


def test_a_probe_cannot_mark_a_gpu_of_another_node_unhealthy(
    local_cluster: LocalCluster, probe_nodes: tuple[str, str], as_identity: Any, kube: Any
) -> None:
    own, other = probe_nodes
    _, custom = _probe_api(local_cluster, own, as_identity)
    before = client.CustomObjectsApi(kube).get_cluster_custom_object(G, V, NGT, other)
    gpus = [dict(g, state="Unhealthy") for g in before["status"]["gpus"]]
    refused(
        lambda: custom.patch_cluster_custom_object_status(
            G, V, NGT, other, {"status": {"gpus": gpus}}
        )
    )
    refused(lambda: custom.patch_cluster_custom_object(G, V, NGT, other, {"spec": {"gpus": []}}))
    after = client.CustomObjectsApi(kube).get_cluster_custom_object(G, V, NGT, other)
    assert after["status"] == before["status"]
    assert after["spec"] == before["spec"]


def test_on_its_own_node_a_probe_changes_only_the_labels_and_taint_it_owns(
    local_cluster: LocalCluster, probe_nodes: tuple[str, str], as_identity: Any, kube: Any
) -> None:
    own, _ = probe_nodes
    core, custom = _probe_api(local_cluster, own, as_identity)
    for patch in (
        {"spec": {"unschedulable": True}},
        {"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}},
        {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}},
        {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
        {"metadata": {"annotations": {"example.com/anything": "x"}}},
        {"metadata": {"finalizers": ["example.com/hold"]}},
    ):
        message = refused(lambda patch=patch: core.patch_node(own, patch))
        assert "device probe" in message, message
    node = client.CoreV1Api(kube).read_node(own)
    assert not node.spec.unschedulable
    assert not node.spec.taints or all(t.key != "evil" for t in node.spec.taints)
    assert node.metadata.labels["kubernetes.io/hostname"] == own

    # What it owns stays writable: its labels, its taint, its own NodeGpuTopology.
    core.patch_node(own, {"metadata": {"labels": {keys.LABEL_GPU_HEALTHY: "3"}}})
    core.patch_node(
        own,
        {
            "spec": {
                "taints": [
                    {"key": keys.TAINT_NO_HEALTHY_GPU, "value": "true", "effect": "NoSchedule"}
                ]
            }
        },
    )
    core.patch_node(own, {"spec": {"taints": None}})
    current = custom.get_cluster_custom_object_status(G, V, NGT, own)
    custom.patch_cluster_custom_object_status(
        G, V, NGT, own, {"status": {"gpus": current["status"]["gpus"]}}
    )
    labels = client.CoreV1Api(kube).read_node(own).metadata.labels
    assert labels[keys.LABEL_GPU_HEALTHY] == "3"


def test_the_probe_identity_reaches_no_subresource_and_deletes_nothing(
    local_cluster: LocalCluster, probe_nodes: tuple[str, str], as_identity: Any
) -> None:
    own, _ = probe_nodes
    api = as_identity(probe_kubeconfig(local_cluster, own))
    assert allowed(api, "patch", "nodes", name=own)
    assert allowed(api, "patch", NGT, group=G, subresource="status", name=own)
    for verb, resource, group, subresource in (
        ("patch", "nodes", "", "status"),
        ("update", "nodes", "", ""),
        ("delete", "nodes", "", ""),
        ("get", "nodes", "", "proxy"),
        ("list", "nodes", "", ""),
        ("delete", NGT, G, ""),
        ("list", NGT, G, ""),
        ("create", "pods", "", "exec"),
        ("create", "pods", "", "eviction"),
        ("get", "secrets", "", ""),
        ("create", "gpujobs", G, ""),
    ):
        assert not allowed(
            api, verb, resource, group=group, subresource=subresource, namespace="default"
        ), (verb, resource, subresource)


# --- node agent: annotations on the pods of its own node -------------------------------------


@pytest.fixture
def node_agent_pods(
    local_cluster: LocalCluster, kube: Any, probe_nodes: tuple[str, str]
) -> Iterator[tuple[str, str, str]]:
    """The node agent's identity (the probe's, plus what the chart adds with
    ``nodeAgent.enabled``) and a pod bound to each of the two nodes: (namespace, own pod,
    other pod)."""
    identities.install(local_cluster, identities.NODE_AGENT)
    core = client.CoreV1Api(kube)
    namespace = f"node-agent-identity-{probe_nodes[0]}"
    core.create_namespace({"metadata": {"name": namespace}})
    for node in probe_nodes:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": node, "labels": {"app": "train"}},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "trainer:1"}],
                },
            },
        )
    yield namespace, probe_nodes[0], probe_nodes[1]
    core.delete_namespace(namespace, grace_period_seconds=0)
    identities.uninstall(local_cluster, identities.NODE_AGENT)


def test_the_node_agent_annotates_only_pods_of_its_own_node_and_only_its_two_keys(
    local_cluster: LocalCluster,
    kube: Any,
    node_agent_pods: tuple[str, str, str],
    as_identity: Any,
) -> None:
    namespace, own, other = node_agent_pods
    agent = client.CoreV1Api(as_identity(probe_kubeconfig(local_cluster, own)))

    def patch(pod: str, metadata: dict[str, Any]) -> Any:
        return agent.patch_namespaced_pod(pod, namespace, {"metadata": metadata})

    allocated = {
        keys.ANNOTATION_ALLOCATED_GPUS: "GPU-a",
        keys.ANNOTATION_ALLOCATED_GPU_INDICES: "0",
    }
    patch(own, {"annotations": allocated})
    message = refused(lambda: patch(other, {"annotations": allocated}))
    assert "bound to the node it runs on" in message
    message = refused(lambda: patch(own, {"annotations": {keys.ANNOTATION_GPUS: "GPU-b"}}))
    # Its own policy and the pod-gpu-ownership one both refuse it; either may answer first.
    assert "only the annotations" in message or "only gpusched writes" in message
    message = refused(lambda: patch(own, {"labels": {"app": "other"}}))
    assert "spec, labels" in message
    stored = client.CoreV1Api(kube).read_namespaced_pod(own, namespace).metadata
    assert stored.annotations[keys.ANNOTATION_ALLOCATED_GPUS] == "GPU-a"
    assert keys.ANNOTATION_GPUS not in stored.annotations
    assert stored.labels == {"app": "train"}
    other_annotations = client.CoreV1Api(kube).read_namespaced_pod(other, namespace).metadata
    assert not other_annotations.annotations


def test_the_node_agent_identity_cannot_create_delete_or_exec_into_pods(
    local_cluster: LocalCluster, node_agent_pods: tuple[str, str, str], as_identity: Any
) -> None:
    namespace, own, _ = node_agent_pods
    api = as_identity(probe_kubeconfig(local_cluster, own))
    assert allowed(api, "patch", "pods", namespace=namespace, name=own)
    assert allowed(api, "watch", "pods")
    for verb, subresource in (
        ("create", ""),
        ("delete", ""),
        ("update", "status"),
        ("create", "exec"),
        ("create", "eviction"),
        ("create", "binding"),
        ("patch", "ephemeralcontainers"),
    ):
        assert not allowed(
            api, verb, "pods", subresource=subresource, namespace=namespace, name=own
        ), (verb, subresource)


# --- scheduler extender: what the HTTP process holds -----------------------------------------


def test_the_extender_identity_holds_only_what_the_extender_uses(
    local_cluster: LocalCluster, as_identity: Any
) -> None:
    extender = start_extender_only(local_cluster)
    try:
        api = as_identity(extender.kubeconfig)
        # What it uses: watch bound pods, topologies, nodes (their labels) and the network
        # levels, read a pod, bind it.
        assert allowed(api, "list", "pods")
        assert allowed(api, "watch", "pods")
        assert allowed(api, "get", "pods", namespace="team")
        assert allowed(api, "create", "pods", subresource="binding", namespace="team")
        assert allowed(api, "watch", NGT, group=G)
        assert allowed(api, "list", "nodes")
        assert allowed(api, "watch", "nodes")
        assert allowed(api, "watch", "networktopologies", group=G)
        # Nothing of kube-scheduler's role that the extender never calls.
        for verb, resource, group, subresource in (
            ("delete", "pods", "", ""),
            ("patch", "pods", "", ""),
            ("update", "pods", "", "status"),
            ("create", "pods", "", ""),
            ("create", "pods", "", "eviction"),
            ("create", "pods", "", "exec"),
            ("update", "persistentvolumes", "", ""),
            ("update", "persistentvolumeclaims", "", ""),
            ("update", "resourceclaims", "resource.k8s.io", "status"),
            ("create", "events", "", ""),
            ("update", "leases", "coordination.k8s.io", ""),
            ("patch", "nodes", "", ""),
            ("update", "nodes", "", "status"),
            ("get", "secrets", "", ""),
        ):
            assert not allowed(
                api, verb, resource, group=group, subresource=subresource, namespace="team"
            ), (verb, resource, subresource)
    finally:
        local_cluster.stop_process(extender.record)


# --- operator: pods only for GpuJobs, never in the system namespaces --------------------------


def _foreign_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def test_the_operator_creates_no_pod_in_the_system_namespaces_and_deletes_no_foreign_pod(
    local_cluster: LocalCluster, kube: Any, as_identity: Any
) -> None:
    operator = OperatorProcess(local_cluster)
    core = client.CoreV1Api(as_identity(operator.kubeconfig))
    for namespace in ("kube-system", "gpusched-system"):
        refused(
            lambda namespace=namespace: core.create_namespaced_pod(
                namespace, _foreign_pod("not-a-gang"), dry_run="All"
            )
        )
    admin = client.CoreV1Api(kube)
    admin.create_namespace({"metadata": {"name": "someone-else"}})
    try:
        admin.create_namespaced_pod("someone-else", _foreign_pod("bystander"))
        refused(lambda: core.delete_namespaced_pod("bystander", "someone-else", dry_run="All"))
        refused(
            lambda: core.patch_namespaced_pod(
                "bystander", "someone-else", {"metadata": {"annotations": {"x": "y"}}}
            )
        )
        # A pod that is not a GpuJob's gang member is refused outside the system namespaces too.
        refused(
            lambda: core.create_namespaced_pod(
                "someone-else", _foreign_pod("impostor"), dry_run="All"
            )
        )
    finally:
        admin.delete_namespace("someone-else", grace_period_seconds=0)


def test_the_operator_cannot_make_a_pod_a_gpujobs_by_relabelling_it_and_then_delete_it(
    local_cluster: LocalCluster, kube: Any, as_identity: Any
) -> None:
    """Its policy checks the pod before a change too: a bystander is no pod the operator may
    label as a GpuJob's gang member, change or delete (and nobody else may label it so); only
    pods a GpuJob controls are."""
    operator = OperatorProcess(local_cluster)
    core = client.CoreV1Api(as_identity(operator.kubeconfig))
    admin = client.CoreV1Api(kube)
    admin.create_namespace({"metadata": {"name": "relabelled"}})
    try:
        admin.create_namespaced_pod("relabelled", _foreign_pod("bystander"))
        job_labels = {keys.LABEL_JOB_NAME: "train", keys.LABEL_JOB_UID: "uid-of-a-job"}
        message = refused(
            lambda: core.patch_namespaced_pod(
                "bystander", "relabelled", {"metadata": {"labels": job_labels}}
            )
        )
        assert "before and after" in message
        # Nobody else may label it so either (the access policies): it stays a bystander,
        # which the operator may not delete.
        message = refused(
            lambda: admin.patch_namespaced_pod(
                "bystander", "relabelled", {"metadata": {"labels": job_labels}}
            )
        )
        assert "only the gpusched operator gives a pod" in message
        message = refused(lambda: core.delete_namespaced_pod("bystander", "relabelled"))
        assert "only pods of GpuJob gangs" in message
        assert (
            admin.read_namespaced_pod("bystander", "relabelled").metadata.deletion_timestamp is None
        )
    finally:
        admin.delete_namespace("relabelled", grace_period_seconds=0)


def test_the_scheduler_identity_deletes_no_pod(
    local_cluster: LocalCluster, kube: Any, as_identity: Any
) -> None:
    """kube-scheduler's built-in role may delete pods (its own preemption, off in the gpusched
    profile): the chart's policy refuses it."""
    api = as_identity(identities.kubeconfig(local_cluster, identities.KUBE_SCHEDULER))
    admin = client.CoreV1Api(kube)
    admin.create_namespace({"metadata": {"name": "sched-victim"}})
    try:
        admin.create_namespaced_pod("sched-victim", _foreign_pod("victim"))
        message = refused(
            lambda: client.CoreV1Api(api).delete_namespaced_pod("victim", "sched-victim")
        )
        assert "does not preempt" in message
    finally:
        admin.delete_namespace("sched-victim", grace_period_seconds=0)


def test_the_node_agent_records_only_its_own_kinds_of_event_from_its_node(
    local_cluster: LocalCluster, node_agent_pods: tuple[str, str, str], as_identity: Any
) -> None:
    namespace, own, other = node_agent_pods
    agent = client.CoreV1Api(as_identity(probe_kubeconfig(local_cluster, own)))

    def event(
        reason: str = "GpuAssignmentDrift",
        *,
        host: str = own,
        kind: str = "Pod",
        name: str = own,
        into: str | None = None,
    ) -> Any:
        return agent.create_namespaced_event(
            into or namespace,
            {
                "metadata": {"generateName": "e-"},
                "involvedObject": {
                    "kind": kind,
                    "name": name,
                    "namespace": namespace if kind == "Pod" else None,
                },
                "reason": reason,
                "message": "m",
                "type": "Warning",
                "source": {"component": "gpusched-node-agent", "host": host},
                "reportingComponent": "gpusched-node-agent",
                "reportingInstance": host,
            },
        )

    event()  # what it records: about a pod, from its node
    assert "reported from the node" in refused(lambda: event(host=other))
    assert "records only" in refused(lambda: event("Pwned"))
    assert "about pods" in refused(lambda: event(kind="Node", name=other, into="default"))
