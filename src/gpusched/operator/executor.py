"""Applies the groups of actions a cycle planned: in order within a group, groups in parallel.

Decisions go first under load. At most :data:`REPORTS_IN_FLIGHT` waiting jobs' reports (their
status and events, :attr:`~gpusched.core.lifecycle.Urgency.REPORT`) are in flight at once, or
:data:`REPORTS_IN_FLIGHT_IDLE` once nothing else is in flight and no admission or preemption
has gone out for :data:`QUIET_SECONDS`: the loop plans only as many as
:meth:`Executor.reports_room` says, and the others are planned again in a later cycle (their
status still differs). Without the bound, a burst of thousands of new
jobs queued thousands of status writes ahead of the admissions' pod creations, and every job
with a report in flight was busy, so the cycle could not admit it either.

Before a group goes out, everything it will write is assumed in the store (see
:mod:`gpusched.operator.store`), and its jobs are busy: the next cycle, which may run while the
group is in flight, accounts them as the writes will leave them and plans nothing for them. Each
write carries its preconditions (UID; for decisions the resourceVersion they were taken on), so a
decision taken on a stale read is refused by the API server and decided again next cycle. A step
whose required write failed ends its group; what the group did not do is dropped from the store.

Crash points (``GPUSCHED_FAILPOINTS``) let the tests kill the process between any two writes of an
admission or a preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from gpusched.core.lifecycle import (
    Action,
    CreatePod,
    DeletePod,
    Group,
    PatchPod,
    Refusal,
    Stage,
    Urgency,
    WriteStatus,
)
from gpusched.metrics import OperatorMetrics
from gpusched.operator import failpoints
from gpusched.operator.api import OperatorApi, Refused
from gpusched.operator.store import Store

log = logging.getLogger(__name__)

#: Most groups of :attr:`Urgency.REPORT` in flight at once while admissions, preemptions or
#: records are (a quarter of the default request slots: the rest stay free for them).
REPORTS_IN_FLIGHT = 8
#: ... and once none has gone out for :data:`QUIET_SECONDS`: as many as the request slots. A
#: cycle over a long queue takes most of a second, so 8 reports a cycle left 10,000 new jobs
#: that could not be admitted without a first status for 20 minutes.
REPORTS_IN_FLIGHT_IDLE = 32
#: Seconds without an admission or preemption sent before reports get every request slot.
#: While jobs keep being admitted, reports stay few: a report not yet sent is often never needed
#: (the job is admitted first), and under steady churn (Kueue's benchmark) sending more of them
#: only loaded the API server: with 32 whenever nothing was in flight, 8,892 of the 15,000 jobs
#: were still pending after 857 s, against about 7,400 with this rule.
QUIET_SECONDS = 10.0

#: Crash point reached after each stage of a group, when the group did that stage.
STAGE_POINTS = {
    Stage.MARK_VICTIMS: "preemption-after-victims-marked",
    Stage.EVICT: "preemption-after-evict",
    Stage.ADMIT: "admission-after-status",
}


class Executor:
    """Runs groups as tasks of the operator's event loop."""

    def __init__(
        self,
        api: OperatorApi,
        store: Store,
        metrics: OperatorMetrics,
        *,
        leading: Callable[[], bool] = lambda: True,
        on_refused: Callable[[CreatePod, Refusal], None] | None = None,
        requests: int = 32,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        refresh_seconds: float = 60.0,
        reports: int = REPORTS_IN_FLIGHT,
        reports_idle: int = REPORTS_IN_FLIGHT_IDLE,
        quiet_seconds: float = QUIET_SECONDS,
        ticks: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.store = store
        self.metrics = metrics
        self.leading = leading
        self.on_refused = on_refused
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self.busy: set[str] = set()
        """Jobs with a group in flight."""
        self._slots = asyncio.Semaphore(requests)
        self.reports_limit = reports
        self.reports_idle_limit = reports_idle
        self.reporting = 0
        """Groups of :attr:`Urgency.REPORT` in flight."""
        self.deciding = 0
        """Other groups in flight (admissions, preemptions, records)."""
        self.quiet_seconds = quiet_seconds
        self.ticks = ticks
        self._decided_at: float | None = None
        """When an admission or preemption last went out (``ticks``)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._written: dict[str, float] = {}

    # --- submitting ----------------------------------------------------------------------

    def submit(self, groups: list[Group]) -> int:
        """Assume and start every group; returns how many were started."""
        started = 0
        now = time.monotonic()
        for group in groups:
            if not group.steps or group.jobs & self.busy:
                continue
            for action in group.actions():
                if isinstance(action, WriteStatus) and not action.deferred:
                    self._written[action.key] = now
            self.busy |= group.jobs
            if group.urgency is Urgency.REPORT:
                self.reporting += 1
            else:
                self.deciding += 1
            if group.urgency is Urgency.DECIDE:
                self._decided_at = self.ticks()
            undo = [self._assume(action) for action in group.actions()]
            task = asyncio.create_task(self._run(group, undo))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    def reports_room(self) -> int:
        """How many more waiting jobs' reports may go out now: few while admissions,
        preemptions or records are in flight or jobs were admitted lately (they go first), as
        many as the request slots once it is quiet."""
        quiet = not self.deciding and (
            self._decided_at is None or self.ticks() - self._decided_at >= self.quiet_seconds
        )
        limit = self.reports_idle_limit if quiet else self.reports_limit
        return max(0, limit - self.reporting)

    def recently_written(self) -> set[str]:
        """Jobs whose status was written within ``refresh_seconds``."""
        now = time.monotonic()
        for key in [k for k, at in self._written.items() if now - at >= self.refresh_seconds]:
            del self._written[key]
        return set(self._written)

    def _assume(self, action: Action) -> Callable[[], None] | None:
        """Record in the store what the action will make true; returns how to take it back."""
        store = self.store
        if isinstance(action, WriteStatus) and action.deferred:
            # Kept whatever becomes of the group: the pods it creates carry this admission, and
            # a refusal of one of them is judged against it.
            store.defer_status(action.key, action.status, action.resource_version or "")
            return None
        if isinstance(action, WriteStatus):
            store.assume_status(action.key, action.status)
            return lambda: store.settle_status(action.key, action.status, None)
        if isinstance(action, CreatePod):
            assumed = store.assume_pod(action.manifest, self.clock())
            return lambda: store.settle_pod(assumed, None)
        if isinstance(action, DeletePod):
            job = self._job_of_pod(action)
            deleting = store.assume_deleting(action.namespace, job, action.name) if job else None
            if deleting is None:
                return None
            return lambda: store.undo_deleting(deleting)
        return None

    def _job_of_pod(self, action: DeletePod) -> str | None:
        for (namespace, job), by_name in self.store.job_pods.items():
            if namespace == action.namespace and action.name in by_name:
                return job
        return None

    # --- running -------------------------------------------------------------------------

    async def _run(self, group: Group, undo: list[Callable[[], None] | None]) -> None:
        # Each action settles its own assumption when it returns; those never sent are taken
        # back at the end.
        outstanding = dict(zip(map(id, group.actions()), undo, strict=True))
        try:
            for step in group.steps:
                if not self.leading():
                    log.warning("not leading any more: dropping the rest of a group")
                    break
                results = await asyncio.gather(
                    *(self._apply(a, outstanding.pop(id(a), None)) for a in step.actions)
                )
                point = STAGE_POINTS.get(step.stage)
                if point is not None and step.actions:
                    failpoints.reach(point)
                if step.required and not all(results):
                    break
        finally:
            for take_back in outstanding.values():
                if take_back is not None:
                    take_back()
            self.busy -= group.jobs
            if group.urgency is Urgency.REPORT:
                self.reporting -= 1
            else:
                self.deciding -= 1
            self.store.wake()

    async def _apply(self, action: Action, undo: Callable[[], None] | None) -> bool:
        """One action; True when it took effect (or had already)."""
        try:
            async with self._slots:
                if not self.leading():
                    # The Lease lapsed while this write waited for a slot: another replica may
                    # lead now, and only a leader writes.
                    if undo is not None:
                        undo()
                    return False
                return await self._call(action)
        except Exception as err:  # connection errors, timeouts, unexpected answers
            self.metrics.api_errors.labels(type(action).__name__).inc()
            log.warning("%s failed: %s", type(action).__name__, err)
            if undo is not None:
                undo()
            return False

    async def _call(self, action: Action) -> bool:
        if isinstance(action, WriteStatus):
            return action.deferred or await self._write_status(action)
        if isinstance(action, CreatePod):
            return await self._create_pod(action)
        if isinstance(action, DeletePod):
            return await self._delete_pod(action)
        if isinstance(action, PatchPod):
            patched = await self.api.patch_pod(
                action.namespace, action.name, action.uid, action.labels, action.annotations
            )
            if isinstance(patched, Refused):
                return patched.stale
            self.store.upsert_job_pod(patched)
            return True
        await self.api.event(
            action.reference,
            warning=action.warning,
            reason=action.reason,
            message=action.message,
            now=self.clock(),
        )
        return True

    async def _write_status(self, action: WriteStatus) -> bool:
        answer = await self.api.patch_job_status(
            action.namespace, action.name, action.uid, dict(action.patch), action.resource_version
        )
        if isinstance(answer, Refused):
            self.metrics.api_errors.labels("job-status").inc()
            self.store.settle_status(action.key, action.status, None, refused=True)
            return False
        self.store.settle_status(action.key, action.status, answer)
        return True

    async def _create_pod(self, action: CreatePod) -> bool:
        store = self.store
        created = await self.api.create_pod(action.manifest)
        assumed = store.pod(action.namespace, action.job_key.partition("/")[2], action.name)
        if isinstance(created, Refused):
            if assumed is not None and assumed.version == 0:
                store.settle_pod(assumed, None)
            if created.code in (400, 403, 422):
                refusal = Refusal(action.admission, created.code, created.message)
                store.record_refusal(action.job_uid, action.admission, refusal)
                if self.on_refused is not None:
                    self.on_refused(action, refusal)
            return False
        if assumed is not None:
            store.settle_pod(assumed, created)
        else:
            store.upsert_job_pod(created)
        failpoints.reach("admission-after-first-pod")
        return True

    async def _delete_pod(self, action: DeletePod) -> bool:
        store = self.store
        deleted = await self.api.delete_pod(
            action.namespace, action.name, action.uid, action.grace_seconds
        )
        job = self._job_of_pod(action)
        if isinstance(deleted, Refused):
            if job is not None:
                if deleted.code == 404:
                    store.forget_pod(action.namespace, job, action.name)
                else:  # another pod of that name now (UID precondition): the watch brings it
                    pod = store.pod(action.namespace, job, action.name)
                    if pod is not None and pod.deleting:
                        store.undo_deleting(pod)
            return True
        return True  # the pod stays assumed terminating until the watch reports it gone

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for the groups in flight (shutdown)."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._tasks, return_exceptions=True), timeout
                )

    @property
    def in_flight(self) -> int:
        return len(self._tasks)
