"""Shared test data for the core placement tests: the real ``topo -m`` fixtures and helpers that
check results independently of the engine's own shortcuts."""

from __future__ import annotations

from functools import cache
from itertools import combinations
from pathlib import Path

import pytest

from gpusched.api.nodegputopology import LinkType
from gpusched.core import NodeTopology, Policy, PreparedNode, parse_topo_matrix, prepare
from gpusched.core.objective import Objective, evaluate, make_context
from gpusched.core.placement import scope_rank
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX, default_fixtures_dir

H100 = "hgx-h100-sxm-8gpu-8nic"
A100 = "hgx-a100-sxm4-80gb-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
TREES = "pcie-8gpu-pix-pxb-two-switch-trees"
RTX4090 = "pcie-8x-rtx4090-2socket-allsys-2nic"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
DGX1 = "synthetic-dgx1-hybrid-cube-mesh"

REAL_FIXTURES = (H100, A100, BRIDGED, TREES, RTX4090, WORKSTATION)
ALL_TOPOLOGIES = (*REAL_FIXTURES, DGX1)

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


def brute_force(
    prepared: PreparedNode, k: int, policy: Policy, free_indices: tuple[int, ...]
) -> tuple[Objective, tuple[int, ...]] | None:
    """Every k-subset scored with the shared objective; ties to the lowest indices."""
    w = prepared.wiring
    free = prepared.mask(free_indices)
    ctx = make_context(w, free, prepared.degraded_mask, scope_rank(policy.scope), policy.multi_node)
    best: tuple[tuple[Objective, tuple[int, ...]], tuple[int, ...]] | None = None
    for combo in combinations(sorted(prepared.position(i) for i in free_indices), k):
        objective = evaluate(ctx, combo)
        if policy.required and not objective.scope_ok:
            continue
        key = (objective, tuple(-p for p in combo))
        if best is None or key > best[0]:
            best = (key, combo)
    if best is None:
        return None
    return best[0][0], tuple(w.indices[p] for p in best[1])


def bottleneck_units(prepared: PreparedNode, gpus: tuple[int, ...]) -> int:
    positions = [prepared.position(g) for g in gpus]
    if len(positions) < 2:
        return 1 << 40
    return min(prepared.wiring.bw[a][b] for a, b in combinations(positions, 2))
