"""For every real ``topo -m`` fixture, the production NVML backend over the fake reads back the
wiring the matrix shows: each GPU pair's link, the NVLink islands, the NUMA groups and which GPUs
each NIC serves. The expectations are written out by hand from the matrices, not derived from
the parser, so a mistake in the fake or the backend cannot cancel itself out."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import pytest
from probe_testdata import A100, BRIDGED, H100, RTX4090, TREES, WORKSTATION, MakeNode, backend_for

from gpusched.api.nodegputopology import LinkType
from gpusched.core import (
    NodeTopology,
    build_graph,
    nic_groups,
    numa_groups,
    nvlink_islands,
    switch_trees,
)

NV = LinkType.NV
PIX, PXB, PHB, NODE, SYS = LinkType.PIX, LinkType.PXB, LinkType.PHB, LinkType.NODE, LinkType.SYS


@dataclass(frozen=True)
class Expected:
    gpus: int
    pairs: dict[tuple[int, int], tuple[LinkType, int]]
    islands: list[set[int]]
    numa: dict[int, set[int]]
    nic_names: list[str] = field(default_factory=list)
    nic_numa: list[int | None] = field(default_factory=list)
    nic_rails: dict[int, set[int]] = field(default_factory=dict)
    """GPUs within a PCIe switch tree (PIX/PXB) of each NIC."""
    nic_links: dict[tuple[int, int], LinkType] = field(default_factory=dict)
    """Selected NIC-GPU distances, (nic, gpu) -> class."""
    nvswitch: bool = False
    nvlinks_per_gpu: int | tuple[int, ...] = 0
    """Active NVLinks of every GPU, or of each GPU in order."""
    switch_trees: list[set[int]] | None = None


def _all_pairs(n: int, link: tuple[LinkType, int]) -> dict[tuple[int, int], tuple[LinkType, int]]:
    return dict.fromkeys(combinations(range(n), 2), link)


def _override(
    base: dict[tuple[int, int], tuple[LinkType, int]],
    **changes: tuple[LinkType, int],
) -> dict[tuple[int, int], tuple[LinkType, int]]:
    out = dict(base)
    for key, value in changes.items():
        a, b = (int(x) for x in key[1:].split("_"))
        out[(a, b)] = value
    return out


HALVES = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}

EXPECTED: dict[str, Expected] = {
    # NV18 between every pair through NVSwitch; a NIC pair at PIX to each even GPU.
    H100: Expected(
        gpus=8,
        pairs=_all_pairs(8, (NV, 18)),
        islands=[set(range(8))],
        numa=HALVES,
        nic_names=[f"mlx5_{i}" for i in range(8)],
        nic_numa=[0, 0, 0, 0, 1, 1, 1, 1],
        nic_rails={0: {0}, 1: {0}, 2: {2}, 3: {2}, 4: {4}, 5: {4}, 6: {6}, 7: {6}},
        nic_links={(0, 0): PIX, (0, 1): NODE, (0, 4): SYS, (5, 4): PIX, (7, 5): NODE},
        nvswitch=True,
        nvlinks_per_gpu=18,
    ),
    # NV12 through NVSwitch; each NIC pair PXB to a GPU pair.
    A100: Expected(
        gpus=8,
        pairs=_all_pairs(8, (NV, 12)),
        islands=[set(range(8))],
        numa=HALVES,
        nic_names=[f"mlx5_{i}" for i in range(8)],
        nic_numa=[0, 0, 0, 0, 1, 1, 1, 1],
        nic_rails={
            0: {0, 1},
            1: {0, 1},
            2: {2, 3},
            3: {2, 3},
            4: {4, 5},
            5: {4, 5},
            6: {6, 7},
            7: {6, 7},
        },
        nic_links={(0, 0): PXB, (0, 2): NODE, (0, 7): SYS, (6, 7): PXB, (6, 4): NODE},
        nvswitch=True,
        nvlinks_per_gpu=12,
    ),
    # Bridged pairs 0-2, 1-3, 4-5, 6-7 at NV12; every other pair SYS (even inside a socket).
    BRIDGED: Expected(
        gpus=8,
        pairs=_override(
            _all_pairs(8, (SYS, 0)), p0_2=(NV, 12), p1_3=(NV, 12), p4_5=(NV, 12), p6_7=(NV, 12)
        ),
        islands=[{0, 2}, {1, 3}, {4, 5}, {6, 7}],
        numa=HALVES,
        nvlinks_per_gpu=12,
    ),
    # Two PCIe switch trees of four: PIX pairs 0-1 and 4-5, PXB within a tree, SYS across.
    TREES: Expected(
        gpus=8,
        pairs=_override(
            {
                (a, b): (PXB, 0) if (a < 4) == (b < 4) else (SYS, 0)
                for a, b in combinations(range(8), 2)
            },
            p0_1=(PIX, 0),
            p4_5=(PIX, 0),
        ),
        islands=[{i} for i in range(8)],
        numa={},
        switch_trees=[{0, 1, 2, 3}, {4, 5, 6, 7}],
    ),
    # All pairs SYS; two NICs on GPU6's host bridge (PHB), SYS to the rest. The NICs' NUMA node
    # is unknown: no PCIe tree puts a NIC on GPU4's NUMA node yet SYS away from it, so the fake's
    # sysfs says -1 for them (documented in pcie_plan).
    RTX4090: Expected(
        gpus=8,
        pairs=_all_pairs(8, (SYS, 0)),
        islands=[{i} for i in range(8)],
        numa=HALVES,
        nic_names=["NIC0", "NIC1"],
        nic_numa=[None, None],
        nic_rails={0: set(), 1: set()},
        nic_links={(0, 6): PHB, (1, 6): PHB, (0, 4): SYS, (1, 0): SYS, (0, 7): SYS},
    ),
    # GPU0-1 bridged (NV12), GPU2-3 NODE, SYS across sockets; both NICs NODE to GPU0/1.
    WORKSTATION: Expected(
        gpus=4,
        pairs=_override(_all_pairs(4, (SYS, 0)), p0_1=(NV, 12), p2_3=(NODE, 0)),
        islands=[{0, 1}, {2}, {3}],
        numa={0: {0, 1}, 1: {2, 3}},
        nic_names=["mlx5_0", "mlx5_1"],
        nic_numa=[0, 0],
        nic_rails={0: set(), 1: set()},
        nic_links={(0, 0): NODE, (1, 1): NODE, (0, 2): SYS, (1, 3): SYS},
        nvlinks_per_gpu=(12, 12, 0, 0),
    ),
}


def _read(make_node: MakeNode, fixture: str) -> NodeTopology:
    fake = make_node(fixture, node=f"{fixture}-node")
    backend = backend_for(fake)
    backend.init()
    reading = backend.read_inventory(f"{fixture}-node")
    assert reading.issues == []
    return reading.topology


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_every_gpu_pair_reads_back_as_the_matrix_shows(make_node: MakeNode, fixture: str) -> None:
    expected = EXPECTED[fixture]
    topology = _read(make_node, fixture)
    assert len(topology.gpus) == expected.gpus
    got = {}
    for a, b in combinations(range(expected.gpus), 2):
        link = topology.link(a, b)
        assert link is not None, f"GPU{a}-GPU{b} missing"
        got[(a, b)] = (link.type, link.nvlinks)
        if link.type is NV:
            assert link.pcie is not None, "an NVLinked pair still reports its PCIe path"
    assert got == expected.pairs


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_islands_and_numa_groups_match_the_matrix(make_node: MakeNode, fixture: str) -> None:
    expected = EXPECTED[fixture]
    topology = _read(make_node, fixture)
    graph = build_graph(topology)
    assert sorted(map(sorted, nvlink_islands(graph))) == sorted(map(sorted, expected.islands))
    assert {k: set(v) for k, v in numa_groups(graph).items()} == expected.numa
    assert topology.nvswitch is expected.nvswitch
    per_gpu = expected.nvlinks_per_gpu
    if isinstance(per_gpu, int):
        per_gpu = (per_gpu,) * expected.gpus
    assert tuple(g.nvlink_count for g in topology.gpus) == per_gpu
    assert tuple(g.nvswitch_links for g in topology.gpus) == (
        per_gpu if expected.nvswitch else (0,) * expected.gpus
    )
    if expected.switch_trees is not None:
        assert sorted(map(sorted, switch_trees(graph))) == sorted(
            map(sorted, expected.switch_trees)
        )


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_nics_are_found_in_sysfs_with_their_distance_to_each_gpu(
    make_node: MakeNode, fixture: str
) -> None:
    expected = EXPECTED[fixture]
    topology = _read(make_node, fixture)
    assert [n.name for n in topology.nics] == expected.nic_names
    assert [n.numa_node for n in topology.nics] == expected.nic_numa
    graph = build_graph(topology)
    assert {k: set(v) for k, v in nic_groups(graph).items()} == expected.nic_rails
    for (nic, gpu), level in expected.nic_links.items():
        assert topology.nic_link(nic, gpu) is level, f"NIC{nic}-GPU{gpu}"
    if expected.nic_names:
        assert len(topology.nic_links) == len(expected.nic_names) * expected.gpus


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_the_fake_reproduces_every_stated_nic_distance(make_node: MakeNode, fixture: str) -> None:
    fake = make_node(fixture)
    nic_cells = [m for m in fake.nvml.plan.mismatches if "NIC" in m]
    assert nic_cells == []
    topology = _read(make_node, fixture)
    for stated in fake.topology.nic_links:
        assert topology.nic_link(stated.nic, stated.gpu) is stated.type


def test_inventory_reads_identity_numa_and_cpu_affinity(make_node: MakeNode) -> None:
    topology = _read(make_node, H100)
    gpu = topology.gpu(5)
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_mib == 80 * 1024
    assert gpu.compute_capability == "9.0"
    assert gpu.numa_node == 1
    assert gpu.cpu_affinity == "48-95,144-191"
    assert gpu.uuid is not None
    assert gpu.uuid.startswith("GPU-")
    assert gpu.pci_bus_id is not None
    assert gpu.pci_bus_id.startswith("0000:")
    assert len({g.uuid for g in topology.gpus}) == 8
    assert len({g.pci_bus_id for g in topology.gpus}) == 8
    assert topology.driver_version == "570.124.06"
    assert topology.source == "fake:hgx-h100-sxm-8gpu-8nic.txt"


def test_each_simulated_node_has_its_own_gpu_uuids(make_node: MakeNode) -> None:
    a = backend_for(make_node(H100, node="node-a"))
    b = backend_for(make_node(H100, node="node-b"))
    a.init()
    b.init()
    uuids_a = {g.uuid for g in a.read_inventory("node-a").topology.gpus}
    uuids_b = {g.uuid for g in b.read_inventory("node-b").topology.gpus}
    assert not uuids_a & uuids_b


def test_a_readback_has_exactly_the_links_of_the_matrix(make_node: MakeNode) -> None:
    for fixture in (BRIDGED, TREES, WORKSTATION):
        fake = make_node(fixture)
        backend = backend_for(fake)
        backend.init()
        read = backend.read_inventory("node-a").topology
        # Identity (model, capability) differs from the bare matrix, the links must not.
        assert {(lk.a, lk.b, lk.type, lk.nvlinks) for lk in read.links} == {
            (lk.a, lk.b, lk.type, lk.nvlinks) for lk in fake.topology.links
        }
