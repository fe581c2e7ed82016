"""Which node a GPU set should go to: the one ranking the operator's plan and the extender share.

Within a node the placement engine picks the set (:mod:`gpusched.core.objective`). Across nodes
the question is different: several nodes can host the request, each with its own best set, and
the choice decides both what the job gets now and what the cluster can still offer later. The
rule, in order:

1. a set that meets the requested scope beats one that does not (``preferred`` mode);
2. a tighter topology class beats a looser one: a job never gets a worse class than a node
   available to it now offers;
3. a faster slowest pair beats a slower one: among equally classed sets, the job gets the
   bandwidth the best of them offers;
4. fewer Degraded GPUs;
5. then, and only among choices equal in all of the above (equally wired), **pack**: the node
   left with the fewest free GPUs wins (best fit), so small jobs fill partly used nodes and whole
   nodes stay free for large ones;
6. then the rest of the placement score (aggregate bandwidth, NUMA spread, NIC locality, what
   the set leaves connected on its node).

Ties after that go to the node name, so every caller that sees the same nodes picks the same
one. The operator's admission cycle ranks its candidate nodes with :func:`node_rank`; the
extender's filter and prioritize rank kube-scheduler's candidates with the same function.
"""

from __future__ import annotations

from typing import NamedTuple

from gpusched.core.placement import Placement, scope_rank


class WiringRank(NamedTuple):
    """What a set gives the job (larger is better); choices equal here are equally wired."""

    scope_ok: bool
    tighter_class: int
    """Minus the class rank (0 nvlink .. -3 node)."""
    bottleneck: int
    """Slowest pair's bandwidth (tenths of GB/s; a huge constant for a single GPU)."""
    fewer_degraded: int


class NodeRank(NamedTuple):
    """A node's rank for one request (larger is better); compare whole tuples."""

    wiring: WiringRank
    fuller: int
    """Minus the free GPUs the node keeps after the placement (best fit)."""
    score: float
    """The placement's 0..100 score: the remaining terms of the objective."""


def wiring_rank(placement: Placement) -> WiringRank:
    """The part of the rank that concerns the job itself."""
    objective = placement.objective
    return WiringRank(
        scope_ok=placement.scope_satisfied,
        tighter_class=-scope_rank(placement.topology_class),
        bottleneck=objective.bottleneck,
        fewer_degraded=objective.fewer_degraded,
    )


def node_rank(placement: Placement, *, unaccounted: int = 0) -> NodeRank:
    """Rank of a node whose best set for the request is ``placement``.

    ``unaccounted`` counts GPUs of the node held by pods whose GPUs are not known (bound by
    another scheduler): they are not free either.
    """
    return NodeRank(
        wiring=wiring_rank(placement),
        fuller=-max(0, placement.free_after - unaccounted),
        score=placement.score,
    )


def outranks(rank: NodeRank, name: str, other: NodeRank, other_name: str) -> bool:
    """Whether node ``name`` ranks before ``other_name``: the higher rank, else the lower name."""
    return rank > other or (rank == other and name < other_name)
