"""The replay: a virtual clock, events in a deterministic order, one policy's decisions applied
to the ground truth of the cluster.

Events at one instant are handled together, completions before arrivals (a GPU freed at ``t``
is free for a job arriving at ``t``), then the policy is asked once what to start. Ties are broken
by the trace's order, so a replay is a pure function of its workload, cluster, policy and seed.
The engine owns which GPU is free: a policy that hands out a GPU twice, or places a replica on a
node that cannot hold it, stops the replay with an error (a bug in the policy, never a figure).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpusched.core.placement import Policy as PlacementPolicy
from gpusched.core.placement import Refusal, place
from gpusched.core.prepared import CLASS_NODE, CLASS_NUMA, CLASS_PCIE_SWITCH, PreparedNode
from gpusched.simulator.model import (
    LINK_ORDER,
    Attempt,
    Cluster,
    JobRecord,
    Link,
    RunResult,
    Sample,
    SimNode,
    TraceJob,
    Workload,
)
from gpusched.simulator.policies.base import KnowsReplay, Placed, SimPolicy

#: Slowdown of a job on a set whose worst link is ``link`` (``gpus`` GPUs in all).
SpeedModel = Callable[[Link, int], float]
#: Told ``(virtual time, events done, events in all, running jobs, queued jobs)``.
ProgressHook = Callable[[float, int, int, int, int], None]

_COMPLETION = 0
#: After a pass that preempted, the victims are queued again; the policy gets further passes at
#: the same instant (the operator's next cycle follows at once), bounded so a thrashing policy
#: cannot stall the clock.
_PASSES_PER_INSTANT = 3
_ARRIVAL = 1
#: A decision the policy asked for at a time of its own (after arrivals of that instant).
_WAKE = 2


class PolicyError(RuntimeError):
    """A policy made a decision the cluster cannot carry out."""


def worst_link(
    nodes: dict[str, SimNode], replicas: tuple[Placed, ...], cluster: Cluster | None = None
) -> Link:
    """The worst link a job placed on ``replicas`` crosses (across nodes: the narrowest
    network level of ``cluster`` whose one domain holds them all)."""
    names = {p.node for p in replicas}
    if len(names) > 1:
        if cluster is None:
            return Link.NETWORK
        return cluster.link_across(nodes[n] for n in names)
    return _set_link(nodes[replicas[0].node].topology, [i for p in replicas for i in p.gpus])


def _set_link(node: PreparedNode, gpus: Sequence[int]) -> Link:
    """The worst link between GPUs ``gpus`` of one node."""
    positions = sorted(node.position(i) for i in gpus)
    worst = 0
    wiring = node.wiring
    for i, a in enumerate(positions):
        for b in positions[i + 1 :]:
            worst = max(worst, wiring.pair_class(a, b))
    if worst >= CLASS_NODE:
        return Link.SOCKET
    if worst == CLASS_NUMA:
        return Link.NUMA
    if worst == CLASS_PCIE_SWITCH:
        return Link.PCIE_SWITCH
    return Link.NVLINK


def best_link(
    nodes: Iterable[SimNode],
    free: Mapping[str, int],
    job: TraceJob,
    cluster: Cluster | None = None,
) -> Link:
    """The best worst-link a set of ``job``'s size offers among the ``free`` GPUs (position
    masks per node): one node holding the whole job on its best-wired free set (the placement
    engine's choice, which puts the slowest pair first), else the narrowest network level of
    ``cluster`` one of whose domains has that many free GPUs, else the link beyond them."""
    if job.gpus == 1:
        return Link.NVLINK
    nodes = list(nodes)
    best: Link | None = None
    for node in nodes:
        if job.gpu_model is not None and node.model != job.gpu_model:
            continue
        mask = free[node.name] & node.topology.placeable_mask
        if mask.bit_count() < job.gpus:
            continue
        chosen = place(node.topology, job.gpus, _ANY_SET, free_mask=mask)
        if isinstance(chosen, Refusal):
            continue
        link = _set_link(node.topology, chosen.gpus)
        if best is None or LINK_ORDER.index(link) < LINK_ORDER.index(best):
            best = link
            if best is Link.NVLINK:
                return best
    # Across nodes (an NVLink clique can beat a node's PCIe set): only when no node gave NVLink.
    across = _across_link(nodes, free, job, cluster)
    if best is None or LINK_ORDER.index(across) < LINK_ORDER.index(best):
        return across
    return best


def _across_link(
    nodes: Sequence[SimNode], free: Mapping[str, int], job: TraceJob, cluster: Cluster | None
) -> Link:
    """The best link a job spanning nodes could get from the free GPUs."""
    if cluster is None:
        return Link.NETWORK
    for level in cluster.levels:
        by_value: dict[str, int] = {}
        for node in nodes:
            value = node.labels.get(level.level.node_label)
            if value is None or (job.gpu_model is not None and node.model != job.gpu_model):
                continue
            count = (free[node.name] & node.topology.placeable_mask).bit_count()
            by_value[value] = by_value.get(value, 0) + count
        if any(count >= job.gpus for count in by_value.values()):
            return level.link
    return cluster.beyond


#: What :func:`best_link` asks the engine for: the best set, any wiring.
_ANY_SET: Final = PlacementPolicy()


@dataclass
class _Run:
    job: TraceJob
    placed: list[Placed] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    epoch: int = 0
    started: float | None = None
    link: Link = Link.NVLINK
    slowdown: float = 1.0
    best_now: Link = Link.NVLINK
    """The best link the cluster's free GPUs offered when its first replica was placed."""
    factors: tuple[float, float, float] = (1.0, 1.0, 1.0)
    """Speed factors of this attempt: its link, the best free at its start, the floor."""
    finished: bool = False
    queued_at: float = 0.0
    longest_wait: float = 0.0
    wait_reason: str | None = None
    estimated_at: float | None = None
    estimate: float | None = None


class Replay:
    """One policy over one workload and cluster; :meth:`run` once."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        policy: SimPolicy,
        *,
        speed: SpeedModel | None = None,
        progress: ProgressHook | None = None,
        cycle_interval: float = 0.0,
    ) -> None:
        self.workload = workload
        self.cycle_interval = cycle_interval
        """Events up to this long after the first undecided one are decided together (0: every
        instant on its own; the operator waits at least 0.1 s between cycles)."""
        self.cluster = cluster
        self.policy = policy
        self.speed = speed
        self.progress = progress
        self.nodes = {n.name: n for n in cluster.nodes}
        self.free = {n.name: n.topology.placeable_mask for n in cluster.nodes}
        self.free_hist: Counter[int] = Counter(m.bit_count() for m in self.free.values())
        self.runs = {j.id: _Run(j) for j in workload.jobs}
        self._floors: dict[tuple[int, str | None], Link] = {}
        self.waiting: dict[str, TraceJob] = {}
        self.waiting_sizes: Counter[int] = Counter()
        self.running = 0
        self.held_by_tenant: Counter[str] = Counter()
        self.queued_by_tenant: Counter[str] = Counter()
        self.queued_sizes: dict[str, Counter[int]] = {}
        """Per tenant, how many of its waiting jobs ask each total GPU count."""
        self.samples: list[Sample] = []
        self.preemptions = 0
        self.events: list[tuple[float, int, int, str, int]] = [
            (j.submit, _ARRIVAL, i, j.id, 0) for i, j in enumerate(workload.jobs)
        ]
        heapq.heapify(self.events)
        self.arrivals_left = len(self.events)
        self._wakes: set[float] = set()
        if isinstance(policy, KnowsReplay):
            policy.replay_started(cluster, speed, {j.id: j.duration for j in workload.jobs})

    # --- ground truth --------------------------------------------------------------------

    def _take(self, job: str, placed: Placed) -> None:
        node = self.nodes.get(placed.node)
        if node is None:
            raise PolicyError(f"{self.policy.name} placed {job} on unknown node {placed.node}")
        if len(set(placed.gpus)) != len(placed.gpus) or not placed.gpus:
            raise PolicyError(f"{self.policy.name} gave {job} GPUs {placed.gpus}")
        mask = node.topology.mask(placed.gpus)
        free = self.free[placed.node]
        if mask & ~free:
            raise PolicyError(
                f"{self.policy.name} gave {job} GPUs {placed.gpus} of {placed.node}, some not free"
            )
        self._set_free(placed.node, free & ~mask)

    def _give_back(self, placed: Placed) -> None:
        node = self.nodes[placed.node]
        self._set_free(placed.node, self.free[placed.node] | node.topology.mask(placed.gpus))

    def _set_free(self, name: str, mask: int) -> None:
        self.free_hist[self.free[name].bit_count()] -= 1
        self.free[name] = mask
        self.free_hist[mask.bit_count()] += 1

    def _queue(self, job: TraceJob) -> None:
        self.waiting[job.id] = job
        self.waiting_sizes[job.gpus_per_replica] += 1
        self.queued_by_tenant[job.tenant] += job.gpus
        self.queued_sizes.setdefault(job.tenant, Counter())[job.gpus] += 1

    def _unqueue(self, job: TraceJob) -> None:
        del self.waiting[job.id]
        self.waiting_sizes[job.gpus_per_replica] -= 1
        if not self.waiting_sizes[job.gpus_per_replica]:
            del self.waiting_sizes[job.gpus_per_replica]
        self.queued_by_tenant[job.tenant] -= job.gpus
        sizes = self.queued_sizes[job.tenant]
        sizes[job.gpus] -= 1
        if not sizes[job.gpus]:
            del sizes[job.gpus]

    # --- events --------------------------------------------------------------------------

    def _arrive(self, job_id: str, now: float) -> None:
        self.arrivals_left -= 1
        run = self.runs[job_id]
        run.queued_at = now
        self._queue(run.job)
        # The policy sees what the cluster would: the job's request, not its trace run time.
        self.policy.submit(run.job.spec, now)

    def _complete(self, job_id: str, epoch: int, now: float) -> None:
        run = self.runs[job_id]
        if run.epoch != epoch or run.started is None:
            return  # preempted since; this completion belongs to an ended attempt
        self._end_attempt(run, now, preempted=False)
        run.finished = True
        self.policy.finished(job_id, now)

    def _end_attempt(self, run: _Run, now: float, *, preempted: bool) -> None:
        assert run.started is not None
        run.attempts.append(
            Attempt(
                start=run.started,
                end=now,
                nodes=tuple(sorted({p.node for p in run.placed})),
                link=run.link,
                slowdown=run.slowdown,
                preempted=preempted,
                factor=run.factors[0],
                best_factor=run.factors[1],
                floor_factor=run.factors[2],
            )
        )
        for placed in run.placed:
            self._give_back(placed)
        self.held_by_tenant[run.job.tenant] -= run.job.gpus_per_replica * len(run.placed)
        run.placed = []
        run.started = None
        run.epoch += 1
        self.running -= 1

    def _preempt(self, job_id: str, now: float) -> None:
        run = self.runs.get(job_id)
        if run is None or run.started is None:
            raise PolicyError(f"{self.policy.name} preempted {job_id}, which is not running")
        self._end_attempt(run, now, preempted=True)
        self.preemptions += 1
        run.queued_at = now
        self._queue(run.job)

    def _start(self, job_id: str, replicas: tuple[Placed, ...], now: float) -> None:
        run = self.runs.get(job_id)
        if run is None or run.job.id not in self.waiting:
            raise PolicyError(f"{self.policy.name} started {job_id}, which is not waiting")
        if not run.placed:
            # The job's GPUs are still free: what the cluster could have given it now.
            run.best_now = self._best(run.job)
        for placed in replicas:
            if len(placed.gpus) != run.job.gpus_per_replica:
                raise PolicyError(
                    f"{self.policy.name} gave a replica of {job_id} {len(placed.gpus)} GPUs, "
                    f"it asks for {run.job.gpus_per_replica}"
                )
            self._take(job_id, placed)
        run.placed.extend(replicas)
        if len(run.placed) > run.job.replicas:
            raise PolicyError(f"{self.policy.name} placed too many replicas of {job_id}")
        if len(run.placed) < run.job.replicas:
            # Replicas bound while others wait (a scheduler without gangs) hold their GPUs
            # without running: not allocated to work, and not free either.
            return
        self.held_by_tenant[run.job.tenant] += run.job.gpus_per_replica * len(run.placed)
        self._unqueue(run.job)
        waited = now - run.queued_at
        if waited > run.longest_wait:
            run.longest_wait = waited
            run.wait_reason = self.policy.last_wait(job_id)
        run.started = now
        run.link = worst_link(self.nodes, tuple(run.placed), self.cluster)
        job = run.job
        if self.speed is not None and job.gpus > 1:
            factor = self.speed(run.link, job.gpus)
            run.factors = (
                factor,
                min(factor, self.speed(run.best_now, job.gpus)),
                min(factor, self.speed(self._floor(job), job.gpus)),
            )
            measured = self.speed(job.measured_on, job.gpus) if job.measured_on else 1.0
            run.slowdown = factor / measured
        else:
            run.factors = (1.0, 1.0, 1.0)
            run.slowdown = 1.0
        self.running += 1
        if math.isfinite(run.job.duration):
            end = now + run.job.duration * run.slowdown
            heapq.heappush(self.events, (end, _COMPLETION, 0, job_id, run.epoch))

    def _best(self, job: TraceJob) -> Link:
        """The best link the free GPUs offer ``job`` now (only what the speed model uses)."""
        if self.speed is None or job.gpus == 1:
            return Link.NVLINK
        return best_link(self.cluster.nodes, self.free, job, self.cluster)

    def _floor(self, job: TraceJob) -> Link:
        """The best link the empty cluster offers a job of this size and model."""
        key = (job.gpus, job.gpu_model)
        found = self._floors.get(key)
        if found is None:
            empty = {n.name: n.topology.placeable_mask for n in self.cluster.nodes}
            found = best_link(self.cluster.nodes, empty, job, self.cluster)
            self._floors[key] = found
        return found

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Replay every event; returns the records of every job."""
        cpu = time.process_time()
        done = 0
        while self.events:
            until = self.events[0][0] + self.cycle_interval
            while self.events and self.events[0][0] <= until:
                now, kind, _, job_id, epoch = heapq.heappop(self.events)
                done += 1
                if kind == _COMPLETION:
                    self._complete(job_id, epoch, now)
                elif kind == _WAKE:
                    self._wakes.discard(now)
                else:
                    self._arrive(job_id, now)
            for _ in range(_PASSES_PER_INSTANT):
                decisions = self.policy.schedule(now)
                for victim in decisions.preempted:
                    self._preempt(victim, now)
                for start in decisions.starts:
                    self._start(start.job, start.replicas, now)
                for job_id, when in decisions.estimates:
                    run = self.runs.get(job_id)
                    if run is not None and run.estimate is None and not run.attempts:
                        run.estimated_at = now
                        run.estimate = when
                if decisions.wake_at is not None and decisions.wake_at > now:
                    self._wake(decisions.wake_at)
                if not decisions.preempted:
                    break
            self._sample(now)
            if self.progress is not None:
                # Still to come: the queued events, and a completion for every job that has not
                # started (waiting, or yet to arrive).
                total = done + len(self.events) + len(self.waiting) + self.arrivals_left
                self.progress(now, done, total, self.running, len(self.waiting))
        return RunResult(
            policy=self.policy.name,
            assumptions=self.policy.assumptions,
            workload=self.workload.name,
            cluster=self.cluster.name,
            capacity=self.cluster.gpus,
            tenants=self.workload.tenants,
            jobs=tuple(self._record(r) for r in self.runs.values()),
            samples=tuple(self.samples),
            preemptions=self.preemptions,
            cpu_seconds=time.process_time() - cpu,
            node_kinds={n.name: n.kind for n in self.cluster.nodes},
            cycle_interval=self.cycle_interval,
        )

    def _wake(self, when: float) -> None:
        """Decide again at ``when`` (one wake-up per instant)."""
        if when in self._wakes:
            return
        self._wakes.add(when)
        heapq.heappush(self.events, (when, _WAKE, 0, "", 0))

    def _sample(self, now: float) -> None:
        held = {t: n for t, n in self.held_by_tenant.items() if n}
        queued = {t: n for t, n in self.queued_by_tenant.items() if n}
        smallest_by_tenant = {t: min(sizes) for t, sizes in self.queued_sizes.items() if sizes}
        smallest = min(self.waiting_sizes) if self.waiting_sizes else 0
        stranded = sum(k * c for k, c in self.free_hist.items() if 0 < k < smallest)
        sample = Sample(
            time=now,
            allocated=sum(held.values()),
            queued_jobs=len(self.waiting),
            queued_gpus=sum(queued.values()),
            by_tenant=held,
            stranded=stranded,
            queued_by_tenant=queued,
            smallest_queued_by_tenant=smallest_by_tenant,
        )
        last = self.samples[-1] if self.samples else None
        if last is not None and (
            last.allocated,
            last.queued_jobs,
            last.stranded,
            last.by_tenant,
            last.queued_by_tenant,
            last.smallest_queued_by_tenant,
        ) == (
            sample.allocated,
            sample.queued_jobs,
            sample.stranded,
            held,
            queued,
            smallest_by_tenant,
        ):
            return
        self.samples.append(sample)

    def _record(self, run: _Run) -> JobRecord:
        reason = None
        if not run.attempts and run.started is None:
            reason = self.policy.reason(run.job.id)
        return JobRecord(
            id=run.job.id,
            tenant=run.job.tenant,
            gpus=run.job.gpus,
            submit=run.job.submit,
            duration=run.job.duration,
            attempts=tuple(run.attempts)
            + (
                ()
                if run.started is None
                else (
                    Attempt(
                        start=run.started,
                        end=math.inf,
                        nodes=tuple(sorted({p.node for p in run.placed})),
                        link=run.link,
                        slowdown=run.slowdown,
                        factor=run.factors[0],
                        best_factor=run.factors[1],
                        floor_factor=run.factors[2],
                    ),
                )
            ),
            finished=run.finished,
            reason=reason,
            wait_reason=run.wait_reason,
            longest_wait=run.longest_wait,
            estimated_at=run.estimated_at,
            estimate=run.estimate,
        )


def replay(
    workload: Workload,
    cluster: Cluster,
    policy: SimPolicy,
    *,
    speed: SpeedModel | None = None,
    progress: ProgressHook | None = None,
    cycle_interval: float = 0.0,
) -> RunResult:
    """Replay ``workload`` on ``cluster`` under ``policy``."""
    return Replay(
        workload, cluster, policy, speed=speed, progress=progress, cycle_interval=cycle_interval
    ).run()
