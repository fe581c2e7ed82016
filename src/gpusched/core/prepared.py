"""Per-wiring structures the placement hot path runs on.

A cluster has thousands of nodes but few distinct wirings (every HGX H100 of a fleet reads the
same), and prioritize must score every node for every pod. So the graph is built and analysed once
per wiring hash, and what the search needs is frozen into plain tuples of integers and bitmasks:
bandwidth and affinity matrices, per-class adjacency masks, components per bandwidth level, NUMA
bits, NIC proximity and the classes of interchangeable GPUs. A GPU set is an ``int`` whose bit
``p`` stands for the GPU at position ``p`` (positions follow increasing GPU index).

Health changes at runtime and is kept out of the shared wiring: a :class:`PreparedNode` pairs the
wiring with the node's current placeable and degraded masks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from gpusched.api.nodegputopology import GpuHealthState, LinkType
from gpusched.core import graph as topo_graph
from gpusched.core.bandwidth import DEFAULT_BANDWIDTH, BandwidthModel
from gpusched.core.topology import NodeTopology

#: Nodes with at most this many GPUs are searched exactly; larger ones by the heuristic.
EXACT_MAX_GPUS: Final = 16

#: Pair class ranks, tightest first; equal to the order of ``TopologyScope``.
CLASS_NVLINK: Final = 0
CLASS_PCIE_SWITCH: Final = 1
CLASS_NUMA: Final = 2
CLASS_NODE: Final = 3

#: Affinity bonus (bandwidth units) for two GPUs on the same NUMA node. NVSwitch boards give every
#: pair the same bandwidth, so without it the fragmentation term could not tell keeping a socket's
#: GPUs together from scattering them.
NUMA_AFFINITY_UNITS: Final = 50

#: NIC proximity points per PCIe distance of a GPU's nearest NIC (RDMA without crossing the CPU
#: is what multi-node jobs need; PIX/PXB NICs are "rail-local").
NIC_POINTS: Final[dict[LinkType, int]] = {
    LinkType.PIX: 4,
    LinkType.PXB: 3,
    LinkType.PHB: 2,
    LinkType.NODE: 1,
    LinkType.SYS: 0,
}
MAX_NIC_POINTS: Final = 4

_TYPE_RANK: Final[dict[LinkType, int]] = {
    LinkType.NV: CLASS_NVLINK,
    LinkType.PIX: CLASS_PCIE_SWITCH,
    LinkType.PXB: CLASS_PCIE_SWITCH,
    LinkType.PHB: CLASS_NUMA,
    LinkType.NODE: CLASS_NUMA,
    LinkType.SYS: CLASS_NODE,
}


@dataclass(frozen=True, eq=False, slots=True)
class PreparedWiring:
    """Everything the search reads about one wiring, as integers and bitmasks.

    Equality and hashing go by ``key`` so the structure can key memo tables directly.
    """

    key: str
    n: int
    indices: tuple[int, ...]
    """GPU index at each position."""
    bw: tuple[tuple[int, ...], ...]
    """Effective pair bandwidth in units (tenths of GB/s); 0 on the diagonal."""
    codes: tuple[tuple[str, ...], ...]
    """``topo -m`` code of each pair (``NV12``, ``PIX``), for reasons."""
    aff: tuple[tuple[int, ...], ...]
    """Pair affinity: bandwidth plus the same-NUMA bonus; the fragmentation currency."""
    adj_nvlink: tuple[int, ...]
    """Per position, the positions it reaches over NVLink."""
    adj_switch: tuple[int, ...]
    """... over NV, PIX or PXB (same PCIe switch tree or better)."""
    adj_numa: tuple[int, ...]
    """... without a SYS hop and not on a different known NUMA node."""
    scope_adj: tuple[tuple[int, ...], ...]
    """For scope ranks 0..2, a superset graph whose cliques include every set of that class."""
    levels: tuple[int, ...]
    """Distinct pair bandwidths, fastest first."""
    adj_ge: tuple[tuple[int, ...], ...]
    """Per level, per position: the positions joined to it by at least that bandwidth."""
    comps_ge: tuple[tuple[int, ...], ...]
    """Per level, the connected components (masks, size >= 2) of the ``adj_ge`` graph."""
    numa_bit: tuple[int, ...]
    """``1 << numa_node`` per position, 0 when not known."""
    nic_points: tuple[int, ...]
    """Proximity of each GPU's nearest NIC (:data:`NIC_POINTS`)."""
    twin_class: tuple[int, ...]
    """Class id per position; GPUs of one class are interchangeable for every objective term."""
    islands: tuple[int, ...]
    """NVLink islands as masks, largest first."""
    max_bw: int
    all_mask: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PreparedWiring) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def mask_of_positions(self, positions: Iterable[int]) -> int:
        """Bitmask of positions."""
        mask = 0
        for p in positions:
            mask |= 1 << p
        return mask

    def positions_of(self, mask: int) -> tuple[int, ...]:
        """Positions set in a mask, increasing."""
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return tuple(out)

    def largest_nvlink_set(self, mask: int) -> int:
        """Size of the largest set within ``mask`` with NVLink between every pair: the most GPUs
        an ``nvlink``-scoped replica can get there. An island is not enough (DGX-1's hybrid cube
        mesh is one island of eight with no five GPUs NVLinked pairwise)."""
        adj = self.adj_nvlink
        best = 0

        def grow(cand: int, size: int) -> None:
            nonlocal best
            best = max(best, size)
            while cand and size + cand.bit_count() > best:
                low = cand & -cand
                cand ^= low
                grow(cand & adj[low.bit_length() - 1], size + 1)

        for island in self.islands:
            region = island & mask
            if region.bit_count() > best:
                grow(region, 0)
        return best

    def pair_class(self, a: int, b: int) -> int:
        """Class rank of a pair of positions (0 nvlink .. 3 node)."""
        bit = 1 << b
        if self.adj_nvlink[a] & bit:
            return CLASS_NVLINK
        if self.adj_switch[a] & bit:
            return CLASS_PCIE_SWITCH
        if self.adj_numa[a] & bit:
            return CLASS_NUMA
        return CLASS_NODE


