"""GpuJob status transitions: phase, reason, message and the standard conditions.

Each function takes the current status and returns the next one; the loop writes it only when it
differs. Conditions keep their ``lastTransitionTime`` while their status does not change.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import (
    GpuJobStatus,
    JobPhase,
    PreemptionRecord,
    ReplicaPlacement,
    ReservedGpus,
)
from gpusched.api.meta import Condition, ConditionStatus
from gpusched.core.admission import (
    Admission,
    Preemption,
    ReplicaPlan,
    Reservation,
    WaitReason,
)
from gpusched.core.lifecycle.facts import JobFacts, PodFacts
from gpusched.core.placement import SCOPES, scope_rank

#: Topology classes, tightest first (as the placement engine ranks them).
SCOPE_ORDER = [scope.value for scope in SCOPES]


class Cond(StrEnum):
    """Condition types of a GpuJob."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    PODS_READY = "PodsReady"
    PREEMPTED = "Preempted"
    FINISHED = "Finished"


class Reason(StrEnum):
    """Machine reasons the operator writes besides the core's wait and admit reasons."""

    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    PRIORITY_CLASS_NOT_ALLOWED = "PriorityClassNotAllowed"
    QUEUED = "Queued"
    WAITING_FOR_PREEMPTION = "WaitingForPreemption"
    PLACED = "Placed"
    WAITING_FOR_PODS = "WaitingForPods"
    RUNNING = "Running"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    PODS_REFUSED = "PodsRefused"
    PODS_LOST = "PodsLost"
    PODS_REJECTED_BY_NODE = "PodsRejectedByNode"
    PREEMPTED_BY = "PreemptedBy"
    REQUEUED = "Requeued"
    SUCCEEDED = "Succeeded"
    POD_FAILED = "PodFailed"
    MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
    SUSPENDED = "Suspended"


#: Reasons of a job that was never queued because its spec cannot run.
INVALID_REASONS = frozenset(
    {
        Reason.INVALID_POD_TEMPLATE,
        Reason.PRIORITY_CLASS_NOT_FOUND,
        Reason.PRIORITY_CLASS_NOT_ALLOWED,
    }
)
#: Invalid reasons that something besides the job's spec can remove (a PriorityClass created,
#: a TenantQuota allowing the class): checked again every cycle.
RECHECKED_REASONS = frozenset({Reason.PRIORITY_CLASS_NOT_FOUND, Reason.PRIORITY_CLASS_NOT_ALLOWED})


#: Conditions are kept in the order :class:`Cond` lists them.
_CONDITION_ORDER = {t.value: i for i, t in enumerate(Cond)}


