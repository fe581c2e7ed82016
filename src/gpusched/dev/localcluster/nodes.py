"""Simulated GPU nodes for the local cluster: kwok Nodes and, optionally, their NodeGpuTopology.

A kwok node is a Node object with the kwok annotation; kwok makes it Ready, renews its lease and
runs the pods bound to it. Its ``nvidia.com/gpu`` capacity is what a device plugin would report.
When a topology is given, the node also gets the NodeGpuTopology object a device probe would
publish, owned by the Node so that deleting the Node garbage-collects it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.api.nodegputopology import NodeGpuTopologySpec, NodeGpuTopologyStatus
from gpusched.kube import body

_LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
NODE_LABELS_BASE: Mapping[str, str] = {
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
    "type": "kwok",
}


def gpu_node_manifest(
    name: str,
    gpus: int = 8,
    *,
    labels: Mapping[str, str] | None = None,
    cpu: str = "128",
    memory: str = "1Ti",
    pods: int = 110,
) -> dict[str, Any]:
    """A kwok Node with ``gpus`` GPUs of allocatable ``nvidia.com/gpu``."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), keys.GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {keys.KWOK_NODE_ANNOTATION: keys.KWOK_NODE_ANNOTATION_VALUE},
            "labels": {**NODE_LABELS_BASE, "kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": {},
        # Ready from the start: otherwise the node lifecycle controller taints the new node
        # not-ready until kwok's first status update, and pods created meanwhile skip it.
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated by kwok",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


def topology_manifest(
    node: dict[str, Any] | client.V1Node,
    spec: NodeGpuTopologySpec,
) -> dict[str, Any]:
    """The NodeGpuTopology object for ``node``, owned by it."""
    if isinstance(node, client.V1Node):
        assert node.metadata is not None
        name, uid = node.metadata.name, node.metadata.uid
    else:
        name, uid = node["metadata"]["name"], node["metadata"]["uid"]
    body = spec.model_copy(update={"node_name": name}).to_k8s()
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "NodeGpuTopology",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": uid,
                    "blockOwnerDeletion": False,
                    "controller": False,
                }
            ],
        },
        "spec": body,
    }


def add_gpu_nodes(
    api: client.ApiClient,
    names: Iterable[str],
    gpus: int = 8,
    *,
    labels: Mapping[str, str] | None = None,
    topology: NodeGpuTopologySpec | None = None,
    status: NodeGpuTopologyStatus | None = None,
    parallelism: int = 16,
) -> list[str]:
    """Create kwok GPU nodes (and their NodeGpuTopology when ``topology`` is given)."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    names = list(names)

    def create(name: str) -> str:
        node = core.create_node(body(gpu_node_manifest(name, gpus, labels=labels)))
        if topology is not None:
            manifest = topology_manifest(node, topology)
            custom.create_cluster_custom_object(
                keys.GROUP, keys.VERSION, "nodegputopologies", manifest
            )
            if status is not None:
                custom.patch_cluster_custom_object_status(
                    keys.GROUP,
                    keys.VERSION,
                    "nodegputopologies",
                    name,
                    {"status": status.to_k8s()},
                )
        return name

    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(names)))) as pool:
        return list(pool.map(create, names))


def wait_nodes_ready(api: client.ApiClient, names: Iterable[str], timeout: float = 60.0) -> None:
    """Block until every node is Ready and carries no not-ready / unreachable taint."""
    core = client.CoreV1Api(api)
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for node in core.list_node(label_selector="type=kwok").items:
            conditions = (node.status.conditions if node.status else None) or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            tainted = any(
                t.key in _LIFECYCLE_TAINTS for t in (node.spec.taints if node.spec else None) or []
            )
            if node.metadata and ready and not tainted:
                pending.discard(node.metadata.name or "")
        if pending:
            time.sleep(0.2)
    if pending:
        raise TimeoutError(f"nodes not Ready after {timeout:.0f}s: {sorted(pending)[:10]}")


def delete_nodes(api: client.ApiClient, names: Iterable[str]) -> None:
    """Delete nodes, ignoring ones already gone."""
    core = client.CoreV1Api(api)
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as err:
            if err.status != 404:
                raise
