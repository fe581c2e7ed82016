"""One admission cycle's decisions over a :class:`~gpusched.operator.store.World`: settle every
job's lifecycle, run the admission core, plan the writes. CPU only, no I/O: the loop runs it in a
worker thread so watches and the lease keep being served, and ``gpusched explain`` runs it as is.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus
from gpusched.core.admission import (
    Cycle,
    CycleConfig,
    CycleResult,
    Cycles,
    Job,
    Node,
    Snapshot,
    Waiting,
    WaitReason,
)
from gpusched.core.admission.arrivals import expected_arrivals
from gpusched.core.admission.model import GuaranteeRounding
from gpusched.core.lifecycle import (
    JobContext,
    JobFacts,
    LifecycleConfig,
    Plan,
    PodFacts,
    Protection,
    QuietJob,
    Refresh,
    Settled,
    TenantMap,
    Verdict,
    WriteStatus,
    build_snapshot,
    charged_pod,
    class_not_allowed,
    core_job,
    core_levels,
    foreign_busy,
    foreign_pods,
    leaving_deadlines,
    leaving_victims,
    plan,
    protection_of,
    settle,
    submitted_job,
    tenant_map,
)
from gpusched.core.lifecycle.snapshot import Busy
from gpusched.core.lifecycle.spend import Pricing
from gpusched.core.lifecycle.status import waiting_since
from gpusched.core.runtime import JobKind, Prediction, RuntimeHistory, family_of
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import World


@dataclass
class OperatorConfig:
    """Operator settings (command-line flags)."""

    pods_ready_timeout: float = 300.0
    """Seconds an admitted gang may take for all its pods to run before it is released."""
    backoff_base: float = 10.0
    """First requeue delay after a release; doubles each time."""
    backoff_max: float = 600.0
    node_selector: dict[str, str] = field(default_factory=dict)
    """Only nodes with these labels are used."""
    max_preemption_searches: int = 32
    quota_meter_interval: float = 15.0
    """Least interval between TenantQuota status writes when only GPU-seconds changed."""
    status_refresh: float = 60.0
    """Least interval between writes that only reword a waiting job's status."""
    record_delay: float = 15.0
    """Longest an admission whose pods are created goes unwritten, so that its status is
    written once, with its pods running (0: written before its pods are created)."""
    max_node_rejections: int = 5
    """Kubelet admission refusals in a row before a job fails (0: never)."""
    max_unready_releases: int = 5
    """Releases for the pods-ready timeout on the job's own containers before it fails (0:
    never)."""
    forecast_interval: float = 60.0
    """Least seconds between two forecasts of every waiting job's expected start (a forward
    replay of the queue; reservations' starts are worked out every cycle)."""
    reservations_per_tenant: int = 0
    """Blocked jobs per tenant holding a reservation (0: none; see CycleConfig)."""
    guarantee_rounding: GuaranteeRounding = "down"
    """How guarantees are honoured in whole jobs (see CycleConfig)."""
    lending_hold_seconds: float = 900.0
    """Seconds a tenant that asked for GPUs keeps that many idle GPUs of its guarantee from
    borrowers (0: lend at once; see CycleConfig)."""
    reclaim_patience_seconds: float = 0.0
    """Seconds after its submission a job weighs reclaiming its guarantee against its wait
    (0: reclaim at once; see CycleConfig)."""
    forecast_limit: int | None = 5000
    """Most waiting jobs (in admission order) given an expected start by a forecast."""
    forecast_arrivals_window: float = 0.0
    """Seconds of past submissions a forecast expects to go on at their steady rate over as
    many ahead, per tenant and priority (:mod:`gpusched.core.admission.arrivals`; 0: nothing
    arrives)."""
    pricing: Pricing = field(default_factory=Pricing)
    """Price of a GPU-hour per GPU model: what TenantQuota spending and budgets count."""
    usage_half_life: float | None = None
    """Seconds over which a tenant's past borrowing halves in the order of borrowers (None:
    fair share has no memory)."""
    arrivals_on_top: float = 10.0
    """Seconds after a cycle that changed nothing within which jobs that arrived (and nothing
    else) are decided on top of it, as of its time, instead of deciding the whole queue again
    (:class:`~gpusched.core.admission.Cycles`; 0: only within the same instant). At most this
    long, then, a queue that only grows goes without a whole cycle."""

    def lifecycle(self) -> LifecycleConfig:
        return LifecycleConfig(
            self.pods_ready_timeout,
            self.backoff_base,
            self.backoff_max,
            self.record_delay,
            self.max_node_rejections,
            self.max_unready_releases,
        )


