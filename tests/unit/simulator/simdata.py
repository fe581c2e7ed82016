"""Small clusters and traces for the simulator's tests, built from the committed matrices."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpusched.core import parse_topo_matrix, prepare
from gpusched.core.admission import Tenant
from gpusched.simulator.model import Cluster, Link, SimNode, TraceJob, Workload

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "topologies"

#: A speed model with round numbers, so expected times can be worked out by hand.
SLOWDOWN = {
    Link.NVLINK: 1.0,
    Link.PCIE_SWITCH: 1.25,
    Link.NUMA: 1.25,
    Link.SOCKET: 1.5,
    Link.NETWORK: 2.0,
    Link.CROSS_LEAF: 3.0,
    Link.CROSS_AGGREGATION: 4.0,
}


def speed(link: Link, gpus: int) -> float:
    return 1.0 if gpus == 1 else SLOWDOWN[link]


def sim_node(fixture: str, name: str, model: str | None = None) -> SimNode:
    text = (FIXTURES / f"{fixture}.txt").read_text()
    topology = parse_topo_matrix(text, node_name=name, source=f"fixture:{fixture}")
    return SimNode(name, prepare(replace(topology, node_name=name)), model, fixture)


def cluster(*nodes: tuple[str, str]) -> Cluster:
    """Nodes given as (fixture, name)."""
    return Cluster("test", tuple(sim_node(f, n) for f, n in nodes))


def trace_job(
    id: str,
    submit: float,
    gpus: int,
    duration: float,
    tenant: str = "t",
    *,
    replicas: int = 1,
    priority: int = 0,
) -> TraceJob:
    return TraceJob(id, submit, duration, replicas, gpus, tenant, priority)


def workload(*jobs: TraceJob, tenants: tuple[Tenant, ...] | None = None) -> Workload:
    owners = tenants or tuple(Tenant(t, guaranteed=1000) for t in sorted({j.tenant for j in jobs}))
    return Workload("test", tuple(sorted(jobs, key=lambda j: (j.submit, j.id))), owners)
