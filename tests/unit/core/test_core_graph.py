"""The networkx graph of a node: edges carry class and bandwidth; islands and groups."""

from __future__ import annotations

import pytest
from core_testdata import A100, BRIDGED, DGX1, H100, RTX4090, TREES, WORKSTATION, topology

from gpusched.api.nodegputopology import LinkType
from gpusched.core import Gpu, Link, NodeTopology, build_graph
from gpusched.core.graph import (
    NVSWITCH_NODE,
    components_at,
    edge,
    nic_groups,
    numa_groups,
    nvlink_islands,
    switch_trees,
)


@pytest.mark.parametrize(
    ("name", "islands"),
    [
        (H100, [{0, 1, 2, 3, 4, 5, 6, 7}]),
        (A100, [{0, 1, 2, 3, 4, 5, 6, 7}]),
        (BRIDGED, [{0, 2}, {1, 3}, {4, 5}, {6, 7}]),
        (WORKSTATION, [{0, 1}, {2}, {3}]),
        (DGX1, [{0, 1, 2, 3, 4, 5, 6, 7}]),
        (RTX4090, [{i} for i in range(8)]),
    ],
)
def test_nvlink_islands(name: str, islands: list[set[int]]) -> None:
    assert [set(i) for i in nvlink_islands(build_graph(topology(name)))] == islands


def test_switch_trees_follow_pix_and_pxb() -> None:
    assert [set(t) for t in switch_trees(build_graph(topology(TREES)))] == [
        {0, 1, 2, 3},
        {4, 5, 6, 7},
    ]


def test_gpu_edges_carry_class_count_and_generation_bandwidth() -> None:
    graph = build_graph(topology(H100))
    data = edge(graph, 0, 5)
    assert data["link_class"] is LinkType.NV
    assert data["nvlinks"] == 18
    assert data["bandwidth_gbps"] == pytest.approx(370.8)
    assert graph.has_edge(("gpu", 0), NVSWITCH_NODE)
    assert edge(build_graph(topology(A100)), 0, 1)["bandwidth_gbps"] == pytest.approx(240.0)


def test_numa_and_nic_groups() -> None:
    graph = build_graph(topology(H100))
    assert numa_groups(graph) == {0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})}
    rails = nic_groups(graph)
    assert rails[0] == frozenset({0})
    assert rails[3] == frozenset({2})
    assert rails[6] == frozenset({6})
    assert nic_groups(build_graph(topology(A100)))[0] == frozenset({0, 1})


def test_unreported_pairs_become_assumed_sys_edges() -> None:
    topo = NodeTopology("n", (Gpu(0), Gpu(1), Gpu(2)), (Link(0, 1, LinkType.NV, nvlinks=4),))
    graph = build_graph(topo)
    assert edge(graph, 0, 2)["link_class"] is LinkType.SYS
    assert edge(graph, 0, 2)["assumed"] is True
    assert edge(graph, 0, 1)["assumed"] is False


def test_components_at_a_bandwidth_level() -> None:
    graph = build_graph(topology(TREES))
    pxb_units = edge(graph, 0, 2)["bandwidth_units"]
    assert [set(c) for c in components_at(graph, pxb_units)] == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    pix_units = edge(graph, 0, 1)["bandwidth_units"]
    assert [set(c) for c in components_at(graph, pix_units) if len(c) > 1] == [{0, 1}, {4, 5}]
