"""What the probe publishes to the cluster: every real machine's inventory fits the
NodeGpuTopology schema, one field that does not fit never keeps the node from being published,
and health read back after a restart or an API outage never replaces what the probe sees live."""

from __future__ import annotations

from typing import Any

from probe_testdata import (
    H100,
    RTX4090,
    Clock,
    ClusterDouble,
    MakeNode,
    backend_for,
    publishing_probe,
)

from gpusched.core import parse_topo_matrix
from gpusched.dev.fakenvml import FakeNvml
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.device_probe.events import GpuEvent
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


def _published_reason(cluster: ClusterDouble, gpu: int) -> str:
    assert cluster.topology is not None
    reason: str = cluster.topology["status"]["gpus"][gpu]["reason"]
    return reason


def test_a_status_read_back_after_an_api_outage_does_not_replace_live_health(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    cluster, clock = ClusterDouble(), Clock()
    publishing_probe(backend_for(fake), cluster, clock).cycle()  # an earlier probe: all healthy
    cluster.down = True  # the next probe starts while the API server is unreachable
    probe = publishing_probe(backend_for(fake), cluster, clock)
    assert probe.cycle().outcome == "api-error"
    uuid = probe.known.gpu(6).uuid if probe.known is not None else None
    probe.on_event(GpuEvent("xid", uuid=uuid, xid=48))
    clock.advance(10)
    assert probe.cycle().status.gpus[6].reason == "Xid48"
    cluster.down = False
    clock.advance(10)
    result = probe.cycle()
    assert (result.outcome, result.status.gpus[6].reason) == ("ok", "Xid48")
    assert _published_reason(cluster, 6) == "Xid48"


def test_a_published_fatal_xid_is_kept_by_a_probe_that_started_during_an_api_outage(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    cluster, clock = ClusterDouble(), Clock()
    earlier = publishing_probe(backend_for(fake), cluster, clock)
    earlier.cycle()
    earlier.on_event(GpuEvent("xid", index=3, xid=79))
    clock.advance(10)
    earlier.cycle()
    assert _published_reason(cluster, 3) == "Xid79"
    cluster.down = True
    probe = publishing_probe(backend_for(fake), cluster, clock)
    clock.advance(10)
    assert probe.cycle().status.gpus[3].reason == "Healthy"  # nothing to go by yet
    cluster.down = False
    clock.advance(10)
    result = probe.cycle()
    assert result.status.gpus[3].reason == "Xid79"
    assert {result.status.gpus[i].reason for i in range(8) if i != 3} == {"Healthy"}
