# ruff: noqa: N802 - overrides keep pynvml's function names
"""The NVML backend's own logic, run against the fake pynvml surface: the NVSwitch rule, direct
NVLink counting, the PCIe fallbacks, and per-GPU / per-field degradation."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml
from probe_testdata import H100, RTX4090, TREES, Clock, MakeNode, backend_for

from gpusched.api import keys
from gpusched.api.nodegputopology import MAX_NICS_PER_NODE, LinkType
from gpusched.core import Gpu, Link, NodeTopology, parse_topo_matrix
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX
from gpusched.dev.fakenvml import FakeNvml, Fault
from gpusched.device_probe.nvml_backend import NvmlBackend, NvmlUnavailableError
from gpusched.device_probe.probe import Probe, ProbeConfig
from gpusched.device_probe.sysfs import Sysfs

CLIQUE = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"


def _switch_board(links_per_gpu: list[int]) -> NodeTopology:
    """An NVSwitch board whose GPUs have the given active switch links."""
    n = len(links_per_gpu)
    return NodeTopology(
        node_name="switch-board",
        gpus=tuple(
            Gpu(
                index=i,
                model="NVIDIA H100 80GB HBM3",
                numa_node=i * 2 // n,
                nvswitch_links=c,
                nvlink_count=c,
            )
            for i, c in enumerate(links_per_gpu)
        ),
        links=tuple(
            Link(a, b, LinkType.NV, nvlinks=min(links_per_gpu[a], links_per_gpu[b]))
            for a, b in combinations(range(n), 2)
        ),
        nvswitch=True,
    )


def _inventory(backend: NvmlBackend) -> Any:
    backend.init()
    return backend.read_inventory("node-a")


def test_nvswitch_links_name_the_switch_and_pairs_take_the_smaller_count(
    make_node: MakeNode,
) -> None:
    fake = make_node(_switch_board([18, 18, 12, 18]))
    reading = _inventory(backend_for(fake))
    gpu_bus_ids = {g.bus_id for g in reading.gpus}
    # What a naive count matches: no link ends at a peer GPU's bus id on a switch board.
    assert all(not g.direct_links for g in reading.gpus)
    for link in range(18):
        remote = fake.nvml.nvmlDeviceGetNvLinkRemotePciInfo(
            fake.nvml.nvmlDeviceGetHandleByIndex(0), link
        )
        assert remote.busId.lower()[4:] not in gpu_bus_ids
    topology = reading.topology
    assert topology.nvswitch
    assert [g.nvswitch_links for g in topology.gpus] == [18, 18, 12, 18]
    assert topology.link(0, 1).nvlinks == 18
    assert topology.link(0, 2).nvlinks == 12
    assert topology.link(2, 3).nvlinks == 12


def test_direct_nvlinks_are_counted_per_peer_in_a_hybrid_cube_mesh(make_node: MakeNode) -> None:
    matrix = parse_topo_matrix(DGX1_LIKE_MATRIX, node_name="dgx1")
    topology = _inventory(backend_for(make_node(matrix))).topology
    assert not topology.nvswitch
    for stated in matrix.links:
        got = topology.link(stated.a, stated.b)
        assert got is not None
        assert (got.type, got.nvlinks) == (stated.type, stated.nvlinks)
    assert {g.nvlink_count for g in topology.gpus} == {6}


def test_a_gpu_lost_before_the_reading_leaves_the_rest_of_the_node_readable(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    backend = backend_for(fake)
    backend.init()
    fake.nvml.inject(Fault(gpu=3, lost=True))
    reading = backend.read_inventory("node-a")
    lost = reading.gpus[3]
    assert lost.lost
    assert not lost.readable
    assert [g.index for g in reading.gpus if g.readable] == [0, 1, 2, 4, 5, 6, 7]
    assert reading.topology.link(0, 3) is None
    assert reading.topology.link(0, 4).nvlinks == 18
    samples, _ = backend.read_health(reading.gpus)
    assert samples[3].lost
    assert not samples[4].lost


def test_a_gpu_lost_between_inventory_and_health_is_reported_lost(make_node: MakeNode) -> None:
    fake = make_node(H100)
    backend = backend_for(fake)
    reading = _inventory(backend)
    fake.nvml.inject(Fault(gpu=6, lost=True))
    samples, issues = backend.read_health(reading.gpus)
    assert samples[6].lost
    assert samples[6].ecc_uncorrected is None
    assert samples[5].ecc_uncorrected == 0
    assert issues == []


def test_unsupported_queries_leave_fields_unknown_without_complaint(make_node: MakeNode) -> None:
    backend = backend_for(make_node(RTX4090))
    reading = _inventory(backend)
    samples, issues = backend.read_health(reading.gpus)
    assert issues == []
    assert samples[0].ecc_uncorrected is None  # GeForce has no ECC
    assert samples[0].remapped_rows_pending is None
    assert samples[0].temperature_c is not None
    assert reading.topology.gpu(0).memory_mib is None  # the matrix does not say
    assert reading.mig_capable is False


class _FlakyNames(FakeNvml):
    def nvmlDeviceGetName(self, handle: Any) -> str:
        if handle.index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetName(handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if handle.index == 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetUUID(handle)


def test_an_unexpected_error_degrades_one_field_or_one_gpu(make_node: MakeNode) -> None:
    fake = make_node(H100)
    nvml = _FlakyNames(fake.topology, fake.nvml.plan)
    reading = _inventory(NvmlBackend(nvml, Sysfs(fake.sysfs_root)))
    assert reading.gpus[1].name is None
    assert reading.gpus[1].uuid is not None
    assert reading.gpus[1].query_error is None
    assert reading.gpus[2].uuid is None
    assert "cannot be identified" in (reading.gpus[2].query_error or "")
    assert reading.topology.link(1, 2).nvlinks == 18  # wiring still read
    assert any("GPU 1 nvmlDeviceGetName" in issue for issue in reading.issues)


class _NoCommonAncestor(FakeNvml):
    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_pcie_levels_fall_back_to_sysfs_when_nvml_cannot_say(make_node: MakeNode) -> None:
    fake = make_node(TREES)
    nvml = _NoCommonAncestor(fake.topology, fake.nvml.plan)
    topology = _inventory(NvmlBackend(nvml, Sysfs(fake.sysfs_root))).topology
    assert topology.link(0, 1).type is LinkType.PIX
    assert topology.link(0, 2).type is LinkType.PXB
    assert topology.link(5, 7).type is LinkType.PXB
    assert topology.link(3, 4).type is LinkType.SYS


def test_numa_and_cpu_affinity_come_from_nvml_when_sysfs_does_not_say(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    for path in Path(fake.sysfs_root, "devices").rglob("numa_node"):
        path.write_text("-1\n")
    for path in Path(fake.sysfs_root, "devices").rglob("local_cpulist"):
        path.unlink()
    topology = _inventory(backend_for(fake)).topology
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topology.gpu(7).cpu_affinity == "48-95,144-191"


def test_fabric_clique_and_mig_mode_come_through(make_node: MakeNode, tmp_path: Path) -> None:
    spec = {
        "gpus": [
            {"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA GB200", "migEnabled": i == 1}
            for i in range(4)
        ],
        "links": [
            {"a": a, "b": b, "type": "NV", "nvlinks": 18} for a, b in combinations(range(4), 2)
        ],
        "nvswitch": True,
        "clique": CLIQUE,
        "driverVersion": "580.65.06",
        "cudaDriverVersion": "13.0",
    }
    path = tmp_path / "gb200.yaml"
    path.write_text(yaml.safe_dump(spec))
    reading = _inventory(backend_for(make_node(path)))
    topology = reading.topology
    assert topology.clique == CLIQUE
    assert [g.mig_enabled for g in topology.gpus] == [False, True, False, False]
    assert reading.mig_capable is True
    assert topology.cuda_driver_version == "13.0"
    assert topology.gpu(2).uuid == "GPU-2"
    assert topology.gpu(2).compute_capability == "10.0"


def test_nvml_init_failure_is_reported_not_raised_as_a_crash(make_node: MakeNode) -> None:
    fake = make_node(H100, init_error="DriverNotLoaded")
    backend = backend_for(fake)
    with pytest.raises(NvmlUnavailableError, match="Driver Not Loaded"):
        backend.init()
    fake.nvml.inject(Fault(nvml_init="ok"))
    backend.init()
    assert backend.device_count() == 8


def test_a_function_the_driver_lacks_answers_function_not_found(make_node: MakeNode) -> None:
    fake = make_node(H100)
    fake.nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        fake.nvml.nvmlDeviceGetNvLinkErrorCounter(fake.nvml.nvmlDeviceGetHandleByIndex(0), 0, 0)


def _add_rdma_functions(root: Path, per_nic: int, *, virtual: bool) -> None:
    """Add ``per_nic`` RDMA functions beside each NIC of a fake sysfs tree, as SR-IOV virtual
    functions (a ``physfn`` link to their NIC) or as further physical functions."""
    infiniband = root / "class" / "infiniband"
    nics = sorted(infiniband.iterdir())
    number = len(nics)
    for nic in nics:
        physical = (nic / "device").resolve()
        domain, bus, _ = physical.name.split(":")
        for function in range(per_nic):
            device = physical.parent / f"{domain}:{bus}:{function + 2:02x}.{function % 8}"
            device.mkdir()
            (device / "numa_node").write_text((physical / "numa_node").read_text())
            if virtual:
                (device / "physfn").symlink_to(physical)
            port = device / "infiniband" / f"mlx5_{number}"
            port.mkdir(parents=True)
            (port / "device").symlink_to(device)
            (infiniband / f"mlx5_{number}").symlink_to(port)
            number += 1


def test_sriov_virtual_functions_are_not_listed_as_nics(make_node: MakeNode) -> None:
    fake = make_node(H100)
    _add_rdma_functions(fake.sysfs_root, 8, virtual=True)
    reading = _inventory(backend_for(fake))
    assert [nic.name for nic in reading.topology.nics] == [f"mlx5_{i}" for i in range(8)]
    assert not reading.issues


def test_nics_beyond_what_the_schema_holds_are_left_out_with_a_warning(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    _add_rdma_functions(fake.sysfs_root, 8, virtual=False)
    reading = _inventory(backend_for(fake))
    assert len(reading.topology.nics) == MAX_NICS_PER_NODE
    assert {nl.nic for nl in reading.topology.nic_links} == set(range(MAX_NICS_PER_NODE))
    assert any("mlx5_64" in issue and "72 RDMA devices" in issue for issue in reading.issues)
    reading.topology.to_api()


class _RemoteTypeFails(FakeNvml):
    """A driver whose remote-device-type query of GPU 1's link 5 fails as many times as told."""

    failures = 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        if handle.index == 1 and link == 5 and self.failures > 0:
            self.failures -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return int(super().nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))


