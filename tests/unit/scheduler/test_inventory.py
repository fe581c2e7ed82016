"""The extender's per-node inventory (GPUs by state, largest free NVLink set), checked against
an independent reading of the real ``topo -m`` matrices with networkx."""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest
from test_cache import pod, topology_object

from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.scheduler.cache import ClusterCache

FIXTURES = (
    "hgx-h100-sxm-8gpu-8nic",
    "pcie-8gpu-nvlink-bridge-pairs-2socket",
    "workstation-2socket-4x-a100-nvlink-bridge-2nic",
    "pcie-8x-rtx4090-2socket-allsys-2nic",
)


def nvlink_graph(fixture: str) -> nx.Graph:
    """GPUs joined where the matrix says NV<n>, read straight from the text."""
    rows = [
        line.split()
        for line in fixture_path(fixture).read_text().splitlines()
        if line.startswith("GPU")
    ]
    graph = nx.Graph()
    for i, row in enumerate(rows):
        graph.add_node(i)
        for j, cell in enumerate(row[1 : len(rows) + 1]):
            if cell.startswith("NV"):
                graph.add_edge(i, j)
    return graph


def unhealthy(obj: dict[str, Any], index: int) -> dict[str, Any]:
    for entry in obj["status"]["gpus"]:
        if entry["index"] == index:
            entry["state"] = "Unhealthy"
    return obj


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize(
    ("held", "broken"), [((), None), ((0,), None), ((0, 2), 5), ((1, 4, 6), 3), ((0, 1, 2, 3), 7)]
)
def test_inventory_counts_and_largest_free_nvlink_set_match_the_matrix(
    fixture: str, held: tuple[int, ...], broken: int | None
) -> None:
    graph = nvlink_graph(fixture)
    size = graph.number_of_nodes()
    held = tuple(i for i in held if i < size)
    broken = broken if broken is not None and broken < size and broken not in held else None
    topology = topology_object("n", fixture)
    if broken is not None:
        topology = unhealthy(topology, broken)
    cache = ClusterCache()
    cache.replace_topologies([topology])
    indices = ",".join(map(str, held))
    cache.replace_pods([pod("p", "n", len(held), indices)] if held else [])

    (row,) = cache.inventory()
    free = set(graph) - set(held) - ({broken} if broken is not None else set())
    expected_largest = max(
        (len(c) for c in nx.connected_components(graph.subgraph(free))), default=0
    )
    assert (row.allocated, row.free, row.unavailable) == (
        len(held),
        len(free),
        size - len(held) - len(free),
    )
    assert row.largest_free_nvlink_set == expected_largest


def test_gpus_held_by_pods_without_an_assignment_count_as_allocated() -> None:
    cache = ClusterCache()
    cache.replace_topologies([topology_object("n")])
    cache.replace_pods([pod("foreign", "n", 3)])  # bound by another scheduler: which is unknown
    (row,) = cache.inventory()
    assert (row.allocated, row.free, row.unavailable) == (3, 5, 0)
    assert row.largest_free_nvlink_set == 5
