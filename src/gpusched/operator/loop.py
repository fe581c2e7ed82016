"""The admission loop: wait for a change (or a deadline), decide over the store, hand the plan to
the executor, publish TenantQuota status and metrics, repeat.

A cycle starts when the watches report a change, when a write of the operator returns, when a
dry-run verdict arrives, or when time alone changes a decision (a gang's pods-ready deadline, the
end of a backoff or of a minimum runtime); at the latest every ``resync`` seconds. A burst of
changes (500 jobs applied at once) coalesces into a cycle or two. The cycle reads only the store:
no API call is made to decide, however many jobs wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import Gauge

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus
from gpusched.api.tenantquota import TenantQuota, TenantQuotaStatus
from gpusched.core.admission import AdmitReason, PreemptReason, TenantUsage
from gpusched.core.admission.tree import TenantTree
from gpusched.core.lifecycle import (
    CreatePod,
    JobFacts,
    MeteredJob,
    Refresh,
    Refusal,
    Verdict,
    merge_patch,
    needs_validation,
    quota_status,
    tenant_map,
)
from gpusched.core.lifecycle import status as st
from gpusched.core.lifecycle.tenants import (
    QuotaEvent,
    QuotaUpdate,
    meterable,
    started_unmetered,
    stopped_running,
    stopped_runs,
    tree_problems,
)
from gpusched.metrics import OperatorMetrics, set_labelled_series
from gpusched.operator import failpoints
from gpusched.operator.api import OperatorApi, Refused
from gpusched.operator.counts import JobCounts, queued_since
from gpusched.operator.decide import Decision, Memo, OperatorConfig, decide
from gpusched.operator.executor import Executor
from gpusched.operator.heap import freeze_long_lived
from gpusched.operator.leader import LeaderElector
from gpusched.operator.nodes import NodeReader
from gpusched.operator.runtimes import RuntimeBook
from gpusched.operator.store import Store, World
from gpusched.operator.templates import TemplateChecker

log = logging.getLogger(__name__)

#: Least seconds between two writes of a TenantQuota's usage (a job stopping is written at once),
#: and between two times its status is worked out: a burst of admissions makes a cycle every few
#: hundred milliseconds, and each would otherwise meter every tenant's jobs again.
QUOTA_MIN_INTERVAL = 1.0
#: Admissions and releases remembered as counted (a decision planned again after its writes
#: were refused is the same admission: counted once).
COUNTED_EVENTS = 100_000
#: Most waiting jobs whose status wording (not reason) is rewritten in one cycle.
STATUS_REFRESH_BUDGET = 100


class StuckError(RuntimeError):
    """The admission loop stopped coming round."""


@dataclass
class CycleReport:
    """What one cycle did (logs, metrics, tests)."""

    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: int = 0
    groups: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class AdmissionLoop:
    """Cycles over the store while this replica leads."""

    def __init__(
        self,
        api: OperatorApi,
        store: Store,
        config: OperatorConfig | None = None,
        metrics: OperatorMetrics | None = None,
        *,
        leader: LeaderElector | None = None,
        runtimes: RuntimeBook | None = None,
        resync: float = 30.0,
        debounce: float = 0.1,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.store = store
        self.config = config or OperatorConfig()
        self.metrics = metrics or OperatorMetrics()
        self.leader = leader
        self.runtimes = runtimes
        self.resync = resync
        self.debounce = debounce
        self.clock = clock
        self.nodes = NodeReader(self.config.node_selector)
        self.memo = Memo()
        self.counts = JobCounts()
        self._checked: dict[str, JobFacts] = {}
        """Per job, the object last found to need no dry run (needing one is a property of
        the object alone)."""
        self._counted_tenants: set[str] = set()
        """Tenants whose counters exist (made once, at 0)."""
        self._counted_events: OrderedDict[tuple[str, str, int, str], None] = OrderedDict()
        """Admissions and releases counted (:meth:`_first_time`)."""
        self.checker = TemplateChecker(api)
        self.executor = Executor(
            api,
            store,
            self.metrics,
            leading=self.leading,
            on_refused=self._refused,
            clock=clock,
            refresh_seconds=self.config.status_refresh,
        )
        self.cycles = 0
        self.turned = time.monotonic()
        """When the loop last came round (it does at least every ``resync`` seconds)."""
        self._published = False
        """Whether this replica's job and tenant gauges hold values (it led a cycle)."""
        self.heap_frozen = False
        """Whether the heap was frozen after the first cycle (:mod:`gpusched.operator.heap`)."""
        self._last_seconds = 0.0
        self._wake_at: datetime | None = None
        self._quota_due: datetime | None = None
        self._quotas_at = -math.inf
        """When (monotonic) every TenantQuota's status was last worked out."""
        self._quotas_seen: dict[str, TenantQuota] = {}
        """The TenantQuota objects whose status was worked out then (a new one is due at once)."""
        self._quota_written: dict[str, float] = {}
        self._quota_busy: set[str] = set()
        self._carried: dict[str, list[MeteredJob]] = {}
        """Per TenantQuota, runs that stopped while its status could not be written, for its
        next metering."""
        self._user_series: dict[str, set[str]] = {}
        """Tenant -> users with per-user series published (to drop those that leave)."""
        self._tenants: set[str] = set()
        """The TenantQuotas of the last cycle counted (a deleted one's series go)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.last: Decision | None = None
        """The last cycle's decision while this replica leads (``explain`` answers from it)."""
        self._pool_locks = (asyncio.Lock(), asyncio.Lock())
        """Per kept pool: held by the cycle deciding on it, and by readers of the decision
        that left it (:meth:`last_decision`)."""
        self._pool_owner: list[Decision | None] = [None, None]
        """Per kept pool: the decision whose cycle last used it."""

    def leading(self) -> bool:
        return self.leader is None or self.leader.leading

    @contextlib.asynccontextmanager
    async def last_decision(self) -> AsyncIterator[Decision | None]:
        """The last cycle's decision, held so that no cycle takes its pool back meanwhile
        (None: this replica does not lead, or has not decided yet). The next cycle decides on
        the other pool, so a reader never waits for a cycle, only for a cycle after next."""
        while (decision := self.last) is not None and self.leading():
            lock = self._pool_locks[decision.pool]
            await lock.acquire()
            if self._pool_owner[decision.pool] is decision:
                try:
                    yield decision
                finally:
                    lock.release()
                return
            lock.release()  # a later cycle used the pool meanwhile: read the newer decision
        yield None

    def health(self, stuck_after: float) -> dict[str, Any]:
        """What the liveness probe reports; raises :class:`StuckError` when the loop has not
        come round for ``stuck_after`` seconds (a cycle or a write that never returns: the
        process answers HTTP but admits nothing, and only a restart helps)."""
        since = time.monotonic() - self.turned
        if since > stuck_after:
            raise StuckError(f"the admission loop has not come round for {since:.0f}s")
        return {
            "leading": self.leading(),
            "ready": self.store.ready,
            "cycles": self.cycles,
            "secondsSinceLoop": round(since, 1),
            "jobs": len(self.store.jobs),
        }

    # --- the loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Cycle until ``stop`` is set."""
        while not stop.is_set():
            self.turned = time.monotonic()
            await self._wait(stop)
            if stop.is_set():
                break
            if not self.leading():
                self.last = None
                if self._published:
                    self.metrics.stand_by()
                    self._published = False
                self.metrics.leading.set(0)
                if self.runtimes is not None:
                    self.runtimes.loaded = False  # the leader writes it: read again on leading
                continue
            self.metrics.leading.set(1)
            if not self.store.ready:
                continue
            try:
                # Read on leading; a connection lost on the way is retried like a cycle that
                # failed (the history is the persisted one, not one started over).
                if self.runtimes is not None and not self.runtimes.loaded:
                    await self.runtimes.load()
                self._published = True
                report = await self.cycle()
            except Exception:
                log.exception("admission cycle failed; retrying")
                await _sleep_or_stop(stop, 1.0)
                continue
            if not self.heap_frozen:
                self.heap_frozen = True
                started = time.perf_counter()
                frozen = freeze_long_lived()
                log.info(
                    "froze %d long-lived objects after the first cycle (%.0f ms)",
                    frozen,
                    (time.perf_counter() - started) * 1000,
                )
            if report.admitted or report.preempted:
                log.info(
                    "cycle %d: admitted %d, preempted %s, %d waiting, %d groups (%s)",
                    self.cycles,
                    len(report.admitted),
                    report.preempted,
                    report.waiting,
                    report.groups,
                    ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in report.seconds.items()),
                )
        await self.executor.drain()

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until something changed, a deadline passed, the lease changed hands, or resync."""
        timeout = self.resync
        if self._wake_at is not None:
            timeout = min(timeout, max(0.0, (self._wake_at - self.clock()).total_seconds()))
        waiters = [
            asyncio.ensure_future(self.store.changed.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        if self.leader is not None:
            waiters.append(asyncio.ensure_future(self.leader.changed.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.leader is not None:
            self.leader.changed.clear()
        # Changes keep coming under load: a cycle waits at least as long as the last one took,
        # so deciding never takes more than about half the process's time and bursts coalesce.
        await _sleep_or_stop(stop, max(self.debounce, min(self._last_seconds, 1.0)))

    async def cycle(self) -> CycleReport:
        """One cycle: decide over the store, start the writes, publish."""
        started = time.perf_counter()
        await failpoints.hang("cycle-hangs")
        self.store.changed.clear()
        world = self.store.world(self.clock())
        verdicts = await self._verdicts(world)
        busy = frozenset(self.executor.busy)
        refresh = Refresh(
            self.executor.recently_written(),
            STATUS_REFRESH_BUDGET,
            reports=self.executor.reports_room(),
        )
        async with self._pool_locks[self.memo.turn]:
            decision = await asyncio.to_thread(
                lambda: decide(
                    world,
                    verdicts,
                    self.config,
                    self.nodes,
                    busy=busy,
                    memo=self.memo,
                    refresh=refresh,
                    history=self.runtimes.history if self.runtimes is not None else None,
                )
            )
            self._pool_owner[decision.pool] = self.last = decision
        report = CycleReport(seconds=dict(decision.seconds))
        self._quota_due = None
        if not self.leading():
            return report
        report.groups = self.executor.submit(list(decision.plan.groups))
        if decision.plan.deferred_reports:
            self.metrics.reports_deferred.inc(decision.plan.deferred_reports)
        report.admitted = [a.job for a in decision.plan.admitted]
        report.preempted = [v.victim for a in decision.plan.admitted for v in a.victims]
        report.waiting = len(decision.result.waiting)
        self._publish_quotas(decision)
        self._record_runtimes(decision)
        wakes = [t for t in (decision.wake_at, self._quota_due) if t is not None]
        self._wake_at = min(wakes) if wakes else None
        self._count(decision)
        self.cycles += 1
        report.seconds["cycle"] = self._last_seconds = time.perf_counter() - started
        for stage, seconds in report.seconds.items():
            self.metrics.cycle_seconds.labels(stage).observe(seconds)
        return report

    def _record_runtimes(self, decision: Decision) -> None:
        book = self.runtimes
        if book is None:
            return
        book.observe(decision)
        self.metrics.runtime_history_kinds.set(len(book.history))
        if book.due():
            task = asyncio.create_task(self._save_runtimes(book))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _save_runtimes(self, book: RuntimeBook) -> None:
        try:
            await book.save()
        except Exception as err:
            self.metrics.api_errors.labels("runtime-history").inc()
            log.warning("run-time history not written: %s", err)

    async def _verdicts(self, world: World) -> dict[str, Verdict | None]:
        """Dry-run verdicts of the jobs to be checked before they are queued."""
        owners = tenant_map(world.quotas).owner
        checked = self._checked
        needed = []
        for job in world.jobs:
            if checked.get(job.key) is job:
                continue  # this same object needed no check last time
            if job.job is not None and needs_validation(job):
                needed.append((job.key, job.job, owners.get(job.namespace)))
            else:
                checked[job.key] = job
        if len(checked) > len(world.jobs):
            present = {job.key for job in world.jobs}
            for key in [k for k in checked if k not in present]:
                del checked[key]
        return await self.checker.verdicts(needed)

    def _refused(self, action: CreatePod, refusal: Refusal) -> None:
        """A pod was refused as invalid: other jobs with the same template are checked again."""
        if not refusal.invalid:
            return
        facts = self.store.jobs.get(action.job_key)
        if facts is not None and facts.job is not None:
            owners = tenant_map(self.store.quotas.values()).owner
            self.checker.forget(facts.job, owners.get(facts.namespace))

    # --- TenantQuota status and metrics ----------------------------------------------------

    def _quotas_due(self, decision: Decision) -> set[str] | None:
        """The TenantQuotas whose status this cycle works out (None: every one).

        Every one at most once per :data:`QUOTA_MIN_INTERVAL` (writes are that far apart
        anyway); before that, only a TenantQuota that is new or changed, and the tenants of a
        job that stopped running in this cycle (with any parent above them): its GPU-seconds
        up to now are counted only from the status it had when the cycle began; and those of a
        job whose start this cycle dates from before their last metering. Anything else
        (usage moved by admissions, by a job deleted while it ran) waits at most the interval:
        a cycle that leaves every tenant out wakes the loop again when it is up."""
        if time.monotonic() - self._quotas_at >= QUOTA_MIN_INTERVAL:
            return None
        due = {
            q.metadata.name or ""
            for q in decision.world.quotas
            if self._quotas_seen.get(q.metadata.name or "") is not q
        }
        tree = TenantTree.of(decision.snapshot.tenants)
        metered_at = {
            q.metadata.name or "": q.status.last_metered_at for q in decision.world.quotas
        }
        for job in decision.world.jobs:
            tenant = decision.contexts[job.key].tenant
            if tenant is None:
                continue
            after = decision.final_status(job.key)
            if stopped_running(job.status, after) or any(
                started_unmetered(job.status, after, metered_at.get(level))
                for level in tree.levels(tenant)
            ):
                due.add(tenant)
        if due:
            due |= {level for name in list(due) for level in tree.levels(name)}
        when = decision.world.now + timedelta(
            seconds=max(0.0, self._quotas_at + QUOTA_MIN_INTERVAL - time.monotonic())
        )
        self._quota_due = when if self._quota_due is None else min(self._quota_due, when)
        return due

    def _publish_quotas(self, decision: Decision) -> None:
        wanted = self._quotas_due(decision)
        if wanted is not None and not wanted:
            return
        if wanted is None:
            self._quotas_at = time.monotonic()
            self._quotas_seen = {}
        now = decision.world.now
        usage = {u.name: u for u in decision.result.tenants}
        models = {n.name: n.model or "" for n in decision.snapshot.nodes}
        # Only jobs that ran count towards GPU-seconds: those running, and those that finished
        # after the earliest time a tenant was last metered (the others were counted then).
        # Kept per tenant, so a tenant's status costs its own jobs, not the cluster's.
        last = [q.status.last_metered_at for q in decision.world.quotas]
        oldest = min((t for t in last if t is not None), default=None)
        metered: dict[str | None, list[tuple[int, MeteredJob]]] = {}
        for index, job in enumerate(decision.world.jobs):
            after = decision.final_status(job.key)
            if not meterable(job.status, oldest, after):
                continue
            owner = decision.contexts[job.key].tenant
            metered.setdefault(owner, []).append(
                (
                    index,
                    MeteredJob(
                        tenant=owner,
                        gpus=job.gpus,
                        before=job.status,
                        after=after,
                        submitter=job.submitter,
                        models=_gpus_by_model(job.status, models),
                    ),
                )
            )
        tree = TenantTree.of(decision.snapshot.tenants)
        members: dict[str, set[str]] = {}
        for tenant in decision.snapshot.tenants:
            for level in tree.levels(tenant.name):
                members.setdefault(level, set()).add(tenant.name)
        problems = tree_problems(decision.world.quotas)
        for quota in decision.world.quotas:
            name = quota.metadata.name or ""
            if wanted is not None and name not in wanted:
                continue
            mine = members.get(name, set()) | {name}
            # In the order of the store, as if read from one list (sums stay the same).
            jobs = sorted((j for t in mine for j in metered.get(t, ())), key=lambda j: j[0])
            stopped = stopped_runs([job for _, job in jobs], now)
            if name in self._quota_busy:
                # Its last status is still being written: the runs that stopped now are
                # counted at its next metering (next cycle their status no longer says so).
                self._carried.setdefault(name, []).extend(stopped)
                continue
            self._quotas_seen[name] = quota
            found = usage.get(name)
            if found is None:
                continue
            carried = self._carried.pop(name, [])
            update = quota_status(
                quota,
                found,
                decision.tenants.conflicts.get(name, []),
                [*(job for _, job in jobs), *carried],
                now,
                pricing=self.config.pricing,
                half_life=self.config.usage_half_life,
                members=members.get(name, ()),
                tree_problem=problems.get(name),
            )
            self._publish_spend(quota, update)
            stale = time.monotonic() - self._quota_written.get(name, 0.0)
            if not update.changed and stale < self.config.quota_meter_interval:
                self.metrics.gpu_seconds.labels(name).set(quota.status.gpu_seconds)
                continue
            if update.changed and not update.urgent and stale < QUOTA_MIN_INTERVAL:
                # Usage moves with every admission under load: written at most once a second.
                due = now + timedelta(seconds=QUOTA_MIN_INTERVAL - stale)
                self._quota_due = due if self._quota_due is None else min(self._quota_due, due)
                continue
            patch = merge_patch(quota.status.to_k8s(), update.status.to_k8s())
            if patch is None:
                continue
            self._quota_busy.add(name)
            task = asyncio.create_task(
                self._write_quota(
                    name,
                    quota.metadata.uid or "",
                    update.status,
                    patch,
                    update.events,
                    unwritten=[*carried, *stopped],
                )
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _publish_spend(self, quota: TenantQuota, update: QuotaUpdate) -> None:
        """The tenant's spending, budget caps, recent borrowing and per-user figures."""
        m = self.metrics
        name = quota.metadata.name or ""
        status = update.status
        for window, hours, cost in (
            ("period", status.period_gpu_hours, status.period_cost),
            ("7d", status.gpu_hours_7d, status.cost_7d),
            ("30d", status.gpu_hours_30d, status.cost_30d),
        ):
            m.tenant_cost.labels(name, window).set(cost)
            m.tenant_gpu_hours.labels(name, window).set(hours)
        budget = quota.spec.budget
        for cap, value in (
            ("soft", budget.soft_cap if budget else None),
            ("hard", budget.hard_cap if budget else None),
        ):
            if value is not None:
                m.tenant_budget_cap.labels(name, cap).set(value)
            else:
                with contextlib.suppress(KeyError):
                    m.tenant_budget_cap.remove(name, cap)
        m.tenant_recent_borrowed.labels(name).set(status.recent_borrowed_gpus)
        users = {u.name for u in status.users}
        for user in status.users:
            m.user_gpus.labels(name, user.name).set(user.gpus)
            m.user_cost.labels(name, user.name).set(user.cost)
        for gone in self._user_series.get(name, set()) - users:
            for gauge in (m.user_gpus, m.user_cost):
                with contextlib.suppress(KeyError):
                    gauge.remove(name, gone)
        self._user_series[name] = users

    async def _write_quota(
        self,
        name: str,
        uid: str,
        status: TenantQuotaStatus,
        patch: dict[str, Any],
        events: Sequence[QuotaEvent] = (),
        *,
        unwritten: Sequence[MeteredJob] = (),
    ) -> None:
        """Write a TenantQuota's status; when it is not written, the runs that stopped since
        its last metering (``unwritten``) are kept for its next one."""
        written = False
        try:
            answer = await self.api.patch_quota_status(name, uid, patch)
            if not isinstance(answer, Refused):
                written = True
                self.store.upsert_quota(answer)
                self._quota_written[name] = time.monotonic()
                self.metrics.gpu_seconds.labels(name).set(status.gpu_seconds)
                reference = {
                    "apiVersion": keys.API_VERSION,
                    "kind": "TenantQuota",
                    "name": name,
                    "uid": uid,
                }
                for event in events:
                    await self.api.event(
                        reference,
                        warning=event.warning,
                        reason=event.reason,
                        message=event.message,
                        now=datetime.now(UTC),
                    )
        except Exception as err:
            self.metrics.api_errors.labels("quota-status").inc()
            log.warning("status of TenantQuota %s not written: %s", name, err)
        finally:
            self._quota_busy.discard(name)
            if not written and unwritten:
                self._carried.setdefault(name, [])[:0] = unwritten

    def _first_time(self, event: tuple[str, str, int, str]) -> bool:
        """Whether this replica counts ``event`` (an admission or a release of one admission
        of a job) for the first time; the last :data:`COUNTED_EVENTS` are remembered."""
        if event in self._counted_events:
            return False
        self._counted_events[event] = None
        while len(self._counted_events) > COUNTED_EVENTS:
            self._counted_events.popitem(last=False)
        return True

    def _count(self, decision: Decision) -> None:
        m = self.metrics
        now = decision.world.now
        counts = self.counts
        for requeue in counts.update(decision):
            if self._first_time(("requeue", requeue.uid, requeue.admission, requeue.reason)):
                m.requeues.labels(requeue.tenant, requeue.reason).inc()
        set_labelled_series(m.jobs, {key: float(n) for key, n in counts.phases.items()})
        jobs = {j.key: j for j in decision.world.jobs} if decision.plan.admitted else {}
        for admission in decision.plan.admitted:
            job = jobs[admission.job]
            # Planned again after its writes were refused (a victim's status moved, the
            # Lease lapsed): the same admission of the job, counted once.
            if not self._first_time(("admit", job.uid, job.status.admission + 1, "")):
                continue
            m.admissions.labels(admission.tenant, admission.reason.value).inc()
            for victim in admission.victims:
                m.preemptions.labels(victim.victim_tenant or "", victim.reason.value).inc()
                m.preempted_gpu_seconds.labels(victim.victim_tenant or "", victim.reason.value).inc(
                    victim.gpu_seconds_lost
                )
            told = job.status.first_expected_start
            if told is not None:
                error = (now - told).total_seconds()
                m.expected_start_error.labels("late" if error > 0 else "early").observe(abs(error))
            since = queued_since(job.status)
            if since is not None:
                priority = decision.contexts[admission.job].priority
                m.queue_wait.labels(admission.tenant, str(priority)).observe(
                    max(0.0, (now - since).total_seconds())
                )
        specs = {q.metadata.name: q.spec for q in decision.world.quotas}
        for u in decision.result.tenants:
            if u.name not in self._counted_tenants:
                self._counted_tenants.add(u.name)
                # Each tenant's counters exist from its first cycle at 0, so its first
                # admission, preemption or requeue shows in rate() and increase().
                for admit in AdmitReason:
                    m.admissions.labels(u.name, admit.value)
                for preempt in PreemptReason:
                    m.preemptions.labels(u.name, preempt.value)
                    m.preempted_gpu_seconds.labels(u.name, preempt.value)
                for released in (
                    st.Reason.PODS_READY_TIMEOUT,
                    st.Reason.PODS_LOST,
                    st.Reason.PODS_REFUSED,
                ):
                    m.requeues.labels(u.name, released.value)
            m.gpus_used.labels(u.name).set(u.used)
            m.gpus_borrowed.labels(u.name).set(u.borrowed)
            m.gpus_guaranteed.labels(u.name).set(
                specs[u.name].guaranteed_gpus if u.name in specs else 0
            )
            m.fair_share.labels(u.name).set(u.fair_share)
        named = [u.name for u in decision.result.tenants]
        pending = counts.pending(named)
        oldest = counts.oldest_wait(named, now)
        reservations: dict[str, float] = dict.fromkeys(pending, 0)
        idle: dict[str, float] = dict.fromkeys(pending, 0)
        for reservation in decision.result.reservations:
            reservations[reservation.tenant] = reservations.get(reservation.tenant, 0) + 1
            idle[reservation.tenant] = idle.get(reservation.tenant, 0) + reservation.idle_gpus
        set_tenant_series(m.reservations, reservations)
        set_tenant_series(m.reserved_idle_gpus, idle)
        set_tenant_series(
            m.lending_hold_gpus, {u.name: float(u.lending_hold) for u in decision.result.tenants}
        )
        set_tenant_series(m.gpus_pending, pending)
        set_tenant_series(m.below_guarantee, below_guarantee(decision.result.tenants))
        set_tenant_series(m.oldest_wait, oldest)
        set_series(m.largest_free_domain, "level", dict(decision.result.largest_free))
        live = {q.metadata.name or "" for q in decision.world.quotas}
        if live != self._tenants:  # a TenantQuota came or went
            self._tenants = live
            m.forget_tenants(live)
            for gone in set(self._user_series) - live:
                del self._user_series[gone]


