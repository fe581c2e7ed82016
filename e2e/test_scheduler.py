"""The real kube-scheduler calling the real extender places GPU pods on well-wired GPU sets.

Simulated nodes carry the real topology matrices of fixtures/topologies; the extender and its
kube-scheduler run as processes under the scheduler ServiceAccount.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client

from e2e.helpers import assigned, extender_knows, gpu_pod, pods, wait_for
from gpusched.api import GpuHealthState, LinkType, keys
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses
from gpusched.dev.localcluster.topologies import fixture_objects, fixture_topology

_serial = itertools.count()
BRIDGED_PAIRS = {(0, 2), (1, 3), (4, 5), (6, 7)}


def _node(
    gpu_nodes: Callable[..., list[str]],
    fixture: str,
    *,
    unhealthy: tuple[int, ...] = (),
    group: str | None = None,
) -> str:
    """One simulated node wired like ``fixture`` (call :func:`_settle` before creating pods)."""
    name = f"{fixture.split('-', maxsplit=1)[0]}-{next(_serial)}"
    spec, status = fixture_objects(fixture, name)
    for health in status.gpus:
        if health.index in unhealthy:
            health.state = GpuHealthState.UNHEALTHY
            health.reason = "Xid79"
            health.message = "GPU has fallen off the bus"
    status.healthy_gpus = len(spec.gpus) - len(unhealthy)
    labels = {"e2e-group": group} if group else None
    gpu_nodes(1, gpus=len(spec.gpus), names=[name], topology=spec, status=status, labels=labels)
    return name


def _settle(scheduler: SchedulerProcesses, nodes: list[str]) -> None:
    """Wait until the extender has the new nodes' topologies, so a pod created now sees them."""
    wait_for(lambda: extender_knows(scheduler.url, nodes), what="extender to see the nodes")


def _create(kube: Any, namespace: str, body: dict[str, Any]) -> None:
    client.CoreV1Api(kube).create_namespaced_pod(namespace, body)


def _bound(kube: Any, namespace: str, name: str) -> client.V1Pod | None:
    pod = client.CoreV1Api(kube).read_namespaced_pod(name, namespace)
    return pod if assigned(pod) is not None else None


