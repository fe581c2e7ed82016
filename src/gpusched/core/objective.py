"""The one objective every search and every check compares: defined once, here.

A GPU set is judged by what limits the job that will run on it, in this order:

1. ``scope_ok``: the set meets the requested topology scope (matters for ``preferred`` mode; with
   ``required`` only such sets are considered at all);
2. ``bottleneck``: the slowest pair's bandwidth, the hop a ring collective waits on;
3. ``fewer_degraded``: minus the number of Degraded GPUs (a throttled GPU slows every step);
4. ``aggregate``: the sum of all pair bandwidths (tree and all-to-all traffic use every pair);
5. ``fewer_numa``: minus the number of NUMA nodes spanned (host memory traffic and CPU threads);
6. ``nic_locality``: for multi-node jobs, how close each GPU sits to an RDMA NIC;
7. ``less_fragmentation``: minus the connectivity the choice takes from the GPUs left free.

Comparison is lexicographic (a plain tuple comparison); ties go to the lowest GPU indices. The
exact search, the heuristic and the brute force used to prove the exact search all call
:func:`evaluate`, so they cannot disagree about what "best" means.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

from gpusched.core.prepared import (
    CLASS_NODE,
    CLASS_NUMA,
    CLASS_NVLINK,
    CLASS_PCIE_SWITCH,
    MAX_NIC_POINTS,
    PreparedWiring,
)

#: Bottleneck of a one-GPU set: it never waits on another GPU, so nothing is faster.
SOLO_BOTTLENECK: Final = 1 << 40

# The float score maps bandwidth on a log scale between these bounds (GB/s): from slower than any
# SYS hop to faster than any NVLink generation, so scores compare across nodes and models.
_SCORE_FLOOR_GBPS: Final = 5.0
_SCORE_CEIL_GBPS: Final = 1000.0
_LOG_SPAN: Final = math.log(_SCORE_CEIL_GBPS / _SCORE_FLOOR_GBPS)

# Weights of the float score's terms (sum 100). The bottleneck dominates as in the tuple.
_W_BOTTLENECK: Final = 65.0
_W_AGGREGATE: Final = 8.0
_W_NUMA: Final = 6.0
_W_NIC: Final = 4.0
_W_PACKING: Final = 12.0
_W_FRAGMENTATION: Final = 5.0
#: Share of the score a set loses when all of its GPUs are Degraded.
_DEGRADED_PENALTY: Final = 0.5


class Objective(NamedTuple):
    """A set's score terms, each oriented so that larger is better."""

    scope_ok: bool
    bottleneck: int
    fewer_degraded: int
    aggregate: int
    fewer_numa: int
    nic_locality: int
    less_fragmentation: int


class SearchContext(NamedTuple):
    """One request against one node state: what the objective needs besides the set itself.

    (A named tuple rather than a dataclass: one is built per uncached request, and tuples are
    the cheapest immutable record Python has.)"""

    wiring: PreparedWiring
    free: int
    """Placeable GPUs not in use (a mask)."""
    degraded: int
    """Degraded GPUs among ``free``."""
    scope_rank: int
    """Requested scope as a class rank (0 nvlink .. 3 node)."""
    multi_node: bool
    free_affinity: tuple[int, ...]
    """Per position, the summed affinity to every other free GPU."""
    capacity: int
    """Summed affinity of all free pairs: the node's remaining ability to host connected sets."""


def make_context(
    wiring: PreparedWiring, free: int, degraded: int, scope_rank: int, multi_node: bool
) -> SearchContext:
    """Precompute the per-request parts of the objective (O(n^2), once per request)."""
    free_positions = wiring.positions_of(free)
    row_sums = [0] * wiring.n
    aff = wiring.aff
    for i in free_positions:
        # aff[i][i] is 0, so the row sum over all free positions is the sum over the others.
        row_sums[i] = sum(map(aff[i].__getitem__, free_positions))
    capacity = sum(row_sums) // 2
    return SearchContext(
        wiring=wiring,
        free=free,
        degraded=degraded & free,
        scope_rank=scope_rank,
        multi_node=multi_node,
        free_affinity=tuple(row_sums),
        capacity=capacity,
    )


def _is_clique(adj: tuple[int, ...], positions: tuple[int, ...], mask: int) -> bool:
    return all(((adj[p] | (1 << p)) & mask) == mask for p in positions)


def set_class(wiring: PreparedWiring, positions: tuple[int, ...]) -> int:
    """Achieved topology class of a set, as a rank: 0 nvlink, 1 pcie-switch, 2 numa, 3 node.

    ``nvlink`` when every pair is NV; ``pcie-switch`` when every pair is NV, PIX or PXB; ``numa``
    when no pair is SYS and the GPUs whose NUMA node is known share one; otherwise ``node``.
    """
    mask = 0
    for p in positions:
        mask |= 1 << p
    if _is_clique(wiring.adj_nvlink, positions, mask):
        return CLASS_NVLINK
    if _is_clique(wiring.adj_switch, positions, mask):
        return CLASS_PCIE_SWITCH
    if _is_clique(wiring.adj_numa, positions, mask):
        return CLASS_NUMA
    return CLASS_NODE