def below_guarantee(tenants: Sequence[TenantUsage]) -> dict[str, float]:
    """1 for each tenant holding less than its guarantee while it wants more and another
    tenant borrows, else 0 (the simulator's "below guarantee" figure, live)."""
    borrowing = {u.name for u in tenants if u.borrowed > 0}
    return {
        u.name: float(u.used < min(u.guaranteed, u.demand) and bool(borrowing - {u.name}))
        for u in tenants
    }


def set_tenant_series(gauge: Gauge, values: Mapping[str, float]) -> None:
    """Set one series per tenant and drop the others, never leaving a scrape without the
    tenants that stay (a gap would reset alerts' `for` timers)."""
    set_series(gauge, "tenant", values)


def set_series(gauge: Gauge, label: str, values: Mapping[str, float]) -> None:
    """Set one series per value of the gauge's one ``label`` and drop the others."""
    set_labelled_series(gauge, {(key,): value for key, value in values.items()})


def _gpus_by_model(status: GpuJobStatus, models: Mapping[str, str]) -> dict[str, int]:
    """GPU model -> GPUs of the job's placement (model "" where a node's is not known)."""
    out: dict[str, int] = {}
    for replica in status.placement:
        model = models.get(replica.node, "")
        out[model] = out.get(model, 0) + len(replica.gpu_indices)
    return out


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
