"""Simulated clusters with network levels: the link a job spanning nodes crosses, the best one
the free GPUs offer, the Lingjun Clos and NVL72 racks as pools, and gpusched keeping gangs in
the narrowest domain."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.simulator.cluster import (
    AGGREGATION_LABEL,
    LEAF_LABEL,
    ClusterError,
    from_mix,
    with_network,
)
from gpusched.simulator.engine import best_link, replay
from gpusched.simulator.model import Link
from gpusched.simulator.policies import build
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"


def _clos(tmp_path: Path, hosts: list[tuple[str, str]]) -> Path:
    """A topology CSV of (leaf, aggregation) per host, one core switch."""
    path = tmp_path / "topo.csv"
    lines = ["ip,DSW,PSW,ASW", *(f"h{i},G1,{agg},{leaf}" for i, (leaf, agg) in enumerate(hosts))]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_job_spanning_nodes_crosses_the_narrowest_level_they_share(tmp_path: Path) -> None:
    base = cluster((H100, "a"), (H100, "b"), (H100, "c"), (H100, "d"))
    clos = with_network(
        base, _clos(tmp_path, [("S1", "P1"), ("S1", "P1"), ("S2", "P1"), ("S3", "P2")])
    )
    a, b, c, d = clos.nodes
    assert clos.link_across([a, b]) is Link.NETWORK
    assert clos.link_across([a, c]) is Link.CROSS_LEAF
    assert clos.link_across([a, d]) is Link.CROSS_AGGREGATION
    assert clos.link_across([a, b, c]) is Link.CROSS_LEAF
    assert a.labels[LEAF_LABEL] == "S1"
    assert d.labels[AGGREGATION_LABEL] == "P2"


def test_the_best_link_on_offer_is_the_narrowest_domain_with_room(tmp_path: Path) -> None:
    base = cluster((H100, "a"), (H100, "b"), (H100, "c"), (H100, "d"))
    hosts = [("S1", "P1"), ("S1", "P1"), ("S2", "P1"), ("S3", "P2")]
    clos = with_network(base, _clos(tmp_path, hosts))
    job = trace_job("g", 0, 8, 10, replicas=2)
    idle = {n.name: n.topology.placeable_mask for n in clos.nodes}
    assert best_link(clos.nodes, idle, job, clos) is Link.NETWORK
    assert best_link(clos.nodes, {**idle, "b": 0}, job, clos) is Link.CROSS_LEAF
    assert best_link(clos.nodes, {**idle, "b": 0, "c": 0}, job, clos) is Link.CROSS_AGGREGATION
    assert best_link(clos.nodes, idle, replace(job, replicas=1), clos) is Link.NVLINK


def test_a_network_file_with_fewer_hosts_than_nodes_is_refused(tmp_path: Path) -> None:
    base = cluster((H100, "a"), (H100, "b"))
    with pytest.raises(ClusterError, match="fewer than the 2 nodes"):
        with_network(base, _clos(tmp_path, [("S1", "P1")]))
    bad = tmp_path / "bad.csv"
    bad.write_text("host,leaf\nh1,S1\n")
    with pytest.raises(ClusterError, match="columns ip, DSW, PSW, ASW"):
        with_network(base, bad)


def test_nvl72_racks_are_cliques_whose_gangs_talk_over_nvlink() -> None:
    racks = from_mix("gb200-nvl72-rack=2")
    assert len(racks.nodes) == 36
    assert racks.gpus == 144
    first = racks.nodes[:18]
    assert racks.link_across(first) is Link.NVLINK
    assert racks.link_across([racks.nodes[0], racks.nodes[18]]) is Link.NETWORK


def test_gpusched_keeps_a_gang_in_one_leaf_where_best_fit_spreads_it(tmp_path: Path) -> None:
    """Leaves S1 (a, b) and S2 (c, d) under one aggregation block; a one-node job holds a. A
    2 x 8 gang under gpusched runs in leaf S2 (the network), under best fit on b and c (the
    fullest nodes first, across leaves)."""
    base = cluster((H100, "a"), (H100, "b"), (H100, "c"), (H100, "d"))
    clos = with_network(
        base, _clos(tmp_path, [("S1", "P1"), ("S1", "P1"), ("S2", "P1"), ("S2", "P1")])
    )
    jobs = workload(
        trace_job("small", 0, 8, 1000),
        trace_job("gang", 1, 8, 100, replicas=2),
    )
    links = {}
    for name in ("gpusched", "best-fit"):
        levels = tuple(level.level for level in clos.levels)
        policy = build(name, clos.nodes, jobs.tenants, 0, levels)
        result = replay(jobs, clos, policy, speed=speed)
        gang = next(r for r in result.jobs if r.id == "gang")
        links[name] = gang.attempts[0].link
    assert links == {"gpusched": Link.NETWORK, "best-fit": Link.CROSS_LEAF}
