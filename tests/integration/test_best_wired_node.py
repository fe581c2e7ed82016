"""On the real control plane, a default GPU job goes to the best-wired node available, whether the
operator plans it (GpuJob) or kube-scheduler asks the extender (a plain pod): twelve idle HGX H100
nodes and one PCIe board that lost a GPU, and a 4-GPU job with the default scope gets four
NVLinked H100 GPUs, never the PCIe board."""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.helpers import extender_knows, gpu_pod
from gpusched.api import GpuHealthState, keys
from gpusched.dev.localcluster.components import SchedulerProcesses
from gpusched.dev.localcluster.topologies import fixture_objects
from tests.integration.operator_harness import (
    H100,
    POOL,
    POOL_LABEL,
    OperatorProcess,
    Scenario,
    scenario,
    wait_for,
)

H100_FIXTURE = "hgx-h100-sxm-8gpu-8nic"
PCIE_FIXTURE = "pcie-8gpu-nvlink-bridge-pairs-2socket"
_ids = itertools.count()


def _cluster(make_nodes: Callable[..., list[str]], group: str) -> tuple[list[str], str]:
    """Twelve idle H100 nodes and a PCIe board whose GPU 3 fell off the bus (Xid79)."""
    labels = {POOL_LABEL: POOL, keys.GFD_PRODUCT: H100, "test-group": group}
    h100s = [f"{group}-h100-{i:02d}" for i in range(12)]
    for name in h100s:
        spec, status = fixture_objects(H100_FIXTURE, name)
        make_nodes(1, 8, names=[name], labels=labels, topology=spec, status=status)
    board = f"{group}-pcie"
    spec, status = fixture_objects(PCIE_FIXTURE, board)
    for health in status.gpus:
        if health.index == 3:
            health.state = GpuHealthState.UNHEALTHY
            health.reason = "Xid79"
            health.message = "GPU has fallen off the bus"
    status.healthy_gpus = len(spec.gpus) - 1
    make_nodes(1, 8, names=[board], labels=labels, topology=spec, status=status)
    return h100s, board


def test_plain_four_gpu_pod_gets_nvlinked_h100_gpus_not_the_pcie_board(
    extender: SchedulerProcesses, kube: Any, gpu_nodes: Callable[..., list[str]]
) -> None:
    group = f"rank{next(_ids)}"
    h100s, board = _cluster(gpu_nodes, group)
    wait_for(lambda: extender_knows(extender.url, [*h100s, board]), 60, "extender to see nodes")
    core = client.CoreV1Api(kube)
    namespace = f"{group}-pods"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "train"},
                "spec": {
                    "schedulerName": keys.SCHEDULER_NAME,
                    "nodeSelector": {"test-group": group},
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {keys.GPU_RESOURCE: "4"}},
                        }
                    ],
                },
            },
        )

        def bound() -> Any:
            pod = core.read_namespaced_pod("train", namespace)
            return pod if pod.spec.node_name else None

        pod = wait_for(bound, 60, "the pod to be bound")
        assert pod.spec.node_name in h100s, f"placed on {pod.spec.node_name}"
        assert pod.metadata.annotations[keys.ANNOTATION_TOPOLOGY_CLASS] == "nvlink"
    finally:
        core.delete_namespace(namespace, grace_period_seconds=0)


def test_default_four_gpu_gpujob_is_planned_and_bound_on_an_h100(
    operator: OperatorProcess,
    extender: SchedulerProcesses,
    kube: Any,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    if not operator.running():
        operator.start()
    group = f"rank{next(_ids)}"
    h100s, board = _cluster(gpu_nodes, group)
    wait_for(lambda: extender_knows(extender.url, [*h100s, board]), 60, "extender to see nodes")
    with scenario(kube, gpu_nodes) as sc:
        _run_gpujob(sc, h100s)


def _run_gpujob(sc: Scenario, h100s: list[str]) -> None:
    _, namespace = sc.tenant("team", guaranteed=8)
    sc.submit(namespace, "finetune", 4)
    status = sc.wait_phase(namespace, "finetune", "Running", timeout=120)
    placement = status["placement"][0]
    assert placement["node"] in h100s, f"planned on {placement['node']}"
    assert placement["topologyClass"] == "nvlink"
    pods = sc.pods(namespace, "finetune")
    assert [p.spec.node_name for p in pods] == [placement["node"]]
    assert pods[0].metadata.annotations[keys.ANNOTATION_TOPOLOGY_CLASS] == "nvlink"


def _filter_answer(url: str, nodes: list[str]) -> list[str]:
    """The nodes the extender's filter passes for a one-GPU pod, asked the way kube-scheduler
    asks."""
    body = json.dumps({"Pod": gpu_pod("probe-levels", 1), "NodeNames": nodes}).encode()
    request = urllib.request.Request(
        f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return list(json.loads(response.read())["NodeNames"] or [])


def test_a_plain_pod_among_equal_nodes_goes_to_the_fullest_rack(
    extender: SchedulerProcesses, kube: Any, gpu_nodes: Callable[..., list[str]]
) -> None:
    """With the cluster's network levels (a rack level), a one-GPU plain pod that four idle
    H100 nodes would take equally goes to the rack already partly used (rack b: one node full),
    not to the first node by name in the idle rack a: the extender reads the NetworkTopology
    and the nodes' labels under its chart identity."""
    group = f"rank{next(_ids)}"
    rack = "topology.kubernetes.io/rack"
    names = {f"{group}-{r}{i}": r for r in "ab" for i in range(2)}
    for name, r in names.items():
        spec, status = fixture_objects(H100_FIXTURE, name)
        labels = {keys.GFD_PRODUCT: H100, "test-group": group, rack: f"{group}-{r}"}
        gpu_nodes(1, 8, names=[name], labels=labels, topology=spec, status=status)
    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    namespace = f"{group}-pods"
    core.create_namespace({"metadata": {"name": namespace}})
    network = {
        "apiVersion": keys.API_VERSION,
        "kind": "NetworkTopology",
        "metadata": {"name": "default"},
        "spec": {"levels": [{"name": "rack", "nodeLabel": rack}]},
    }
    with suppress(ApiException):
        custom.delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, "networktopologies", "default"
        )
    custom.create_cluster_custom_object(keys.GROUP, keys.VERSION, "networktopologies", network)
    try:
        # b1 is full: a pod bound there by another scheduler holds its eight GPUs.
        full = gpu_pod("elsewhere", 8, node=f"{group}-b1")
        full["spec"]["nodeName"] = f"{group}-b1"
        full["spec"].pop("schedulerName", None)
        core.create_namespaced_pod(namespace, full)
        nodes = sorted(names)
        wait_for(
            lambda: _filter_answer(extender.url, nodes) == [f"{group}-b0"],
            60,
            "the extender to pass only the idle node of the fuller rack",
        )
        core.create_namespaced_pod(namespace, gpu_pod("one", 1, selector={"test-group": group}))

        def bound() -> Any:
            pod = core.read_namespaced_pod("one", namespace)
            return pod if pod.spec.node_name else None

        assert wait_for(bound, 60, "the pod to be bound").spec.node_name == f"{group}-b0"
    finally:
        with suppress(ApiException):
            custom.delete_cluster_custom_object(
                keys.GROUP, keys.VERSION, "networktopologies", "default"
            )
        core.delete_namespace(namespace, grace_period_seconds=0)
