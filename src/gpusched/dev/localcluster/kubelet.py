"""A real kubelet as a Node of the local cluster, running pods on a fake container runtime.

The kubelet is built from the pinned ``k8s.io/kubernetes`` (``e2e/tools/kubelet``), and so is the
fake CRI runtime it talks to (``fakecri``: k8s.io/cri-client's fake runtime, which records every
container it is asked to create). Sandboxes and containers exist only in the runtime's memory, so
no root-owned state, image or cgroup is touched, yet everything above the CRI is the real kubelet:
registration, admission, the device manager and Topology Manager, device-plugin registration,
PodResources, status updates, checkpoints and restarts.

The kubelet's device-plugin directory is fixed at ``/var/lib/kubelet/device-plugins`` (a
constant of the kubelet), so each kubelet runs in its own mount namespace (``unshare``) where a
directory of the node is bind-mounted over ``/var/lib/kubelet``: several kubelets run side by
side, and the device plugin (outside the namespace) reaches their sockets under that directory.

Host checks that do not apply here are off: cgroup v1 is accepted (``failCgroupV1: false``), swap
is tolerated, no QoS cgroups or node-allocatable enforcement, no eviction thresholds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusched.dev.localcluster import podnetwork
from gpusched.dev.localcluster.cluster import ClusterError, LocalCluster
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running

#: What the kubelet sees as its root directory (inside its mount namespace).
KUBELET_ROOT = "/var/lib/kubelet"


def kubelet_configuration(node_dir: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """The KubeletConfiguration of a loopback kubelet on the fake runtime."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{node_dir / 'cri.sock'}",
        "podLogsDir": f"{KUBELET_ROOT}/pod-logs",
        # This machine: cgroup v1, maybe swap, not ours to reconfigure.
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "cgroupDriver": "cgroupfs",
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": False,
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "",
        "registerNode": True,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "fileCheckFrequency": "0s",
        "shutdownGracePeriod": "0s",
    }


@dataclass
class KubeletNode:
    """One real kubelet registered as a Node, and its fake runtime."""

    cluster: LocalCluster
    name: str
    directory: Path
    """Bind-mounted over /var/lib/kubelet in the kubelet's mount namespace."""
    fakecri: ProcessRecord
    kubelet: ProcessRecord
    labels: dict[str, str]
    port: int
    healthz_port: int

    @property
    def root(self) -> Path:
        """The kubelet's /var/lib/kubelet, seen from outside its namespace."""
        return self.directory / "root"

    @property
    def device_plugin_dir(self) -> Path:
        """Where the kubelet's ``kubelet.sock`` and the plugins' sockets are."""
        return self.root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API."""
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def containers_file(self) -> Path:
        """One JSON line per container the kubelet asked the runtime to create."""
        return self.directory / "created-containers.jsonl"

    def created_containers(self) -> list[dict[str, Any]]:
        """What the kubelet asked the runtime to give each container (devices, CDI, env)."""
        if not self.containers_file.exists():
            return []
        lines = self.containers_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def healthy(self) -> bool:
        """Whether the kubelet answers its health check."""
        import urllib.request

        try:
            url = f"http://127.0.0.1:{self.healthz_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def restart_kubelet(self, *, kill: bool = False) -> None:
        """Stop the kubelet (SIGTERM, or SIGKILL like a crash) and start it again; the fake
        runtime keeps its containers, as a real one would."""
        self.stop_kubelet(kill=kill)
        self.start_kubelet()

    def stop_kubelet(self, *, kill: bool = False) -> None:
        """Stop the kubelet alone (the Node stays Ready until its lease runs out)."""
        if kill and is_running(self.kubelet):
            os.killpg(self.kubelet.pid, signal.SIGKILL)
        self.cluster.stop_process(self.kubelet)

    def start_kubelet(self) -> None:
        """Start the kubelet again after :meth:`stop_kubelet`."""
        self.kubelet = _spawn_kubelet(self.cluster, self.name, self.directory, self.labels)
        _wait_healthy(self)

    def stop(self) -> None:
        """Stop the kubelet and its runtime (the Node object stays)."""
        for record in (self.kubelet, self.fakecri):
            if is_running(record):
                self.cluster.stop_process(record)


def _spawn_kubelet(
    cluster: LocalCluster, name: str, directory: Path, labels: dict[str, str]
) -> ProcessRecord:
    kubeconfig = cluster.state_dir / f"kubelet-{name}.kubeconfig"
    if not kubeconfig.exists():
        # system:masters spares a node authorizer (the local API server runs RBAC only).
        cluster.identity_kubeconfig(
            f"kubelet-{name}", f"system:node:{name}", ("system:nodes", "system:masters")
        )
    node_labels = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    script = 'mkdir -p "$1" && mount --bind "$0" "$1" && shift && exec "$@"'
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(directory / "root"),
        KUBELET_ROOT,
        cluster.binary("kubelet"),
        f"--config={directory / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={KUBELET_ROOT}",
        f"--hostname-override={name}",
        *([f"--node-labels={node_labels}"] if node_labels else []),
        "--v=2",
    ]
    record = cluster.spawn(f"kubelet-{name}", argv)
    # unshare and sh exec the kubelet: this pid is the kubelet's, and so is its mount namespace
    # (a process-running runtime starts containers from it).
    (directory / "kubelet.pid").write_text(str(record.pid))
    return record


def _wait_healthy(node: KubeletNode, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(node.kubelet):
            log = Path(node.kubelet.log).read_text(errors="replace")[-3000:]
            raise ClusterError(f"kubelet {node.name} exited during start-up:\n{log}")
        if node.healthy() and node.device_plugin_dir.joinpath("kubelet.sock").exists():
            return
        time.sleep(0.2)
    raise ClusterError(f"kubelet {node.name} not healthy after {timeout:.0f}s")


def _wait_registered(node: KubeletNode, timeout: float = 120.0) -> None:
    from kubernetes import client  # optional dependency, as in LocalCluster.api_client

    core = client.CoreV1Api(node.cluster.api_client())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(node.kubelet):
            log = Path(node.kubelet.log).read_text(errors="replace")[-3000:]
            raise ClusterError(f"kubelet {node.name} exited before registering:\n{log}")
        if core.list_node(field_selector=f"metadata.name={node.name}").items:
            return
        time.sleep(0.2)
    raise ClusterError(f"kubelet {node.name} did not register its Node in {timeout:.0f}s")


@dataclass(frozen=True)
class RunProcesses:
    """Containers of these images run as real processes on this machine, each pod in a network
    namespace of its own on the cluster's pod network (``fakecri/processes.go``); others stay
    make-believe. The cluster must have been started with ``pod_network=True``."""

    images: str
    """Regular expression on the image reference."""
    path: tuple[str, ...] = ()
    """Directories put first on the processes' PATH (the virtualenv's ``bin``, the tools')."""
    env: dict[str, str] | None = None
    """Extra environment of every process: the node's simulated hardware, for instance."""