@dataclass(frozen=True)
class Decision:
    """What one cycle decided, and the evidence."""

    world: World
    tenants: TenantMap
    contexts: Mapping[str, JobContext]
    settled: Mapping[str, Settled]
    snapshot: Snapshot
    result: CycleResult
    plan: Plan
    wake_at: datetime | None
    """When time alone changes a decision (a deadline, a backoff, a protection ending)."""
    seconds: Mapping[str, float]
    cycle: Cycle
    """The admission cycle in the state it left, for ``explain``: good until a later
    :func:`decide` with the same memo uses its pool again (the one after next)."""
    pool: int = 0
    """Which of the memo's pools the cycle used."""
    forecast_at: datetime | None = None
    """When the expected starts ``result`` carries were forecast (reservations' excepted)."""
    forecast: Mapping[str, float | None] = field(default_factory=dict)
    """That forecast: the jobs it covered (None: it found no start for them)."""
    forecast_limit: int | None = None
    """Most waiting jobs, in admission order, that forecast gave a start."""
    played: dict[str, float | None] = field(default_factory=dict, compare=False)
    """Expected starts ``explain`` played forward over :attr:`snapshot` for one job each (jobs
    the forecast did not cover), kept so that a job asked about again is played once."""

    final: Mapping[str, GpuJobStatus] = field(default_factory=dict)
    """Statuses the planned writes give their jobs."""

    def final_status(self, key: str) -> GpuJobStatus:
        """The status the cycle leaves the job with (planned writes included)."""
        return self.final.get(key) or self.settled[key].status


#: A settled answer :meth:`Memo.settle` gives again only after checking it in full.
_CHECK = datetime.min.replace(tzinfo=UTC)

