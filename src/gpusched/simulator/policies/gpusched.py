"""gpusched as shipped: the operator's admission cycle (:func:`gpusched.core.admission.run_cycle`)
decides who starts, where, and whom to preempt; the placement engine inside it picks the GPUs.

The replay stands in for the API server: what the operator would read from its watch cache
(TenantQuotas, GpuJobs with their state and placement, nodes with their NodeGpuTopology) is built
here as a core :class:`~gpusched.core.admission.Snapshot`, and the cycle's admissions become
starts. Two simplifications, both named in the assumptions: pods start the moment a job is
admitted (no image pulls, no pods-ready timeout), and a preempted job's pods leave at once (no
grace period), so its preemptor starts in the same instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpusched.core.admission import (
    Assignment,
    CycleConfig,
    Job,
    JobState,
    Node,
    Snapshot,
    Tenant,
    run_cycle,
)
from gpusched.core.placement import Policy as PlacementPolicy
from gpusched.simulator.model import SimNode, TraceJob
from gpusched.simulator.policies.base import Decisions, Placed, Start

ASSUMPTIONS = (
    "admission, quotas, fair share, priorities, gangs and preemption: gpusched's own admission "
    "cycle (gpusched.core.admission.run_cycle), run after every batch of events",
    "GPU sets: gpusched's placement engine inside that cycle (topology scope, bandwidth, packing)",
    "pods run the instant their job is admitted; preempted pods leave at once (no grace period)",
    "a preempted job loses the work since its start (no checkpoints) and queues again",
)


def core_job(job: TraceJob) -> Job:
    """The GpuJob the trace job stands for, as the operator hands it to the cycle."""
    return Job(
        key=f"{job.tenant}/{job.id}",
        tenant=job.tenant,
        replicas=job.replicas,
        gpus_per_replica=job.gpus_per_replica,
        policy=PlacementPolicy(scope=job.scope, mode=job.mode, multi_node=job.replicas > 1),
        gpu_model=job.gpu_model,
        priority=job.priority,
        preemptible=job.preemptible,
        submitted_at=job.submit,
    )


def core_node(node: SimNode) -> Node:
    """The node as the operator builds it from a Node and its NodeGpuTopology."""
    return Node(name=node.name, topology=node.topology, model=node.model, labels=node.labels)


class GpuschedPolicy:
    """Runs the admission core over the replay's state."""

    name: str = "gpusched"
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def __init__(
        self,
        nodes: Sequence[SimNode],
        tenants: Sequence[Tenant],
        config: CycleConfig | None = None,
    ) -> None:
        self.nodes = tuple(core_node(n) for n in nodes)
        self.tenants = tuple(tenants)
        # Replays need only what starts; the reasons of jobs that never start are asked for by
        # one full cycle at the end (:meth:`reason`).
        self.config = replace(config or CycleConfig(), decisions_only=True)
        self.queued: dict[str, Job] = {}
        self.admitted: dict[str, Job] = {}
        self.ids: dict[str, str] = {}
        """Core job key -> trace job id."""
        self.reasons: dict[str, str] = {}
        self.waits: dict[str, str] = {}
        """Core job key -> reason code of the last cycle it waited in."""
        self.last_now = 0.0
        self.dirty = False

    def submit(self, job: TraceJob, now: float) -> None:
        core = core_job(job)
        self.ids[core.key] = job.id
        self.queued[job.id] = core
        self.dirty = True

    def finished(self, job: str, now: float) -> None:
        del self.admitted[job]
        self.dirty = True

    def schedule(self, now: float) -> Decisions:
        if not self.dirty or not self.queued:
            self.dirty = False
            return Decisions()
        self.dirty = False
        snapshot = Snapshot(
            now=now,
            tenants=self.tenants,
            jobs=(*self.admitted.values(), *self.queued.values()),
            nodes=self.nodes,
            config=self.config,
        )
        result = run_cycle(snapshot)
        preempted: list[str] = []
        starts: list[Start] = []
        for admission in result.admissions:
            for victim in admission.victims:
                job_id = self.ids[victim.victim]
                job = self.admitted.pop(job_id)
                self.queued[job_id] = replace(
                    job, state=JobState.QUEUED, placement=(), started_at=None
                )
                preempted.append(job_id)
            job_id = self.ids[admission.job]
            job = self.queued.pop(job_id)
            placement = tuple(Assignment(p.node, p.gpus) for p in admission.placement)
            self.admitted[job_id] = replace(
                job, state=JobState.ADMITTED, placement=placement, started_at=now
            )
            starts.append(Start(job_id, tuple(Placed(p.node, p.gpus) for p in admission.placement)))
        self.reasons = {}
        self.last_now = now
        self.waits.update((key, reason.value) for key, reason in result.wait_reasons.items())
        if result.preemption_searches >= self.config.max_preemption_searches:
            self.dirty = True  # jobs past the search budget are tried again next instant
        if preempted:
            # Victims are queued again and GPUs the preemptors do not use are free: the
            # operator's next cycle follows at once, and so does this one (same instant).
            self.dirty = True
        return Decisions(starts=tuple(starts), preempted=tuple(preempted))

    def last_wait(self, job: str) -> str | None:
        core = self.queued.get(job) or self.admitted.get(job)
        return self.waits.pop(core.key, None) if core is not None else None

    def reason(self, job: str) -> str | None:
        if not self.reasons and self.queued:
            # One cycle with its waiting records over the state the replay ended in.
            snapshot = Snapshot(
                now=self.last_now,
                tenants=self.tenants,
                jobs=(*self.admitted.values(), *self.queued.values()),
                nodes=self.nodes,
                config=replace(self.config, decisions_only=False, max_preemption_searches=0),
            )
            for waiting in run_cycle(snapshot).waiting:
                self.reasons[self.ids[waiting.job]] = f"{waiting.reason.value}: {waiting.message}"
        return self.reasons.get(job)