def _process_flags(cluster: LocalCluster, directory: Path, run: RunProcesses) -> list[str]:
    if not cluster.state.pod_network:
        raise ClusterError("running containers as processes needs a cluster with a pod network")
    index = len(
        [d for d in (cluster.state_dir / "kubelets").iterdir() if (d / "pod-network").exists()]
    )
    (directory / "pod-network").write_text(str(index + 1))
    path = os.pathsep.join([*run.path, os.environ.get("PATH", "")])
    return [
        f"--run-images={run.images}",
        f"--path={path}",
        f"--kubelet-root={directory / 'root'}",
        f"--kubelet-pid-file={directory / 'kubelet.pid'}",
        f"--bridge={podnetwork.BRIDGE}",
        f"--gateway={podnetwork.GATEWAY}",
        f"--subnet={podnetwork.node_subnet(index + 1)}",
        f"--apiserver-port={cluster.state.ports['apiserver']}",
        f"--netns-prefix={podnetwork.netns_prefix(index + 1)}",
        *(f"--env={k}={v}" for k, v in sorted((run.env or {}).items())),
    ]


def start_kubelet_node(
    cluster: LocalCluster,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    run: RunProcesses | None = None,
) -> KubeletNode:
    """Start a fake runtime and a real kubelet registering Node ``name``; return once the kubelet
    is healthy and its Node object exists (wait for the Node's Ready condition separately: a
    healthy kubelet may not have registered yet, and reading the Node then is a 404). ``run``:
    containers of some images run as processes."""
    if shutil.which("unshare") is None:
        raise ClusterError("a real kubelet node needs `unshare` (util-linux) and root")
    directory = cluster.state_dir / "kubelets" / name
    (directory / "root").mkdir(parents=True, exist_ok=True)
    port, healthz = free_port(), free_port()
    (directory / "kubelet.yaml").write_text(
        yaml.safe_dump(kubelet_configuration(directory, port, healthz), sort_keys=False)
    )
    fakecri = cluster.spawn(
        f"fakecri-{name}",
        [
            cluster.binary("fakecri"),
            f"--endpoint=unix://{directory / 'cri.sock'}",
            f"--record={directory / 'created-containers.jsonl'}",
            *(_process_flags(cluster, directory, run) if run is not None else ()),
        ],
    )
    deadline = time.monotonic() + 30
    while not (directory / "cri.sock").exists():
        if not is_running(fakecri) or time.monotonic() > deadline:
            raise ClusterError(f"fake CRI runtime of {name} did not start; see {fakecri.log}")
        time.sleep(0.05)
    all_labels = {"gpusched.dev/kubelet": "real", **(labels or {})}
    node = KubeletNode(
        cluster,
        name,
        directory,
        fakecri,
        _spawn_kubelet(cluster, name, directory, all_labels),
        all_labels,
        port,
        healthz,
    )
    _wait_healthy(node)
    _wait_registered(node)
    return node
