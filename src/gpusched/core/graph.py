"""The node's wiring as a networkx graph, and the groups placement reasons about.

The graph is the readable, general form of a topology: GPUs, NICs, NUMA nodes and (on switch
boards) the NVSwitch fabric as vertices; links as edges carrying their class and effective
bandwidth. Islands, switch trees and NUMA groups are graph questions, so they are answered here
with networkx. The search itself never walks this graph: :mod:`gpusched.core.prepared` turns what
it needs into integer matrices and bitmasks once per distinct wiring.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import networkx as nx

from gpusched.api.nodegputopology import LinkType
from gpusched.core.bandwidth import (
    DEFAULT_BANDWIDTH,
    BandwidthModel,
    Generation,
    generation_for,
    to_units,
)
from gpusched.core.topology import NodeTopology

GpuNode = tuple[str, int]

#: Link classes whose pairs share a PCIe switch tree (or better).
SWITCH_LOCAL: Final = frozenset({LinkType.NV, LinkType.PIX, LinkType.PXB})
#: Link classes that stay inside one NUMA node (or better).
NUMA_LOCAL: Final = frozenset(
    {LinkType.NV, LinkType.PIX, LinkType.PXB, LinkType.PHB, LinkType.NODE}
)


def gpu_node(index: int) -> GpuNode:
    """Graph vertex of a GPU."""
    return ("gpu", index)


def nic_node(index: int) -> GpuNode:
    """Graph vertex of a NIC."""
    return ("nic", index)


def numa_node(index: int) -> GpuNode:
    """Graph vertex of a NUMA node."""
    return ("numa", index)


NVSWITCH_NODE: Final[GpuNode] = ("nvswitch", 0)


def generations(topology: NodeTopology) -> dict[int, Generation]:
    """Generation of every GPU, by index."""
    return {g.index: generation_for(g.model, g.compute_capability) for g in topology.gpus}


def build_graph(topology: NodeTopology, bandwidth: BandwidthModel = DEFAULT_BANDWIDTH) -> nx.Graph:
    """The node as a graph.

    GPU-GPU edges (``kind="gpu"``) exist for every pair; a pair the topology does not report is
    added as ``SYS`` with ``assumed=True``, the conservative reading. GPU-NIC edges carry the PCIe
    distance; GPUs and NICs attach to their NUMA node; on NVSwitch boards every GPU also attaches
    to one ``nvswitch`` vertex with its switch link count.
    """
    gens = generations(topology)
    graph = nx.Graph(node_name=topology.node_name, wiring_hash=topology.wiring_hash)
    for gpu in topology.gpus:
        gen = gens[gpu.index]
        graph.add_node(
            gpu_node(gpu.index),
            kind="gpu",
            index=gpu.index,
            model=gpu.model,
            generation=gen.name,
            numa=gpu.numa_node,
            health=gpu.health.value,
            placeable=gpu.placeable,
        )
        if gpu.numa_node is not None:
            graph.add_node(numa_node(gpu.numa_node), kind="numa", index=gpu.numa_node)
            graph.add_edge(gpu_node(gpu.index), numa_node(gpu.numa_node), kind="attach")
    indices = topology.gpu_indices
    for i, a in enumerate(indices):
        for b in indices[i + 1 :]:
            link = topology.link(a, b)
            link_type = LinkType.SYS if link is None else link.type
            nvlinks = 0 if link is None else link.nvlinks
            gbps = bandwidth.pair_gbps(link_type, nvlinks, gens[a], gens[b])
            graph.add_edge(
                gpu_node(a),
                gpu_node(b),
                kind="gpu",
                link_class=link_type,
                nvlinks=nvlinks,
                code=f"NV{nvlinks}" if link_type is LinkType.NV else link_type.value,
                bandwidth_gbps=gbps,
                bandwidth_units=to_units(gbps),
                assumed=link is None,
            )
    if topology.nvswitch:
        graph.add_node(NVSWITCH_NODE, kind="nvswitch")
        for gpu in topology.gpus:
            graph.add_edge(
                gpu_node(gpu.index), NVSWITCH_NODE, kind="nvswitch", nvlinks=gpu.nvswitch_links
            )
    for nic in topology.nics:
        graph.add_node(nic_node(nic.index), kind="nic", index=nic.index, name=nic.name)
        if nic.numa_node is not None:
            graph.add_node(numa_node(nic.numa_node), kind="numa", index=nic.numa_node)
            graph.add_edge(nic_node(nic.index), numa_node(nic.numa_node), kind="attach")
    for nl in topology.nic_links:
        gen = gens[nl.gpu]
        graph.add_edge(
            gpu_node(nl.gpu),
            nic_node(nl.nic),
            kind="nic",
            link_class=nl.type,
            bandwidth_gbps=bandwidth.pcie_gbps(nl.type, gen, gen),
        )
    return graph


def gpu_subgraph(graph: nx.Graph, classes: Iterable[LinkType]) -> nx.Graph:
    """GPUs joined only by GPU-GPU edges of the given link classes."""
    wanted = frozenset(classes)
    sub = nx.Graph()
    sub.add_nodes_from(n for n, d in graph.nodes(data=True) if d["kind"] == "gpu")
    sub.add_edges_from(
        (u, v, d)
        for u, v, d in graph.edges(data=True)
        if d["kind"] == "gpu" and d["link_class"] in wanted
    )
    return sub


def _components(sub: nx.Graph) -> list[frozenset[int]]:
    comps = [frozenset(v[1] for v in comp) for comp in nx.connected_components(sub)]
    return sorted(comps, key=lambda c: (-len(c), min(c)))


def nvlink_islands(graph: nx.Graph) -> list[frozenset[int]]:
    """GPUs reachable from each other over NVLink, largest first (single GPUs included).

    An island is where an ``nvlink``-scoped set can live. On NVSwitch boards it is the whole
    board; on bridged boards it is each bridged pair.
    """
    return _components(gpu_subgraph(graph, {LinkType.NV}))


def switch_trees(graph: nx.Graph) -> list[frozenset[int]]:
    """GPUs reachable from each other without leaving a PCIe switch tree (NV, PIX, PXB)."""
    return _components(gpu_subgraph(graph, SWITCH_LOCAL))


def components_at(graph: nx.Graph, min_units: int) -> list[frozenset[int]]:
    """GPUs connected through pairs of at least ``min_units`` (tenths of GB/s): candidate regions
    for sets whose slowest pair is that fast (a set whose pairs all reach it lies inside one)."""
    sub = nx.Graph()
    sub.add_nodes_from(n for n, d in graph.nodes(data=True) if d["kind"] == "gpu")
    sub.add_edges_from(
        (u, v)
        for u, v, d in graph.edges(data=True)
        if d["kind"] == "gpu" and d["bandwidth_units"] >= min_units
    )
    return _components(sub)


def numa_groups(graph: nx.Graph) -> dict[int, frozenset[int]]:
    """GPU indices per NUMA node (GPUs with unknown NUMA node are left out)."""
    groups: dict[int, set[int]] = {}
    for node, data in graph.nodes(data=True):
        if data["kind"] == "gpu" and data["numa"] is not None:
            groups.setdefault(data["numa"], set()).add(node[1])
    return {k: frozenset(v) for k, v in sorted(groups.items())}


def nic_groups(graph: nx.Graph) -> dict[int, frozenset[int]]:
    """For each NIC, the GPUs that reach it inside a PCIe switch tree (PIX/PXB): its rail."""
    groups: dict[int, frozenset[int]] = {}
    for node, data in graph.nodes(data=True):
        if data["kind"] != "nic":
            continue
        near = {
            other[1]
            for other in graph.neighbors(node)
            if graph.nodes[other]["kind"] == "gpu"
            and graph.edges[node, other]["link_class"] in (LinkType.PIX, LinkType.PXB)
        }
        groups[node[1]] = frozenset(near)
    return dict(sorted(groups.items()))


def edge(graph: nx.Graph, a: int, b: int) -> dict[str, Any]:
    """Attributes of the GPU-GPU edge between two GPU indices."""
    data: dict[str, Any] = graph.edges[gpu_node(a), gpu_node(b)]
    return data
