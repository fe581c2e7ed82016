"""A GpuJob's lifecycle between admission cycles, as a pure function of what was read.

``settle(job, context, now, config)`` looks at one job and its pods and answers where the job
stands for the admission cycle (queued, holding GPUs, leaving them) and what must happen to it
regardless of admission: a new job checked and queued, a finished gang recorded, a failed pod
failing the job, a suspended job's pods released, a gang that lost a pod or never started
released and requeued with backoff, a preempted job requeued once its pods are gone, missing pods
of an admitted gang created (an operator that restarted halfway), pods refused by the API server
failing or releasing the job. It never reads a clock or the API server: the operator passes
``now`` and the facts, and applies the returned actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.core.admission import Assignment, JobState
from gpusched.core.lifecycle import status as st
from gpusched.core.lifecycle.actions import Action, CreatePod, DeletePod, Event, PatchPod
from gpusched.core.lifecycle.facts import JobFacts, PodFacts, gone_by
from gpusched.core.lifecycle.pods import pod_manifest
from gpusched.core.lifecycle.tenants import Protection
from gpusched.core.lifecycle.validation import priority_class_refusal


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """Operator settings the lifecycle depends on (command-line flags)."""

    pods_ready_timeout: float = 300.0
    """Seconds an admitted gang may take for all its pods to run before it is released."""
    backoff_base: float = 10.0
    """First requeue delay after a release; doubles each time."""
    backoff_max: float = 600.0
    record_delay: float = 15.0
    """Longest an admission carried out (its pods created) goes unwritten, waiting to be
    written together with its pods running (see :class:`~gpusched.core.lifecycle.Unwritten`)."""
    max_node_rejections: int = 5
    """Times in a row a node's kubelet may refuse to admit a pod of the job (its admission
    failed, no container ran) before the job fails; each one releases and requeues the gang
    with backoff. 0: never fails for it."""
    max_unready_releases: int = 5
    """Releases for the pods-ready timeout while a pod of the gang waited on one of its own
    containers (an image that cannot be pulled, a missing secret), without running in
    between, before the job fails: each attempt would hold its GPUs, and may evict others,
    for the whole timeout again. 0: never fails for it."""

    def backoff(self, requeues: int) -> float:
        """Seconds to wait after the job's ``requeues``-th release."""
        return float(min(self.backoff_max, self.backoff_base * 2**requeues))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The API server's answer to a dry run of the job's pod."""

    error: str | None = None
    """None: the pod would be accepted; else the server's message."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The API server refused to create a pod of the job's current admission."""

    admission: int
    code: int
    """HTTP status: 400/422 (invalid: never accepted as it is) or 403 (refused for now)."""
    message: str

    @property
    def invalid(self) -> bool:
        return self.code in (400, 422)


@dataclass(frozen=True, slots=True)
class JobContext:
    """What the cycle knows about a job beyond its own object and pods."""

    tenant: str | None
    """The TenantQuota owning its namespace now."""
    priority: int = 0
    priority_class_missing: bool = False
    """``spec.priorityClassName`` names no PriorityClass."""
    verdict: Verdict | None = None
    """Dry run of its pod (None: not known yet)."""
    refusal: Refusal | None = None
    leaving: bool = False
    """Victims of its preemption still hold its GPUs."""
    leaving_until: datetime | None = None
    """When those victims' pods are all due gone (their deletion deadlines; None while one
    is not being deleted yet)."""
    protection: Protection = field(default_factory=Protection)
    """Its tenant's bounds on minimum runtime and grace periods."""
    class_not_allowed: str | None = None
    """Why its tenant does not allow ``spec.priorityClassName`` (None: allowed)."""
    runtime: float | None = None
    """Its predicted run time in seconds (:mod:`gpusched.core.runtime`; its declared limit
    caps it); None: nothing is known."""


