"""The simulator's data: what a replay reads (a workload and a cluster) and what it records.

Plain immutable dataclasses so every part (adapters, engine, policies, figures, report) agrees
on one shape and a run can be written to JSON and read back for ``--what-if`` diffs. Times are
seconds on the replay's virtual clock (0 = the first submission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Final

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core.admission import Level, Tenant
from gpusched.core.prepared import PreparedNode


class Link(StrEnum):
    """The worst link a job's GPUs cross, best first (what the job-speed model is keyed on)."""

    NVLINK = "nvlink"
    """Every pair of GPUs in one replica is NVLinked (and the job has one replica)."""
    PCIE_SWITCH = "pcie-switch"
    """Some pair talks through a PCIe switch (PIX/PXB), none worse."""
    NUMA = "numa"
    """Some pair crosses the host bridge of one CPU socket (PHB/NODE), none worse."""
    SOCKET = "socket"
    """Some pair crosses the inter-socket link (SYS)."""
    NETWORK = "network"
    """The job spans nodes: its gradients cross the network (nodes under one leaf switch, or a
    cluster whose network levels are not modelled)."""
    CROSS_LEAF = "cross-leaf"
    """The job's nodes sit under different leaf (top-of-rack) switches of one aggregation
    block: its traffic climbs to the aggregation layer."""
    CROSS_AGGREGATION = "cross-aggregation"
    """The job's nodes sit under different aggregation blocks: its traffic crosses the core."""


