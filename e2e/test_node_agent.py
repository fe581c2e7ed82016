"""End to end with a real kubelet: the device probe, gpusched's device plugin, the extender and
kube-scheduler, and kubelets built from the pinned Kubernetes release running pods on a fake
container runtime. Each container must receive exactly the GPUs written on its pod.

Two GPU nodes, simulated from real ``nvidia-smi topo -m`` matrices: an HGX H100 (NVSwitch) and a
PCIe board whose GPUs are NVLink-bridged in pairs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from e2e.helpers import extender_knows, gpu_pod, wait_for
from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.binaries import repo_root
from gpusched.dev.localcluster.components import SchedulerProcesses, gpusched_command
from gpusched.dev.localcluster.kubelet import KubeletNode, start_kubelet_node
from gpusched.dev.localcluster.processes import is_running
from gpusched.dev.localnodeagent import DevicePluginProcess, start_device_plugin
from gpusched.dev.localprobes import FakeProbe, start_fake_probe
from gpusched.node_agent.kubelet import PodResourcesClient

TOPOLOGIES = {
    "kubelet-h100": "hgx-h100-sxm-8gpu-8nic.txt",
    "kubelet-pcie": "pcie-8gpu-nvlink-bridge-pairs-2socket.txt",
}


@dataclass
class RealNode:
    """A kubelet node with its probe and device plugin."""

    kubelet: KubeletNode
    probe: FakeProbe
    plugin: DevicePluginProcess

    @property
    def name(self) -> str:
        return self.kubelet.name

    def holdings(self) -> dict[str, frozenset[str]]:
        """What the kubelet's PodResources says each pod holds."""

        async def read() -> dict[str, frozenset[str]]:
            lister = PodResourcesClient(self.kubelet.pod_resources_socket, keys.GPU_RESOURCE)
            try:
                return {key: pod.held for key, pod in (await lister.list()).items()}
            finally:
                await lister.close()

        return asyncio.run(read())


def node_status(kube: Any, name: str) -> tuple[str | None, str | None]:
    """The node's (capacity, allocatable) of nvidia.com/gpu."""
    status = client.CoreV1Api(kube).read_node(name).status
    return (status.capacity or {}).get(keys.GPU_RESOURCE), (status.allocatable or {}).get(
        keys.GPU_RESOURCE
    )