def test_four_gpu_pod_lands_on_four_nvlinked_gpus_named_in_its_annotation(
    gpusched_scheduler: SchedulerProcesses,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    group = f"g{next(_serial)}"
    pcie = _node(gpu_nodes, "pcie-8x-rtx4090-2socket-allsys-2nic", group=group)
    hgx = _node(gpu_nodes, "hgx-h100-sxm-8gpu-8nic", group=group)
    _settle(gpusched_scheduler, [pcie, hgx])
    _create(kube, namespace, gpu_pod("train", 4, selector={"e2e-group": group}))
    pod = wait_for(lambda: _bound(kube, namespace, "train"), what="train bound")
    assert pod.spec.node_name == hgx, (
        f"placed on {pod.spec.node_name}, not the NVLink node ({pcie})"
    )
    gpus = assigned(pod)
    assert gpus is not None
    assert len(gpus) == 4
    topology = fixture_topology("hgx-h100-sxm-8gpu-8nic", hgx)
    for a, b in itertools.combinations(gpus, 2):
        link = topology.link(a, b)
        assert link is not None
        assert link.type is LinkType.NV
    uuids = pod.metadata.annotations[keys.ANNOTATION_GPUS].split(",")
    assert uuids == [topology.gpu(i).uuid for i in gpus]
    assert pod.metadata.annotations[keys.ANNOTATION_TOPOLOGY_CLASS] == "nvlink"


def test_two_gpu_pod_on_a_bridged_board_lands_on_a_bridged_pair(
    gpusched_scheduler: SchedulerProcesses,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    node = _node(gpu_nodes, "pcie-8gpu-nvlink-bridge-pairs-2socket")
    _settle(gpusched_scheduler, [node])
    for i in range(3):
        _create(kube, namespace, gpu_pod(f"pair-{i}", 2, node=node))
    for i in range(3):
        pod = wait_for(lambda i=i: _bound(kube, namespace, f"pair-{i}"), what=f"pair-{i} bound")
        assert assigned(pod) in BRIDGED_PAIRS


def test_required_nvlink_pod_that_cannot_fit_stays_pending_with_the_reason(
    gpusched_scheduler: SchedulerProcesses,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    node = _node(gpu_nodes, "pcie-8gpu-nvlink-bridge-pairs-2socket")
    _settle(gpusched_scheduler, [node])
    _create(kube, namespace, gpu_pod("wide", 4, node=node, scope="nvlink", mode="required"))

    def failed_event() -> str | None:
        events = (
            client.CoreV1Api(kube)
            .list_namespaced_event(
                namespace, field_selector="involvedObject.name=wide,reason=FailedScheduling"
            )
            .items
        )
        return events[0].message if events else None

    message = wait_for(failed_event, what="FailedScheduling event")
    assert "ScopeUnsatisfiable" in message
    assert "nvlink (required)" in message
    pod = client.CoreV1Api(kube).read_namespaced_pod("wide", namespace)
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


def test_unhealthy_gpus_are_never_assigned(
    gpusched_scheduler: SchedulerProcesses,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    node = _node(gpu_nodes, "hgx-a100-sxm4-80gb-8gpu-8nic", unhealthy=(0, 3, 5))
    _settle(gpusched_scheduler, [node])
    for i in range(5):
        _create(kube, namespace, gpu_pod(f"one-{i}", 1, node=node))
    _create(kube, namespace, gpu_pod("extra", 1, node=node))
    wait_for(
        lambda: sum(assigned(p) is not None for p in pods(kube, namespace)) == 5,
        what="five pods bound",
    )
    held = [gpu for pod in pods(kube, namespace) for gpu in (assigned(pod) or ())]
    assert sorted(held) == [1, 2, 4, 6, 7]


def _burst(kube: Any, namespace: str, group: str, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes = [rng.choice((1, 1, 2, 2, 4)) for _ in range(count)]
    for i, size in enumerate(sizes):
        _create(kube, namespace, gpu_pod(f"burst-{i}", size, selector={"e2e-group": group}))
    return sizes


def _assert_no_gpu_assigned_twice(kube: Any, namespace: str) -> int:
    holders: Counter[tuple[str, int]] = Counter()
    bound = 0
    for pod in pods(kube, namespace):
        gpus = assigned(pod)
        if gpus is None:
            continue
        bound += 1
        requested = int(pod.spec.containers[0].resources.limits[keys.GPU_RESOURCE])
        assert len(gpus) == requested, f"{pod.metadata.name} got {gpus} for {requested} GPUs"
        holders.update((pod.spec.node_name, gpu) for gpu in gpus)
    doubles = {slot: n for slot, n in holders.items() if n > 1}
    assert doubles == {}, f"GPUs assigned twice: {doubles}"
    return bound


_FLEET = (
    "hgx-h100-sxm-8gpu-8nic",
    "hgx-a100-sxm4-80gb-8gpu-8nic",
    "pcie-8gpu-nvlink-bridge-pairs-2socket",
    "pcie-8gpu-pix-pxb-two-switch-trees",
    "pcie-8x-rtx4090-2socket-allsys-2nic",
)


def test_hundred_pods_created_at_once_never_share_a_gpu(
    gpusched_scheduler: SchedulerProcesses,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    group = f"g{next(_serial)}"
    fleet = [_node(gpu_nodes, fixture, group=group) for fixture in _FLEET * 6]  # 240 GPUs
    _settle(gpusched_scheduler, fleet)
    sizes = _burst(kube, namespace, group, 100, seed=1)
    assert sum(sizes) <= 220
    wait_for(
        lambda: sum(assigned(p) is not None for p in pods(kube, namespace)) == 100,
        timeout=120,
        what="all 100 pods bound",
    )
    assert _assert_no_gpu_assigned_twice(kube, namespace) == 100


def test_extender_killed_and_restarted_mid_burst_still_never_shares_a_gpu(
    gpusched_scheduler: SchedulerProcesses,
    local_cluster: LocalCluster,
    kube: Any,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
) -> None:
    group = f"g{next(_serial)}"
    fleet = [_node(gpu_nodes, fixture, group=group) for fixture in _FLEET * 6]
    _settle(gpusched_scheduler, fleet)
    rng = random.Random(4)
    sizes = [rng.choice((1, 1, 2, 2, 4)) for _ in range(100)]
    assert sum(sizes) <= 220
    for i, size in enumerate(sizes[:60]):
        _create(kube, namespace, gpu_pod(f"burst-{i}", size, selector={"e2e-group": group}))
    wait_for(
        lambda: sum(assigned(p) is not None for p in pods(kube, namespace)) >= 30,
        what="the first pods bound",
    )
    for i, size in enumerate(sizes[60:65], start=60):
        _create(kube, namespace, gpu_pod(f"burst-{i}", size, selector={"e2e-group": group}))
    # Kill while the rest of the burst is still being created and bound.
    rest = threading.Thread(
        target=lambda: [
            _create(kube, namespace, gpu_pod(f"burst-{i}", size, selector={"e2e-group": group}))
            for i, size in enumerate(sizes[65:], start=65)
        ]
    )
    rest.start()
    bound_at_crash = sum(assigned(p) is not None for p in pods(kube, namespace))
    gpusched_scheduler.restart_extender(local_cluster, kill=True)
    rest.join()
    assert bound_at_crash < 100, "the burst finished before the crash; nothing was tested"
    wait_for(
        lambda: sum(assigned(p) is not None for p in pods(kube, namespace)) == 100,
        timeout=180,
        what="all 100 pods bound after the restart",
    )
    assert _assert_no_gpu_assigned_twice(kube, namespace) == 100