class Sums(NamedTuple):
    """Additive statistics of a set, from which :func:`compose` builds its objective.

    The exact search accumulates them one GPU at a time while it grows a set; :func:`evaluate`
    computes them from scratch. Both end in :func:`compose`, so the terms are defined once.
    """

    mask: int
    bottleneck: int
    aggregate: int
    internal_affinity: int
    numa_bits: int
    nic_points: int
    free_affinity: int


def compose(ctx: SearchContext, sums: Sums, scope_ok: bool) -> Objective:
    """The objective of a set from its sums."""
    # Taking the set removes its internal pairs and every pair between it and the rest of the
    # free GPUs from the node's capacity: the members' free affinity, internal pairs once.
    fragmentation = sums.free_affinity - sums.internal_affinity
    return Objective(
        scope_ok=scope_ok,
        bottleneck=sums.bottleneck,
        fewer_degraded=-(sums.mask & ctx.degraded).bit_count(),
        aggregate=sums.aggregate,
        fewer_numa=-sums.numa_bits.bit_count(),
        nic_locality=sums.nic_points if ctx.multi_node else 0,
        less_fragmentation=-fragmentation,
    )


def in_scope(ctx: SearchContext, positions: tuple[int, ...]) -> bool:
    """Whether a set meets the context's scope."""
    return ctx.scope_rank >= CLASS_NODE or set_class(ctx.wiring, positions) <= ctx.scope_rank


def sums_of(ctx: SearchContext, positions: tuple[int, ...]) -> Sums:
    """The sums of a set computed from scratch."""
    w = ctx.wiring
    bw = w.bw
    aff = w.aff
    mask = numa = nic = spent = 0
    for p in positions:
        mask |= 1 << p
        numa |= w.numa_bit[p]
        nic += w.nic_points[p]
        spent += ctx.free_affinity[p]
    bottleneck = SOLO_BOTTLENECK
    aggregate = internal = 0
    k = len(positions)
    for a in range(k - 1):
        i = positions[a]
        row = bw[i]
        arow = aff[i]
        for b in range(a + 1, k):
            j = positions[b]
            v = row[j]
            aggregate += v
            bottleneck = min(bottleneck, v)
            internal += arow[j]
    return Sums(mask, bottleneck, aggregate, internal, numa, nic, spent)


def evaluate(ctx: SearchContext, positions: tuple[int, ...]) -> Objective:
    """Score a set of positions (increasing, all free) under the context's request."""
    return compose(ctx, sums_of(ctx, positions), in_scope(ctx, positions))


def _log_scale(units: float) -> float:
    gbps = units / 10.0
    if gbps <= _SCORE_FLOOR_GBPS:
        return 0.0
    return min(1.0, math.log(gbps / _SCORE_FLOOR_GBPS) / _LOG_SPAN)


def fragmentation_share(ctx: SearchContext, objective: Objective) -> float:
    """Share (0..1) of the node's free connectivity the set consumes."""
    if ctx.capacity <= 0:
        return 0.0
    return min(1.0, -objective.less_fragmentation / ctx.capacity)


def float_score(ctx: SearchContext, objective: Objective, k: int) -> float:
    """A single number in 0..100 for ranking nodes, e.g. in the extender's prioritize.

    Within one node it follows the tuple's priorities through its weights: the bottleneck on a
    log scale carries 65 points, so a faster slowest hop wins unless bandwidths are within a few
    percent; aggregate bandwidth, NUMA spread, NIC locality (multi-node jobs) and the share of
    free connectivity the set takes split most of the rest. Across nodes two more things hold:
    bandwidths are absolute (an NVLink set on one node outscores a PCIe set on another), and a
    packing term (12 points) rewards the node left with the fewest free GPUs afterwards, so
    equally good placements fill partly used nodes first and keep whole nodes for large jobs
    (best fit). Degraded GPUs scale the score down.
    """
    if k <= 1:
        bottleneck = 1.0
        aggregate = 1.0
    else:
        pairs = k * (k - 1) // 2
        bottleneck = _log_scale(objective.bottleneck)
        aggregate = _log_scale(objective.aggregate / pairs)
    numa_span = max(1, -objective.fewer_numa)
    nic = objective.nic_locality / (MAX_NIC_POINTS * k) if ctx.multi_node else 1.0
    n = max(1, ctx.wiring.n)
    packing = 1.0 - (ctx.free.bit_count() - k) / n
    keep = 1.0 - fragmentation_share(ctx, objective)
    raw = (
        _W_BOTTLENECK * bottleneck
        + _W_AGGREGATE * aggregate
        + _W_NUMA / numa_span
        + _W_NIC * nic
        + _W_PACKING * packing
        + _W_FRAGMENTATION * keep
    )
    degraded_share = -objective.fewer_degraded / k
    return round(raw * (1.0 - _DEGRADED_PENALTY * degraded_share), 4)
