"""Helpers shared by the end-to-end tests."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpusched.api import keys


def gpu_pod(
    name: str,
    gpus: int,
    *,
    node: str | None = None,
    selector: dict[str, str] | None = None,
    scope: str | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """A pod for the gpusched scheduler asking for ``gpus`` GPUs."""
    annotations = {}
    if scope:
        annotations[keys.ANNOTATION_TOPOLOGY_SCOPE] = scope
    if mode:
        annotations[keys.ANNOTATION_TOPOLOGY_MODE] = mode
    node_selector = dict(selector or {})
    if node:
        node_selector["kubernetes.io/hostname"] = node
    spec: dict[str, Any] = {
        "schedulerName": keys.SCHEDULER_NAME,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll until ``condition()`` is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def pods(kube: Any, namespace: str) -> list[client.V1Pod]:
    """Pods of a namespace."""
    return list(client.CoreV1Api(kube).list_namespaced_pod(namespace).items)


def assigned(pod: client.V1Pod) -> tuple[int, ...] | None:
    """GPU indices written on a bound pod, None if it has none."""
    annotations = pod.metadata.annotations or {}
    value = annotations.get(keys.ANNOTATION_GPU_INDICES)
    if not pod.spec.node_name or value is None:
        return None
    return tuple(int(part) for part in value.split(","))


def extender_knows(url: str, nodes: list[str]) -> bool:
    """Whether the extender's cache has the topology of every node (asked through filter, the
    way kube-scheduler asks, for a pod too large for any node, so every node answers with its
    reason)."""
    probe = gpu_pod("probe", 10_000)
    body = json.dumps({"Pod": probe, "NodeNames": nodes}).encode()
    request = urllib.request.Request(
        f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        result = json.loads(response.read())
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    return not any(reason.startswith("NoTopology") for reason in refused.values())
