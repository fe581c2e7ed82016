"""Nodes without a NodeGpuTopology object: the GPU count is all that is known."""

from __future__ import annotations

from gpusched.core.topology import Gpu, NodeTopology

COUNT_ONLY_SOURCE = "count-only"


def count_only_topology(name: str, gpus: int, model: str | None = None) -> NodeTopology:
    """A topology of ``gpus`` GPUs with no known links.

    The placement engine treats unreported pairs as the slowest class (SYS), so such a node meets
    only scope ``node``: jobs with a tighter *required* scope never land there, *preferred* ones
    may, and their placement reports class ``node``. Identical counts and models share one wiring
    hash, so thousands of such nodes cost one prepared wiring.
    """
    return NodeTopology(
        node_name=name,
        gpus=tuple(Gpu(index=i, model=model) for i in range(gpus)),
        source=COUNT_ONLY_SOURCE,
    )