#: A settled answer no deadline ends.
_NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass
class Memo:
    """What earlier cycles settled, kept while a job, its pods and its context stay the same:
    at steady state a cycle settles only the jobs that changed (or whose deadline came).

    Each stage of a cycle goes over every job in the store, and at 10,000 queued jobs a pass
    that does real work per job costs tens of milliseconds: so each stage first asks, per job,
    whether the same objects as last cycle came in (identity, not equality), and does its work
    only for the jobs that changed, or whose time came."""

    settled: dict[str, tuple[JobFacts, JobContext, Settled, datetime]] = field(default_factory=dict)
    """Per job: what it was settled from, the answer, and until when that answer stands for
    the same job and context without a further look (:data:`_CHECK`: not without one)."""
    jobs: dict[str, tuple[Settled, JobContext, Job | None]] = field(default_factory=dict)
    contexts: dict[str, JobContext] = field(default_factory=dict)
    context_inputs: dict[str, tuple[JobFacts, Verdict | None, object, bool, datetime | None]] = (
        field(default_factory=dict)
    )
    """Per job, what its context in :attr:`contexts` was worked out from besides the tables."""
    context_tables: tuple[object, ...] = ()
    """The tables every context was worked out from (priorities, TenantQuotas, run-time
    history): while they stay the same, an unchanged job keeps its context without a lookup."""
    verdicts: dict[str, Verdict | None] = field(default_factory=dict)
    """The dry-run verdicts the last contexts were worked out with."""
    leaving: dict[str, datetime | None] = field(default_factory=dict)
    """The jobs whose victims were still leaving then, with when their pods were due gone."""
    refusals: dict[tuple[str, int], object] = field(default_factory=dict)
    """The refusals then."""
    keys: dict[str, JobFacts] = field(default_factory=dict)
    """The last cycle's jobs by key (to find the ones gone)."""
    foreign: tuple[tuple[PodFacts, ...], dict[str, str], tuple[list[Job], Busy], int] | None = None
    """The last cycle's pods, namespace owners, (pods charged as jobs, foreign pods' GPUs) and
    count of accounted jobs: kept while the pods and every job's own pods stay the same."""
    accounted: dict[str, tuple[str, str, str, int]] = field(default_factory=dict)
    """Per job taking part in admission: (namespace, UID, name, admission), which of its pods
    count as its own."""
    nodes: (
        tuple[
            NodeReader,
            tuple[Mapping[str, Any], ...],
            dict[str, Mapping[str, Any]],
            Busy,
            list[Node],
            list[dict[str, str]],
        ]
        | None
    ) = None
    """The last cycle's reader, Node objects, topologies and foreign pods' GPUs, and the
    admission core's nodes and down labels read from them."""
    merged: tuple[dict[str, tuple[Waiting, float | None, Waiting]], ...] = field(
        default_factory=lambda: ({}, {})
    )
    """Per pool, per waiting job: the cycle's entry, the forecast's start, and the entry with
    it (each pool's cycle has entries of its own)."""
    quiet: tuple[dict[str, QuietJob], ...] = field(default_factory=lambda: ({}, {}))
    """Per pool, the jobs the last plans found nothing to do for
    (:func:`~gpusched.core.lifecycle.plan`)."""
    waiting_since: dict[str, tuple[Settled, datetime | None]] = field(default_factory=dict)
    """Per job, the settled answer its current wait's start was read from, and that start
    (read again only when the answer is a new object)."""
    forecast_at: datetime | None = None
    """When the last forecast of expected starts was made."""
    forecast: dict[str, float | None] = field(default_factory=dict)
    """Its expected starts (epoch seconds) of the jobs waiting then."""
    arrivals: tuple[Job, ...] = ()
    """The jobs expected to arrive, worked out at the last forecast: every snapshot carries
    them, so ``explain`` plays the kept cycle forward as that forecast did."""
    pools: tuple[Cycles, Cycles] = field(default_factory=lambda: (Cycles(), Cycles()))
    """The admission core's pools of free GPUs, kept from cycle to cycle, used in turn: while
    one cycle decides on one, ``explain`` reads the last cycle, left in the other."""
    turn: int = 0
    """The pool the next cycle uses."""

    def next_pool(self) -> tuple[int, Cycles]:
        """The pool for the cycle about to run (and the other one for the cycle after)."""
        index = self.turn
        self.turn = 1 - index
        return index, self.pools[index]

    def context(self, key: str, context: JobContext) -> JobContext:
        """The same context object as last cycle when nothing in it changed (so the tables
        below compare by identity)."""
        found = self.contexts.get(key)
        if found is not None and found == context:
            return found
        self.contexts[key] = context
        return context

    def job_contexts(
        self,
        world: World,
        tenants: TenantMap,
        verdicts: Mapping[str, Verdict | None],
        leaving: Mapping[str, list[str]],
        history: RuntimeHistory | None = None,
        *,
        until: Mapping[str, datetime | None] | None = None,
    ) -> dict[str, JobContext]:
        """:func:`job_contexts`, working out again only the jobs whose inputs changed.

        A burst of arrivals makes a cycle every few hundred milliseconds over every job in
        the store; a job's context reads its own facts, verdict, refusal and victims leaving,
        and tables that change rarely (PriorityClasses, TenantQuotas, the run-time history:
        compared once per cycle)."""
        tables = (
            world.priorities,
            world.default_priority,
            tuple(id(q) for q in world.quotas),
            id(history),
            history.records if history is not None else 0,
        )
        same_tables = tables == self.context_tables
        self.context_tables = tables
        until = until or {}
        dirty = self._dirty(world, verdicts, leaving, until) if same_tables else None
        kept: dict[str, JobContext | None] = {}
        changed: list[JobFacts] = []
        contexts, context_inputs = self.contexts, self.context_inputs
        for job in world.jobs:
            key = job.key
            before = context_inputs.get(key)
            found = contexts.get(key)
            if (
                dirty is not None
                and found is not None
                and before is not None
                and before[0] is job
                and key not in dirty
            ):
                # Nothing it reads changed since its inputs were last compared.
                kept[key] = found
                continue
            inputs = (
                job,
                verdicts.get(key),
                world.refusals.get((job.uid, job.status.admission)),
                bool(leaving.get(key)),
                until.get(key),
            )
            if (
                same_tables
                and found is not None
                and before is not None
                and before[0] is job
                and before[1:] == inputs[1:]
            ):
                kept[key] = found
                continue
            context_inputs[key] = inputs
            kept[key] = None
            changed.append(job)
        made = (
            job_contexts(
                replace(world, jobs=tuple(changed)),
                tenants,
                verdicts,
                leaving,
                history,
                until=until,
            )
            if changed
            else {}
        )
        return {
            key: found if found is not None else self.context(key, made[key])
            for key, found in kept.items()
        }

    def _dirty(
        self,
        world: World,
        verdicts: Mapping[str, Verdict | None],
        leaving: Mapping[str, list[str]],
        until: Mapping[str, datetime | None],
    ) -> set[str] | None:
        """The jobs whose verdict or victims leaving changed since the last cycle (None: the
        refusals changed, every job is looked at), and those become the last cycle's."""
        last_verdicts, last_leaving, last_refusals = self.verdicts, self.leaving, self.refusals
        now_leaving = {key: until.get(key) for key, victims in leaving.items() if victims}
        self.verdicts, self.leaving = dict(verdicts), now_leaving
        if world.refusals != last_refusals:
            self.refusals = dict(world.refusals)
            return None
        dirty = {key for key, _ in now_leaving.items() ^ last_leaving.items()}
        if verdicts != last_verdicts:
            dirty.update(
                key
                for key in verdicts.keys() | last_verdicts.keys()
                if verdicts.get(key) != last_verdicts.get(key)
            )
        return dirty

    def settle_all(
        self,
        jobs: Mapping[str, JobFacts],
        contexts: Mapping[str, JobContext],
        now: datetime,
        config: LifecycleConfig,
    ) -> tuple[dict[str, Settled], bool]:
        """Every job settled (:meth:`settle`, with the check that keeps an answer for the same
        job and context before its time made inline: most jobs stop there); whether any job's
        own pods moved (:meth:`account`)."""
        settled: dict[str, Settled] = {}
        kept = self.settled
        moved = False
        for key, job in jobs.items():
            context = contexts[key]
            before = kept.get(key)
            if before is not None and before[0] is job and before[1] is context and now < before[3]:
                settled[key] = before[2]
                continue
            done = settled[key] = self.settle(job, context, now, config)
            moved |= self.account(job, done)
        return settled, moved

    def settle(
        self, job: JobFacts, context: JobContext, now: datetime, config: LifecycleConfig
    ) -> Settled:
        found = self.settled.get(job.key)
        if found is not None and found[0] is job and _settles_alike(found[1], context):
            done = found[2]
            if _reusable(job, done) and (done.wake_at is None or now < done.wake_at):
                if found[1] is not context:
                    self.settled[job.key] = (job, context, done, found[3])
                return done
        done = settle(job, context, now, config)
        until = (done.wake_at or _NEVER) if _reusable(job, done) else _CHECK
        self.settled[job.key] = (job, context, done, until)
        return done

    def core_job(
        self, job: JobFacts, done: Settled, context: JobContext, now: datetime
    ) -> Job | None:
        found = self.jobs.get(job.key)
        if found is not None and found[0] is done and found[1] is context:
            made = found[2]
            # An expected end that has passed moves (the overrun rule): worked out again.
            if made is None or made.expected_end is None or made.expected_end > now.timestamp():
                return made
        made = core_job(job, done, context, now)
        self.jobs[job.key] = (done, context, made)
        return made

    def account(self, job: JobFacts, done: Settled) -> bool:
        """Record which pods count as the job's own now; whether that moved."""
        before = self.accounted.get(job.key)
        if done.state is None:
            if before is None:
                return False
            del self.accounted[job.key]
            return True
        now = (job.namespace, job.uid, job.name, done.status.admission)
        if now == before:
            return False
        self.accounted[job.key] = now
        return True

    def pods_outside_jobs(
        self,
        world: World,
        settled: Mapping[str, Settled],
        tenants: TenantMap,
        accounted_moved: bool,
    ) -> tuple[list[Job], Busy]:
        """GPU pods no job accounts for (:func:`foreign_pods`): those in a tenant's namespace
        charged to it as jobs, and per node the GPUs the others hold. The last cycle's while
        the pods and every job's own pods are the same."""
        kept = self.foreign
        if (
            kept is not None
            and not accounted_moved
            and kept[0] == world.pods
            and kept[1] == tenants.owner
            and kept[3] == len(self.accounted)
        ):
            return kept[2]
        foreign = foreign_pods(world.pods, world.jobs, settled)
        charged = [
            charged_pod(pod, tenants.owner[pod.namespace])
            for pod in foreign
            if pod.namespace in tenants.owner and not pod.controller_uid
        ]
        busy_gpus = foreign_busy(
            p for p in foreign if p.namespace not in tenants.owner or p.controller_uid
        )
        self.foreign = (world.pods, dict(tenants.owner), (charged, busy_gpus), len(self.accounted))
        return charged, busy_gpus

    def read_nodes(
        self, world: World, reader: NodeReader, busy: Busy
    ) -> tuple[list[Node], list[dict[str, str]]]:
        """The admission core's nodes and the labels of nodes out of service: the last
        cycle's objects while the Node objects, topologies and foreign pods' GPUs are."""
        kept = self.nodes
        if (
            kept is not None
            and kept[0] is reader
            and kept[1] == world.nodes
            and kept[2] == world.topologies
            and kept[3] == busy
        ):
            return list(kept[4]), list(kept[5])
        found = reader.nodes(world.nodes, world.topologies, busy)
        down = reader.down_labels(world.nodes, world.topologies)
        self.nodes = (reader, world.nodes, dict(world.topologies), busy, found, down)
        return list(found), list(down)

    def with_forecast(
        self, waiting: Sequence[Waiting], pool: int, statuses: Mapping[str, Settled] | None = None
    ) -> tuple[Waiting, ...]:
        """The cycle's waiting jobs, each without an expected start of its own given the
        last forecast's (the same objects as the pool's last cycle gave, for the jobs whose
        entries are); none for a job whose wait began after that forecast (``statuses``: the
        jobs as settled this cycle): what it said of the job was of an earlier wait."""
        merged, forecast, made_at = self.merged[pool], self.forecast, self.forecast_at
        statuses = statuses if statuses is not None else {}
        out: list[Waiting] = []
        for w in waiting:
            if w.expected_start is not None or w.reason in _NEVER_STARTS:
                # A job that waits for an owner or for a node that can hold it has no start,
                # whatever the last forecast said of it while it had them.
                out.append(w)
                continue
            start = forecast.get(w.job)
            settled = statuses.get(w.job)
            if start is not None and made_at is not None and settled is not None:
                known = self.waiting_since.get(w.job)
                if known is not None and known[0] is settled:
                    since = known[1]
                else:
                    since = waiting_since(settled.status)
                    self.waiting_since[w.job] = (settled, since)
                if since is not None and since > made_at:
                    start = None
            found = merged.get(w.job)
            if found is not None and found[0] is w and found[1] == start:
                out.append(found[2])
                continue
            made = replace(w, expected_start=start)
            merged[w.job] = (w, start, made)
            out.append(made)
        return tuple(out)

    def forget_except(self, keys: Mapping[str, JobFacts]) -> None:
        """Drop jobs that are gone."""
        gone = self.keys.keys() - keys.keys() if self.keys else None
        self.keys = dict(keys)
        tables: tuple[dict[str, Any], ...] = (
            self.settled,
            self.jobs,
            self.contexts,
            self.context_inputs,
            self.accounted,
            self.waiting_since,
            *self.merged,
            *self.quiet,
        )
        for table in tables:
            for key in gone if gone is not None else [k for k in table if k not in keys]:
                table.pop(key, None)


