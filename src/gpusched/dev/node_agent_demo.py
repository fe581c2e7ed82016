"""The demo's node-side part: a real kubelet runs a pod, and its container receives exactly the
GPUs the extender wrote on it; a pod claiming another pod's GPUs is refused by the API server,
and one bound by hand gets none of the GPUs gpusched's pods hold."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.kubelet import KubeletNode, start_kubelet_node
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.dev.localnodeagent import start_device_plugin
from gpusched.dev.localprobes import start_fake_probe

NODE = "kubelet-h100"
FIXTURE = "hgx-h100-sxm-8gpu-8nic"


def _wait(check: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError("the node-agent demo waited too long; see the cluster's logs")


def _pod(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-o", "json").stdout))


def _holdings(node: KubeletNode) -> dict[str, frozenset[str]]:
    from gpusched.node_agent.kubelet import PodResourcesClient

    async def read() -> dict[str, frozenset[str]]:
        lister = PodResourcesClient(node.pod_resources_socket, keys.GPU_RESOURCE)
        try:
            return {key: pod.held for key, pod in (await lister.list()).items()}
        finally:
            await lister.close()

    return asyncio.run(read())


def _manifest(name: str, gpus: int, **extra: Any) -> str:
    spec: dict[str, Any] = {
        "schedulerName": keys.SCHEDULER_NAME,
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    spec.update(extra.pop("spec", {}))
    metadata = {"name": name, "namespace": "default", **extra}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})


def run_node_agent_demo(cluster: LocalCluster, echo: Callable[[str], None]) -> None:
    """Start a real kubelet node with its probe and gpusched's device plugin, run a pod on it and
    show what its container received. Needs the gpusched scheduler already running."""
    node = start_kubelet_node(cluster, NODE)
    start_fake_probe(cluster, NODE, fixture_path(FIXTURE))
    start_device_plugin(cluster, node)
    _wait(
        lambda: (
            json.loads(cluster.kubectl("get", "node", NODE, "-o", "json").stdout)["status"]
            .get("allocatable", {})
            .get(keys.GPU_RESOURCE)
            == "8"
        )
    )
    echo(f"$ kubectl get node {NODE}   (a real kubelet, built from the pinned release)")
    echo(cluster.kubectl("get", "node", NODE, "-o", "wide").stdout)
    echo(f"allocatable {keys.GPU_RESOURCE}: 8, advertised by gpusched's device plugin")

    cluster.kubectl("apply", "-f", "-", input=_manifest("trainer", 4))
    _wait(lambda: _pod(cluster, "trainer")["status"].get("phase") == "Running")
    pod = _pod(cluster, "trainer")
    assigned = pod["metadata"]["annotations"][keys.ANNOTATION_GPUS].split(",")
    indices = pod["metadata"]["annotations"][keys.ANNOTATION_GPU_INDICES]
    echo(f"pod/trainer Running; the extender chose GPUs {indices}:")
    for uuid in assigned:
        echo(f"  {keys.ANNOTATION_GPUS}: {uuid}")
    held = _holdings(node)["default/trainer"]
    echo(
        f"the kubelet's PodResources: the container holds {len(held)} GPUs, "
        f"{'the same set' if held == set(assigned) else 'A DIFFERENT SET: ' + ','.join(held)}"
    )
    created = [c for c in node.created_containers() if c["pod"] == "trainer"][-1]
    echo("what the kubelet asked the container runtime to give the container:")
    echo(f"  NVIDIA_VISIBLE_DEVICES={created['envs'].get('NVIDIA_VISIBLE_DEVICES')}")
    for device in created["cdiDevices"]:
        echo(f"  CDI device {device}")

    stolen = ",".join(assigned[:2])
    refused = cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=_manifest(
            "intruder",
            2,
            annotations={keys.ANNOTATION_GPUS: stolen},
            spec={"schedulerName": "default-scheduler", "nodeName": NODE},
        ),
        check=False,
    )
    echo("pod/intruder, claiming two of trainer's GPUs in its annotation, is refused by the API")
    echo(f"server (the chart's pod-gpu-ownership policy): {refused.stderr.strip()[:300]}")
    # Bound by hand (nodeName, no scheduler): the node agent gives it GPUs, never trainer's.
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=_manifest(
            "squatter", 2, spec={"schedulerName": "default-scheduler", "nodeName": NODE}
        ),
    )
    _wait(lambda: _pod(cluster, "squatter")["status"].get("phase") == "Running")
    got = _holdings(node)["default/squatter"]
    verdict = "none of trainer's" if not got & set(assigned) else "SOME OF TRAINER'S"
    echo(
        f"pod/squatter, bound by hand without the extender, got {len(got)} GPUs from the node "
        f"agent: {verdict}"
    )
