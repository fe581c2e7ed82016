"""Shared test data for the core placement tests: the real ``topo -m`` fixtures and helpers that
check results independently of the engine's own shortcuts."""

from __future__ import annotations

from functools import cache
from itertools import combinations
from pathlib import Path

import pytest

from gpusched.api.nodegputopology import GpuHealthState, LinkType
from gpusched.core import NodeTopology, Policy, PreparedNode, parse_topo_matrix, prepare
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX, default_fixtures_dir

H100 = "hgx-h100-sxm-8gpu-8nic"
A100 = "hgx-a100-sxm4-80gb-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
TREES = "pcie-8gpu-pix-pxb-two-switch-trees"
RTX4090 = "pcie-8x-rtx4090-2socket-allsys-2nic"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
DGX1 = "synthetic-dgx1-hybrid-cube-mesh"
ODD = "synthetic-odd-links"

REAL_FIXTURES = (H100, A100, BRIDGED, TREES, RTX4090, WORKSTATION)
ALL_TOPOLOGIES = (*REAL_FIXTURES, DGX1)
#: What the placement properties run on: every fixture plus a board with the corner cases real
#: pastes rarely combine (see :data:`ODD_MATRIX`).
PROPERTY_TOPOLOGIES = (*ALL_TOPOLOGIES, ODD)

#: Unknown model (PCIe Gen4, 20 GB/s per NVLink), so one NVLink (NV1) is exactly as fast as PHB:
#: only the link class tells GPU 0 (NV1 to 1, PHB to 3) from GPU 2 (PHB to 1, NV1 to 3). GPUs 4
#: and 5 are joined by NODE but sit on different NUMA nodes (not one socket); GPU 6's NUMA node
#: is not known and its pair with GPU 5 is not reported (N/A, scored as SYS).
ODD_MATRIX = """\
# machine: synthetic board with odd links, model not stated
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV1\tPHB\tPHB\tSYS\tNODE\tNODE\tPIX\tSYS\t0-7\t0
GPU1\tNV1\t X \tPHB\tPHB\tSYS\tNODE\tNODE\tPIX\tSYS\t0-7\t0
GPU2\tPHB\tPHB\t X \tNV1\tSYS\tNODE\tNODE\tPIX\tSYS\t0-7\t0
GPU3\tPHB\tPHB\tNV1\t X \tSYS\tNODE\tNODE\tPIX\tSYS\t0-7\t0
GPU4\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tPIX\tSYS\tPIX\t8-15\t1
GPU5\tNODE\tNODE\tNODE\tNODE\tNODE\t X \tN/A\tNODE\tSYS\t0-7\t0
GPU6\tNODE\tNODE\tNODE\tNODE\tPIX\tN/A\t X \tSYS\tPXB\t0-15\tN/A
NIC0\tPIX\tPIX\tPIX\tPIX\tSYS\tNODE\tSYS\t X \tSYS
NIC1\tSYS\tSYS\tSYS\tSYS\tPIX\tSYS\tPXB\tSYS\t X
"""

SCOPE_ORDER = ("nvlink", "pcie-switch", "numa", "node")


def fixtures_dir() -> Path:
    directory = default_fixtures_dir()
    if directory is None or not directory.is_dir():
        pytest.fail("topology fixtures not found: set GPUSCHED_TOPOLOGY_FIXTURES")
    return directory


@cache
def fixture_text(name: str) -> str:
    if name == DGX1:
        return DGX1_LIKE_MATRIX
    if name == ODD:
        return ODD_MATRIX
    return (fixtures_dir() / f"{name}.txt").read_text(encoding="utf-8")


@cache
def topology(name: str) -> NodeTopology:
    return parse_topo_matrix(fixture_text(name), node_name=name)


def node(name: str) -> PreparedNode:
    return prepare(topology(name))


def class_of(topo: NodeTopology, gpus: tuple[int, ...]) -> str:
    """Achieved class computed from the link list directly (not from the engine's masks)."""
    pairs = list(combinations(gpus, 2))

    def kind(a: int, b: int) -> LinkType:
        link = topo.link(a, b)
        return LinkType.SYS if link is None else link.type

    if all(kind(a, b) is LinkType.NV for a, b in pairs):
        return "nvlink"
    if all(kind(a, b) in (LinkType.NV, LinkType.PIX, LinkType.PXB) for a, b in pairs):
        return "pcie-switch"
    numa = {topo.gpu(g).numa_node for g in gpus} - {None}
    if all(kind(a, b) is not LinkType.SYS for a, b in pairs) and len(numa) <= 1:
        return "numa"
    return "node"