#: Waits the forecast gives no start (:meth:`Cycle.forecast`): no tenant owns the job, or no
#: node could hold it even idle.
_NEVER_STARTS: Final = frozenset({WaitReason.NO_TENANT, WaitReason.NO_FEASIBLE_NODES})


def _reusable(job: JobFacts, done: Settled) -> bool:
    """Whether settling the same job again gives ``done`` until its deadline: settling changed
    nothing, or the job is new and its first status not written yet (thousands of them after a
    burst: the first answer, its submittedAt included, stands until it is written)."""
    return (
        (done.status is job.status or job.status.phase is None)
        and not done.actions
        and not done.needs_verdict
    )


def _settles_alike(before: JobContext, now: JobContext) -> bool:
    """Whether settling reads the same from both contexts: it never reads the predicted run
    time, which moves for every waiting job of a kind whenever one of that kind ends."""
    return before is now or replace(before, runtime=now.runtime) == now


def job_kind(job: JobFacts, tenant: str | None) -> JobKind:
    """What makes the job alike others for run-time prediction (:mod:`gpusched.core.runtime`):
    its tenant, namespace, name family (or its ``gpusched.io/family`` label) and size."""
    labels = job.job.metadata.labels if job.job is not None else None
    family = (labels or {}).get(keys.LABEL_FAMILY) or family_of(job.name)
    return JobKind(tenant or "", job.namespace, family, job.gpus)