#: Order of :class:`Link`, best first (index = how bad).
LINK_ORDER: tuple[Link, ...] = tuple(Link)


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a workload, in the generic trace format (docs/simulator.md)."""

    id: str
    submit: float
    """Seconds after the trace's start."""
    duration: float
    """Run time in seconds when placed on a well-wired set (the speed model's baseline)."""
    replicas: int
    gpus_per_replica: int
    tenant: str
    priority: int = 0
    gpu_model: str | None = None
    """Only nodes of this model may run it (None: any)."""
    scope: TopologyScope = TopologyScope.NODE
    mode: TopologyMode = TopologyMode.PREFERRED
    preemptible: bool = True
    measured_on: Link | None = None
    """The worst link of the placement its ``duration`` was measured on (``network`` for a
    gang a trace ran across nodes); None: a well-wired set. The speed model charges only the
    difference between that link and the one the replay gives it."""

    @property
    def gpus(self) -> int:
        """GPUs the whole job holds."""
        return self.replicas * self.gpus_per_replica

    @property
    def spec(self) -> JobSpec:
        """The job as a cluster knows it at submission: everything but its run time."""
        return JobSpec(**{name: getattr(self, name) for name in _SPEC_FIELDS})


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a policy is told of a job: what a GpuJob says when it is submitted. The trace's
    run time is not in it, so a policy cannot decide on the future (an oracle is handed run
    times explicitly: :class:`gpusched.simulator.policies.base.KnowsReplay`)."""

    id: str
    submit: float
    replicas: int
    gpus_per_replica: int
    tenant: str
    priority: int = 0
    gpu_model: str | None = None
    scope: TopologyScope = TopologyScope.NODE
    mode: TopologyMode = TopologyMode.PREFERRED
    preemptible: bool = True
    measured_on: Link | None = None

    @property
    def gpus(self) -> int:
        """GPUs the whole job holds."""
        return self.replicas * self.gpus_per_replica


#: The fields a policy is told (all of a trace job's but its run time).
_SPEC_FIELDS: Final = tuple(f.name for f in fields(JobSpec))


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node of the simulated cluster."""

    name: str
    topology: PreparedNode
    model: str | None = None
    kind: str = ""
    """Where the wiring came from (a fixture name, ``count:<n>`` for an openb node)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """GPUs the node offers."""
        return len(self.topology.wiring.indices)


@dataclass(frozen=True)
class Workload:
    """Jobs to replay, with the tenants that own them."""

    name: str
    jobs: tuple[TraceJob, ...]
    tenants: tuple[Tenant, ...]
    notes: tuple[str, ...] = ()
    """How the workload was derived (e.g. how priorities were synthesised)."""


@dataclass(frozen=True)
class Cluster:
    """Nodes to replay on, and the network levels above them."""

    name: str
    nodes: tuple[SimNode, ...]
    levels: tuple[NetworkLevel, ...] = ()
    """Narrowest first: the link of a job whose nodes all share one domain of a level."""
    beyond: Link = Link.NETWORK
    """The link of a job whose nodes share no domain of any level."""

    def link_across(self, nodes: Iterable[SimNode]) -> Link:
        """The link a job spanning ``nodes`` (two or more) crosses."""
        members = list(nodes)
        for level in self.levels:
            values = {n.labels.get(level.level.node_label) for n in members}
            if len(values) == 1 and None not in values:
                return level.link
        return self.beyond

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.gpus for n in self.nodes)


@dataclass(frozen=True, slots=True)
class NetworkLevel:
    """One network level of a simulated cluster, and what a job inside one of its domains
    crosses (an NVLink clique: NVLink; a leaf switch: the network; an aggregation block:
    the aggregation layer)."""

    level: Level
    link: Link


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job on a set of GPUs (a preempted job has several).

    Speeds are factors over a well-wired run (1.0): ``factor`` on the link it got, and for the
    split of GPU-hours lost to slow placement, ``best_factor`` on the best-wired set the
    cluster's free GPUs offered at its start, ``floor_factor`` on the best set of the empty
    cluster (a gang larger than any node crosses the network whatever a policy does)."""

    start: float
    end: float
    nodes: tuple[str, ...]
    link: Link
    slowdown: float
    """Run time on this set divided by the trace's recorded run time (``factor`` over the factor
    of the link the duration was measured on)."""
    preempted: bool = False
    """Ended by preemption; its work is lost (no checkpoints in the model)."""
    factor: float = 1.0
    """Slowdown of the link it got, over a well-wired run."""
    best_factor: float = 1.0
    """Slowdown of the best-wired set free at its start."""
    floor_factor: float = 1.0
    """Slowdown of the best-wired set of the empty cluster."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job in one replay."""

    id: str
    tenant: str
    gpus: int
    submit: float
    duration: float
    attempts: tuple[Attempt, ...] = ()
    finished: bool = False
    """Ran to completion before the replay ended."""
    reason: str | None = None
    """Why an unfinished job never started (the policy's last wait reason)."""
    wait_reason: str | None = None
    """Why it waited, at the end of its longest wait before a start (the policy's reason in the
    last decision it waited in)."""
    longest_wait: float = 0.0
    """Its longest wait in the queue before a start, seconds."""
    estimated_at: float | None = None
    """When the policy first told it an expected start (None: never)."""
    estimate: float | None = None
    """That first expected start."""

    @property
    def end(self) -> float | None:
        """Completion time, if finished."""
        return self.attempts[-1].end if self.finished and self.attempts else None

    @property
    def first_start(self) -> float | None:
        """When it first started."""
        return self.attempts[0].start if self.attempts else None


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at one instant of virtual time (taken whenever it changes)."""

    time: float
    allocated: int
    """GPUs held by running jobs."""
    queued_jobs: int
    queued_gpus: int
    by_tenant: Mapping[str, int]
    """GPUs held by each tenant's running jobs (not by replicas of a gang still waiting for
    the rest)."""
    stranded: int
    """Free GPUs that no waiting job can use (fragmentation)."""
    queued_by_tenant: Mapping[str, int] = field(default_factory=dict)
    """GPUs asked for by each tenant's jobs that are not running (its unmet demand)."""
    smallest_queued_by_tenant: Mapping[str, int] = field(default_factory=dict)
    """GPUs of each tenant's smallest waiting job: whether a job that fits what is left of its
    guarantee is waiting."""


@dataclass(frozen=True)
class RunResult:
    """One policy's replay of one workload on one cluster."""

    policy: str
    assumptions: tuple[str, ...]
    workload: str
    cluster: str
    capacity: int
    tenants: tuple[Tenant, ...]
    jobs: tuple[JobRecord, ...]
    samples: tuple[Sample, ...]
    preemptions: int
    cpu_seconds: float
    """CPU time the replay took (for the speed targets)."""
    node_kinds: Mapping[str, str] = field(default_factory=dict)
    """Node name -> where its wiring came from (fixture name), for per-job records."""
    cycle_interval: float = 0.0
    """Events this close were decided together (the engine's ``cycle_interval``). Infinite: every
    event in one decision (the FGD experiment), so a job's start is that decision's time, not
    when it could have started: the replay has no timeline of waits."""

    @property
    def has_waits(self) -> bool:
        """Whether starts are times a job waited for (not one batch's decision time)."""
        return math.isfinite(self.cycle_interval)