@dataclass(frozen=True, slots=True)
class PreparedNode:
    """A node ready for placement: its shared wiring plus its current health."""

    topology: NodeTopology
    wiring: PreparedWiring
    placeable_mask: int
    """GPUs that may receive new work (Healthy or Degraded, not MIG)."""
    degraded_mask: int
    _position: dict[int, int] = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """Node name."""
        return self.topology.node_name

    def position(self, index: int) -> int:
        """Bit position of a GPU index (ValueError if the node has no such GPU)."""
        try:
            return self._position[index]
        except KeyError:
            raise ValueError(f"node {self.name} has no GPU {index}") from None

    def mask(self, indices: Iterable[int]) -> int:
        """Bitmask of GPU indices."""
        m = 0
        position = self._position
        try:
            for index in indices:
                m |= 1 << position[index]
        except KeyError as exc:
            raise ValueError(f"node {self.name} has no GPU {exc.args[0]}") from None
        return m

    def indices(self, mask: int) -> tuple[int, ...]:
        """GPU indices in a bitmask, increasing."""
        return tuple(self.wiring.indices[p] for p in self.wiring.positions_of(mask))


def _rank(link: LinkType) -> int:
    return _TYPE_RANK[link]


def _twin_classes(
    n: int,
    bw: list[list[int]],
    rank: list[list[int]],
    numa: list[int | None],
    nic: list[int],
) -> tuple[int, ...]:
    """Partition positions into classes of GPUs that can be swapped without changing any term.

    Two GPUs are twins when they agree on NUMA node and NIC proximity and see every third GPU
    through the same link class and bandwidth; swapping them maps every set to one that scores the
    same. Twins form an equivalence relation, so the search only tries the lowest free members
    of each class.
    """
    cls = list(range(n))
    if n > EXACT_MAX_GPUS:
        return tuple(cls)
    for i in range(n):
        if cls[i] != i:
            continue
        for j in range(i + 1, n):
            if cls[j] != j or numa[i] != numa[j] or nic[i] != nic[j]:
                continue
            if all(
                bw[i][m] == bw[j][m] and rank[i][m] == rank[j][m]
                for m in range(n)
                if m not in (i, j)
            ):
                cls[j] = i
    return tuple(cls)