def job_contexts(
    world: World,
    tenants: TenantMap,
    verdicts: Mapping[str, Verdict | None],
    leaving: Mapping[str, list[str]],
    history: RuntimeHistory | None = None,
    *,
    until: Mapping[str, datetime | None] | None = None,
) -> dict[str, JobContext]:
    """Per job: its tenant, priority, dry-run verdict, refusal, whether it waits for victims
    to leave (and until when their pods are due gone), and its predicted run time."""
    out: dict[str, JobContext] = {}
    quotas = {q.metadata.name: q for q in world.quotas}
    protections = {name: protection_of(quota) for name, quota in quotas.items()}
    for job in world.jobs:
        spec = job.job.spec if job.job is not None else None
        class_name = spec.priority_class_name if spec is not None else None
        priority = world.priorities.get(class_name, 0) if class_name else world.default_priority
        tenant = tenants.owner.get(job.namespace)
        declared = spec.max_runtime_seconds if spec is not None else None
        predicted = (
            history.predict(job_kind(job, tenant), declared)
            if history is not None
            else (None if declared is None else Prediction(float(declared), 0))
        )
        out[job.key] = JobContext(
            tenant=tenant,
            priority=priority,
            priority_class_missing=bool(class_name) and class_name not in world.priorities,
            verdict=verdicts.get(job.key),
            refusal=world.refusals.get((job.uid, job.status.admission)),
            leaving=bool(leaving.get(job.key)),
            leaving_until=(until or {}).get(job.key),
            protection=protections.get(tenant or "", Protection()),
            class_not_allowed=class_not_allowed(quotas.get(tenant or ""), class_name),
            runtime=predicted.seconds if predicted is not None else None,
        )
    return out


