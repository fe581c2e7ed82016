"""Builders for admission-core tests: nodes of a few real wirings, jobs, tenants, and a replay
step that applies a cycle's decisions to its snapshot as if pods started and stopped at once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import cache

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core import NodeTopology, Policy, parse_topo_matrix, prepare
from gpusched.core.admission import (
    AcrossReplicas,
    Assignment,
    Job,
    JobState,
    Node,
    Snapshot,
    Tenant,
    count_only_topology,
)
from gpusched.dev.bench.admission import settled
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX

#: An 8-GPU NVSwitch board: every pair NV18, two NUMA nodes.
NVSWITCH_MATRIX = "\n".join(
    [
        "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity",
        *(
            f"GPU{i}\t"
            + "\t".join(" X " if i == j else "NV18" for j in range(8))
            + f"\t{0 if i < 4 else 48}-{47 if i < 4 else 95}\t{0 if i < 4 else 1}"
            for i in range(8)
        ),
    ]
)

WIRINGS = ("nvswitch", "dgx1", "count")


@cache
def wiring(kind: str) -> NodeTopology:
    if kind == "nvswitch":
        return parse_topo_matrix(NVSWITCH_MATRIX, node_name="nvswitch")
    if kind == "dgx1":
        return parse_topo_matrix(DGX1_LIKE_MATRIX, node_name="dgx1")
    raise ValueError(kind)


def node(
    name: str,
    kind: str = "nvswitch",
    model: str = "H100",
    *,
    labels: dict[str, str] | None = None,
    busy: Iterable[int] = (),
    busy_count: int = 0,
) -> Node:
    """A node of one of the test wirings (``count``: no NodeGpuTopology, 8 GPUs)."""
    if kind == "count":
        topology = count_only_topology(name, 8, model)
    else:
        topology = replace(wiring(kind), node_name=name)
    return Node(
        name=name,
        topology=prepare(topology),
        model=model,
        labels={"kubernetes.io/hostname": name, **(labels or {})},
        busy=frozenset(busy),
        busy_count=busy_count,
        count_only=kind == "count",
    )


def job(
    key: str,
    tenant: str | None,
    gpus: int = 8,
    replicas: int = 1,
    *,
    priority: int = 0,
    submitted: float = 0.0,
    scope: TopologyScope = TopologyScope.NODE,
    mode: TopologyMode = TopologyMode.PREFERRED,
    running_on: list[tuple[str, tuple[int, ...]]] | None = None,
    started: float | None = 0.0,
    **kwargs: object,
) -> Job:
    """A queued job, or an admitted one when ``running_on`` lists (node, gpus) per replica."""
    fields: dict[str, object] = {
        "key": key,
        "tenant": tenant,
        "replicas": replicas,
        "gpus_per_replica": gpus,
        "policy": Policy(scope, mode, multi_node=replicas > 1),
        "priority": priority,
        "submitted_at": submitted,
        **kwargs,
    }
    if running_on is not None:
        fields["state"] = JobState.ADMITTED
        fields["placement"] = tuple(
            Assignment(n, g) if g else Assignment(n, (), gpus) for n, g in running_on
        )
        fields["started_at"] = started
    return Job(**fields)  # type: ignore[arg-type]


def snap(
    tenants: Iterable[Tenant], jobs: Iterable[Job], nodes: Iterable[Node], now: float
) -> Snapshot:
    """The snapshot of a cycle at ``now``."""
    return Snapshot(now=now, tenants=tuple(tenants), jobs=tuple(jobs), nodes=tuple(nodes))


def across(label: str, required: bool = True) -> AcrossReplicas:
    return AcrossReplicas(label, required)


#: The next snapshot once a cycle's writes landed, ``dt`` seconds later (admitted jobs run at
#: once where they were placed, victims are queued again): the admission benchmark's own.
replay = settled