def prepare_wiring(
    topology: NodeTopology, bandwidth: BandwidthModel = DEFAULT_BANDWIDTH
) -> PreparedWiring:
    """Build the wiring structures (uncached; see :func:`prepare`)."""
    g = topo_graph.build_graph(topology, bandwidth)
    indices = topology.gpu_indices
    n = len(indices)
    pos = {index: p for p, index in enumerate(indices)}
    bw = [[0] * n for _ in range(n)]
    rank = [[0] * n for _ in range(n)]
    codes = [["X"] * n for _ in range(n)]
    numa = [topology.gpu(i).numa_node for i in indices]
    for a in range(n):
        for b in range(a + 1, n):
            data = topo_graph.edge(g, indices[a], indices[b])
            units = int(data["bandwidth_units"])
            bw[a][b] = bw[b][a] = units
            rank[a][b] = rank[b][a] = _rank(data["link_class"])
            codes[a][b] = codes[b][a] = data["code"]

    def compatible(a: int, b: int) -> bool:
        return numa[a] is None or numa[b] is None or numa[a] == numa[b]

    adj_nv = [0] * n
    adj_sw = [0] * n
    adj_numa = [0] * n
    aff = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            bit = 1 << b
            if rank[a][b] <= CLASS_NVLINK:
                adj_nv[a] |= bit
            if rank[a][b] <= CLASS_PCIE_SWITCH:
                adj_sw[a] |= bit
            if rank[a][b] <= CLASS_NUMA and compatible(a, b):
                adj_numa[a] |= bit
            same_numa = numa[a] is not None and numa[a] == numa[b]
            aff[a][b] = bw[a][b] + (NUMA_AFFINITY_UNITS if same_numa else 0)
    all_mask = (1 << n) - 1
    scope_adj = (
        tuple(adj_nv),
        tuple(adj_sw),
        tuple(adj_sw[p] | adj_numa[p] for p in range(n)),
    )

    levels = tuple(sorted({bw[a][b] for a in range(n) for b in range(a + 1, n)}, reverse=True))
    adj_ge: list[tuple[int, ...]] = []
    comps_ge: list[tuple[int, ...]] = []
    for level in levels:
        row = []
        for a in range(n):
            m = 0
            for b in range(n):
                if b != a and bw[a][b] >= level:
                    m |= 1 << b
            row.append(m)
        adj_ge.append(tuple(row))
        # Components come from the graph: a set whose slowest pair reaches `level` lies in one.
        comps = topo_graph.components_at(g, level)
        comps_ge.append(tuple(sum(1 << pos[i] for i in comp) for comp in comps if len(comp) >= 2))

    nic_best: dict[int, int] = {}
    for nl in topology.nic_links:
        points = NIC_POINTS.get(nl.type, 0)
        nic_best[nl.gpu] = max(nic_best.get(nl.gpu, 0), points)
    nic_points = [nic_best.get(i, 0) for i in indices]
    numa_bit = tuple(0 if v is None else 1 << v for v in numa)
    islands = tuple(sum(1 << pos[i] for i in island) for island in topo_graph.nvlink_islands(g))
    return PreparedWiring(
        key=f"{topology.wiring_hash}:{hash(bandwidth):x}",
        n=n,
        indices=indices,
        bw=tuple(tuple(r) for r in bw),
        codes=tuple(tuple(r) for r in codes),
        aff=tuple(tuple(r) for r in aff),
        adj_nvlink=tuple(adj_nv),
        adj_switch=tuple(adj_sw),
        adj_numa=tuple(adj_numa),
        scope_adj=scope_adj,
        levels=levels,
        adj_ge=tuple(adj_ge),
        comps_ge=tuple(comps_ge),
        numa_bit=numa_bit,
        nic_points=tuple(nic_points),
        twin_class=_twin_classes(n, bw, rank, numa, nic_points),
        islands=islands,
        max_bw=levels[0] if levels else 0,
        all_mask=all_mask,
    )


class _WiringCache:
    """Bounded map from wiring hash to prepared wiring, safe to share between threads."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._entries: dict[tuple[str, BandwidthModel], PreparedWiring] = {}
        self._lock = threading.Lock()
        self._max = max_entries

    def get(self, topology: NodeTopology, bandwidth: BandwidthModel) -> PreparedWiring:
        key = (topology.wiring_hash, bandwidth)
        found = self._entries.get(key)
        if found is not None:
            return found
        built = prepare_wiring(topology, bandwidth)
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = built
        return built

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_WIRINGS: Final = _WiringCache()


def prepare(topology: NodeTopology, bandwidth: BandwidthModel = DEFAULT_BANDWIDTH) -> PreparedNode:
    """Make a node placeable: shared wiring structures (built once per wiring) plus its health.

    Call again whenever the node's NodeGpuTopology changes; it is cheap when only health changed.
    """
    wiring = _WIRINGS.get(topology, bandwidth)
    placeable = 0
    degraded = 0
    for p, gpu in enumerate(topology.gpus):
        if gpu.placeable:
            placeable |= 1 << p
            if gpu.health is GpuHealthState.DEGRADED:
                degraded |= 1 << p
    return PreparedNode(
        topology=topology,
        wiring=wiring,
        placeable_mask=placeable,
        degraded_mask=degraded,
        _position={index: p for p, index in enumerate(wiring.indices)},
    )


def clear_caches() -> None:
    """Forget prepared wirings (benchmarks measure cold starts with it)."""
    _WIRINGS.clear()