@dataclass(frozen=True)
class Settled:
    """Where a job stands after settling, and what to do about it."""

    key: str
    status: GpuJobStatus
    """The status the job is to have (equal to the one read when nothing changes)."""
    state: JobState | None = None
    """For the admission cycle; None: it takes no part (new, finished, failed, suspended...)."""
    placement: tuple[Assignment, ...] = ()
    reserved_for: str | None = None
    actions: tuple[Action, ...] = ()
    """Pod operations and events, applied after the status is written."""
    wake_at: datetime | None = None
    """When time alone changes the answer (a gang's pods-ready deadline)."""
    needs_verdict: bool = False
    """Waits for the dry run of its pod before it is queued."""
    requeued: str | None = None
    """Reason, when the job was released and queued again in this settle."""
    write_waits: bool = False
    """The status is an admission not written yet, and its write waits for the job's next
    change (its pods running), at the latest until ``wake_at``."""


def needs_validation(job: JobFacts) -> bool:
    """Whether the job is checked before it is queued: new, or refused earlier for a reason its
    spec (a new generation) or a PriorityClass appearing may have removed."""
    if job.job is None or job.deleting:
        return False
    status = job.status
    if status.phase is None:
        return True
    return (
        status.phase is JobPhase.FAILED
        and status.reason in st.INVALID_REASONS
        and (status.observed_generation != job.generation or status.reason in st.RECHECKED_REASONS)
    )


def settle(job: JobFacts, context: JobContext, now: datetime, config: LifecycleConfig) -> Settled:
    """Settle one job's lifecycle from its pods (see the module docstring)."""
    return _Settle(job, context, now, config).run()


