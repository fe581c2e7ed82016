"""The device probe against the real control plane: one probe process per simulated node (each
on a different real ``topo -m`` matrix, NVML faked), authenticated with a token of the chart's
probe ServiceAccount bound to its node, under exactly the RBAC and own-node policy the chart
renders.

Covers publishing, an XID flipping a GPU through the event path, zero writes when nothing
changed, restarts without flapping, drift repair, garbage collection with the Node, GFD
coexistence and the no-healthy-GPU taint.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpusched.api import keys
from gpusched.api.nodegputopology import GpuHealthState, NodeGpuTopology
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import gpusched_command
from gpusched.dev.localcluster.processes import ProcessRecord, is_running
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.dev.localprobes import probe_kubeconfig, start_fake_probe

H100 = "hgx-h100-sxm-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
G, V, PLURAL = keys.GROUP, keys.VERSION, "nodegputopologies"


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll until ``condition`` returns something truthy (and return it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


@dataclass
class RunningProbe:
    """A ``gpusched probe`` process for one simulated node."""

    record: ProcessRecord
    node: str
    port: int
    faults: Path

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def total(self, name: str) -> float:
        return sum(v for (n, _), v in self.samples().items() if n == name)

    def writes(self) -> float:
        return self.total("gpusched_probe_api_writes_total")

    def cycles(self) -> float:
        return self.total("gpusched_probe_cycles_total")

    def log(self) -> str:
        return Path(self.record.log).read_text(errors="replace")[-4000:]

    def fault(self, **fields: Any) -> None:
        with self.faults.open("a") as handle:
            handle.write(json.dumps(fields) + "\n")

    def wait_cycles(self, more_than: float, timeout: float = 60.0) -> float:
        def done() -> float:
            assert is_running(self.record), f"probe for {self.node} exited:\n{self.log()}"
            try:
                cycles = self.cycles()
            except OSError:
                return 0.0
            return cycles if cycles > more_than else 0.0

        return float(wait_for(done, f"probe cycles of {self.node} > {more_than}", timeout))


@dataclass
class Probes:
    """Starts probe processes as the probe's ServiceAccount and stops them after the test."""

    cluster: LocalCluster
    directory: Path
    running: list[RunningProbe] = field(default_factory=list)

    def start(
        self, node: str, fixture: str, *args: str, faults: Path | None = None
    ) -> RunningProbe:
        started = start_fake_probe(
            self.cluster,
            node,
            fixture_path(fixture),
            faults=faults or self.directory / f"{node}-faults.jsonl",
            args=args,
        )
        probe = RunningProbe(started.record, node, started.metrics_port, started.faults)
        self.running.append(probe)
        probe.wait_cycles(0)
        return probe

    def stop(self, probe: RunningProbe) -> None:
        self.cluster.stop_process(probe.record)
        self.running.remove(probe)

    def run_once(
        self, node: str, fixture: str, *args: str, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *gpusched_command(),
                "probe",
                "--once",
                f"--node={node}",
                f"--kubeconfig={kubeconfig or probe_kubeconfig(self.cluster, node)}",
                f"--fake={fixture_path(fixture)}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def once(self, node: str, fixture: str, *args: str) -> dict[str, Any]:
        result = self.run_once(node, fixture, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        return dict(json.loads(result.stdout))


@pytest.fixture
def probes(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[Probes]:
    runner = Probes(local_cluster, tmp_path)
    yield runner
    for probe in list(runner.running):
        runner.stop(probe)


def node_labels(kube: Any, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube).read_node(node).metadata.labels or {})


def topology(kube: Any, node: str) -> NodeGpuTopology | None:
    try:
        obj = client.CustomObjectsApi(kube).get_cluster_custom_object(G, V, PLURAL, node)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return NodeGpuTopology.model_validate(obj)


def ours(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith((keys.PREFIX, keys.GFD_PREFIX))}


def test_each_simulated_node_gets_its_labels_and_topology_object(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    expected = {
        # fixture: (GPUs, islands, largest island, nvswitch, GPU pairs with NVLink)
        H100: (8, "1", "8", "true", 28),
        BRIDGED: (8, "4", "2", "false", 4),
        WORKSTATION: (4, "3", "2", "false", 1),
    }
    nodes = {
        fixture: gpu_nodes(1, gpus=gpus, prefix="probe-pub")[0]
        for fixture, (gpus, *_rest) in expected.items()
    }
    for fixture, node in nodes.items():
        probes.start(node, fixture)
    core = client.CoreV1Api(kube)
    for fixture, node in nodes.items():
        gpus, islands, largest, nvswitch, nv_pairs = expected[fixture]
        labels = wait_for(
            lambda node=node: (lb := node_labels(kube, node)).get(keys.LABEL_PROBED) and lb,
            f"labels on {node}",
        )
        assert labels[keys.LABEL_GPU_COUNT] == str(gpus)
        assert labels[keys.LABEL_GPU_HEALTHY] == str(gpus)
        assert labels[keys.LABEL_NVLINK_ISLANDS] == islands
        assert labels[keys.LABEL_NVLINK_LARGEST_ISLAND] == largest
        assert labels[keys.LABEL_NVSWITCH] == nvswitch
        assert labels[keys.GFD_COUNT] == str(gpus)  # no GFD on these nodes
        obj = wait_for(lambda node=node: topology(kube, node), f"NodeGpuTopology {node}")
        assert obj.spec.node_name == node
        assert obj.spec.source == f"fake:{fixture}.txt"
        assert len(obj.spec.gpus) == gpus
        assert sum(1 for link in obj.spec.links if link.type == "NV") == nv_pairs
        assert obj.spec.topology_hash == labels[keys.LABEL_TOPOLOGY_HASH]
        owner = obj.metadata.owner_references[0]
        assert (owner["kind"], owner["name"]) == ("Node", node)
        assert owner["uid"] == core.read_node(node).metadata.uid
        assert obj.status.healthy_gpus == gpus
        assert {g.state for g in obj.status.gpus} == {GpuHealthState.HEALTHY}
        assert obj.status.conditions[0].type == "NvmlReady"
    # Different nodes, different GPUs.
    uuids = [{g.uuid for g in topology(kube, n).spec.gpus} for n in nodes.values()]  # type: ignore[union-attr]
    assert not uuids[0] & uuids[1]


def test_an_injected_xid_79_flips_that_gpu_in_the_published_status(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    (node,) = gpu_nodes(1, gpus=8, prefix="probe-xid")
    # An hour between readings: only the event path can publish the change.
    probe = probes.start(node, H100, "--interval=3600", "--resync=3600")
    wait_for(lambda: topology(kube, node), "the first publication")
    probe.fault(gpu=3, xid=79)

    def flipped() -> NodeGpuTopology | None:
        obj = topology(kube, node)
        return obj if obj is not None and obj.status.gpus[3].reason == "Xid79" else None

    obj = wait_for(flipped, "GPU 3 to turn Unhealthy (Xid79)", timeout=30)
    gpu = obj.status.gpus[3]
    assert gpu.state is GpuHealthState.UNHEALTHY
    assert "fallen off the bus" in gpu.message
    assert gpu.since is not None
    assert obj.status.healthy_gpus == 7
    assert {g.state for i, g in enumerate(obj.status.gpus) if i != 3} == {GpuHealthState.HEALTHY}
    wait_for(lambda: node_labels(kube, node)[keys.LABEL_GPU_HEALTHY] == "7", "gpu.healthy=7")
    assert (
        probe.samples()[
            (
                "gpusched_probe_xid_events_total",
                (("action", "unhealthy"), ("gpu", "3"), ("xid", "79")),
            )
        ]
        == 1.0
    )


def test_nothing_changed_means_no_writes(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    (node,) = gpu_nodes(1, gpus=8, prefix="probe-quiet")
    probe = probes.start(node, BRIDGED, "--interval=0.5", "--resync=1")
    wait_for(lambda: topology(kube, node), "the first publication")
    settled = probe.wait_cycles(probe.cycles() + 1)
    writes = probe.writes()
    assert writes == 3  # the object, its status, the labels: once
    probe.wait_cycles(settled + 6)  # several readings and resyncs later
    assert probe.writes() == writes
    second = probes.once(node, BRIDGED)
    assert (second["outcome"], second["writes"]) == ("ok", 0)


def test_a_restarted_probe_republishes_nothing(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    (node,) = gpu_nodes(1, gpus=4, prefix="probe-restart")
    first = probes.start(node, WORKSTATION, "--interval=0.5")
    first.fault(gpu=2, remappedRows="pending")
    wait_for(
        lambda: (o := topology(kube, node)) and o.status.gpus[2].reason == "RowRemapPending",
        "GPU 2 unschedulable",
    )
    # The labels are written after the object's status: read them once they say it too.
    wait_for(lambda: node_labels(kube, node)[keys.LABEL_GPU_HEALTHY] == "3", "gpu.healthy=3")
    before = topology(kube, node)
    labels_before = ours(node_labels(kube, node))
    probes.stop(first)
    # Same node, same (still pending) fault: the restarted probe finds everything in place.
    second = probes.start(node, WORKSTATION, "--interval=0.5", faults=first.faults)
    second.wait_cycles(second.cycles() + 2)
    assert second.writes() == 0
    after = topology(kube, node)
    assert after is not None
    assert before is not None
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.status.gpus[2].since == before.status.gpus[2].since
    assert ours(node_labels(kube, node)) == labels_before


def test_labels_removed_by_someone_else_come_back_at_resync(
    kube: Any,
    local_cluster: LocalCluster,
    gpu_nodes: Callable[..., list[str]],
    probes: Probes,
) -> None:
    (node,) = gpu_nodes(1, gpus=8, prefix="probe-drift")
    probe = probes.start(node, BRIDGED, "--interval=0.5", "--resync=1")
    wait_for(lambda: node_labels(kube, node).get(keys.LABEL_NVLINK_ISLANDS), "labels")
    writes = probe.writes()
    local_cluster.kubectl("label", "node", node, f"{keys.LABEL_NVLINK_ISLANDS}-")
    wait_for(
        lambda: node_labels(kube, node).get(keys.LABEL_NVLINK_ISLANDS) == "4", "the label back"
    )
    assert probe.writes() == writes + 1  # only the labels were re-applied


def test_deleting_the_node_garbage_collects_its_object_and_nothing_comes_back(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    (node,) = gpu_nodes(1, gpus=8, prefix="probe-gc")
    probe = probes.start(node, H100, "--interval=0.5", "--resync=1")
    wait_for(lambda: topology(kube, node), "the first publication")
    client.CoreV1Api(kube).delete_node(node)
    wait_for(lambda: topology(kube, node) is None, "the garbage collector", timeout=60)
    probe.fault(gpu=1, xid=79)  # a change the probe would like to publish
    probe.wait_cycles(probe.cycles() + 4)
    assert topology(kube, node) is None
    names = {n.metadata.name for n in client.CoreV1Api(kube).list_node().items}
    assert node not in names  # the label apply never resurrects the Node
    assert probe.total("gpusched_probe_cycles_total") > 0
    assert probe.samples()[("gpusched_probe_cycles_total", (("result", "node-missing"),))] >= 1


def test_gfd_labels_are_left_to_gfd(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes
) -> None:
    core = client.CoreV1Api(kube)
    (with_gfd,) = gpu_nodes(
        1,
        gpus=8,
        prefix="probe-gfd",
        labels={keys.GFD_TIMESTAMP: "1724632719", keys.GFD_PRODUCT: "NVIDIA-H100-SXM5-80GB"},
    )
    assert probes.once(with_gfd, H100)["outcome"] == "ok"
    labels = node_labels(kube, with_gfd)
    assert labels[keys.GFD_PRODUCT] == "NVIDIA-H100-SXM5-80GB"
    assert keys.GFD_MEMORY not in labels
    assert labels[keys.LABEL_GPU_MODEL] == "NVIDIA-H100-80GB-HBM3"

    # GFD arrives on a node the probe labelled first: the probe steps back from nvidia.com/.
    (late,) = gpu_nodes(1, gpus=8, prefix="probe-gfd-late")
    probes.once(late, H100)
    assert node_labels(kube, late)[keys.GFD_MEMORY] == "81920"
    core.patch_node(
        late,
        {"metadata": {"labels": {keys.GFD_TIMESTAMP: "1724632720", keys.GFD_PRODUCT: "from-gfd"}}},
        field_manager="gpu-feature-discovery",
    )
    assert probes.once(late, H100)["writes"] == 1
    labels = node_labels(kube, late)
    assert labels[keys.GFD_PRODUCT] == "from-gfd"  # GFD's value stands
    assert keys.GFD_MEMORY not in labels  # the probe's own nvidia.com/ keys are withdrawn
    assert labels[keys.LABEL_GPU_COUNT] == "8"
    assert probes.once(late, H100)["writes"] == 0


def test_a_node_without_healthy_gpus_is_tainted_when_asked(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube)
    (node,) = gpu_nodes(1, gpus=4, prefix="probe-taint")
    core.patch_node(
        node, {"spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}}
    )
    faults = tmp_path / "all-lost.jsonl"
    faults.write_text("".join(json.dumps({"gpu": i, "lost": True}) + "\n" for i in range(4)))
    result = probes.once(node, WORKSTATION, "--taint-unhealthy", f"--fake-faults={faults}")
    assert result["healthyGpus"] == 0
    taints = {(t.key, t.effect) for t in core.read_node(node).spec.taints}
    assert taints == {("dedicated", "NoSchedule"), (keys.TAINT_NO_HEALTHY_GPU, "NoSchedule")}
    assert node_labels(kube, node)[keys.LABEL_GPU_HEALTHY] == "0"
    healed = probes.once(node, WORKSTATION, "--taint-unhealthy")
    assert healed["healthyGpus"] == 4
    taints = {(t.key, t.effect) for t in core.read_node(node).spec.taints}
    assert taints == {("dedicated", "NoSchedule")}


def test_nvml_failure_is_published_and_recovered_from(
    kube: Any, gpu_nodes: Callable[..., list[str]], probes: Probes, tmp_path: Path
) -> None:
    (node,) = gpu_nodes(1, gpus=8, prefix="probe-nonvml")
    faults = tmp_path / "nvml.jsonl"
    faults.write_text(json.dumps({"nvmlInit": "fail", "error": "DriverNotLoaded"}) + "\n")
    probe = probes.start(node, H100, "--interval=0.5", faults=faults)
    down = wait_for(lambda: topology(kube, node), "the object of a node without NVML")
    assert down.spec.gpus == []
    assert (down.status.conditions[0].status, down.status.conditions[0].reason) == (
        "False",
        "InitFailed",
    )
    assert node_labels(kube, node)[keys.LABEL_GPU_COUNT] == "0"
    probe.fault(nvmlInit="ok")
    up = wait_for(
        lambda: (o := topology(kube, node)) and o.status.conditions[0].status == "True" and o,
        "NvmlReady after recovery",
    )
    assert len(up.spec.gpus) == 8
    assert up.status.healthy_gpus == 8
    assert is_running(probe.record)


def test_a_probe_publishes_only_for_the_node_its_token_is_bound_to(
    kube: Any,
    local_cluster: LocalCluster,
    gpu_nodes: Callable[..., list[str]],
    probes: Probes,
) -> None:
    own, other = gpu_nodes(2, gpus=4, prefix="probe-own")
    kubeconfig = probe_kubeconfig(local_cluster, own)
    refused = probes.run_once(other, WORKSTATION, kubeconfig=kubeconfig)
    assert refused.returncode == 1
    assert "may only write the Node it runs on" in refused.stderr
    assert json.loads(refused.stdout)["outcome"] == "api-error"
    allowed = probes.run_once(own, WORKSTATION, kubeconfig=kubeconfig)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert json.loads(allowed.stdout)["writes"] == 3
    assert node_labels(kube, own)[keys.LABEL_GPU_COUNT] == "4"
    assert topology(kube, own) is not None
    assert keys.LABEL_PROBED not in node_labels(kube, other)
    assert topology(kube, other) is None
