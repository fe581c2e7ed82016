"""Two baselines the benchmark compares the engine against.

* **First fit**: the lowest-numbered free GPUs, what an allocator without topology does.
* **gpuallocator best effort**: the NVIDIA device plugin's ``GetPreferredAllocation`` policy,
  reimplemented from its published description (research notes, section 2.2), not from its code:

  - a pair scores the sum of its links' points: the PCIe path (SYS 10, NODE 20, PHB 30, PXB 40,
    PIX 50) plus, when NVLink is detected between the two GPUs, 100 per link;
  - NVLink is detected by matching each link's remote PCI address to the peer GPU, which on
    NVSwitch boards finds the switch instead, so there every pair scores by PCIe alone;
  - a set scores the sum of its pair scores;
  - the available GPUs are padded with empty slots to a multiple of the request size and every
    partition into sets of that size is enumerated (each set's first member in increasing order,
    padding all in one set); the partition with the highest total wins, and inside it the set
    with the highest score is returned. A request for one GPU returns the first available one.

  The padding rule can pick the padded, incomplete set (the bug reported upstream as
  go-gpuallocator PR #80, where the plugin then fails). :func:`gpuallocator_best_effort` reports
  that case so callers can count it and fall back to first fit, as kubelet would fall back to its
  own choice.

A ``topo -m`` matrix does not show the PCIe level of NVLinked pairs; when a link's ``pcie`` field
is unset we assume ``NODE`` for GPUs on the same known NUMA node and ``SYS`` otherwise, the level
NVML reports for GPUs under different switches of one socket or of two.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Final

from gpusched.api.nodegputopology import LinkType
from gpusched.core.topology import NodeTopology

PCIE_POINTS: Final[dict[LinkType, int]] = {
    LinkType.SYS: 10,
    LinkType.NODE: 20,
    LinkType.PHB: 30,
    LinkType.PXB: 40,
    LinkType.PIX: 50,
}
NVLINK_POINTS_PER_LINK: Final = 100


def first_fit(available: Sequence[int], k: int) -> tuple[int, ...] | None:
    """The ``k`` lowest available GPU indices, or None if there are fewer."""
    ordered = sorted(available)
    return tuple(ordered[:k]) if len(ordered) >= k else None


def _pcie_level(topology: NodeTopology, a: int, b: int) -> LinkType:
    link = topology.link(a, b)
    if link is not None and link.type is not LinkType.NV:
        return link.type
    if link is not None and link.pcie is not None:
        return link.pcie
    numa_a = topology.gpu(a).numa_node
    numa_b = topology.gpu(b).numa_node
    if numa_a is not None and numa_a == numa_b:
        return LinkType.NODE
    return LinkType.SYS


def pair_score(topology: NodeTopology, a: int, b: int) -> int:
    """Points of a GPU pair under the best-effort policy."""
    score = PCIE_POINTS[_pcie_level(topology, a, b)]
    link = topology.link(a, b)
    if link is not None and link.type is LinkType.NV and not topology.nvswitch:
        score += NVLINK_POINTS_PER_LINK * link.nvlinks
    return score


@dataclass(frozen=True, slots=True)
class BestEffortResult:
    """What the best-effort policy chose."""

    gpus: tuple[int, ...]
    """The GPUs returned (fewer than requested when ``padding_bug``)."""
    padding_bug: bool
    """The winning set contained padding: the real plugin would fail this request."""


def _partitions(items: tuple[int | None, ...], size: int) -> Iterator[list[tuple[int | None, ...]]]:
    """Partitions of ``items`` into sets of ``size``; padding (None) all in one set."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for companions in combinations(range(len(rest)), size - 1):
        group = (first, *(rest[i] for i in companions))
        pads = sum(1 for g in group if g is None)
        total_pads = pads + sum(1 for i, r in enumerate(rest) if r is None and i not in companions)
        if pads not in (0, total_pads):
            continue
        remaining = tuple(r for i, r in enumerate(rest) if i not in companions)
        for tail in _partitions(remaining, size):
            yield [group, *tail]


def gpuallocator_best_effort(
    topology: NodeTopology, available: Sequence[int], k: int
) -> BestEffortResult | None:
    """The set the best-effort policy picks from ``available`` (None if fewer than ``k``)."""
    ordered = tuple(sorted(available))
    if len(ordered) < k or k < 1:
        return None
    if k == 1:
        return BestEffortResult((ordered[0],), padding_bug=False)
    scores: dict[tuple[int, int], int] = {}
    for a, b in combinations(ordered, 2):
        scores[(a, b)] = pair_score(topology, a, b)

    def set_score(group: tuple[int | None, ...]) -> int:
        real = sorted(g for g in group if g is not None)
        return sum(scores[(a, b)] for a, b in combinations(real, 2))

    pad = (-len(ordered)) % k
    items: tuple[int | None, ...] = (*ordered, *([None] * pad))
    best_total = -1
    best_partition: list[tuple[int | None, ...]] = []
    for partition in _partitions(items, k):
        total = sum(set_score(group) for group in partition)
        if total > best_total:
            best_total = total
            best_partition = partition
    best_group = max(best_partition, key=set_score)
    members = tuple(sorted(g for g in best_group if g is not None))
    return BestEffortResult(members, padding_bug=len(members) < k)
