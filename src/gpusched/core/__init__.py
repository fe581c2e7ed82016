"""Pure logic shared by the extender, the operator and the simulator: no I/O, no Kubernetes.

Placement API (see docs/placement.md)::

    from gpusched.core import NodeTopology, Policy, parse_topo_matrix, place, prepare

    topology = NodeTopology.from_api(spec, status)   # or parse_topo_matrix(text)
    node = prepare(topology)                          # shared structures, once per wiring
    result = place(node, k, Policy(scope, mode), busy=indices_in_use)
"""

from gpusched.core.bandwidth import (
    DEFAULT_BANDWIDTH,
    BandwidthModel,
    Generation,
    generation_for,
)
from gpusched.core.graph import build_graph, nic_groups, numa_groups, nvlink_islands, switch_trees
from gpusched.core.objective import Objective
from gpusched.core.placement import (
    DEFAULT_POLICY,
    Placement,
    PlacementResult,
    Policy,
    Refusal,
    RefusalReason,
    clear_placement_cache,
    evaluate_set,
    place,
)
from gpusched.core.prepared import EXACT_MAX_GPUS, PreparedNode, prepare
from gpusched.core.topo_matrix import TopologyParseError, format_topo_matrix, parse_topo_matrix
from gpusched.core.topology import Gpu, Link, Nic, NicLink, NodeTopology, TopologyError

__all__ = [
    "DEFAULT_BANDWIDTH",
    "DEFAULT_POLICY",
    "EXACT_MAX_GPUS",
    "BandwidthModel",
    "Generation",
    "Gpu",
    "Link",
    "Nic",
    "NicLink",
    "NodeTopology",
    "Objective",
    "Placement",
    "PlacementResult",
    "Policy",
    "PreparedNode",
    "Refusal",
    "RefusalReason",
    "TopologyError",
    "TopologyParseError",
    "build_graph",
    "clear_placement_cache",
    "evaluate_set",
    "format_topo_matrix",
    "generation_for",
    "nic_groups",
    "numa_groups",
    "nvlink_islands",
    "parse_topo_matrix",
    "place",
    "prepare",
    "switch_trees",
]
