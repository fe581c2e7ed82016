"""gpusched's device plugin for a real kubelet node of the local cluster, run as the Helm chart
runs it: a separate ``gpusched device-plugin`` process with a token of the device probe's
ServiceAccount bound to its Node, under exactly the identity the chart renders with
``nodeAgent.enabled`` (the probe's RBAC and own-node policy plus the node agent's), so whatever
uses this also proves that identity sufficient."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.api import keys
from gpusched.dev.localcluster import identities
from gpusched.dev.localcluster.cluster import LocalCluster
from gpusched.dev.localcluster.components import gpusched_command
from gpusched.dev.localcluster.kubelet import KubeletNode
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running
from gpusched.dev.localprobes import probe_kubeconfig
from gpusched.kube import body


def node_agent_kubeconfig(cluster: LocalCluster, node: str) -> Path:
    """A token of the probe's ServiceAccount bound to ``node``, with the node agent's rules and
    pod policy from the chart installed."""
    kubeconfig = probe_kubeconfig(cluster, node)
    identities.install(cluster, identities.NODE_AGENT)
    return kubeconfig


@dataclass(frozen=True)
class KubeletSockets:
    """Where a plugin finds its kubelet: the device-plugin directory and PodResources."""

    node: str
    device_plugin_dir: Path
    pod_resources_socket: Path


@dataclass
class DevicePluginProcess:
    """A running ``gpusched device-plugin`` for one node."""

    cluster: LocalCluster
    node: KubeletSockets
    record: ProcessRecord
    metrics_port: int
    kubeconfig: Path
    args: tuple[str, ...]

    @property
    def metrics_url(self) -> str:
        """Its Prometheus endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def restart(self, *, kill: bool = True) -> None:
        """Stop it (SIGKILL by default, like a crash) and start it again."""
        self.stop(kill=kill)
        self.start()

    def stop(self, *, kill: bool = True) -> None:
        """Stop it (SIGKILL by default, like a crash)."""
        if kill and is_running(self.record):
            os.killpg(self.record.pid, signal.SIGKILL)
        self.cluster.stop_process(self.record)

    def start(self) -> None:
        """Start it again after :meth:`stop`."""
        self.record = _spawn(self.cluster, self.node, self.kubeconfig, self.metrics_port, self.args)


def _spawn(
    cluster: LocalCluster,
    node: KubeletSockets,
    kubeconfig: Path,
    metrics_port: int,
    args: tuple[str, ...],
) -> ProcessRecord:
    argv = [
        *gpusched_command(),
        "device-plugin",
        f"--node={node.node}",
        f"--kubeconfig={kubeconfig}",
        f"--device-plugin-dir={node.device_plugin_dir}",
        f"--pod-resources-socket={node.pod_resources_socket}",
        f"--metrics-port={metrics_port}",
        "--metrics-address=127.0.0.1",
        *args,
    ]
    return cluster.spawn(f"device-plugin-{node.node}-{metrics_port}", argv)


def start_device_plugin(
    cluster: LocalCluster,
    node: KubeletNode | KubeletSockets,
    *,
    kubeconfig: Path | None = None,
    args: tuple[str, ...] = (),
) -> DevicePluginProcess:
    """Start ``gpusched device-plugin`` for a real kubelet node, or for the sockets of a test
    playing the kubelet; ``down()`` of the cluster stops it."""
    if isinstance(node, KubeletNode):
        node = KubeletSockets(node.name, node.device_plugin_dir, node.pod_resources_socket)
    kubeconfig = kubeconfig or node_agent_kubeconfig(cluster, node.node)
    port = free_port()
    record = _spawn(cluster, node, kubeconfig, port, args)
    return DevicePluginProcess(cluster, node, record, port, kubeconfig, args)


def bind_like_extender(kube: Any, namespace: str, name: str, node: str, gpus: list[str]) -> None:
    """Create a pod asking for ``len(gpus)`` GPUs and bind it as the extender does: a pod for the
    gpusched scheduler, the node and ``gpusched.io/gpus`` in one Binding (callers run no
    gpusched kube-scheduler, so nothing else binds it); with no GPUs it is a plain pod for no
    scheduler, on the node."""
    from kubernetes import client

    core = client.CoreV1Api(kube)
    resources = {"limits": {keys.GPU_RESOURCE: str(len(gpus))}} if gpus else {}
    core.create_namespaced_pod(
        namespace,
        body(
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": keys.SCHEDULER_NAME if gpus else "nobody",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "busybox", "resources": resources}],
                },
            }
        ),
    )
    annotations = {keys.ANNOTATION_GPUS: ",".join(gpus)} if gpus else {}
    core.create_namespaced_pod_binding(
        name,
        namespace,
        body(
            {
                "metadata": {"name": name, "annotations": annotations},
                "target": {"kind": "Node", "name": node},
            }
        ),
        _preload_content=False,
    )