def metric(url: str, name: str) -> float:
    """A sample of the plugin's metrics; 0 while it does not serve them (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def real_nodes(
    local_cluster: LocalCluster, kube: Any, gpusched_scheduler: SchedulerProcesses
) -> Iterator[dict[str, RealNode]]:
    nodes: dict[str, RealNode] = {}
    for name, fixture in TOPOLOGIES.items():
        kubelet = start_kubelet_node(local_cluster, name)
        probe = start_fake_probe(
            local_cluster, name, repo_root() / "fixtures" / "topologies" / fixture
        )
        plugin = start_device_plugin(local_cluster, kubelet)
        nodes[name] = RealNode(kubelet, probe, plugin)
    for name in nodes:
        wait_for(
            lambda n=name: node_status(kube, n) == ("8", "8"),
            timeout=180,
            what=f"{name} to report 8 allocatable GPUs from the device plugin",
        )
    wait_for(
        lambda: extender_knows(gpusched_scheduler.url, list(nodes)),
        timeout=120,
        what="the extender to know both nodes",
    )
    yield nodes
    for node in nodes.values():
        for record in (node.plugin.record, node.probe.record):
            local_cluster.stop_process(record)
        node.kubelet.stop()
    client.CoreV1Api(kube).delete_collection_node(label_selector="gpusched.dev/kubelet=real")


def create(kube: Any, namespace: str, manifest: dict[str, Any]) -> None:
    client.CoreV1Api(kube).create_namespaced_pod(namespace, manifest)


def read_pod(kube: Any, namespace: str, name: str) -> client.V1Pod:
    return client.CoreV1Api(kube).read_namespaced_pod(name, namespace)


def running(kube: Any, namespace: str, names: list[str]) -> bool:
    return all(read_pod(kube, namespace, n).status.phase == "Running" for n in names)


def assert_exact(kube: Any, namespace: str, node: RealNode, names: list[str]) -> None:
    """Each pod's container got exactly its gpusched.io/gpus: per the kubelet's PodResources,
    per what the kubelet asked the runtime to create, and per the node agent's annotation."""
    holdings = node.holdings()
    created = {(c["namespace"], c["pod"]): c for c in node.kubelet.created_containers()}
    for name in names:
        pod = read_pod(kube, namespace, name)
        annotations = pod.metadata.annotations or {}
        assigned = annotations[keys.ANNOTATION_GPUS].split(",")
        assert holdings[f"{namespace}/{name}"] == frozenset(assigned), name
        container = created[(namespace, name)]
        assert sorted(container["cdiDevices"]) == sorted(f"nvidia.com/gpu={u}" for u in assigned)
        assert sorted(container["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(assigned)
    wait_for(
        lambda: all(
            (read_pod(kube, namespace, n).metadata.annotations or {}).get(
                keys.ANNOTATION_ALLOCATED_GPUS
            )
            == (read_pod(kube, namespace, n).metadata.annotations or {})[keys.ANNOTATION_GPUS]
            for n in names
        ),
        timeout=90,
        what="the node agent to annotate what each pod holds",
    )


def test_real_kubelet_gives_each_container_exactly_its_annotated_gpus(
    kube: Any, namespace: str, real_nodes: dict[str, RealNode]
) -> None:
    layout = {"kubelet-h100": [4, 2, 1, 1], "kubelet-pcie": [2, 2, 4]}
    names: dict[str, list[str]] = {}
    for node, sizes in layout.items():
        names[node] = [f"{node}-{i}" for i in range(len(sizes))]
        for name, gpus in zip(names[node], sizes, strict=True):
            create(kube, namespace, gpu_pod(name, gpus, node=node, scope="nvlink"))
    every = [n for group in names.values() for n in group]
    wait_for(lambda: running(kube, namespace, every), timeout=180, what="all pods Running")
    for node, group in names.items():
        assert_exact(kube, namespace, real_nodes[node], group)
        assert node_status(kube, node) == ("8", "8")
    pairs = [
        read_pod(kube, namespace, n).metadata.annotations[keys.ANNOTATION_TOPOLOGY_CLASS]
        for n in names["kubelet-pcie"][:2]
    ]
    assert pairs == ["nvlink", "nvlink"]
    for name in every:
        client.CoreV1Api(kube).delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_a_pod_claiming_gpus_another_pod_holds_never_gets_them(
    local_cluster: LocalCluster, kube: Any, namespace: str, real_nodes: dict[str, RealNode]
) -> None:
    """The chart's policy refuses a pod carrying another pod's GPUs in its annotation. Without
    the policy (say it is switched off), the node agent alone still never hands them out: the
    annotation on a pod no gpusched scheduler bound is not believed, and a gpusched-scheduler
    pod claiming GPUs an older pod was bound to is refused."""
    create(kube, namespace, gpu_pod("holder", 2, node="kubelet-h100"))
    wait_for(lambda: running(kube, namespace, ["holder"]), timeout=120, what="holder Running")
    stolen = read_pod(kube, namespace, "holder").metadata.annotations[keys.ANNOTATION_GPUS]

    def claiming(name: str, scheduler: str | None) -> dict[str, Any]:
        pod = gpu_pod(name, 2)
        pod["metadata"]["annotations"][keys.ANNOTATION_GPUS] = stolen
        pod["spec"].pop("schedulerName")
        if scheduler is not None:
            pod["spec"]["schedulerName"] = scheduler
        pod["spec"]["nodeName"] = "kubelet-h100"  # bound without the extender
        return pod

    with pytest.raises(client.ApiException) as refused:
        create(kube, namespace, claiming("intruder", None))
    assert "only gpusched writes gpusched.io/gpus" in str(refused.value.body)

    identities.uninstall(local_cluster, identities.ACCESS)
    try:
        create(kube, namespace, claiming("intruder", None))
        create(kube, namespace, claiming("copy", keys.SCHEDULER_NAME))
        copy = wait_for(
            lambda: (p := read_pod(kube, namespace, "copy")).status.phase == "Failed" and p,
            timeout=120,
            what="the copy to fail admission",
        )
    finally:
        identities.install(local_cluster, identities.ACCESS)
    assert copy.status.reason == "UnexpectedAdmissionError"
    assert "AssignmentConflict" in copy.status.message
    assert f"to pod {namespace}/holder" in copy.status.message
    wait_for(lambda: running(kube, namespace, ["intruder"]), timeout=120, what="intruder Running")
    holdings = real_nodes["kubelet-h100"].holdings()
    assert holdings[f"{namespace}/holder"] == frozenset(stolen.split(","))
    assert not holdings[f"{namespace}/intruder"] & frozenset(stolen.split(","))
    wait_for(
        lambda: any(
            e.reason == "GpuAllocationRefused"
            for e in client.CoreV1Api(kube)
            .list_namespaced_event(namespace, field_selector="involvedObject.name=copy")
            .items
        ),
        timeout=60,
        what="the refusal event on the copy",
    )
    explained = subprocess.run(
        [*gpusched_command(), "explain", f"pod/{namespace}/copy"],
        env={**os.environ, "KUBECONFIG": str(local_cluster.kubeconfig)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "admission refused: " in explained
    assert "GpuAllocationRefused" in explained
    for name in ("holder", "intruder", "copy"):
        client.CoreV1Api(kube).delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_a_pod_of_another_scheduler_takes_only_gpus_gpusched_did_not_reserve(
    kube: Any, namespace: str, real_nodes: dict[str, RealNode]
) -> None:
    create(kube, namespace, gpu_pod("placed", 4, node="kubelet-pcie"))
    wait_for(lambda: running(kube, namespace, ["placed"]), timeout=120, what="placed Running")
    foreign = gpu_pod("foreign", 2, node="kubelet-pcie")
    foreign["spec"].pop("schedulerName")  # the default scheduler
    create(kube, namespace, foreign)
    wait_for(lambda: running(kube, namespace, ["foreign"]), timeout=120, what="foreign Running")
    holdings = real_nodes["kubelet-pcie"].holdings()
    reserved = set(
        read_pod(kube, namespace, "placed").metadata.annotations[keys.ANNOTATION_GPUS].split(",")
    )
    assert not holdings[f"{namespace}/foreign"] & reserved
    wait_for(
        lambda: (
            keys.ANNOTATION_ALLOCATED_GPU_INDICES
            in (read_pod(kube, namespace, "foreign").metadata.annotations or {})
        ),
        timeout=90,
        what="the node agent to record the foreign pod's GPUs",
    )
    # The extender now knows which GPUs the foreign pod holds and places around them.
    create(kube, namespace, gpu_pod("after", 2, node="kubelet-pcie"))
    wait_for(lambda: running(kube, namespace, ["after"]), timeout=120, what="after Running")
    assert_exact(kube, namespace, real_nodes["kubelet-pcie"], ["placed", "after"])
    for name in ("placed", "foreign", "after"):
        client.CoreV1Api(kube).delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_an_unhealthy_gpu_leaves_the_kubelets_allocatable(
    kube: Any, real_nodes: dict[str, RealNode]
) -> None:
    node = real_nodes["kubelet-h100"]
    node.probe.inject(gpu=7, xid=79)
    wait_for(
        lambda: node_status(kube, node.name) == ("8", "7"),
        timeout=120,
        what="GPU 7 to leave the allocatable GPUs",
    )


def test_plugin_and_kubelet_restarts_lose_no_allocation(
    kube: Any, namespace: str, real_nodes: dict[str, RealNode]
) -> None:
    node = real_nodes["kubelet-pcie"]
    create(kube, namespace, gpu_pod("before", 4, node=node.name))
    wait_for(lambda: running(kube, namespace, ["before"]), timeout=120, what="before Running")
    held = node.holdings()[f"{namespace}/before"]

    node.plugin.restart(kill=True)
    wait_for(
        lambda: metric(node.plugin.metrics_url, "gpusched_node_agent_registered") == 1,
        timeout=120,
        what="the restarted plugin to register",
    )
    create(kube, namespace, gpu_pod("after-plugin", 2, node=node.name))
    wait_for(lambda: running(kube, namespace, ["after-plugin"]), timeout=120, what="Running")

    node.kubelet.restart_kubelet(kill=True)
    wait_for(
        lambda: node_status(kube, node.name)[1] == "8" and node.holdings(),
        timeout=180,
        what="the restarted kubelet to see the plugin's GPUs again",
    )
    assert node.holdings()[f"{namespace}/before"] == held
    create(kube, namespace, gpu_pod("after-kubelet", 2, node=node.name))
    names = ["before", "after-plugin", "after-kubelet"]
    wait_for(lambda: running(kube, namespace, names), timeout=180, what="all Running")
    assert_exact(kube, namespace, node, names)


def test_a_pod_a_restarted_kubelet_refuses_requeues_its_gpujob_instead_of_failing_it(
    local_cluster: LocalCluster, kube: Any, namespace: str, real_nodes: dict[str, RealNode]
) -> None:
    """A pod bound while its node's kubelet was down is refused admission when the kubelet comes
    back before gpusched's device plugin has registered again (no healthy device yet): the
    workload never ran, so the GpuJob is requeued with the reason, and runs once the plugin is
    back, instead of ending Failed for good."""
    from tests.cases.manifests import gpujob, tenantquota
    from tests.integration.operator_harness import POOL, POOL_LABEL, OperatorProcess

    node = real_nodes["kubelet-pcie"]
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    core.patch_node(node.name, {"metadata": {"labels": {POOL_LABEL: POOL}}})
    quota = f"restart-{namespace}"
    custom.create_cluster_custom_object(
        keys.GROUP, keys.VERSION, "tenantquotas", tenantquota(quota, namespaces=[namespace])
    )
    operator = OperatorProcess(local_cluster)
    operator.start(pods_ready_timeout=300, backoff_base=1)
    try:
        node.plugin.stop()
        node.kubelet.stop_kubelet(kill=True)
        template = {
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "containers": [{"name": "main", "image": "busybox"}],
            }
        }
        custom.create_namespaced_custom_object(
            keys.GROUP,
            keys.VERSION,
            namespace,
            "gpujobs",
            gpujob("survivor", gpusPerReplica=2, checkpointGracePeriodSeconds=0, template=template),
        )
        wait_for(
            lambda: any(
                p.spec.node_name == node.name
                for p in core.list_namespaced_pod(
                    namespace, label_selector=f"{keys.LABEL_JOB_NAME}=survivor"
                ).items
            ),
            timeout=120,
            what="the job's pod to be bound while the kubelet is down",
        )
        node.kubelet.start_kubelet()

        def job() -> dict[str, Any]:
            return dict(
                custom.get_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, namespace, "gpujobs", "survivor"
                )
            )

        rejected = wait_for(
            # (no status yet while the admission waits for --record-delay or its pods)
            lambda: (j := job()).get("status", {}).get("nodeRejections", 0) >= 1 and j,
            timeout=180,
            what="the job to be requeued after the kubelet refused its pod",
        )
        assert rejected["status"]["phase"] != "Failed"
        node.plugin.start()
        done = wait_for(
            lambda: (j := job()).get("status", {}).get("phase") == "Running" and j,
            timeout=240,
            what="the job to run once the device plugin is back",
        )
        assert done["status"]["nodeRejections"] == 0
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=survivor"
        ).items
        assert any(e.reason == "PodsRejectedByNode" for e in events)
    finally:
        operator.kill()
        if not is_running(node.plugin.record):
            node.plugin.start()
        custom.delete_cluster_custom_object(keys.GROUP, keys.VERSION, "tenantquotas", quota)