def _condition(
    conditions: Sequence[Condition],
    type_: Cond,
    *,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out = []
    found = False
    for c in conditions:
        if c.type == type_.value:
            found = True
            since = c.last_transition_time if c.status == value else now
            out.append(
                Condition.model_construct(
                    type=type_.value,
                    status=value,
                    reason=reason,
                    message=message[:32000],
                    last_transition_time=since,
                    observed_generation=generation,
                )
            )
        else:
            out.append(c)
    if not found:
        out.append(
            Condition.model_construct(
                type=type_.value,
                status=value,
                reason=reason,
                message=message[:32000],
                last_transition_time=now,
                observed_generation=generation,
            )
        )
    return sorted(out, key=lambda c: _CONDITION_ORDER.get(c.type, len(_CONDITION_ORDER)))


class Transition:
    """Builds the next status of one job from its current one.

    Every step makes a new status that shares what it does not change with the previous one
    (lists are replaced, never changed in place), so a transition costs what it changes, not a
    copy of the whole status: thousands of waiting jobs are rewritten in one cycle."""

    def __init__(self, status: GpuJobStatus, now: datetime, generation: int) -> None:
        self.status = status
        self.now = now
        self.generation = generation

    def cond(self, type_: Cond, status: bool, reason: str, message: str) -> Transition:
        conditions = _condition(
            self.status.conditions,
            type_,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.generation,
        )
        return self.set(conditions=conditions)

    def has(self, type_: Cond) -> bool:
        return any(
            c.type == type_.value and c.status == ConditionStatus.TRUE
            for c in self.status.conditions
        )

    def set(self, **fields: Any) -> Transition:
        """The status with these fields replaced (values of the field's type, unvalidated)."""
        self.status = self.status.model_copy(update=fields)
        return self

    def stop_metering(self, gpus: int, until: datetime | None = None) -> Transition:
        """Add the current run's GPU-seconds (if it ran), up to ``until`` (default now), to
        the total."""
        started = self.status.started_at
        if started is not None:
            seconds = max(0.0, ((until or self.now) - started).total_seconds()) * gpus
            self.set(gpu_seconds=round(self.status.gpu_seconds + seconds, 1))
        return self


def queued(t: Transition, tenant: str | None, gpus: int) -> Transition:
    """First time in the queue (after validation)."""
    if t.status.submitted_at is None:
        t.set(submitted_at=t.now)
    return t.set(
        phase=JobPhase.QUEUED,
        tenant=tenant,
        gpus=gpus,
        reason=Reason.QUEUED.value,
        message="waiting for the next admission cycle",
        observed_generation=t.generation,
    ).cond(Cond.QUOTA_RESERVED, False, Reason.QUEUED, "waiting for the next admission cycle")


def invalid(t: Transition, reason: Reason, message: str, gpus: int) -> Transition:
    """Failed before it ran (its spec, PriorityClass or tenant refuses it): a job that waited
    no longer shows when it was expected to start nor GPUs held for it."""
    return t.set(
        phase=JobPhase.FAILED,
        reason=reason.value,
        message=message[:4000],
        gpus=gpus,
        queue_position=None,
        expected_start=None,
        first_expected_start=None,
        reservation=None,
        observed_generation=t.generation,
    ).cond(Cond.QUOTA_RESERVED, False, reason, message)


def waiting(
    t: Transition,
    tenant: str | None,
    reason: WaitReason,
    message: str,
    position: int | None,
    *,
    expected_start: datetime | None = None,
    reservation: ReservedGpus | None = None,
) -> Transition:
    """Still queued after a cycle; the first expected start of a wait is kept."""
    first = t.status.first_expected_start
    t.set(
        phase=JobPhase.QUEUED,
        tenant=tenant,
        reason=reason.value,
        message=message,
        queue_position=position,
        expected_start=expected_start,
        first_expected_start=first if first is not None else expected_start,
        reservation=reservation,
    )
    return t.cond(Cond.QUOTA_RESERVED, False, reason.value, message)


def admitted_by_pods(job: JobFacts) -> GpuJobStatus | None:
    """The admission a job's live pods carry when it is newer than the job's status: one the
    operator carried out and has not written yet (see
    :class:`~gpusched.core.lifecycle.facts.Unwritten`); None when there is none. For readers of
    the cluster that do not share the operator's memory (``gpusched explain``)."""
    newer = [
        p
        for p in job.pods
        if p.live and not p.deleting and (p.admission or 0) > job.status.admission
    ]
    if job.job is None or not newer:
        return None
    admission = max(p.admission or 0 for p in newer)
    created = [p.created for p in newer if p.admission == admission and p.created]
    return job.status.model_copy(
        update={
            "phase": JobPhase.ADMITTED,
            "admission": admission,
            "admitted_at": min(created) if created else job.status.admitted_at,
            "started_at": None,
            "queue_position": None,
        }
    )


def admitted(
    t: Transition,
    admission: Admission,
    tenant: str,
    counts_only: set[str],
    *,
    after: int = 0,
) -> Transition:
    """Admitted with a planned placement; waits for victims to leave if it preempted some.

    The admission number follows both the status's and ``after`` (the highest admission of a
    pod the job still has): pods of an admission that was carried out but never written keep
    their names until they are gone, and the new admission's pods must not collide with them."""
    placement = replica_placements(admission.placement, counts_only)
    worst = max(admission.placement, key=lambda p: scope_rank(p.topology_class))
    t.set(
        phase=JobPhase.ADMITTED,
        tenant=tenant,
        admission=max(t.status.admission, after) + 1,
        admitted_at=t.now,
        started_at=None,
        placement=placement,
        placement_quality=worst.topology_class.value,
        queue_position=None,
        requeue_at=None,
        reason=admission.reason.value,
        message=admission.message,
        expected_start=None,
        first_expected_start=None,
        reservation=None,
        expected_end=_at(admission.expected_end),
        backfill_until=_at(admission.backfill_until),
    )
    t.cond(Cond.QUOTA_RESERVED, True, admission.reason.value, admission.message)
    # Says only what is true before any pod exists (the GPUs are reserved); pods that the API
    # server then refuses show up as PodsRefused.
    t.cond(Cond.PODS_READY, False, Reason.WAITING_FOR_PODS, "pods not all running yet")
    if t.has(Cond.PREEMPTED):
        t.cond(Cond.PREEMPTED, False, "Readmitted", "admitted again after a preemption")
    if admission.victims:
        names = ", ".join(v.victim for v in admission.victims)
        text = f"waiting for preempted jobs to release their GPUs: {names}"
        t.set(reason=Reason.WAITING_FOR_PREEMPTION.value, message=text)
        t.cond(Cond.ADMITTED, False, Reason.WAITING_FOR_PREEMPTION, text)
    else:
        t.cond(Cond.ADMITTED, True, Reason.PLACED, admission.message)
    return t


def released_by_victims(t: Transition) -> Transition:
    """The victims of its preemption left its GPUs: its pods come next."""
    text = "the preempted jobs released its GPUs"
    reserved = next((c for c in t.status.conditions if c.type == Cond.QUOTA_RESERVED.value), None)
    reason = reserved.reason if reserved is not None else Reason.PLACED.value
    t.set(reason=reason, message=text)
    return t.cond(Cond.ADMITTED, True, Reason.PLACED, text)


def refused(t: Transition, message: str, gpus: int) -> Transition:
    """The API server refused the job's pods as invalid: failed until its spec changes."""
    t.stop_metering(gpus)
    text = f"the API server refuses its pods: {message}"
    t.set(
        phase=JobPhase.FAILED,
        reason=Reason.INVALID_POD_TEMPLATE.value,
        message=text[:4000],
        started_at=None,
        placement=[],
        placement_quality=None,
        queue_position=None,
        requeue_at=None,
        observed_generation=t.generation,
    )
    t.cond(Cond.QUOTA_RESERVED, False, Reason.INVALID_POD_TEMPLATE, text)
    t.cond(Cond.ADMITTED, False, Reason.INVALID_POD_TEMPLATE, text)
    return t.cond(Cond.PODS_READY, False, Reason.PODS_REFUSED, text)


def running(
    t: Transition, replicas: int, bound: Sequence[PodFacts] = (), since: datetime | None = None
) -> Transition:
    """All pods run (``since``: when the last started, default now); the placement records
    the GPUs the extender actually bound, if it did."""
    text = f"all {replicas} pods running" if replicas > 1 else "its pod is running"
    by_replica = {p.replica: p for p in bound}
    placement = []
    for plan in t.status.placement:
        pod = by_replica.get(plan.replica)
        update: dict[str, Any] = {}
        if pod is not None:
            if pod.node:
                update["node"] = pod.node
            # Only the extender's own set (gpusched.core.podgpus) is recorded as bound.
            parsed = pod.claim.assigned
            if parsed is not None:
                update["gpu_indices"] = list(parsed)
                uuids = [u for u in pod.annotations.get(keys.ANNOTATION_GPUS, "").split(",") if u]
                if len(uuids) == len(parsed):
                    update["gpu_uuids"] = uuids
                achieved = pod.annotations.get(keys.ANNOTATION_TOPOLOGY_CLASS)
                if achieved in SCOPE_ORDER:
                    update["topology_class"] = achieved
        placement.append(plan.model_copy(update=update))
    worst = max(
        (p.topology_class for p in placement if p.topology_class in SCOPE_ORDER),
        key=SCOPE_ORDER.index,
        default=t.status.placement_quality,
    )
    t.set(placement=placement, placement_quality=worst)
    # The reason column keeps saying on what capacity it runs (WithinGuarantee / Borrowing).
    reserved = next((c for c in t.status.conditions if c.type == Cond.QUOTA_RESERVED.value), None)
    reason = reserved.reason if reserved is not None and reserved.status.value == "True" else None
    where = " on borrowed GPUs" if reason == "Borrowing" else ""
    return t.set(
        phase=JobPhase.RUNNING,
        started_at=since or t.now,
        node_rejections=0,
        unready_releases=0,
        reason=reason or Reason.RUNNING.value,
        message=text + where,
    ).cond(Cond.PODS_READY, True, Reason.RUNNING, text)


def preempted(t: Transition, victim: Preemption, gpus: int) -> Transition:
    t.stop_metering(gpus)
    record = PreemptionRecord(
        time=t.now, preemptor=victim.preemptor, reason=victim.reason.value, message=victim.message
    )
    text = f"preempted by {victim.preemptor}: {victim.message}"
    t.set(
        phase=JobPhase.PREEMPTED,
        reason=Reason.PREEMPTED_BY.value,
        message=text,
        started_at=None,
        preemptions=[*t.status.preemptions, record][-20:],
        preemption_count=t.status.preemption_count + 1,
    )
    t.cond(Cond.PREEMPTED, True, victim.reason.value, text)
    t.cond(Cond.QUOTA_RESERVED, False, Reason.PREEMPTED_BY, text)
    t.cond(Cond.ADMITTED, False, Reason.PREEMPTED_BY, text)
    return t.cond(Cond.PODS_READY, False, Reason.PREEMPTED_BY, text)


def requeued(
    t: Transition,
    reason: Reason,
    message: str,
    gpus: int,
    requeue_at: datetime | None = None,
) -> Transition:
    """Released (gang timeout, pods lost) or back from preemption: queued again."""
    t.stop_metering(gpus)
    t.set(
        phase=JobPhase.QUEUED,
        reason=reason.value,
        message=message,
        started_at=None,
        placement=[],
        placement_quality=None,
        requeue_at=requeue_at,
        expected_end=None,
        backfill_until=None,
    )
    if reason is not Reason.REQUEUED:
        t.set(requeue_count=t.status.requeue_count + (1 if requeue_at else 0))
        t.cond(Cond.PODS_READY, False, reason, message)
    t.cond(Cond.QUOTA_RESERVED, False, reason, message)
    return t.cond(Cond.ADMITTED, False, reason, message)


def finished(
    t: Transition,
    ok: bool,
    message: str,
    gpus: int,
    reason: Reason | None = None,
    *,
    at: datetime | None = None,
) -> Transition:
    """Succeeded or failed, ``at`` when its pods ended (default now).

    A job that ran keeps its placement (and its quality) as the record of where it ran. One
    that never ran (``startedAt`` unset: given up after pods-ready timeouts or kubelet
    refusals) loses the placement it was planned on, as a gang released and queued again
    does: its pods go with it, and ``placementQuality`` would describe a set it never ran on.
    Its conditions and message keep the record of what happened."""
    t.stop_metering(gpus, at)
    reason = reason or (Reason.SUCCEEDED if ok else Reason.POD_FAILED)
    if t.status.started_at is None:
        t.set(placement=[], placement_quality=None)
    t.set(
        expected_start=None,
        reservation=None,
        expected_end=None,
        backfill_until=None,
    )
    t.set(
        phase=JobPhase.SUCCEEDED if ok else JobPhase.FAILED,
        reason=reason.value,
        message=message,
        finished_at=at or t.now,
        queue_position=None,
    )
    t.cond(Cond.PODS_READY, False, reason, message)
    return t.cond(Cond.FINISHED, True, reason, message)


def suspended(t: Transition, gpus: int) -> Transition:
    t.stop_metering(gpus)
    text = "spec.suspend is true; pods released"
    t.set(
        phase=JobPhase.SUSPENDED,
        reason=Reason.SUSPENDED.value,
        message=text,
        started_at=None,
        placement=[],
        placement_quality=None,
        queue_position=None,
        expected_start=None,
        first_expected_start=None,
        reservation=None,
        expected_end=None,
        backfill_until=None,
    )
    t.cond(Cond.QUOTA_RESERVED, False, Reason.SUSPENDED, text)
    return t.cond(Cond.ADMITTED, False, Reason.SUSPENDED, text)


def waiting_since(status: GpuJobStatus) -> datetime | None:
    """When the job's current wait began: its ``QuotaReserved`` condition turned False then
    (first queued, released or preempted); its submission where none is recorded. A forecast
    made before it is of an earlier wait, or of none."""
    for c in status.conditions:
        if c.type == "QuotaReserved" and c.status is ConditionStatus.FALSE:
            return c.last_transition_time
    return status.submitted_at


def _at(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def reserved_gpus(reservation: Reservation, counts_only: Collection[str] = ()) -> ReservedGpus:
    """A core reservation as the job's status shows it."""
    return ReservedGpus(
        start=datetime.fromtimestamp(reservation.start, UTC).replace(microsecond=0),
        placement=replica_placements(reservation.placement, counts_only),
        idle_gpus=reservation.idle_gpus,
    )


def replica_placements(
    plans: Sequence[ReplicaPlan], counts_only: Collection[str] = ()
) -> list[ReplicaPlacement]:
    """The core's replica plans as a status shows them (no GPU indices on count-only nodes)."""
    return [
        ReplicaPlacement(
            replica=p.replica,
            node=p.node,
            gpu_indices=[] if p.node in counts_only else list(p.gpus),
            topology_class=p.topology_class.value,
            score=round(p.score, 2),
        )
        for p in plans
    ]
