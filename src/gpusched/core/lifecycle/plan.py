"""From one cycle's decisions to the writes that carry them out, as ordered groups of actions.

An admission is one group: its victims are marked Preempted first (conditional on what was read;
their status names the preemptor, which reserves their GPUs for it even if the operator dies right
after), then evicted with their grace period, then the admitted job's status records its planned
GPUs (conditional) and its pods are created once no victim holds its GPUs any more. An admission
without victims creates its pods at once and, with a ``record_delay``, leaves its status to the
job's next write (usually its pods running: one write instead of two). Every other job gets at
most one status write (what settling changed, its waiting reason) followed by the pod operations
and events settling asked for.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, JobPhase, ReservedGpus
from gpusched.core.admission import (
    Admission,
    CycleResult,
    JobState,
    PreemptReason,
    Reservation,
    Waiting,
    WaitReason,
)
from gpusched.core.admission.cycle import span
from gpusched.core.lifecycle import status as st
from gpusched.core.lifecycle.actions import (
    Action,
    CreatePod,
    DeletePod,
    Event,
    Group,
    PatchPod,
    Stage,
    Step,
    Urgency,
    WriteStatus,
)
from gpusched.core.lifecycle.facts import JobFacts, holds_any
from gpusched.core.lifecycle.patch import merge_patch
from gpusched.core.lifecycle.pods import pod_manifest
from gpusched.core.lifecycle.settle import Settled
from gpusched.core.lifecycle.tenants import Protection

#: Wait reasons worth a Warning event (the job cannot start without someone acting).
WARNING_REASONS = frozenset({WaitReason.NO_TENANT, WaitReason.NO_FEASIBLE_NODES})


@dataclass(frozen=True)
class Refresh:
    """Which waiting jobs may have only the wording of their status rewritten this cycle (its
    counts and queue position move with every admission; the reason itself is always written
    at once)."""

    recent: Collection[str] = ()
    """Jobs whose status was written lately: not again for the wording alone."""
    budget: int = 100
    """Most such rewrites in one cycle."""
    reports: int | None = None
    """Most waiting jobs' reports (status and events, a new reason included) planned in one
    cycle; None: no bound. The operator passes the room its executor has for them, so that the
    statuses of thousands of new jobs are neither built nor sent ahead of the admissions, and
    jobs not reported stay free to be admitted (the rest are reported in later cycles)."""


class QuietJob(NamedTuple):
    """A job a plan found nothing to write or do for, and what it found that from: while the
    same objects come again, before ``until``, the next plan finds the same (whatever the
    refresh allows: nothing was held back). A tuple: one is made per job and cycle."""

    job: JobFacts
    settled: Settled
    waiting: Waiting | None
    reservation: Reservation | None
    until: float
    """Epoch seconds: the shown expected start starts moving with the clock then."""


@dataclass(frozen=True)
class Plan:
    """The groups of one cycle and what they do, for metrics and logs."""

    groups: tuple[Group, ...]
    admitted: tuple[Admission, ...]
    """Admissions planned (those touching a job with writes in flight wait a cycle)."""
    deferred_reports: int = 0
    """Waiting jobs whose report :attr:`Refresh.reports` held back for a later cycle."""


def write_status(
    job: JobFacts,
    status: GpuJobStatus,
    *,
    resource_version: str | None = None,
    deferred: bool = False,
) -> WriteStatus | None:
    """The write that brings the job's status from what the API server has to ``status``
    (None: equal); with ``resource_version``, only if the job still has it. A job whose
    admission is not written yet gets it in this write, conditional on the version it was
    decided on."""
    if status is job.status and job.unwritten is None:
        return None
    patch = merge_patch(job.written.to_k8s(), status.to_k8s())
    if patch is None:
        return None
    if resource_version is None and job.unwritten is not None:
        resource_version = job.unwritten.resource_version
    return WriteStatus(
        key=job.key,
        namespace=job.namespace,
        name=job.name,
        uid=job.uid,
        status=status,
        patch=patch,
        resource_version=resource_version,
        deferred=deferred,
    )


def plan(
    jobs: Mapping[str, JobFacts],
    settled: Mapping[str, Settled],
    result: CycleResult,
    now: datetime,
    *,
    leaving: Mapping[str, Collection[str]] | None = None,
    busy: Collection[str] = (),
    refresh: Refresh | None = None,
    defer: bool = False,
    protections: Mapping[str, Protection] | None = None,
    quiet: MutableMapping[str, QuietJob] | None = None,
) -> Plan:
    """Groups of actions for one cycle. ``busy`` jobs have writes in flight: nothing is
    planned for them (an admission touching one waits for the next cycle). With ``defer``, an
    admission that creates its pods at once is written with the job's next status change, at
    the latest when settling says so (``LifecycleConfig.record_delay``; see
    :class:`~gpusched.core.lifecycle.facts.Unwritten`). ``protections``: each job's tenant's
    bounds on grace periods (victims' pods are deleted within them). ``quiet``: the jobs
    earlier plans found nothing to do for, kept and brought up to date here (a cycle over
    10,000 waiting jobs looks again only at those whose objects changed)."""
    leaving = leaving or {}
    protections = protections or {}
    refresh = refresh or Refresh()
    budget = [refresh.budget]
    reports = _Reports(refresh.reports)
    groups: list[Group] = []
    planned: set[str] = set()
    admitted: list[Admission] = []
    for admission in result.admissions:
        touched = {admission.job, *(v.victim for v in admission.victims)}
        if touched & set(busy) or touched & planned:
            continue
        groups.append(
            _admission(
                admission,
                jobs,
                settled,
                now,
                leaving=_victims_hold(admission, jobs, leaving.get(admission.job, ())),
                defer=defer,
                protections=protections,
            )
        )
        planned |= touched
        admitted.append(admission)
    waiting = {w.job: w for w in result.waiting}
    reserved = {r.job: r for r in result.reservations}
    # Jobs written lately go last: with room for only some reports, a job whose reason moves
    # every cycle never keeps a new job from its first status.
    recent = refresh.recent
    order = [k for k in settled if k not in recent] + [k for k in settled if k in recent]
    kept = quiet if quiet is not None else {}
    at = now.timestamp()
    for key in order:
        done = settled[key]
        if key in planned or key in busy:
            continue
        job = jobs[key]
        entry, reservation = waiting.get(key), reserved.get(key)
        found = kept.get(key)
        if (
            found is not None
            and found.job is job
            and found.settled is done
            and found.waiting is entry
            and found.reservation is reservation
            and at < found.until
        ):
            continue
        if done.write_waits:
            group, until = _group(job, None, list(done.actions)), None
        else:
            group, until = _settled(
                job,
                done,
                entry,
                now,
                recent=recent,
                budget=budget,
                reports=reports,
                reservation=reservation,
            )
        if group is not None:
            groups.append(group)
        if until is None:
            kept.pop(key, None)
        else:
            kept[key] = QuietJob(job, done, entry, reservation, until)
    return Plan(tuple(groups), tuple(admitted), reports.deferred)


@dataclass
class _Reports:
    """What is left of :attr:`Refresh.reports` in this plan, and how many it held back."""

    room: int | None
    deferred: int = 0

    def take(self) -> bool:
        """One more report, if there is room for it."""
        if self.room is None:
            return True
        if self.room <= 0:
            self.deferred += 1
            return False
        self.room -= 1
        return True


def _victims_hold(
    admission: Admission, jobs: Mapping[str, JobFacts], leaving: Collection[str]
) -> bool:
    """Whether what the job waits for (``leaving``: victims of an earlier preemption of
    it) still holds a GPU this admission plans for it: then its pods wait for them. One it
    cannot see is taken to hold them; a victim elsewhere does not hold up pods on free GPUs."""
    spots = [(p.node, () if p.count_only else p.gpus) for p in admission.placement]
    for name in leaving:
        victim = jobs.get(name)
        if victim is None:
            return True
        if any(p.live and holds_any(p, spots) for p in victim.pods_of(victim.status.admission)):
            return True
    return False


def _admission(
    admission: Admission,
    jobs: Mapping[str, JobFacts],
    settled: Mapping[str, Settled],
    now: datetime,
    *,
    leaving: bool,
    defer: bool,
    protections: Mapping[str, Protection],
) -> Group:
    job = jobs[admission.job]
    assert job.job is not None
    steps: list[Step] = []
    after: list[Action] = []
    if admission.victims:
        marks: list[Action] = []
        evictions: list[Action] = []
        for preemption in admission.victims:
            victim = jobs[preemption.victim]
            t = st.Transition(settled[victim.key].status, now, victim.generation)
            status = st.preempted(t, preemption, victim.gpus).status
            write = write_status(victim, status, resource_version=victim.resource_version)
            if write is not None:
                marks.append(write)
            grace = (
                protections.get(victim.key, Protection()).grace(
                    victim.job.spec, reclaim=preemption.reason is PreemptReason.RECLAIM_GUARANTEE
                )
                if victim.job
                else None
            )
            for pod in victim.pods_of(status.admission):
                if pod.live and not pod.deleting:
                    evictions.append(
                        PatchPod(
                            pod.namespace,
                            pod.name,
                            pod.uid,
                            annotations={keys.ANNOTATION_PREEMPTED_BY: admission.job},
                        )
                    )
                    evictions.append(DeletePod(pod.namespace, pod.name, pod.uid, grace))
            evictions.append(
                Event(victim.reference(), st.Reason.PREEMPTED_BY.value, status.message or "", True)
            )
            after.extend(settled[victim.key].actions)
        steps.append(Step(Stage.MARK_VICTIMS, tuple(marks)))
        steps.append(Step(Stage.EVICT, tuple(evictions), required=False))
    base = settled[job.key]
    t = st.Transition(base.status, now, job.generation)
    highest = max((p.admission for p in job.pods if p.admission is not None), default=0)
    status = st.admitted(t, admission, admission.tenant, set(), after=highest).status
    creates_pods = not admission.victims and not leaving
    # An admission that waits for victims is written at once: its status is what holds the
    # GPUs for it until they are free, and no pod of it exists yet to say so.
    write = write_status(
        job,
        status,
        resource_version=job.resource_version,
        deferred=defer and creates_pods,
    )
    steps.append(Step(Stage.ADMIT, (write,) if write is not None else ()))
    if creates_pods:
        by_replica = {p.replica: p for p in status.placement}
        creates = tuple(
            CreatePod(
                job.key,
                job.uid,
                status.admission,
                pod_manifest(
                    job.job,
                    tenant=admission.tenant,
                    admission=status.admission,
                    replica=replica,
                    placement=by_replica.get(replica),
                    grace_seconds=protections.get(job.key, Protection()).grace(job.job.spec),
                ),
            )
            for replica in range(job.job.spec.replicas)
        )
        steps.append(Step(Stage.CREATE_PODS, creates))
    events: list[Action] = [Event(job.reference(), "Admitted", admission.message)]
    if admission.victims:
        names = ", ".join(v.victim for v in admission.victims)
        events.append(Event(job.reference(), "Preempting", f"preempting {names}"))
    steps.append(Step(Stage.PODS, (*events, *base.actions, *after), required=False))
    return Group(
        frozenset({job.key, *(v.victim for v in admission.victims)}),
        tuple(steps),
        Urgency.DECIDE,
    )


def _settled(
    job: JobFacts,
    done: Settled,
    waiting: Waiting | None,
    now: datetime,
    *,
    recent: Collection[str],
    budget: list[int],
    reports: _Reports,
    reservation: Reservation | None = None,
) -> tuple[Group | None, float | None]:
    """The job's group (None: nothing to do), and, when there is nothing to do whatever the
    refresh allows, until when (epoch seconds) the same objects keep it so: the shown
    expected start follows the clock once it has passed; a start shown within the tolerance
    but not equal can leave it with the clock alone (None: not known to keep)."""
    status = done.status
    actions = list(done.actions)
    # A waiting job with nothing to do but say why it waits: a report, sent behind the cycle's
    # decisions under load (its preemption or release was recorded when it happened).
    report = waiting is not None and all(isinstance(a, Event) for a in actions)
    held = st.reserved_gpus(reservation) if reservation is not None else None
    expected = _expected(waiting, now)
    if (
        waiting is not None
        and done.state is JobState.QUEUED
        and not _says(status, waiting, expected, held, now)
    ):
        server = job.status
        moved = _reservation_change(server.reservation, held)
        # Only the wording, the queue position or the expected start moved: written when the
        # refresh allows. A reservation made, moved or released, or its GPUs idle now, is
        # written at once (the next cycle starts from it; few jobs hold one).
        cosmetic = (
            status is server
            and server.phase is JobPhase.QUEUED
            and server.reason == waiting.reason.value
            and server.tenant == waiting.tenant
            and moved is None
            and _idle(server.reservation) == _idle(held)
        )
        if cosmetic and (job.key in recent or budget[0] <= 0):
            return (None if not actions else _group(job, status, actions)), None
        if report and not reports.take():
            return None, None
        if cosmetic:
            budget[0] -= 1
        if status.reason != waiting.reason.value:
            actions.insert(
                0,
                Event(
                    job.reference(),
                    waiting.reason.value,
                    waiting.message,
                    waiting.reason in WARNING_REASONS,
                ),
            )
        if moved is not None:
            actions.append(Event(job.reference(), moved, _reservation_event(moved, held, now)))
        t = st.Transition(status, now, job.generation)
        status = st.waiting(
            t,
            waiting.tenant,
            waiting.reason,
            waiting.message,
            waiting.queue_position,
            expected_start=expected,
            reservation=held,
        ).status
        return _group(job, status, actions, Urgency.REPORT if report else Urgency.SETTLE), None
    group = _group(job, status, actions, Urgency.REPORT if report else Urgency.SETTLE)
    if group is not None:
        return group, None
    if waiting is None or done.state is not JobState.QUEUED:
        return None, math.inf
    # (A reserved job's expected start is its reservation's start: one check covers both.)
    if status.expected_start != expected:
        return None, None
    # Past its expected start, the start shown follows the clock (never before now).
    return None, (waiting.expected_start if waiting.expected_start is not None else math.inf)


#: Event reasons of a waiting job's reservation.
RESERVED = "Reserved"
RESERVATION_MOVED = "ReservationMoved"
RESERVATION_RELEASED = "ReservationReleased"


def _expected(waiting: Waiting | None, now: datetime) -> datetime | None:
    """The expected start to show, to the second (never before now)."""
    if waiting is None or waiting.expected_start is None:
        return None
    at = datetime.fromtimestamp(max(waiting.expected_start, now.timestamp()), UTC)
    return at.replace(microsecond=0)


def _close(before: datetime | None, after: datetime | None, now: datetime) -> bool:
    """Whether two expected starts say the same to a user: within a minute, or within 10 % of
    the wait still ahead (a forecast an hour out moving by a minute is not news)."""
    if before is None or after is None:
        return before is after
    ahead = max(0.0, (after - now).total_seconds())
    return abs((after - before).total_seconds()) <= max(60.0, 0.1 * ahead)


def _idle(reservation: ReservedGpus | None) -> int | None:
    return reservation.idle_gpus if reservation is not None else None


def _where(reservation: ReservedGpus) -> list[tuple[str, tuple[int, ...]]]:
    return [(p.node, tuple(p.gpu_indices)) for p in reservation.placement]


def _reservation_change(before: ReservedGpus | None, after: ReservedGpus | None) -> str | None:
    """The event a change of reservation deserves (None: no change worth one)."""
    if before is None and after is None:
        return None
    if before is None:
        return RESERVED
    if after is None:
        return RESERVATION_RELEASED
    return RESERVATION_MOVED if _where(before) != _where(after) else None


def _reservation_event(reason: str, held: ReservedGpus | None, now: datetime) -> str:
    if held is None:
        return (
            "its reserved GPUs were released (it no longer heads its tenant's blocked jobs, "
            "or its tenant is past its entitlement)"
        )
    nodes = sorted({p.node for p in held.placement})
    where = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    ahead = max(0.0, (held.start - now).total_seconds())
    verb = "reserved on" if reason == RESERVED else "reservation moved to"
    return (
        f"GPUs {verb} {where}, expected free in about {span(ahead)} "
        f"({held.idle_gpus} idle until then)"
    )


def _group(
    job: JobFacts,
    status: GpuJobStatus | None,
    actions: list[Action],
    urgency: Urgency = Urgency.SETTLE,
) -> Group | None:
    """The job's status write (none when ``status`` is None) and then its other actions."""
    steps: list[Step] = []
    write = write_status(job, status) if status is not None else None
    if write is not None:
        steps.append(Step(Stage.SETTLE, (write,)))
    if actions:
        steps.append(Step(Stage.PODS, tuple(actions), required=False))
    return Group(frozenset({job.key}), tuple(steps), urgency) if steps else None


def _says(
    status: GpuJobStatus,
    waiting: Waiting,
    expected: datetime | None,
    held: ReservedGpus | None,
    now: datetime,
) -> bool:
    """Whether the status already says what the cycle says of the waiting job (expected starts
    and reservation starts alike within :func:`_close`)."""
    before = status.reservation
    return (
        status.phase is JobPhase.QUEUED
        and status.reason == waiting.reason.value
        and status.message == waiting.message
        and status.queue_position == waiting.queue_position
        and status.tenant == waiting.tenant
        and _close(status.expected_start, expected, now)
        and _reservation_change(before, held) is None
        and _idle(before) == _idle(held)
        and (before is None or held is None or _close(before.start, held.start, now))
        and (status.first_expected_start is not None or expected is None)
    )