def test_a_link_whose_remote_end_cannot_be_read_is_not_taken_for_a_direct_link(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _RemoteTypeFails(fake.topology, fake.nvml.plan)
    nvml.failures = 1
    reading = _inventory(NvmlBackend(nvml, Sysfs(fake.sysfs_root)))
    gpu = reading.gpus[1]
    assert (gpu.nvlinks_active, gpu.switch_links, gpu.direct_links) == (18, 17, {})
    assert any("nvmlDeviceGetNvLinkRemoteDeviceType" in issue for issue in reading.issues)


def test_a_query_that_fails_once_keeps_the_previous_reading_of_the_same_gpu(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _RemoteTypeFails(fake.topology, fake.nvml.plan)
    backend = NvmlBackend(nvml, Sysfs(fake.sysfs_root))
    first = _inventory(backend)
    nvml.failures = 1
    second = backend.read_inventory("node-a", first)
    assert second.issues
    assert second.topology == first.topology
    assert second.gpus[1].switch_links == 18
    assert second.topology.wiring_hash == first.topology.wiring_hash


def test_a_one_off_wiring_query_error_leaves_the_published_wiring_alone(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _RemoteTypeFails(fake.topology, fake.nvml.plan)
    probe = Probe(
        NvmlBackend(nvml, Sysfs(fake.sysfs_root)),
        ProbeConfig(node_name="node-a"),
        clock=Clock(),
        watch_events=False,
    )
    hashes = set()
    for cycle in range(3):
        nvml.failures = 1 if cycle == 1 else 0
        probe.request_inventory()  # as every periodic resync does
        result = probe.cycle()
        hashes.add(result.labels[keys.LABEL_TOPOLOGY_HASH])
        link = result.topology.link(0, 1)
        assert link is not None
        assert (link.type, link.nvlinks) == (LinkType.NV, 18)
    assert len(hashes) == 1
