"""What the probe publishes to the cluster: every real machine's inventory fits the
NodeGpuTopology schema, one field that does not fit never keeps the node from being published,
and health read back after a restart or an API outage never replaces what the probe sees live."""

from __future__ import annotations

from typing import Any

from probe_testdata import H100, RTX4090, Clock, ClusterDouble, MakeNode, publishing_probe

from gpusched.core import parse_topo_matrix
from gpusched.dev.fakenvml import FakeNvml
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.device_probe.nvml_backend import NvmlBackend
from gpusched.device_probe.sysfs import Sysfs

#: Round-robin CPU numbering of a 2-socket Intel host: socket 0 has the even CPUs.
EVEN_CPUS = ",".join(str(cpu) for cpu in range(0, 224, 2))
ODD_CPUS = ",".join(str(cpu) for cpu in range(1, 224, 2))


def test_a_round_robin_cpu_list_of_a_two_socket_host_is_published_whole(
    make_node: MakeNode,
) -> None:
    text = fixture_path(RTX4090).read_text()
    text = text.replace("0-55,112-167", EVEN_CPUS).replace("56-111,168-223", ODD_CPUS)
    fake = make_node(parse_topo_matrix(text, node_name="node-a"))
    cluster = ClusterDouble()
    backend = NvmlBackend(fake.nvml, Sysfs(fake.sysfs_root), source=fake.topology.source)
    result = publishing_probe(backend, cluster, Clock()).cycle()
    assert result.outcome == "ok"
    assert cluster.topology is not None
    affinity = {g["index"]: g["cpuAffinity"] for g in cluster.topology["spec"]["gpus"]}
    assert len(EVEN_CPUS) > 256
    assert set(affinity.values()) == {EVEN_CPUS, ODD_CPUS}


class _OverlongName(FakeNvml):
    """A driver answering a product name longer than any the schema admits."""

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802 - pynvml's name
        name = super().nvmlDeviceGetName(handle)
        return name + " x" * 100 if handle.index == 2 else name


def test_a_field_the_schema_refuses_is_left_out_and_the_node_still_published(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _OverlongName(fake.topology, fake.nvml.plan)
    cluster = ClusterDouble()
    probe = publishing_probe(NvmlBackend(nvml, Sysfs(fake.sysfs_root)), cluster, Clock())
    result = probe.cycle()
    assert result.outcome == "ok"
    assert cluster.topology is not None
    gpus = cluster.topology["spec"]["gpus"]
    assert gpus[2]["model"] == "unknown"
    assert gpus[2]["uuid"] == result.topology.gpu(2).uuid
    assert gpus[2]["pciBusId"] == result.topology.gpu(2).pci_bus_id
    assert {g["model"] for i, g in enumerate(gpus) if i != 2} == {"NVIDIA H100 80GB HBM3"}
