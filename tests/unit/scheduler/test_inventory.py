"""The extender's per-node inventory (GPUs by state, largest free NVLink set), checked against
an independent reading of the ``topo -m`` matrices with networkx."""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest
from test_cache import pod, topology_object

from gpusched.core import parse_topo_matrix
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.scheduler.cache import ClusterCache

DGX1 = "synthetic-dgx1-hybrid-cube-mesh"
H100 = "hgx-h100-sxm-8gpu-8nic"
A100_WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
FIXTURES = (
    "hgx-h100-sxm-8gpu-8nic",
    DGX1,
    "pcie-8gpu-nvlink-bridge-pairs-2socket",
    "workstation-2socket-4x-a100-nvlink-bridge-2nic",
    "pcie-8x-rtx4090-2socket-allsys-2nic",
)


def matrix_text(fixture: str) -> str:
    if fixture == DGX1:
        return DGX1_LIKE_MATRIX
    return fixture_path(fixture).read_text()


def nvlink_graph(fixture: str) -> nx.Graph:
    """GPUs joined where the matrix says NV<n>, read straight from the text."""
    rows = [line.split() for line in matrix_text(fixture).splitlines() if line.startswith("GPU")]
    graph = nx.Graph()
    for i, row in enumerate(rows):
        graph.add_node(i)
        for j, cell in enumerate(row[1 : len(rows) + 1]):
            if cell.startswith("NV"):
                graph.add_edge(i, j)
    return graph


def node_object(fixture: str) -> dict[str, Any]:
    if fixture != DGX1:
        return topology_object("n", fixture)
    spec, status = parse_topo_matrix(DGX1_LIKE_MATRIX, node_name="n").to_api()
    return {"metadata": {"name": "n"}, "spec": spec.to_k8s(), "status": status.to_k8s()}


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
    topology = node_object(fixture)
    if broken is not None:
        topology = unhealthy(topology, broken)
    cache = ClusterCache()
    cache.replace_topologies([topology])
    indices = ",".join(map(str, held))
    cache.replace_pods([pod("p", "n", len(held), indices)] if held else [])

    (row,) = cache.inventory()
    free = set(graph) - set(held) - ({broken} if broken is not None else set())
    expected_largest = max((len(c) for c in nx.find_cliques(graph.subgraph(free))), default=0)
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


def test_node_gauges_expose_the_last_published_inventory_and_drop_nodes_gone() -> None:
    from prometheus_client import generate_latest

    from gpusched.metrics import SchedulerMetrics, new_registry

    cache = ClusterCache()
    cache.replace_topologies([topology_object("a"), topology_object("b")])
    cache.replace_pods([pod("p", "a", 2, "0,1")])
    metrics = SchedulerMetrics(new_registry())
    metrics.node_inventory.publish(cache.inventory())
    value = metrics.registry.get_sample_value
    model = cache.inventory()[0].model
    for node, allocated, free in (("a", 2, 6), ("b", 0, 8)):
        labels = {"node": node, "gpu_model": model}
        assert value("gpusched_node_gpus", {**labels, "state": "allocated"}) == allocated
        assert value("gpusched_node_gpus", {**labels, "state": "free"}) == free
        assert value("gpusched_node_gpus", {**labels, "state": "unavailable"}) == 0
    assert value("gpusched_node_largest_free_nvlink_set_gpus", {"node": "a"}) == 6

    cache.delete_topology("b")
    metrics.node_inventory.publish(cache.inventory())
    text = generate_latest(metrics.registry).decode()
    assert 'node="b"' not in text
    assert value("gpusched_node_gpus", {"node": "a", "gpu_model": model, "state": "free"}) == 6


def test_free_gpus_of_a_model_whose_last_node_is_gone_are_no_longer_exported() -> None:
    from gpusched.metrics import SchedulerMetrics, new_registry
    from gpusched.scheduler.server import export_inventory

    cache = ClusterCache()
    cache.replace_topologies(
        [topology_object("h100", H100), topology_object("a100", A100_WORKSTATION)]
    )
    cache.replace_pods([pod("p", "h100", 2, "0,1")])
    metrics = SchedulerMetrics(new_registry())
    export_inventory(cache, metrics)
    models = {row.node: row.model for row in cache.inventory()}
    assert models["h100"] != models["a100"]
    value = metrics.registry.get_sample_value
    assert value("gpusched_free_gpus", {"gpu_model": models["h100"]}) == 6
    assert value("gpusched_free_gpus", {"gpu_model": models["a100"]}) == 4

    cache.delete_topology("a100")
    export_inventory(cache, metrics)
    assert value("gpusched_free_gpus", {"gpu_model": models["a100"]}) is None
    assert value("gpusched_free_gpus", {"gpu_model": models["h100"]}) == 6
