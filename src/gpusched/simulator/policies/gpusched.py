"""gpusched as shipped: the operator's admission cycle (:class:`gpusched.core.admission.Cycle`)
decides who starts, where, whom to preempt and whose GPUs to reserve; the placement engine inside
it picks the GPUs.

The replay stands in for the API server: what the operator would read from its watch cache
(TenantQuotas, GpuJobs with their state and placement, nodes with their NodeGpuTopology) is built
here as a core :class:`~gpusched.core.admission.Snapshot`, and the cycle's admissions become
starts. Run times are what the operator knows too: predicted from the jobs that finished so far
(:mod:`gpusched.core.runtime`), never the trace's future. Two simplifications, both named in the
assumptions: pods start the moment a job is admitted (no image pulls, no pods-ready timeout), and
a preempted job's pods leave at once (no grace period), so its preemptor starts in the same
instant.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from gpusched.core.admission import (
    Assignment,
    CycleConfig,
    CycleResult,
    Cycles,
    Job,
    JobState,
    Level,
    Node,
    Reservation,
    Snapshot,
    Tenant,
    run_cycle,
)
from gpusched.core.admission.arrivals import expected_arrivals
from gpusched.core.admission.quota import Ledger
from gpusched.core.lifecycle.spend import decayed
from gpusched.core.placement import Policy as PlacementPolicy
from gpusched.core.runtime import JobKind, RuntimeHistory, expected_end
from gpusched.simulator.model import JobSpec, SimNode
from gpusched.simulator.policies.base import Decisions, Placed, Start

ASSUMPTIONS = (
    "admission, quotas, fair share, priorities, gangs, reservations, backfill and preemption: "
    "gpusched's own admission cycle (gpusched.core.admission), run after every batch of events",
    "GPU sets: gpusched's placement engine inside that cycle (topology scope, bandwidth, packing)",
    "run times: predicted from the jobs finished so far (gpusched.core.runtime), never the "
    "trace's; expected starts from the operator's forecast, at most once per forecast "
    "interval, by the first cycle an event causes after it (no wake-up of its own; with "
    "each tenant's steady rate of the last 12 h of submissions expected again over the next "
    "12 h in gpusched-arrivals)",
    "pods run the instant their job is admitted; preempted pods leave at once (no grace period)",
    "a preempted job loses the work since its start (no checkpoints) and queues again",
)

#: Seconds after a cycle that changed nothing within which arrivals are decided on top of it
#: (the operator's ``--arrivals-on-top`` default).
ARRIVALS_ON_TOP: Final = 10.0
#: Least seconds of virtual time between two forecasts of every waiting job's start (the
#: operator's ``--forecast-interval`` default); reservations' starts are told every cycle. A
#: forecast rides on the first cycle the replay's events cause once it is due: a wake-up for it
#: alone would be a cycle of its own (predictions refreshed, later arrivals decided on top of
#: it), which could change admissions.
FORECAST_INTERVAL: Final = 300.0


def core_job(job: JobSpec, runtime: float | None = None) -> Job:
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
        expected_runtime=runtime,
    )


def core_node(node: SimNode) -> Node:
    """The node as the operator builds it from a Node and its NodeGpuTopology."""
    return Node(name=node.name, topology=node.topology, model=node.model, labels=node.labels)


def job_kind(job: JobSpec) -> JobKind:
    """What the runtime history knows the job by (traces name no submitter or family: the
    tenant stands for both)."""
    return JobKind(tenant=job.tenant, group=job.tenant, family="", gpus=job.gpus)


class GpuschedPolicy:
    """Runs the admission core over the replay's state."""

    name: str = "gpusched"
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def __init__(
        self,
        nodes: Sequence[SimNode],
        tenants: Sequence[Tenant],
        config: CycleConfig | None = None,
        *,
        forecast_interval: float = FORECAST_INTERVAL,
        usage_half_life: float | None = None,
        arrivals_window: float = 0.0,
        arrivals_on_top: float = ARRIVALS_ON_TOP,
    ) -> None:
        self.nodes = tuple(core_node(n) for n in nodes)
        self.tenants = tuple(tenants)
        self.usage_half_life = usage_half_life
        """Fair share with memory (the operator's ``--usage-half-life``); None: none."""
        self.recent: dict[str, float] = {}
        """Tenant -> borrowed GPUs on average lately, as the operator keeps it in status."""
        self.borrowed: dict[str, int] = {}
        """Tenant -> GPUs borrowed since the last cycle."""
        self.recent_at = 0.0
        self.levels: tuple[Level, ...] = ()
        """The cluster's network levels, narrowest first (set by :func:`build`)."""
        # Replays need only what starts; the reasons of jobs that never start are asked for by
        # one full cycle at the end (:meth:`reason`).
        self.config = replace(config or CycleConfig(), decisions_only=True)
        self.cycles = Cycles(arrivals_within=arrivals_on_top)
        """Keeps the pool of free GPUs from one cycle to the next, as the operator does (and,
        with ``arrivals_on_top``, decides jobs that arrived within so many seconds of a cycle
        that changed nothing on top of it: :class:`~gpusched.core.admission.Cycles`)."""
        self.forecast_interval = forecast_interval
        self.queued: dict[str, Job] = {}
        self.admitted: dict[str, Job] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.ids: dict[str, str] = {}
        """Core job key -> trace job id."""
        self.reasons: dict[str, str] = {}
        self.waits: dict[str, str] = {}
        """Core job key -> reason code of the last cycle it waited in."""
        self.last_now = 0.0
        self.dirty = False
        self.history = RuntimeHistory()
        self.ends: list[tuple[float, str, float]] = []
        """(expected end, job id, start) of admitted jobs, to move the expected end of a job
        that runs past it."""
        self.next_forecast = -math.inf
        self.told: set[str] = set()
        """Jobs told an expected start, or started before (only the first expected start of a
        job that never ran is recorded)."""
        self.wake: float = math.inf
        self.arrivals_window = arrivals_window
        """Submissions of this many seconds back are expected to go on over as many ahead,
        in every forecast (the operator's ``--forecast-arrivals-window``; 0: none)."""
        self.submitted: deque[tuple[float, str]] = deque()
        """(submission time, trace job id) of the jobs submitted within that window."""

    def _runtime(self, job: JobSpec) -> float | None:
        found = self.history.predict(job_kind(job))
        return found.seconds if found is not None else None

    def submit(self, job: JobSpec, now: float) -> None:
        core = core_job(job, self._runtime(job))
        self.ids[core.key] = job.id
        self.jobs[job.id] = job
        self.queued[job.id] = core
        if self.arrivals_window > 0:
            self.submitted.append((now, job.id))
        self.dirty = True

    def finished(self, job: str, now: float) -> None:
        done = self.admitted.pop(job)
        if done.started_at is not None:
            self.history.record(job_kind(self.jobs[job]), now - done.started_at)
        self.dirty = True

    def _overruns(self, now: float) -> None:
        """Jobs past their expected end are expected to run as long again (core.runtime)."""
        while self.ends and self.ends[0][0] <= now:
            _, job_id, started = heapq.heappop(self.ends)
            job = self.admitted.get(job_id)
            if job is None or job.started_at != started:
                continue
            end = expected_end(started, now, job.expected_runtime)
            if end is None:
                continue
            self.admitted[job_id] = replace(job, expected_end=end)
            heapq.heappush(self.ends, (end, job_id, started))

    def _refresh_predictions(self) -> None:
        for job_id, job in list(self.queued.items()):
            runtime = self._runtime(self.jobs[job_id])
            if runtime != job.expected_runtime:
                self.queued[job_id] = replace(job, expected_runtime=runtime)

    def schedule(self, now: float) -> Decisions:
        if now >= self.wake:
            self.dirty = True
        forecast = now >= self.next_forecast and bool(self.queued)
        if not (self.dirty or forecast) or not self.queued:
            self.dirty = False
            return Decisions()
        self.dirty = False
        self._overruns(now)
        if forecast:
            self._refresh_predictions()
            self.next_forecast = now + self.forecast_interval
        # Only a job's first expected start is recorded, and expected starts feed no decision:
        # the forecast is played (on a whole cycle, its order) only for waiting jobs not told
        # yet, which can only be among the queued ones.
        play = forecast and any(job_id not in self.told for job_id in self.queued)
        snapshot = Snapshot(
            now=now,
            tenants=self._remembering(now),
            jobs=(*self.admitted.values(), *self.queued.values()),
            nodes=self.nodes,
            config=self.config,
            levels=self.levels,
            arrivals=self._arrivals(now) if play else (),
        )
        cycle = self.cycles.cycle(snapshot, whole=play)
        result = cycle.run()
        preempted: list[str] = []
        starts: list[Start] = []
        for admission in result.admissions:
            for victim in admission.victims:
                job_id = self.ids[victim.victim]
                job = self.admitted.pop(job_id)
                self.queued[job_id] = replace(
                    job,
                    state=JobState.QUEUED,
                    placement=(),
                    started_at=None,
                    expected_end=None,
                    backfill_until=None,
                    preemptions=job.preemptions + 1,
                )
                preempted.append(job_id)
                # A job that ran is not told an expected start again (the first one counts).
                self.told.add(job_id)
            job_id = self.ids[admission.job]
            job = self.queued.pop(job_id)
            placement = tuple(Assignment(p.node, p.gpus) for p in admission.placement)
            runtime = job.expected_runtime
            end = now + runtime if runtime is not None else None
            self.admitted[job_id] = replace(
                job,
                state=JobState.ADMITTED,
                placement=placement,
                started_at=now,
                expected_end=end,
                backfill_until=admission.backfill_until,
                reservation=(),
                reservation_start=None,
            )
            if end is not None:
                heapq.heappush(self.ends, (end, job_id, now))
            starts.append(Start(job_id, tuple(Placed(p.node, p.gpus) for p in admission.placement)))
        self._keep_reservations(result.reservations)
        estimates: dict[str, float] = {}
        for reservation in result.reservations:
            estimates[self.ids[reservation.job]] = reservation.start
        untold = (
            frozenset(key for key in result.wait_reasons if self.ids[key] not in self.told)
            if play
            else frozenset()
        )
        if untold:
            # Played until every job not told yet is decided.
            for key, when in cycle.forecast(until=untold).items():
                if when is not None and key in untold:
                    estimates.setdefault(self.ids[key], when)
        told = tuple((j, t) for j, t in estimates.items() if j not in self.told)
        self.told.update(j for j, _ in told)
        self.reasons = {}
        self.last_now = now
        self.waits.update((key, reason.value) for key, reason in result.wait_reasons.items())
        if result.preemption_searches >= self.config.max_preemption_searches:
            self.dirty = True  # jobs past the search budget are tried again next instant
        if preempted:
            # Victims are queued again and GPUs the preemptors do not use are free: the
            # operator's next cycle follows at once, and so does this one (same instant).
            self.dirty = True
        self.wake = self._next_wake(now, result)
        if self.usage_half_life:
            self._count_borrowed()
        return Decisions(
            starts=tuple(starts),
            preempted=tuple(preempted),
            estimates=told,
            wake_at=self.wake if math.isfinite(self.wake) else None,
        )

    def _arrivals(self, now: float) -> tuple[Job, ...]:
        """The jobs expected to arrive, from those submitted within the window (as the
        operator builds them from its GpuJobs, with today's predicted run times)."""
        window = self.arrivals_window
        if window <= 0:
            return ()
        while self.submitted and self.submitted[0][0] < now - window:
            self.submitted.popleft()
        recent = (self.jobs[job_id] for _, job_id in self.submitted)
        return expected_arrivals((core_job(j, self._runtime(j)) for j in recent), now, window)

    def _remembering(self, now: float) -> tuple[Tenant, ...]:
        """The tenants with their recent borrowing brought up to ``now`` (as the operator's
        metering does between cycles), when fair share has memory."""
        if not self.usage_half_life:
            return self.tenants
        elapsed = now - self.recent_at
        self.recent_at = now
        for tenant in self.tenants:
            name = tenant.name
            self.recent[name] = decayed(
                self.recent.get(name, 0.0),
                float(self.borrowed.get(name, 0)),
                elapsed,
                self.usage_half_life,
            )
        return tuple(replace(t, recent_borrowed=self.recent[t.name]) for t in self.tenants)

    def _count_borrowed(self) -> None:
        """What each tenant borrows after this cycle's decisions (the ledger's own count)."""
        held: dict[str, list[Job]] = {t.name: [] for t in self.tenants}
        for job in self.admitted.values():
            if job.tenant in held:
                held[job.tenant].append(job)
        self.borrowed = {t.name: Ledger(t, held[t.name]).borrowed() for t in self.tenants}

    def _keep_reservations(self, reservations: Sequence[Reservation]) -> None:
        """The next cycle starts from this one's reservations, as the operator's does from the
        GpuJobs' status."""
        held = {self.ids[r.job]: r for r in reservations}
        for job_id, job in list(self.queued.items()):
            found = held.get(job_id)
            placement = tuple(Assignment(p.node, p.gpus) for p in found.placement) if found else ()
            start = found.start if found else None
            if job.reservation != placement or job.reservation_start != start:
                self.queued[job_id] = replace(job, reservation=placement, reservation_start=start)

    def _next_wake(self, now: float, result: CycleResult) -> float:
        """The operator decides again when a backfilled job's deadline passes, and by the
        cycle's :attr:`~gpusched.core.admission.CycleResult.wake_at` (a lender's hold that kept
        a job waiting lapses, a job that turned a reclaim down runs out of patience, a
        protection that kept a waiting job's victims out ends); here the replay is asked to
        wake the policy then."""
        times = [
            j.backfill_until
            for j in self.admitted.values()
            if j.backfill_until is not None and j.backfill_until > now
        ]
        if result.wake_at is not None:
            times.append(result.wake_at)
        return min(times, default=math.inf)

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
                levels=self.levels,
            )
            for waiting in run_cycle(snapshot).waiting:
                self.reasons[self.ids[waiting.job]] = f"{waiting.reason.value}: {waiting.message}"
        return self.reasons.get(job)
