"""On the real control plane, a default GPU job goes to the best-wired node available, whether the
operator plans it (GpuJob) or kube-scheduler asks the extender (a plain pod): twelve idle HGX H100
nodes and one PCIe board that lost a GPU, and a 4-GPU job with the default scope gets four
NVLinked H100 GPUs, never the PCIe board."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kubernetes import client

from e2e.helpers import extender_knows
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