#: Per GPU family as docs/placement.md tables it: GB/s per NVLink, PCIe x16 GB/s.
_DOCUMENTED_RATES: tuple[tuple[str, float, float], ...] = (
    ("H100", 20.6, 48.0),
    ("A100", 20.0, 24.0),
    ("RTX 4090", 20.0, 24.0),
    ("V100", 20.0, 12.0),
)
_UNKNOWN_RATES = (20.0, 24.0)
_NIC_POINTS = {LinkType.PIX: 4, LinkType.PXB: 3, LinkType.PHB: 2, LinkType.NODE: 1}


def documented_units(topo: NodeTopology, a: int, b: int) -> int:
    """A pair's bandwidth in tenths of GB/s, from the link list and the table in
    docs/placement.md (not from the engine's bandwidth model)."""
    model = topo.gpu(a).model or ""
    nvlink, pcie = next(
        ((nv, pc) for name, nv, pc in _DOCUMENTED_RATES if name in model), _UNKNOWN_RATES
    )
    link = topo.link(a, b)
    kind = LinkType.SYS if link is None else link.type
    phb = pcie * 5 / 6
    gbps = {
        LinkType.PIX: pcie,
        LinkType.PXB: pcie * 0.9,
        LinkType.PHB: phb,
        LinkType.NODE: phb * 0.9,
        LinkType.SYS: min(10.0, phb * 0.9 * 0.9),
    }.get(kind)
    if gbps is None:
        assert link is not None
        gbps = link.nvlinks * nvlink
    return max(1, round(gbps * 10))


def documented_objective(
    topo: NodeTopology,
    gpus: tuple[int, ...],
    policy: Policy,
    free: tuple[int, ...],
    degraded: frozenset[int],
) -> tuple[bool, int, int, int, int, int, int]:
    """The objective tuple of docs/placement.md ("How a set is scored"), computed from the link
    list: scope met, bottleneck, fewer Degraded, aggregate, fewer NUMA nodes, NIC locality (for
    multi-node jobs), less fragmentation."""

    def affinity(a: int, b: int) -> int:
        na, nb = topo.gpu(a).numa_node, topo.gpu(b).numa_node
        return documented_units(topo, a, b) + (50 if na is not None and na == nb else 0)

    pairs = list(combinations(gpus, 2))
    units = [documented_units(topo, a, b) for a, b in pairs]
    nic: dict[int, int] = {}
    for nl in topo.nic_links:
        nic[nl.gpu] = max(nic.get(nl.gpu, 0), _NIC_POINTS.get(nl.type, 0))
    cost = sum(affinity(i, j) for i in gpus for j in free if j != i) - sum(
        affinity(a, b) for a, b in pairs
    )
    return (
        SCOPE_ORDER.index(class_of(topo, gpus)) <= SCOPE_ORDER.index(policy.scope.value),
        min(units, default=1 << 40),
        -len(degraded.intersection(gpus)),
        sum(units),
        -len({topo.gpu(g).numa_node for g in gpus} - {None}),
        sum(nic.get(g, 0) for g in gpus) if policy.multi_node else 0,
        -cost,
    )


def brute_force(
    prepared: PreparedNode, k: int, policy: Policy, free_indices: tuple[int, ...]
) -> tuple[tuple[bool, int, int, int, int, int, int], tuple[int, ...]] | None:
    """Every k-subset of the free GPUs scored by :func:`documented_objective` (the engine's own
    objective is not used, so a wrong term shows); ties to the lowest indices."""
    topo = prepared.topology
    free = tuple(sorted(free_indices))
    degraded = frozenset(g.index for g in topo.gpus if g.health is GpuHealthState.DEGRADED)
    best: tuple[tuple[bool, int, int, int, int, int, int], tuple[int, ...]] | None = None
    for combo in combinations(free, k):
        objective = documented_objective(topo, combo, policy, free, degraded)
        if policy.required and not objective[0]:
            continue
        if best is None or objective > best[0]:
            best = (objective, combo)
    return best


def bottleneck_units(prepared: PreparedNode, gpus: tuple[int, ...]) -> int:
    positions = [prepared.position(g) for g in gpus]
    if len(positions) < 2:
        return 1 << 40
    return min(prepared.wiring.bw[a][b] for a, b in combinations(positions, 2))