@dataclass
class _Settle:
    job: JobFacts
    context: JobContext
    now: datetime
    config: LifecycleConfig
    status: GpuJobStatus = field(init=False)
    actions: list[Action] = field(default_factory=list)
    state: JobState | None = None
    placement: tuple[Assignment, ...] = ()
    reserved_for: str | None = None
    wake_at: datetime | None = None
    requeued: str | None = None

    def __post_init__(self) -> None:
        self.status = self.job.status

    # --- helpers -------------------------------------------------------------------------

    def transition(self) -> st.Transition:
        return st.Transition(self.status, self.now, self.job.generation)

    def move(self, t: st.Transition) -> None:
        self.status = t.status

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.actions.append(Event(self.job.reference(), reason, message, warning))

    def delete(self, pods: list[PodFacts], grace: int | None) -> None:
        for pod in pods:
            if pod.live and not pod.deleting:
                self.actions.append(DeletePod(pod.namespace, pod.name, pod.uid, grace))

    def terminating(self, pods: list[PodFacts], reserved_for: str | None) -> None:
        """Its live pods still hold GPUs: account them until they are gone."""
        placement = []
        for pod in pods:
            if pod.live and pod.host:
                gpus = pod.bound_gpus
                placement.append(
                    Assignment(pod.host, gpus) if gpus else Assignment(pod.host, (), pod.gpus)
                )
        if placement:
            self.state = JobState.TERMINATING
            self.placement = tuple(placement)
            self.reserved_for = reserved_for
        else:
            self.state = None

    def result(self, *, needs_verdict: bool = False) -> Settled:
        write_by = self._unwritten_deadline()
        if write_by is not None:
            self.wake_at = min(write_by, self.wake_at or write_by)
        return Settled(
            key=self.job.key,
            status=self.status,
            state=self.state,
            placement=self.placement,
            reserved_for=self.reserved_for,
            actions=tuple(self.actions),
            wake_at=self.wake_at,
            needs_verdict=needs_verdict,
            requeued=self.requeued,
            write_waits=write_by is not None,
        )

    def _unwritten_deadline(self) -> datetime | None:
        """Until when the job's unwritten admission may stay unwritten: only while settling
        changes nothing but its pods starting, and for at most ``record_delay``."""
        job = self.job
        admitted_at = job.status.admitted_at
        if (
            job.unwritten is None
            or self.status is not job.status
            or job.status.phase is not JobPhase.ADMITTED
            or admitted_at is None
        ):
            return None
        write_by = admitted_at + timedelta(seconds=self.config.record_delay)
        return write_by if self.now < write_by else None

    # --- the lifecycle -------------------------------------------------------------------

    def run(self) -> Settled:
        job = self.job
        if job.deleting:
            self.delete(job.live_pods(), None)
            return self.result()
        if job.job is None:
            return self.result()
        spec = job.job.spec
        gpus = job.gpus
        current = job.pods_of(self.status.admission)
        # Pods of earlier admissions (a gang released before) go at once.
        self.delete([p for p in job.pods if p.admission != self.status.admission], 0)
        phase = self.status.phase

        if needs_validation(job):
            problem = self.validate()
            if problem is None:
                return self.result(needs_verdict=True)
            reason, message = problem
            if reason is not None:
                before = self.status.reason
                self.move(st.invalid(self.transition(), reason, message, gpus))
                if before != reason.value:
                    self.event(reason.value, message, warning=True)
                return self.result()
            self.move(st.queued(self.transition(), self.context.tenant, gpus))
            phase = JobPhase.QUEUED

        if phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            self.delete(current, None)
            self.terminating(current, None)  # pods still leaving hold their GPUs
            return self.result()

        if spec.suspend:
            self.delete(current, self.context.protection.grace(spec))
            if phase is not JobPhase.SUSPENDED:
                self.move(st.suspended(self.transition(), gpus))
                self.event("Suspended", "spec.suspend is true; pods released")
            self.terminating(current, None)
            return self.result()
        if phase is JobPhase.SUSPENDED:
            self.move(st.queued(self.transition(), self.context.tenant, gpus))
            phase = JobPhase.QUEUED

        if phase is JobPhase.PREEMPTED:
            live = [p for p in current if p.live]
            if live:
                # Eviction may have been cut short by a restart: finish it.
                self.delete(live, self.context.protection.grace(spec))
                preemptions = self.status.preemptions
                kept_for = preemptions[-1].preemptor if preemptions else None
                stuck = self._outstaying(gone_by(live))
                if stuck is not None:
                    # Pods that outstay their deletion (a finalizer, a node that does not
                    # answer) still hold the GPUs, but no longer for the preemptor, which is
                    # released at the same moment (:meth:`admitted`).
                    kept_for = None
                self.terminating(current, kept_for)
                return self.result()
            text = "requeued after preemption"
            self.move(st.requeued(self.transition(), st.Reason.REQUEUED, text, gpus))
            self.event("Requeued", text)
            phase = JobPhase.QUEUED

        if phase in (JobPhase.ADMITTED, JobPhase.RUNNING):
            self.admitted(current)
            return self.result()

        # Queued: pods of a released gang may still be on their GPUs.
        if any(p.live for p in current):
            self.delete(current, 0)
            self.terminating(current, None)
            return self.result()
        if self.context.class_not_allowed is not None:
            # Its tenant stopped allowing the class while it waited: it is not admitted.
            reason = st.Reason.PRIORITY_CLASS_NOT_ALLOWED
            self.move(st.invalid(self.transition(), reason, self.context.class_not_allowed, gpus))
            self.event(reason.value, self.context.class_not_allowed, warning=True)
            return self.result()
        self.state = JobState.QUEUED
        requeue_at = self.status.requeue_at
        if requeue_at is not None and requeue_at > self.now:
            self.wake_at = requeue_at  # its backoff ends
        return self.result()

    def validate(self) -> tuple[st.Reason | None, str] | None:
        """(reason, message) when the job cannot be queued, (None, "") when it can, None
        while the dry run of its pod is outstanding."""
        spec = self.job.job.spec if self.job.job is not None else None
        if spec is not None and spec.priority_class_name and self.context.priority_class_missing:
            # The webhook's own refusal: the status says what apply would have said.
            refusal = priority_class_refusal(spec.priority_class_name, ())
            assert refusal is not None
            return st.Reason.PRIORITY_CLASS_NOT_FOUND, refusal
        if self.context.class_not_allowed is not None:
            return st.Reason.PRIORITY_CLASS_NOT_ALLOWED, self.context.class_not_allowed
        verdict = self.context.verdict
        if verdict is None:
            return None
        if verdict.error:
            return (
                st.Reason.INVALID_POD_TEMPLATE,
                f"the API server refuses its pods: {verdict.error}",
            )
        return None, ""

    def admitted(self, current: list[PodFacts]) -> None:
        """A job holding GPUs: record what its pods did, release it when they cannot run."""
        job = self.job
        assert job.job is not None
        spec = job.job.spec
        gpus = job.gpus
        replicas = spec.replicas
        tenant = self.context.tenant
        # The namespace's owner may have changed (its TenantQuota deleted, another one claiming
        # it): the job and its pods name the tenant that accounts them now.
        if self.status.tenant != tenant:
            self.move(self.transition().set(tenant=tenant))
        label = tenant or ""
        for pod in current:
            if pod.live and not pod.deleting and pod.labels.get(keys.LABEL_TENANT) != label:
                self.actions.append(
                    PatchPod(pod.namespace, pod.name, pod.uid, labels={keys.LABEL_TENANT: label})
                )

        refusal = self.context.refusal
        if refusal is not None and refusal.admission == self.status.admission:
            self.refused(refusal, current)
            return

        failed = [p for p in current if p.phase == "Failed"]
        if failed and all(p.never_started for p in failed):
            self.rejected_by_node(failed[0], current)
            return
        if failed and all(p.disrupted or p.never_started for p in failed):
            # Stopped by the cluster (a drain, an eviction, a node shutting down), not by its
            # work: the gang is released and queued again, as when a pod disappears.
            pod = next(p for p in failed if p.disrupted)
            why = pod.message or pod.reason or "deleted"
            self.lost(current, f"pod {pod.name} was stopped on {pod.node or 'its node'} ({why})")
            return
        if failed:
            pod = failed[0]
            text = f"pod {pod.name} failed" + (f": {pod.message}" if pod.message else "")
            self.delete(current, None)
            ran = self._ran(current)
            # Ended when its last pod did: a pod still running held its GPUs until now.
            self.move(st.finished(ran, False, text, gpus, at=self._ended(ran, current)))
            self.event("Failed", text, warning=True)
            self.terminating(current, None)
            return
        if len(current) == replicas and all(p.phase == "Succeeded" for p in current):
            text = f"all {replicas} pods succeeded" if replicas > 1 else "its pod succeeded"
            ran = self._ran(current)
            self.move(st.finished(ran, True, text, gpus, at=self._ended(ran, current)))
            self.event("Succeeded", text)
            return

        started = self.status.started_at is not None
        present = {p.replica for p in current}
        if started and len(present) < replicas:
            # A running gang lost a pod (deleted, node gone): release and queue it again.
            self.lost(current, f"{replicas - len(present)} of {replicas} pods disappeared")
            return

        if self.ran_out(current):
            return

        # Still holding its planned GPUs.
        self.state = JobState.ADMITTED
        self.placement = self.held(current)
        self.wake_when_unprotected()
        if self.context.leaving:
            stuck = self._outstaying(self.context.leaving_until)
            if stuck is not None:
                self.release_unready(
                    current, f"the pods of its preemption's victims were still there {stuck}"
                )
            return  # victims still on the GPUs
        created = [p.created for p in current if p.created is not None]
        # The clock starts when the pods were created, or at admission if none could be: a
        # gang never sits Admitted forever.
        waiting_since = min(created) if created else self.status.admitted_at
        # A replica that already finished ran: the gang started (and is metered) all the same.
        all_running = len(present) == replicas and all(
            p.phase in ("Running", "Succeeded") for p in current
        )
        if self.status.phase is JobPhase.ADMITTED and not all_running and waiting_since:
            deadline = waiting_since + timedelta(seconds=self.config.pods_ready_timeout)
            if self.now > deadline:
                self.release_unready(current)
                return
            self.wake_at = min(deadline, self.wake_at or deadline)
        if len(present) < replicas:
            self.create_missing(current)
            return
        if all_running and self.status.phase is not JobPhase.RUNNING:
            # No event: the PodsReady condition and status.placement say it, and an event per
            # job start would be the operator's most numerous write.
            since = self._started(current)
            self.move(st.running(self.transition(), replicas, bound=current, since=since))
            # Its run is counted from its start, which may lie long before this moment (an
            # operator down or restarting meanwhile): the limit and the minimum runtime's
            # protection hold from there.
            if not self.ran_out(current):
                self.wake_when_unprotected()

    def ran_out(self, current: list[PodFacts]) -> bool:
        """Whether the job has run for its declared ``spec.maxRuntimeSeconds`` (then it fails,
        :meth:`past_limit`); else the cycle is woken when it will have."""
        assert self.job.job is not None
        started_at = self.status.started_at
        limit = self.job.job.spec.max_runtime_seconds
        if started_at is None or limit is None:
            return False
        deadline = started_at + timedelta(seconds=limit)
        if self.now >= deadline:
            self.past_limit(current, limit)
            return True
        self.wake_at = min(deadline, self.wake_at or deadline)
        return False

    def wake_when_unprotected(self) -> None:
        """Wakes the cycle when the job's minimum runtime (as its tenant caps it) ends, counted
        from its run's start: a preemption it blocked until then can happen at that moment."""
        assert self.job.job is not None
        started_at = self.status.started_at
        min_runtime = self.context.protection.min_runtime(self.job.job.spec)
        if started_at is None or not min_runtime:
            return
        protected = started_at + timedelta(seconds=min_runtime)
        if protected > self.now:
            self.wake_at = min(protected, self.wake_at or protected)

    def lost(self, current: list[PodFacts], why: str) -> None:
        """The gang lost a pod to the cluster, not to its work: released (its other pods
        with their grace period) and queued again."""
        assert self.job.job is not None
        text = f"{why}; gang released"
        self.delete(current, self.context.protection.grace(self.job.job.spec))
        self.move(st.requeued(self.transition(), st.Reason.PODS_LOST, text, self.job.gpus))
        self.event(st.Reason.PODS_LOST.value, text, warning=True)
        self.requeued = st.Reason.PODS_LOST.value
        self.terminating(current, None)

    def _ran(self, current: list[PodFacts]) -> st.Transition:
        """The transition of a job whose pods ran to their end: one never seen with all its
        pods running (they ended between two cycles) is metered from its pods' creation."""
        t = self.transition()
        if t.status.started_at is None:
            created = [p.created for p in current if p.created is not None]
            since = self._started(current) or (min(created) if created else None)
            since = since or self.status.admitted_at
            if since is not None:
                t.set(started_at=since)
        return t

    def _started(self, current: list[PodFacts]) -> datetime | None:
        """When the gang began running: its last pod's containers' start (the kubelet's
        clock, so never later than now nor earlier than that pod's creation), None when a
        pod has no start recorded."""
        if not current or any(p.started is None for p in current):
            return None
        starts = [
            max(p.started, p.created) if p.created is not None else p.started
            for p in current
            if p.started is not None
        ]
        return min(max(starts), self.now)

    def _ended(self, t: st.Transition, pods: list[PodFacts]) -> datetime | None:
        """When ``pods`` had all ended (their containers' ``finishedAt``), within the run
        (not before its start, not after now); None when one has no end recorded."""
        if not pods or any(p.ended is None for p in pods):
            return None
        end = min(max(p.ended for p in pods if p.ended is not None), self.now)
        started = t.status.started_at
        return max(end, started) if started is not None else end

    def past_limit(self, current: list[PodFacts], limit: int) -> None:
        """The job ran for its declared ``spec.maxRuntimeSeconds``: it fails, and its pods go
        with the grace period a preemption would give them (time to checkpoint)."""
        assert self.job.job is not None
        reason = st.Reason.MAX_RUNTIME_EXCEEDED
        text = f"ran for its spec.maxRuntimeSeconds ({limit}s); pods stopped"
        self.delete(current, self.context.protection.grace(self.job.job.spec))
        self.move(st.finished(self.transition(), False, text, self.job.gpus, reason))
        self.event(reason.value, text, warning=True)
        self.terminating(current, None)

    def create_missing(self, current: list[PodFacts]) -> None:
        """Create the pods the gang lacks (first creation, or finishing an interrupted one)."""
        job = self.job
        assert job.job is not None
        status = self.status
        by_replica = {p.replica: p for p in status.placement}
        existing = {p.name for p in current}
        created = 0
        for replica in range(job.job.spec.replicas):
            manifest = pod_manifest(
                job.job,
                tenant=self.context.tenant or "",
                admission=status.admission,
                replica=replica,
                placement=by_replica.get(replica),
                grace_seconds=self.context.protection.grace(job.job.spec),
            )
            if manifest["metadata"]["name"] not in existing:
                self.actions.append(CreatePod(job.key, job.uid, status.admission, manifest))
                created += 1
        t = self.transition()
        if created and not t.has(st.Cond.ADMITTED):
            self.move(st.released_by_victims(t))
            self.event("PodsCreated", f"creating {created} pods")

    def refused(self, refusal: Refusal, current: list[PodFacts]) -> None:
        """The API server refused a pod of the gang: fail the job (invalid) or release it at
        once and retry after the backoff (refused for now). All or nothing: pods of the gang
        it did accept go too."""
        gpus = self.job.gpus
        self.delete(current, 0)
        if refusal.invalid:
            self.move(st.refused(self.transition(), refusal.message, gpus))
            self.event(st.Reason.INVALID_POD_TEMPLATE.value, refusal.message, warning=True)
            self.terminating(current, None)
            return
        delay = self.config.backoff(self.status.requeue_count)
        text = (
            f"the API server refused its pods: {refusal.message}; gang released, next attempt "
            f"in {delay:.0f}s"
        )
        self.move(
            st.requeued(
                self.transition(),
                st.Reason.PODS_REFUSED,
                text,
                gpus,
                requeue_at=self.now + timedelta(seconds=delay),
            )
        )
        self.event(st.Reason.PODS_REFUSED.value, text, warning=True)
        self.requeued = st.Reason.PODS_REFUSED.value
        self.terminating(current, None)

    def rejected_by_node(self, pod: PodFacts, current: list[PodFacts]) -> None:
        """A node's kubelet refused to admit a pod of the gang: the workload never ran, so it
        has not failed. Release the gang and queue it again with backoff; only after
        ``max_node_rejections`` such refusals in a row does the job fail."""
        gpus = self.job.gpus
        count = self.status.node_rejections + 1
        limit = self.config.max_node_rejections
        why = (
            f"the kubelet on {pod.node or 'its node'} refused to admit pod {pod.name}"
            + (f" ({pod.reason})" if pod.reason else "")
            + (f": {pod.message}" if pod.message and pod.message != pod.reason else "")
        )
        self.delete(current, 0)
        if limit and count >= limit:
            text = f"{why}; {count} refusals in a row, giving up"
            self.move(st.finished(self.transition(), False, text, gpus).set(node_rejections=count))
            self.event(st.Reason.PODS_REJECTED_BY_NODE.value, text, warning=True)
            self.terminating(current, None)
            return
        delay = self.config.backoff(self.status.requeue_count)
        bound = f" of at most {limit}" if limit else ""
        text = f"{why}; gang released (refusal {count}{bound}), next attempt in {delay:.0f}s"
        self.move(
            st.requeued(
                self.transition(),
                st.Reason.PODS_REJECTED_BY_NODE,
                text,
                gpus,
                requeue_at=self.now + timedelta(seconds=delay),
            ).set(node_rejections=count)
        )
        self.event(st.Reason.PODS_REJECTED_BY_NODE.value, text, warning=True)
        self.requeued = st.Reason.PODS_REJECTED_BY_NODE.value
        self.terminating(current, None)

    def _outstaying(self, due: datetime | None) -> str | None:
        """How late pods due gone at ``due`` are, once later than the pods-ready timeout
        (None: not that late, or not known; the loop is woken when they would be)."""
        if due is None:
            return None
        stuck_at = due + timedelta(seconds=self.config.pods_ready_timeout)
        if self.now <= stuck_at:
            self.wake_at = min(stuck_at, self.wake_at or stuck_at)
            return None
        late = (self.now - due).total_seconds()
        return f"{late:.0f}s after their grace period ended"

    def release_unready(self, current: list[PodFacts], why: str | None = None) -> None:
        """Release a gang whose pods did not all run in time (or whose victims' pods did not
        leave) and queue it again with backoff."""
        delay = self.config.backoff(self.status.requeue_count)
        what = why or f"pods not all running within {self.config.pods_ready_timeout:.0f}s"
        stuck = None
        if why is None:
            # The pods go with the release, and with them what `kubectl describe pod` would
            # have said: the first one's own cause is kept in the message (a wrong image, an
            # unschedulable pod), since retrying will not cure it.
            stuck = next((p for p in current if p.live and p.waiting), None)
            if stuck is not None:
                what += f" (pod {stuck.name}: {stuck.waiting})"
        own = stuck is not None and stuck.waits_on_own_container
        count = self.status.unready_releases + (1 if own else 0)
        limit = self.config.max_unready_releases
        self.delete(current, 0)
        if own and limit and count >= limit:
            text = (
                f"{what}; released {count} times in a row for its own containers, giving up "
                "(fix spec.template and create the job again)"
            )
            reason = st.Reason.PODS_READY_TIMEOUT
            failed = st.finished(self.transition(), False, text, self.job.gpus, reason)
            self.move(failed.set(unready_releases=count))
            self.event(reason.value, text, warning=True)
            self.terminating(current, None)
            return
        bound = f" ({count} of at most {limit} for its own containers)" if own and limit else ""
        text = f"{what}; gang released{bound}, next attempt in {delay:.0f}s"
        self.move(
            st.requeued(
                self.transition(),
                st.Reason.PODS_READY_TIMEOUT,
                text,
                self.job.gpus,
                requeue_at=self.now + timedelta(seconds=delay),
            ).set(unready_releases=count)
        )
        self.event(st.Reason.PODS_READY_TIMEOUT.value, text, warning=True)
        self.requeued = st.Reason.PODS_READY_TIMEOUT.value
        self.terminating(current, None)

    def held(self, pods: list[PodFacts]) -> tuple[Assignment, ...]:
        """The GPUs an admitted job holds: what the extender bound where known, else the plan."""
        assert self.job.job is not None
        by_replica = {p.replica: p for p in pods}
        out = []
        k = self.job.job.spec.gpus_per_replica
        for plan in self.status.placement:
            pod = by_replica.get(plan.replica)
            bound = pod.bound_gpus if pod is not None and pod.node == plan.node else None
            gpus = tuple(bound or plan.gpu_indices)
            out.append(Assignment(plan.node, gpus) if gpus else Assignment(plan.node, (), k))
        return tuple(out)
