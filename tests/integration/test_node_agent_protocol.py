"""gpusched's device plugin against the real API server, with the test playing the kubelet over
unix sockets: registration, the device list, the pod<->request protocol and its races.

Pods are bound the way the extender binds them (one Binding carrying ``gpusched.io/gpus``), to a
kwok node whose NodeGpuTopology is what the probe would publish for an HGX H100.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from gpusched.api import keys
from gpusched.dev.kubelet_double import KubeletDouble
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.dev.localnodeagent import (
    DevicePluginProcess,
    KubeletSockets,
    bind_like_extender,
    start_device_plugin,
)
from tests.integration.operator_harness import wait_for

FIXTURE = "hgx-h100-sxm-8gpu-8nic"
_namespaces = itertools.count()


@dataclass
class Setup:
    node: str
    kubelet: KubeletDouble
    plugin: DevicePluginProcess
    uuids: list[str]
    numa: list[int | None]


@pytest.fixture(scope="module")
def setup(local_cluster: LocalCluster, kube: Any) -> Iterator[Setup]:
    from gpusched.dev.localcluster.nodes import add_gpu_nodes, delete_nodes, wait_nodes_ready

    node = "plays-kubelet-0"
    spec, status = fixture_objects(FIXTURE, node)
    add_gpu_nodes(kube, [node], 8, topology=spec, status=status)
    wait_nodes_ready(kube, [node])
    # Not under pytest's base temp: other pytest runs on a shared machine rotate those away.
    directory = Path(tempfile.mkdtemp(prefix="gpusched-kubelet-"))
    kubelet = KubeletDouble(directory)
    plugin = start_device_plugin(
        local_cluster,
        KubeletSockets(node, kubelet.device_plugin_dir, kubelet.pod_resources_socket),
        args=("--drift-interval=2",),
    )
    kubelet.registered()
    gpus = sorted(spec.gpus, key=lambda g: g.index)
    yield Setup(node, kubelet, plugin, [g.uuid for g in gpus], [g.numa_node for g in gpus])
    local_cluster.stop_process(plugin.record)
    kubelet.stop()
    shutil.rmtree(directory, ignore_errors=True)
    delete_nodes(kube, [node])


@pytest.fixture
def ns(kube: Any, setup: Setup) -> Iterator[str]:
    name = f"plays-kubelet-{next(_namespaces)}-{int(time.time()) % 100000}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    setup.kubelet.pods.clear()
    # The next test's pods may be bound to the same GPUs (as the extender would once these
    # are gone): these are gone first, not left to the namespace controller.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(name).items and time.monotonic() < deadline:
        time.sleep(0.2)
    core.delete_namespace(name, grace_period_seconds=0)


def bound_pod(kube: Any, ns: str, node: str, name: str, gpus: list[str]) -> None:
    bind_like_extender(kube, ns, name, node, gpus)


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    assert failure.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    return str(failure.value.details())


def test_registers_and_lists_one_device_per_gpu_with_its_numa_node(setup: Setup) -> None:
    setup.kubelet.restart()  # a kubelet restart: the plugin registers again
    request = setup.kubelet.registered()
    assert request.version == "v1beta1"
    assert request.resource_name == keys.GPU_RESOURCE
    assert request.options.get_preferred_allocation_available
    with setup.kubelet.plugin(request.endpoint) as stub:
        first = next(iter(stub.ListAndWatch(setup_empty(), timeout=30)))
    assert [d.ID for d in first.devices] == setup.uuids
    assert {d.health for d in first.devices} == {"Healthy"}
    assert [d.topology.nodes[0].ID for d in first.devices] == setup.numa


def setup_empty() -> Any:
    from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp

    return dp.Empty()


def test_the_admitted_pod_gets_exactly_its_annotated_gpus(kube: Any, ns: str, setup: Setup) -> None:
    gpus = setup.uuids[2:4]
    bound_pod(kube, ns, setup.node, "happy", gpus)
    setup.kubelet.admitting(f"{ns}/happy")
    with setup.kubelet.plugin("gpusched.sock") as stub:
        preferred = setup.kubelet.preferred(stub, setup.uuids, 2)
        assert sorted(preferred) == sorted(gpus)
        answer = setup.kubelet.allocate(stub, preferred)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={u}" for u in gpus]


def test_a_mismatched_set_is_refused_with_both_pods_named(kube: Any, ns: str, setup: Setup) -> None:
    bound_pod(kube, ns, setup.node, "mine", setup.uuids[0:2])
    bound_pod(kube, ns, setup.node, "theirs", setup.uuids[4:6])
    setup.kubelet.admitting(f"{ns}/mine")
    with setup.kubelet.plugin("gpusched.sock") as stub:
        message = refused(lambda: setup.kubelet.allocate(stub, setup.uuids[4:6]))
    assert f"pod {ns}/mine" in message
    assert f"assigned to pod {ns}/theirs" in message
    wait_for(
        lambda: any(
            e.reason == "GpuAllocationRefused"
            for e in client.CoreV1Api(kube).list_namespaced_event(ns).items
        ),
        60,
        "the refusal event on the pod",
    )


def test_two_pods_admitted_back_to_back_each_get_their_own_set(
    kube: Any, ns: str, setup: Setup
) -> None:
    first, second = setup.uuids[0:4], setup.uuids[4:8]
    bound_pod(kube, ns, setup.node, "first", first)
    bound_pod(kube, ns, setup.node, "second", second)
    with setup.kubelet.plugin("gpusched.sock") as stub:
        # The kubelet admits "second" first: it sees it before "first".
        setup.kubelet.admitting(f"{ns}/second")
        got = setup.kubelet.preferred(stub, setup.uuids, 4)
        assert sorted(got) == sorted(second)
        setup.kubelet.allocate(stub, got)
        setup.kubelet.allocated(f"{ns}/second", "main", got)
        setup.kubelet.admitting(f"{ns}/first")
        rest = [u for u in setup.uuids if u not in got]
        assert sorted(setup.kubelet.preferred(stub, rest, 4)) == sorted(first)
        setup.kubelet.allocate(stub, first)


def test_a_pod_deleted_between_bind_and_allocate_gets_nothing(
    kube: Any, ns: str, setup: Setup
) -> None:
    gpus = setup.uuids[6:8]
    bound_pod(kube, ns, setup.node, "doomed", gpus)
    setup.kubelet.admitting(f"{ns}/doomed")
    client.CoreV1Api(kube).delete_namespaced_pod("doomed", ns, grace_period_seconds=0)
    with setup.kubelet.plugin("gpusched.sock") as stub:
        message = refused(lambda: setup.kubelet.allocate(stub, gpus))
    assert "PodGone" in message
    assert f"{ns}/doomed" in message


def test_a_plugin_restart_while_pods_are_pending_loses_nothing(
    kube: Any, ns: str, setup: Setup
) -> None:
    gpus = setup.uuids[1:3]
    setup.plugin.restart(kill=True)
    bound_pod(kube, ns, setup.node, "pending", gpus)
    setup.kubelet.admitting(f"{ns}/pending")
    setup.kubelet.registered()
    with setup.kubelet.plugin("gpusched.sock") as stub:
        assert sorted(setup.kubelet.preferred(stub, setup.uuids, 2)) == sorted(gpus)
        assert setup.kubelet.allocate(stub, gpus).envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)


def test_drift_is_annotated_and_reported(kube: Any, ns: str, setup: Setup) -> None:
    bound_pod(kube, ns, setup.node, "drifted", setup.uuids[0:2])
    # The kubelet gave it other GPUs (say, the stock plugin was in charge).
    setup.kubelet.allocated(f"{ns}/drifted", "main", setup.uuids[5:7])
    pod = wait_for(
        lambda: (
            (
                p := client.CoreV1Api(kube).read_namespaced_pod("drifted", ns)
            ).metadata.annotations.get(keys.ANNOTATION_ALLOCATED_GPUS)
            and p
        ),
        60,
        "the allocated-gpus annotation",
    )
    assert pod.metadata.annotations[keys.ANNOTATION_ALLOCATED_GPU_INDICES] == "5,6"
    events = wait_for(
        lambda: [
            e
            for e in client.CoreV1Api(kube).list_namespaced_event(ns).items
            if e.reason == "GpuAssignmentDrift"
        ],
        60,
        "a drift event",
    )
    assert "outside its assigned" in events[0].message
    from gpusched.kubeasync import BlockingApi
    from gpusched.node_agent.explain import pod_report, render_pod

    api = BlockingApi(kube.configuration)
    try:
        report = pod_report(api, ns, "drifted")
    finally:
        api.close()
    assert report["enforcement"] == "Drift"
    assert any("GpuAssignmentDrift" in line for line in render_pod(report))


def test_no_registration_while_another_plugin_serves_the_same_gpus(kube: Any, setup: Setup) -> None:
    from concurrent import futures

    other = grpc.server(futures.ThreadPoolExecutor(1))  # the NVIDIA plugin's socket name
    other.add_insecure_port(f"unix://{setup.kubelet.device_plugin_dir / 'nvidia-gpu.sock'}")
    other.start()
    try:
        setup.kubelet.drain()
        setup.kubelet.restart(keep=("nvidia-gpu.sock",))
        wait_for(
            lambda: metric(setup.plugin, "gpusched_node_agent_conflicting_plugin") == 1,
            60,
            "the plugin to see the other plugin",
        )
        assert setup.kubelet.registrations.empty()
        assert metric(setup.plugin, "gpusched_node_agent_registered") == 0
        events = wait_for(
            lambda: [
                e
                for e in client.CoreV1Api(kube).list_namespaced_event("default").items
                if e.reason == "ConflictingDevicePlugin" and e.involved_object.name == setup.node
            ],
            60,
            "a ConflictingDevicePlugin event on the Node",
        )
        assert "nvidia-gpu.sock" in events[0].message
    finally:
        other.stop(grace=None)
        (setup.kubelet.device_plugin_dir / "nvidia-gpu.sock").unlink(missing_ok=True)
    assert setup.kubelet.registered().resource_name == keys.GPU_RESOURCE
    wait_for(
        lambda: metric(setup.plugin, "gpusched_node_agent_conflicting_plugin") == 0,
        60,
        "the conflict to clear",
    )


def metric(plugin: DevicePluginProcess, name: str) -> float:
    """A sample of the plugin's metrics; -1 while it does not serve them."""
    import urllib.request

    try:
        with urllib.request.urlopen(plugin.metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return -1.0
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return -1.0
