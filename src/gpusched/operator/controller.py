"""One admission cycle against the API server: read everything, settle each job's lifecycle,
run the pure admission core, write its decisions.

Every fact the next cycle needs is in the API server, never only in memory: a job's status says
whether it is queued, admitted (with its planned GPUs and admission number) or preempted (and by
whom); its pods carry deterministic names. So an operator that dies at any point and restarts
reads the same facts and finishes what was begun:

* admitted but pods missing -> create them (same names, AlreadyExists is success);
* victims marked Preempted but pods still running -> delete them (grace period honoured);
* victims evicted but preemptor not yet marked -> the victims' GPUs are reserved for the
  preemptor named in their status, so the next cycle admits it there and nobody else takes them.

Writes that decide something (admit, preempt) are conditional on the object's resourceVersion, so
a decision taken on a stale read is dropped instead of applied.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob, GpuJobStatus, JobPhase
from gpusched.api.meta import Condition, ConditionStatus
from gpusched.api.tenantquota import TenantQuotaStatus
from gpusched.core.admission import (
    Admission,
    Assignment,
    CycleConfig,
    CycleResult,
    Job,
    JobState,
    Snapshot,
    WaitReason,
    run_cycle,
)
from gpusched.metrics import OperatorMetrics
from gpusched.operator import failpoints
from gpusched.operator import status as st
from gpusched.operator.api import OperatorApi, PodRefusedError
from gpusched.operator.pods import pod_manifest, pod_name
from gpusched.operator.records import JobRecord, PodInfo, World, build_world
from gpusched.operator.translate import NodeReader, TenantMap, core_tenant, job_shape, tenant_map

log = logging.getLogger(__name__)

#: How long a dry-run verdict on a pod template is reused for identical templates.
VALIDATION_TTL = 60.0


@dataclass
class OperatorConfig:
    """Operator settings (command-line flags)."""

    pods_ready_timeout: float = 300.0
    """Seconds an admitted gang may take for all its pods to run before it is released."""
    backoff_base: float = 10.0
    """First requeue delay after a gang timeout; doubles each time."""
    backoff_max: float = 600.0
    node_selector: dict[str, str] = field(default_factory=dict)
    """Only nodes with these labels are used."""
    max_preemption_searches: int = 32
    write_workers: int = 16
    quota_meter_interval: float = 15.0
    """Least interval between TenantQuota status writes when only GPU-seconds changed."""


@dataclass
class JobView:
    """A job as this cycle sees it after settling its lifecycle."""

    record: JobRecord
    job: GpuJob
    tenant: str | None
    priority: int
    status: GpuJobStatus
    """The status as this cycle means it to be."""
    server: GpuJobStatus
    """The status as last read from or written to the API server."""
    resource_version: str
    state: JobState | None = None
    placement: tuple[Assignment, ...] = ()
    reserved_for: str | None = None

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def gpus(self) -> int:
        return self.job.total_gpus


@dataclass
class CycleReport:
    """What one cycle did (logs, metrics, tests)."""

    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch from ``old`` to ``new`` (None when equal); removed keys become null."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, Any] = {}
        for key, value in new.items():
            if key not in old:
                out[key] = value
            else:
                sub = merge_patch(old[key], value)
                if sub is not None:
                    out[key] = sub
        for key in old:
            if key not in new:
                out[key] = None
        return out or None
    return None if old == new else new


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


class Controller:
    """The operator's admission cycle (synchronous; the loop runs it in a worker thread)."""

    def __init__(
        self,
        api: OperatorApi,
        config: OperatorConfig | None = None,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.config = config or OperatorConfig()
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self.nodes = NodeReader(self.config.node_selector)
        self._validated: dict[str, tuple[float, str | None]] = {}
        # Per-job work runs on the outer pool and per-pod calls on the inner one, so a job's
        # task never waits for a slot of the pool it occupies.
        self._writer = ThreadPoolExecutor(self.config.write_workers, "gpusched-job")
        self._pods = ThreadPoolExecutor(self.config.write_workers, "gpusched-pod")
        self._events = ThreadPoolExecutor(4, "gpusched-event")
        self._quota_written: dict[str, float] = {}
        self._leaving: dict[str, list[str]] = {}
        """Preemptor key -> its victims whose pods are still on the GPUs (this cycle)."""

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._pods.shutdown(wait=True)
        self._events.shutdown(wait=True)

    # --- reading ---------------------------------------------------------------------------

    def observe(self) -> World:
        """Read every object the cycle needs (consistent reads)."""
        api = self.api
        futures = {
            "jobs": self._writer.submit(api.list_custom, "gpujobs"),
            "quotas": self._writer.submit(api.list_custom, "tenantquotas"),
            "topologies": self._writer.submit(api.list_custom, "nodegputopologies"),
            "nodes": self._writer.submit(api.list_nodes),
            "priorities": self._writer.submit(api.list_priority_classes),
            "pods": self._writer.submit(api.list_pods),
        }
        raw = {name: f.result() for name, f in futures.items()}
        return build_world(
            self.clock(),
            jobs=raw["jobs"],
            quotas=raw["quotas"],
            nodes=raw["nodes"],
            topologies=raw["topologies"],
            priority_classes=raw["priorities"],
            pods=raw["pods"],
        )

    # --- the cycle -------------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        """Observe, settle lifecycles, decide, apply."""
        report = CycleReport()
        t0 = time.perf_counter()
        world = self.observe()
        t1 = time.perf_counter()
        tenants = tenant_map(world.quotas)
        views = self.settle(world, tenants)
        t2 = time.perf_counter()
        snapshot = self.snapshot(world, views)
        result = run_cycle(snapshot)
        t3 = time.perf_counter()
        self.apply(world, views, result, report)
        self.publish_tenants(world, tenants, views, result)
        self.update_metrics(world, views, result)
        t4 = time.perf_counter()
        report.seconds = {
            "observe": t1 - t0,
            "settle": t2 - t1,
            "decide": t3 - t2,
            "apply": t4 - t3,
        }
        for stage, seconds in report.seconds.items():
            self.metrics.cycle_seconds.labels(stage).observe(seconds)
        report.waiting = len(result.waiting)
        return report

    def dry_snapshot(self) -> tuple[Snapshot, World]:
        """The snapshot a cycle would decide over now (with a read-only API: no writes)."""
        world = self.observe()
        views = self.settle(world, tenant_map(world.quotas))
        return self.snapshot(world, views), world

    # --- writes ----------------------------------------------------------------------------

    def _write(self, view: JobView, t: st.Transition, *, conditional: bool = False) -> bool:
        """Write the job's status if it differs from the server's; keeps the view current."""
        old = view.server.to_k8s()
        new = t.status.to_k8s()
        patch = merge_patch(old, new)
        if patch is None:
            view.status = view.server = t.status
            return True
        version = self.api.patch_job_status(
            view.record.namespace,
            view.record.name,
            patch,
            view.resource_version if conditional else None,
        )
        if version is None:
            self.metrics.api_errors.labels("job-status").inc()
            return False
        view.status = view.server = t.status
        view.resource_version = version
        return True

    def _stage(self, view: JobView, t: st.Transition) -> None:
        """Change the status in memory only; the cycle's next write of the job carries it (a
        new job admitted at once costs one status write, not two)."""
        view.status = t.status

    def _flush(self, views: Iterable[JobView]) -> None:
        """Write staged statuses no decision wrote."""
        dirty = [v for v in views if v.status is not v.server]
        for _ in self._writer.map(
            lambda v: self._write(v, st.Transition(v.status, self.clock(), v.record.generation)),
            dirty,
        ):
            pass

    def _event(self, view: JobView, reason: str, message: str, warning: bool = False) -> None:
        """Record an event in the background (events never hold up decisions)."""
        self._events.submit(
            self.api.event,
            view.record.raw,
            "GpuJob",
            event_type="Warning" if warning else "Normal",
            reason=reason,
            message=message,
            now=self.clock(),
        )

    def _delete_pods(self, pods: Iterable[PodInfo], grace: int | None) -> None:
        todo = [p for p in pods if p.live and not p.deleting]
        for _ in self._pods.map(lambda p: self.api.delete_pod(p.namespace, p.name, grace), todo):
            pass

    def _create_pods(self, view: JobView) -> PodRefusedError | bool:
        """Create the missing pods of the job's admission: True when all exist, False when
        some could not be made now, or the API server's refusal."""
        status = view.status
        tenant = view.tenant or ""
        by_replica = {p.replica: p for p in status.placement}
        manifests = [
            pod_manifest(
                view.job,
                tenant=tenant,
                admission=status.admission,
                replica=r,
                placement=by_replica.get(r),
            )
            for r in range(view.job.spec.replicas)
        ]
        existing = {p.name for p in view.record.pods_of(status.admission)}
        todo = [m for m in manifests if m["metadata"]["name"] not in existing]

        def create(manifest: dict[str, Any]) -> PodRefusedError | bool:
            try:
                ok = self.api.create_pod(manifest)
            except PodRefusedError as err:
                return err
            failpoints.reach("admission-after-first-pod")
            return ok

        outcomes = list(self._pods.map(create, todo))
        refusal = next((o for o in outcomes if isinstance(o, PodRefusedError)), None)
        return refusal if refusal is not None else all(outcomes)

    def _start_pods(self, view: JobView, now: datetime) -> bool:
        """Create the job's pods; a refusal releases the gang at once (True: all pods exist)."""
        outcome = self._create_pods(view)
        if not isinstance(outcome, PodRefusedError):
            return outcome
        # All or nothing: pods of the gang the server did accept go too.
        for replica in range(view.job.spec.replicas):
            name = pod_name(view.record.name, view.status.admission, replica)
            self.api.delete_pod(view.record.namespace, name, 0)
        gpus = view.gpus
        transition = st.Transition(view.status, now, view.record.generation)
        if outcome.invalid:
            # The pod can never be created as it is: fail the job with the server's reason
            # (and check the template again for every job that shares the verdict).
            self._validated.pop(self._template_key(view), None)
            if self._write(view, st.refused(transition, str(outcome), gpus)):
                self._event(view, st.Reason.INVALID_POD_TEMPLATE.value, str(outcome), True)
            self._terminating(view, [], None)
            return False
        # Refused for now (a namespace ResourceQuota, a policy): release and retry later.
        count = view.status.requeue_count
        delay = min(self.config.backoff_max, self.config.backoff_base * 2**count)
        text = (
            f"the API server refused its pods: {outcome}; gang released, next attempt in "
            f"{delay:.0f}s"
        )
        if self._write(
            view,
            st.requeued(
                transition,
                st.Reason.PODS_REFUSED,
                text,
                gpus,
                requeue_at=now + timedelta(seconds=delay),
            ),
        ):
            self._event(view, st.Reason.PODS_REFUSED.value, text, warning=True)
            self.metrics.requeues.labels(view.tenant or "", st.Reason.PODS_REFUSED.value).inc()
        self._terminating(view, [], None)
        return False

    # --- lifecycle -------------------------------------------------------------------------

    def _validate(self, view: JobView, world: World) -> tuple[st.Reason, str] | None:
        """Why the job cannot be queued (None: it can). The pod is dry-run against the API
        server, so admission webhooks, LimitRanges and field validation all have their say."""
        spec = view.job.spec
        if spec.priority_class_name and spec.priority_class_name not in world.priorities:
            return (
                st.Reason.PRIORITY_CLASS_NOT_FOUND,
                f"PriorityClass {spec.priority_class_name} does not exist",
            )
        manifest = pod_manifest(
            view.job,
            tenant=view.tenant or "",
            admission=0,
            replica=0,
            placement=None,
            dry_run=True,
        )
        digest = self._template_key(view, manifest)
        now = time.monotonic()
        cached = self._validated.get(digest)
        if cached is not None and now - cached[0] < VALIDATION_TTL:
            error = cached[1]
        else:
            error = self.api.dry_run_pod(manifest)
            self._validated[digest] = (now, error)
        if error:
            return st.Reason.INVALID_POD_TEMPLATE, f"the API server refuses its pods: {error}"
        return None

    def _template_key(self, view: JobView, manifest: dict[str, Any] | None = None) -> str:
        """The dry-run verdict's key: the whole pod that would be created (namespace, labels,
        annotations and spec), so only jobs whose pods are the same share a verdict."""
        if manifest is None:
            manifest = pod_manifest(
                view.job,
                tenant=view.tenant or "",
                admission=0,
                replica=0,
                placement=None,
                dry_run=True,
            )
        return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()

    def settle(self, world: World, tenants: TenantMap) -> dict[str, JobView]:
        """Bring every job's status in line with its pods, before admission decides."""
        views: dict[str, JobView] = {}
        for record in world.jobs:
            if record.deleting:
                self._delete_pods(record.live_pods(), None)
                continue
            if record.job is None:
                log.warning("GpuJob %s unreadable: %s", record.key, record.error)
                continue
            job = record.job
            spec = job.spec
            priority = (
                world.priorities.get(spec.priority_class_name, 0)
                if spec.priority_class_name
                else world.default_priority
            )
            view = JobView(
                record=record,
                job=job,
                tenant=tenants.owner.get(record.namespace),
                priority=priority,
                status=job.status,
                server=job.status,
                resource_version=record.resource_version,
            )
            views[record.key] = view
        # Victims still leaving, by the preemptor they make room for.
        leaving: dict[str, list[str]] = {}
        for view in views.values():
            if view.status.phase is JobPhase.PREEMPTED and view.status.preemptions:
                pods = view.record.pods_of(view.status.admission)
                if any(p.live for p in pods):
                    leaving.setdefault(view.status.preemptions[-1].preemptor, []).append(view.key)
        self._leaving = leaving
        work = list(views.values())
        for _ in self._writer.map(lambda v: self._settle_one(v, world, leaving), work):
            pass
        return views

    def _settle_one(self, view: JobView, world: World, leaving: dict[str, list[str]]) -> None:
        try:
            self._settle_job(view, world, leaving)
        except Exception:
            log.exception("settling %s failed", view.key)
            view.state = None

    def _settle_job(self, view: JobView, world: World, leaving: dict[str, list[str]]) -> None:
        now = world.now
        record = view.record
        spec = view.job.spec
        status = view.status
        phase = status.phase
        gpus = view.gpus
        current = record.pods_of(status.admission)
        stale = [p for p in record.pods if p.admission != status.admission]
        self._delete_pods(stale, 0)

        def transition() -> st.Transition:
            return st.Transition(view.status, now, record.generation)

        # New jobs, and jobs refused before whose spec or PriorityClass may have changed.
        revalidate = (
            phase is JobPhase.FAILED
            and status.reason in st.INVALID_REASONS
            and (
                status.observed_generation != record.generation
                or status.reason == st.Reason.PRIORITY_CLASS_NOT_FOUND
            )
        )
        if phase is None or revalidate:
            problem = self._validate(view, world)
            if problem is not None:
                reason, message = problem
                before = view.status.reason
                if self._write(view, st.invalid(transition(), reason, message, gpus)) and (
                    before != reason.value
                ):
                    self._event(view, reason.value, message, warning=True)
                return
            self._stage(view, st.queued(transition(), view.tenant, gpus))
            phase = view.status.phase

        if phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            self._delete_pods(current, None)
            return

        if spec.suspend:
            if phase is not JobPhase.SUSPENDED:
                self._delete_pods(current, spec.checkpoint_grace_period_seconds)
                if self._write(view, st.suspended(transition(), gpus)):
                    self._event(view, "Suspended", "spec.suspend is true; pods released")
            self._terminating(view, current, None)
            return
        if phase is JobPhase.SUSPENDED:
            self._stage(view, st.queued(transition(), view.tenant, gpus))
            phase = JobPhase.QUEUED

        if phase is JobPhase.PREEMPTED:
            live = [p for p in current if p.live]
            if live:
                # Eviction may have been cut short by a restart: finish it.
                self._delete_pods(live, spec.checkpoint_grace_period_seconds)
                preemptor = status.preemptions[-1].preemptor if status.preemptions else None
                self._terminating(view, current, preemptor)
                return
            text = "requeued after preemption"
            self._write(view, st.requeued(transition(), st.Reason.REQUEUED, text, gpus))
            self._event(view, "Requeued", text)
            phase = JobPhase.QUEUED

        if phase in (JobPhase.ADMITTED, JobPhase.RUNNING):
            self._settle_admitted(view, world, current, leaving)
            return

        # Queued: pods of a released gang may still be on their GPUs.
        if any(p.live for p in current):
            self._delete_pods(current, 0)
            self._terminating(view, current, None)
            return
        view.state = JobState.QUEUED

    def _terminating(self, view: JobView, pods: list[PodInfo], reserved_for: str | None) -> None:
        placement = []
        for pod in pods:
            if pod.live and pod.host:
                gpus = pod.bound_gpus
                placement.append(
                    Assignment(pod.host, gpus) if gpus else Assignment(pod.host, (), pod.gpus)
                )
        if placement:
            view.state = JobState.TERMINATING
            view.placement = tuple(placement)
            view.reserved_for = reserved_for
        else:
            view.state = None

    def _settle_admitted(
        self,
        view: JobView,
        world: World,
        current: list[PodInfo],
        leaving: dict[str, list[str]],
    ) -> None:
        now = world.now
        record = view.record
        spec = view.job.spec
        gpus = view.gpus
        replicas = spec.replicas

        def transition() -> st.Transition:
            return st.Transition(view.status, now, record.generation)

        # The namespace's owner may have changed (its TenantQuota deleted, another one
        # claiming it): the job and its pods name the tenant that accounts them now.
        if view.status.tenant != view.tenant:
            self._stage(view, transition().set(tenant=view.tenant))
        label = view.tenant or ""
        for pod in current:
            if pod.live and not pod.deleting and pod.labels.get(keys.LABEL_TENANT) != label:
                self.api.patch_pod_metadata(
                    pod.namespace, pod.name, labels={keys.LABEL_TENANT: label}
                )

        failed = [p for p in current if p.phase == "Failed"]
        if failed:
            pod = failed[0]
            text = f"pod {pod.name} failed" + (f": {pod.message}" if pod.message else "")
            self._delete_pods(current, None)
            if self._write(view, st.finished(transition(), False, text, gpus)):
                self._event(view, "Failed", text, warning=True)
            return
        if len(current) == replicas and all(p.phase == "Succeeded" for p in current):
            text = f"all {replicas} pods succeeded" if replicas > 1 else "its pod succeeded"
            if self._write(view, st.finished(transition(), True, text, gpus)):
                self._event(view, "Succeeded", text)
            return

        started = view.status.started_at is not None
        present = {p.replica for p in current}
        if started and len(present) < replicas:
            # A running gang lost a pod (deleted, node gone): release and queue it again.
            text = f"{replicas - len(present)} of {replicas} pods disappeared; gang released"
            self._delete_pods(current, spec.checkpoint_grace_period_seconds)
            if self._write(view, st.requeued(transition(), st.Reason.PODS_LOST, text, gpus)):
                self._event(view, st.Reason.PODS_LOST.value, text, warning=True)
                self.metrics.requeues.labels(view.tenant or "", st.Reason.PODS_LOST.value).inc()
            self._terminating(view, current, None)
            return

        # Still holding its planned GPUs.
        view.state = JobState.ADMITTED
        view.placement = self._held(view, current)
        if leaving.get(view.key):
            return  # victims still on the GPUs
        created = [p.created for p in current if p.created is not None]
        # The clock starts when the pods were created, or at admission if none could be
        # (e.g. a ResourceQuota refuses them): a gang never sits Admitted forever.
        started_waiting = min(created) if created else view.status.admitted_at
        all_running = len(present) == replicas and all(p.phase == "Running" for p in current)
        if (
            view.status.phase is JobPhase.ADMITTED
            and not all_running
            and started_waiting is not None
            and now > started_waiting + timedelta(seconds=self.config.pods_ready_timeout)
        ):
            self._release_unready(view, current, transition(), gpus, now)
            return
        if len(present) < replicas:
            if self._start_pods(view, now) and not transition().has(st.Cond.ADMITTED):
                self._write(view, st.released_by_victims(transition()))
                self._event(view, "PodsCreated", f"created {replicas} pods")
            return
        if (
            all_running
            and view.status.phase is not JobPhase.RUNNING
            and self._write(view, st.running(transition(), replicas, bound=current))
        ):
            nodes = ", ".join(sorted({p.node or "?" for p in current}))
            self._event(view, "Running", f"all pods running on {nodes}")

    def _release_unready(
        self,
        view: JobView,
        current: list[PodInfo],
        transition: st.Transition,
        gpus: int,
        now: datetime,
    ) -> None:
        """Release a gang whose pods did not all run in time and queue it again with backoff."""
        count = view.status.requeue_count
        delay = min(self.config.backoff_max, self.config.backoff_base * 2**count)
        text = (
            f"pods not all running within {self.config.pods_ready_timeout:.0f}s; gang "
            f"released, next attempt in {delay:.0f}s"
        )
        self._delete_pods(current, 0)
        if self._write(
            view,
            st.requeued(
                transition,
                st.Reason.PODS_READY_TIMEOUT,
                text,
                gpus,
                requeue_at=now + timedelta(seconds=delay),
            ),
        ):
            self._event(view, st.Reason.PODS_READY_TIMEOUT.value, text, warning=True)
            self.metrics.requeues.labels(
                view.tenant or "", st.Reason.PODS_READY_TIMEOUT.value
            ).inc()
        self._terminating(view, current, None)

    def _held(self, view: JobView, pods: list[PodInfo]) -> tuple[Assignment, ...]:
        """The GPUs an admitted job holds: what the extender bound where known, else the plan."""
        by_replica = {p.replica: p for p in pods}
        out = []
        k = view.job.spec.gpus_per_replica
        for plan in view.status.placement:
            pod = by_replica.get(plan.replica)
            bound = pod.bound_gpus if pod is not None and pod.node == plan.node else None
            gpus = tuple(bound or plan.gpu_indices)
            out.append(Assignment(plan.node, gpus) if gpus else Assignment(plan.node, (), k))
        return tuple(out)

    # --- snapshot ----------------------------------------------------------------------------

    def snapshot(self, world: World, views: dict[str, JobView]) -> Snapshot:
        accounted: set[tuple[str, str, str | None, int]] = set()
        jobs: list[Job] = []
        for view in views.values():
            if view.state is None:
                continue
            status = view.status
            uid = view.record.raw["metadata"].get("uid")
            accounted.add((view.record.namespace, view.record.name, uid, status.admission))
            checkpoint = view.record.last_checkpoint()
            # Creation time is the FIFO order users expect, and it never changes.
            submitted = view.job.metadata.creation_timestamp or status.submitted_at or world.now
            jobs.append(
                Job(
                    key=view.key,
                    tenant=view.tenant,
                    priority=view.priority,
                    submitted_at=submitted.timestamp(),
                    state=view.state,
                    placement=view.placement,
                    started_at=_ts(status.started_at) if view.state is JobState.ADMITTED else None,
                    last_checkpoint_at=_ts(checkpoint),
                    not_before=_ts(status.requeue_at),
                    reserved_for=view.reserved_for,
                    **job_shape(view.job),
                )
            )
        # GPUs of pods no accounted job explains (other workloads, leftovers).
        busy: dict[str, tuple[set[int], int]] = {}
        for pod in world.pods:
            if not pod.live or not pod.node or pod.gpus <= 0:
                continue
            if pod.job and (pod.namespace, pod.job, pod.job_uid, pod.admission) in accounted:
                continue
            if (
                pod.job
                and pod.job_uid is None
                and any(
                    key[:2] == (pod.namespace, pod.job) and key[3] == pod.admission
                    for key in accounted
                )
            ):
                continue
            indices, unknown = busy.setdefault(pod.node, (set(), 0))
            gpus = pod.bound_gpus
            if gpus:
                indices.update(gpus)
            else:
                busy[pod.node] = (indices, unknown + pod.gpus)
        nodes = self.nodes.nodes(world.nodes, world.topologies, busy)
        return Snapshot(
            now=world.now.timestamp(),
            tenants=tuple(core_tenant(q) for q in world.quotas),
            jobs=tuple(jobs),
            nodes=tuple(nodes),
            config=CycleConfig(max_preemption_searches=self.config.max_preemption_searches),
        )

    # --- applying decisions ------------------------------------------------------------------

    def apply(
        self, world: World, views: dict[str, JobView], result: CycleResult, report: CycleReport
    ) -> None:
        now = world.now
        count_only = {
            n["metadata"]["name"]
            for n in world.nodes
            if n["metadata"]["name"] not in world.topologies
        }
        # Admissions are independent of each other (the cycle already gave each its own GPUs),
        # so their writes go out in parallel.
        applied = self._writer.map(
            lambda a: (a, self._apply_admission(views[a.job], views, a, now, count_only)),
            result.admissions,
        )
        for admission, ok in applied:
            if ok:
                report.admitted.append(admission.job)
                report.preempted.extend(v.victim for v in admission.victims)

        def wait(w: Any) -> None:
            view = views.get(w.job)
            if view is None or view.state is not JobState.QUEUED:
                return
            before = view.status.reason
            t = st.waiting(
                st.Transition(view.status, now, view.record.generation),
                w.tenant,
                w.reason,
                w.message,
                w.queue_position,
            )
            if self._write(view, t) and before != w.reason.value:
                warning = w.reason in (WaitReason.NO_TENANT, WaitReason.NO_FEASIBLE_NODES)
                self._event(view, w.reason.value, w.message, warning=warning)

        for _ in self._writer.map(wait, result.waiting):
            pass
        self._flush(views.values())

    def _apply_admission(
        self,
        view: JobView,
        views: dict[str, JobView],
        admission: Admission,
        now: datetime,
        count_only: set[str],
    ) -> bool:
        victims = [(views[v.victim], v) for v in admission.victims]
        # 1. Victims first: their status names the preemptor, which reserves their GPUs for it
        #    even if this process dies before writing anything else.
        marked = list(
            self._pods.map(
                lambda pair: self._write(
                    pair[0],
                    st.preempted(
                        st.Transition(pair[0].status, now, pair[0].record.generation),
                        pair[1],
                        pair[0].gpus,
                    ),
                    conditional=True,
                ),
                victims,
            )
        )
        if victims:
            failpoints.reach("preemption-after-victims-marked")
        for (victim, preemption), ok in zip(victims, marked, strict=True):
            if not ok:
                continue
            pods = [p for p in victim.record.pods_of(victim.status.admission) if p.live]
            for pod in pods:
                self.api.patch_pod_metadata(
                    pod.namespace,
                    pod.name,
                    annotations={keys.ANNOTATION_PREEMPTED_BY: admission.job},
                )
            self._delete_pods(pods, victim.job.spec.checkpoint_grace_period_seconds)
            self._event(victim, st.Reason.PREEMPTED_BY.value, victim.status.message or "", True)
            self.metrics.preemptions.labels(victim.tenant or "", preemption.reason.value).inc()
        if victims:
            failpoints.reach("preemption-after-evict")
        if not all(marked):
            return False
        # 2. The admitted job: planned GPUs in its status (the reservation), then its pods.
        waited_since = self._queued_since(view)
        t = st.admitted(
            st.Transition(view.status, now, view.record.generation),
            admission,
            admission.tenant,
            count_only,
        )
        if not self._write(view, t, conditional=True):
            return False
        failpoints.reach("admission-after-status")
        self._event(view, "Admitted", admission.message)
        if admission.victims:
            self._event(
                view,
                "Preempting",
                "preempting " + ", ".join(v.victim for v in admission.victims),
            )
        elif not self._leaving.get(view.key):
            # (GPUs reserved by victims that are still leaving: pods come once they are gone.)
            self._start_pods(view, now)
        self.metrics.admissions.labels(admission.tenant, admission.reason.value).inc()
        if waited_since is not None:
            self.metrics.queue_wait.labels(admission.tenant, str(view.priority)).observe(
                max(0.0, (now - waited_since).total_seconds())
            )
        return True

    @staticmethod
    def _queued_since(view: JobView) -> datetime | None:
        for c in view.status.conditions:
            if c.type == st.Cond.QUOTA_RESERVED.value and c.status == ConditionStatus.FALSE:
                return c.last_transition_time
        return view.status.submitted_at

    # --- tenants and metrics -----------------------------------------------------------------

    def publish_tenants(
        self,
        world: World,
        tenants: TenantMap,
        views: dict[str, JobView],
        result: CycleResult,
    ) -> None:
        now = world.now
        usage = {u.name: u for u in result.tenants}

        def publish(quota: Any) -> None:
            name = quota.metadata.name or ""
            u = usage.get(name)
            if u is None:
                return
            old = quota.status
            seconds = old.gpu_seconds
            last = old.last_metered_at
            if last is not None:
                seconds += _gpu_seconds_between(views.values(), name, last, now)
            # A job of the tenant stopped running in this cycle: its time up to now is counted
            # only if written now (next cycle its status no longer says it ran).
            stopped = any(
                view.tenant == name
                and view.job.status.phase is JobPhase.RUNNING
                and view.status.phase is not JobPhase.RUNNING
                for view in views.values()
            )
            conflicts = tenants.conflicts.get(name, [])
            conditions = list(old.conditions)
            conditions = _set_condition(
                conditions,
                "NamespaceConflict",
                value=bool(conflicts),
                reason="NamespaceOwnedElsewhere" if conflicts else "NoConflict",
                message=(
                    "namespaces owned by an older TenantQuota: " + ", ".join(conflicts)
                    if conflicts
                    else "every namespace listed belongs to this TenantQuota"
                ),
                now=now,
            )
            conditions = _set_condition(
                conditions,
                "Ready",
                value=True,
                reason="Accounted",
                message="usage computed by the admission cycle",
                now=now,
            )
            new = TenantQuotaStatus(
                used_gpus=u.used,
                borrowed_gpus=u.borrowed,
                used_gpus_by_model=dict(u.used_by_model),
                fair_share=u.fair_share,
                pending_jobs=u.pending,
                admitted_jobs=u.admitted,
                running_jobs=u.running,
                gpu_seconds=round(seconds, 1),
                conditions=conditions,
                last_metered_at=now,
            )
            old_body = old.to_k8s()
            new_body = new.to_k8s()
            compare_old = {
                k: v for k, v in old_body.items() if k not in ("gpuSeconds", "lastMeteredAt")
            }
            compare_new = {
                k: v for k, v in new_body.items() if k not in ("gpuSeconds", "lastMeteredAt")
            }
            stale = time.monotonic() - self._quota_written.get(name, 0.0)
            quiet = compare_old == compare_new and not stopped
            if quiet and stale < self.config.quota_meter_interval and last:
                # Exported from what is stored, so the series never goes back.
                self.metrics.gpu_seconds.labels(name).set(old.gpu_seconds)
                return
            patch = merge_patch(old_body, new_body)
            if patch and self.api.patch_quota_status(name, patch):
                self._quota_written[name] = time.monotonic()
                self.metrics.gpu_seconds.labels(name).set(new.gpu_seconds)
            else:
                self.metrics.gpu_seconds.labels(name).set(old.gpu_seconds)

        for _ in self._writer.map(publish, world.quotas):
            pass

    def update_metrics(self, world: World, views: dict[str, JobView], result: CycleResult) -> None:
        m = self.metrics
        counts: dict[tuple[str, str], int] = {}
        for view in views.values():
            phase = view.status.phase.value if view.status.phase else "New"
            key = (view.tenant or "", phase)
            counts[key] = counts.get(key, 0) + 1
        m.jobs.clear()
        for (tenant, phase), n in counts.items():
            m.jobs.labels(tenant, phase).set(n)
        specs = {q.metadata.name: q.spec for q in world.quotas}
        for u in result.tenants:
            m.gpus_used.labels(u.name).set(u.used)
            m.gpus_borrowed.labels(u.name).set(u.borrowed)
            m.gpus_guaranteed.labels(u.name).set(
                specs[u.name].guaranteed_gpus if u.name in specs else 0
            )
            m.fair_share.labels(u.name).set(u.fair_share)


def _gpu_seconds_between(
    views: Iterable[JobView], tenant: str, since: datetime, until: datetime
) -> float:
    """GPU-seconds the tenant's jobs ran between two times, from their start and finish times.

    Read from each job's status as it stood when the cycle began: a job this cycle preempts or
    requeues still counts up to now (its new status has forgotten that it started)."""
    total = 0.0
    for view in views:
        if view.tenant != tenant:
            continue
        status = view.job.status
        started = status.started_at
        if started is None:
            continue
        if status.phase is JobPhase.RUNNING:
            end = until
        elif status.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) and status.finished_at:
            end = status.finished_at
        else:
            continue
        finished = view.status.finished_at  # finishing in this very cycle
        if finished is not None:
            end = min(end, finished)
        begin = max(started, since)
        if end > begin:
            total += (end - begin).total_seconds() * view.gpus
    return total


def _set_condition(
    conditions: list[Condition],
    type_: str,
    *,
    value: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    status = ConditionStatus.TRUE if value else ConditionStatus.FALSE
    out = [c for c in conditions if c.type != type_]
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    out.append(
        Condition(
            type=type_, status=status, reason=reason, message=message, last_transition_time=since
        )
    )
    return sorted(out, key=lambda c: c.type)