def _submitted(
    world: World, contexts: Mapping[str, JobContext], now: datetime, window: float
) -> Iterator[Job]:
    """The jobs created within ``window`` seconds before ``now``, as submitted (finished or
    not): what the forecast expects to go on arriving."""
    if window <= 0:
        return
    since = now - timedelta(seconds=window)
    # expected_arrivals keeps to the window too; this spares building the older jobs.
    for job in world.jobs:
        created = job.job.metadata.creation_timestamp if job.job is not None else None
        if created is None or created < since:
            continue
        found = submitted_job(job, contexts[job.key])
        if found is not None:
            yield found


def decide(
    world: World,
    verdicts: Mapping[str, Verdict | None],
    config: OperatorConfig,
    nodes: NodeReader,
    *,
    busy: Collection[str] = (),
    memo: Memo | None = None,
    refresh: Refresh | None = None,
    history: RuntimeHistory | None = None,
    forecast: bool | None = None,
) -> Decision:
    """Settle, admit and plan over ``world`` (``memo``: what earlier cycles settled;
    ``history``: finished jobs' run times; ``forecast``: work out every waiting job's expected
    start now, or not; None: when ``config.forecast_interval`` has passed since the last)."""
    memo = memo if memo is not None else Memo()
    t0 = time.perf_counter()
    now = world.now
    tenants = tenant_map(world.quotas)
    lifecycle = config.lifecycle()
    leaving = leaving_victims(
        world.jobs, world.pods, now=now, stuck_after=lifecycle.pods_ready_timeout
    )
    by_key: dict[str, JobFacts] = {job.key: job for job in world.jobs}
    until = leaving_deadlines(leaving, by_key, world.pods)
    contexts = memo.job_contexts(world, tenants, verdicts, leaving, history, until=until)
    memo.forget_except(by_key)
    settled, accounted_moved = memo.settle_all(by_key, contexts, now, lifecycle)
    t1 = time.perf_counter()
    jobs = [
        found
        for key, job in by_key.items()
        if (found := memo.core_job(job, settled[key], contexts[key], now)) is not None
    ]
    charged, busy_gpus = memo.pods_outside_jobs(world, settled, tenants, accounted_moved)
    if forecast is None:
        forecast = memo.forecast_at is None or (now - memo.forecast_at).total_seconds() >= (
            config.forecast_interval
        )
    if forecast or memo.forecast_at is None:
        # Also for a decision made to be played forward by ``explain`` (no forecast of its own).
        memo.arrivals = expected_arrivals(
            _submitted(world, contexts, now, config.forecast_arrivals_window),
            now.timestamp(),
            config.forecast_arrivals_window,
        )
    core_nodes, down_labels = memo.read_nodes(world, nodes, busy_gpus)
    snapshot = build_snapshot(
        [*jobs, *charged],
        world.quotas,
        core_nodes,
        now,
        CycleConfig(
            max_preemption_searches=config.max_preemption_searches,
            reservations_per_tenant=config.reservations_per_tenant,
            guarantee_rounding=config.guarantee_rounding,
            lending_hold_seconds=config.lending_hold_seconds,
            reclaim_patience_seconds=config.reclaim_patience_seconds,
        ),
        levels=core_levels(world.network),
        down_labels=down_labels,
        arrivals=memo.arrivals,
    )
    t2 = time.perf_counter()
    pool, cycles = memo.next_pool()
    # A forecast plays the cycle forward in its order, which arrivals decided on top of a
    # cycle do not take exactly: a forecast gets a whole cycle.
    cycles.arrivals_within = config.arrivals_on_top
    cycle = cycles.cycle(snapshot, whole=forecast)
    result = cycle.run()
    t3 = time.perf_counter()
    if forecast:
        memo.forecast = cycle.forecast(config.forecast_limit)
        memo.forecast_at = now
        result = cycle.result()
    elif memo.forecast:
        # Between forecasts a waiting job keeps the last one's answer (reservations excepted:
        # the cycle works their starts out every time).
        result = replace(result, waiting=memo.with_forecast(result.waiting, pool, settled))
    t_forecast = time.perf_counter()
    planned = plan(
        by_key,
        settled,
        result,
        now,
        leaving=leaving,
        busy=busy,
        refresh=refresh,
        defer=config.record_delay > 0,
        protections={key: context.protection for key, context in contexts.items()},
        quiet=memo.quiet[pool],
    )
    t4 = time.perf_counter()
    wakes = [s.wake_at for s in settled.values() if s.wake_at is not None]
    if result.wake_at is not None:
        wakes.append(datetime.fromtimestamp(result.wake_at, UTC))
    return Decision(
        world=world,
        tenants=tenants,
        contexts=contexts,
        settled=settled,
        snapshot=snapshot,
        result=result,
        plan=planned,
        wake_at=min(wakes) if wakes else None,
        seconds={
            "settle": t1 - t0,
            "snapshot": t2 - t1,
            "decide": t3 - t2,
            "forecast": t_forecast - t3,
            "plan": t4 - t_forecast,
        },
        cycle=cycle,
        pool=pool,
        forecast_at=memo.forecast_at,
        forecast=memo.forecast,
        forecast_limit=config.forecast_limit,
        final={
            action.key: action.status
            for group in planned.groups
            for action in group.actions()
            if isinstance(action, WriteStatus)
        },
    )
