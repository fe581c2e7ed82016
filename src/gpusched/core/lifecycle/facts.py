"""What the job lifecycle reads: GpuJobs and their pods, parsed once from API objects.

A :class:`PodFacts` or :class:`JobFacts` is built when the watch delivers the object (or when the
operator assumes what its own write will make), then shared, unchanged, by every cycle until the
object changes again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Final

from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.annotations import whole_number
from gpusched.api.gpujob import GpuJob, GpuJobStatus, JobPhase
from gpusched.core.podgpus import GpuClaim, claim_of, controlling_gpujob, distinct_indices
from gpusched.core.scheduling import RequestError, gpu_count

#: Pod phases after which a pod holds no GPU.
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (as the API server writes them), or None."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _refused_by_kubelet(status: Mapping[str, Any]) -> bool:
    """Whether a Failed pod never got a container: the kubelet's admission refused it (device
    plugin, resources, affinity, a restart that found it unadmitted). Its status then carries
    the kubelet's reason and no container status ever left ``waiting``."""
    if status.get("phase") != "Failed" or not status.get("reason"):
        return False
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        if cs.get("containerID") or "running" in state or "terminated" in state or last:
            return False
    return True


#: Pod status reasons the kubelet gives a pod it shut down with its node (graceful node
#: shutdown). ``Evicted`` is not one: the kubelet gives it as well to a pod that outgrew its own
#: ephemeral-storage or emptyDir limit (the work's doing, and evicted again on every run),
#: and marks only its evictions under node pressure ``DisruptionTarget``
#: (``pkg/kubelet/eviction/eviction_manager.go``).
DISRUPTION_REASONS: Final = frozenset({"Terminated", "Shutdown", "NodeShutdown"})


def _disrupted(meta: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether a Failed pod was stopped by the cluster rather than failing: deleted (a drain,
    the eviction API: its container then exits on SIGTERM), shut down with its node, or marked
    a ``DisruptionTarget`` by Kubernetes (the kubelet's evictions under node pressure, the
    eviction API, taint eviction)."""
    if status.get("phase") != "Failed":
        return False
    if meta.get("deletionTimestamp") or status.get("reason") in DISRUPTION_REASONS:
        return True
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _container_times(status: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """When the pod's containers had all started, and (a pod that ended) all ended."""
    starts: list[datetime] = []
    ends: list[datetime] = []
    statuses = status.get("containerStatuses") or []
    for cs in statuses:
        state = cs.get("state") or {}
        running, terminated = state.get("running"), state.get("terminated")
        began = parse_time((running or terminated or {}).get("startedAt"))
        if began is not None:
            starts.append(began)
        finished = parse_time((terminated or {}).get("finishedAt"))
        if finished is not None:
            ends.append(finished)
    started = max(starts) if statuses and len(starts) == len(statuses) else None
    ended = max(ends) if statuses and len(ends) == len(statuses) else None
    return started, ended


#: How :attr:`PodFacts.waiting` starts when one of the pod's own containers holds it back.
OWN_CONTAINER: Final = "container "
#: Longest quote of a waiting pod's cause (an image pull's error can run to kilobytes).
WAITING_CHARS: Final = 300


def _waiting(status: Mapping[str, Any]) -> str:
    """What :attr:`PodFacts.waiting` says of a pending pod (empty for any other)."""
    if (status.get("phase") or "Pending") != "Pending":
        return ""
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            said = f"{OWN_CONTAINER}{cs.get('name')}: {waiting['reason']}"
            if waiting.get("message"):
                said += f": {waiting['message']}"
            return said[:WAITING_CHARS]
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            said = "not scheduled" + (f": {c['reason']}" if c.get("reason") else "")
            if c.get("message"):
                said += f": {c['message']}"
            return said[:WAITING_CHARS]
    return ""


def _number(value: str | None) -> int | None:
    return whole_number(value) if value else None


def _version(meta: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (0 when absent or not numeric)."""
    value = str(meta.get("resourceVersion") or "")
    return whole_number(value) or 0


@dataclass(frozen=True, slots=True)
class PodFacts:
    """One pod as the lifecycle needs it."""

    name: str
    namespace: str
    phase: str
    node: str | None
    deleting: bool
    created: datetime | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    gpus: int
    message: str = ""
    uid: str = ""
    version: int = 0
    """resourceVersion as a number (0: assumed by the operator, not yet read back)."""
    scheduler: str = ""
    """``spec.schedulerName``: the extender's GPU set is believed only on gpusched's pods."""
    controller_uid: str = ""
    """UID of the GpuJob controlling the pod (reference and label agree), else empty: only
    such a pod's plan (``planned-*``) is the operator's."""
    reason: str = ""
    """``status.reason`` (e.g. the kubelet's ``UnexpectedAdmissionError``)."""
    deletion_at: datetime | None = None
    """When a deleted pod is due gone (``deletionTimestamp``: the deletion's time plus its
    grace period)."""
    disrupted: bool = False
    """Failed because the cluster stopped it (a drain, an eviction, its node shutting down),
    not because its work failed."""
    never_started: bool = False
    """Failed before any container was created: the kubelet refused to admit it (a device
    plugin, resources, a node restart), so the workload never ran."""
    started: datetime | None = None
    """When the last of its containers started (the kubelet's ``startedAt``), None while one
    has not: when the pod began running, however late a cycle saw it."""
    ended: datetime | None = None
    """When the last of its containers ended (``finishedAt``), for a pod that ran to its end."""
    waiting: str = ""
    """Why a pod not running yet waits, in the kubelet's or the scheduler's words: a
    container's waiting reason and message (``ImagePullBackOff: Back-off pulling image ...``),
    else the scheduler's (``Unschedulable: 0/4 nodes are available: ...``); empty when nothing
    says. A gang released for not running in time says it, as its pods go with the release."""

    @property
    def waits_on_own_container(self) -> bool:
        """Whether what holds the pod back is one of its own containers (an image that
        cannot be pulled, a missing secret or config map), which the job's next admission
        would meet again, rather than the cluster (no node, the scheduler)."""
        return self.waiting.startswith(OWN_CONTAINER)

    admission: int | None = field(init=False, default=None)
    """The admission of its job that created it (label), read once."""
    replica: int | None = field(init=False, default=None)
    """Its replica index (label), read once."""
    claim: GpuClaim = field(init=False, default=GpuClaim())
    """The GPUs it is believed to hold (gpusched.core.podgpus), read once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "admission", _number(self.labels.get(keys.LABEL_ADMISSION)))
        object.__setattr__(self, "replica", _number(self.labels.get(keys.LABEL_REPLICA_INDEX)))
        object.__setattr__(
            self,
            "claim",
            claim_of(
                self.annotations, self.gpus, for_gpusched=self.scheduler == keys.SCHEDULER_NAME
            ),
        )

    @classmethod
    def from_api(cls, pod: Mapping[str, Any]) -> PodFacts:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        try:
            gpus = gpu_count(pod)
        except RequestError:
            gpus = 0
        # The kubelet's word on the pod (an eviction's cause) follows a container's exit.
        said = status.get("message") or status.get("reason") or ""
        if status.get("message") and status.get("reason"):
            said = f"{status['reason']}: {status['message']}"
        message = said
        for cs in status.get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated and terminated.get("exitCode"):
                message = (
                    f"container {cs.get('name')} exited with code {terminated.get('exitCode')}"
                    + (f" ({terminated.get('reason')})" if terminated.get("reason") else "")
                    + (f"; {said}" if said else "")
                )
                break
        started, ended = _container_times(status)
        return cls(
            started=started,
            ended=ended,
            waiting=_waiting(status),
            scheduler=str(spec.get("schedulerName") or ""),
            controller_uid=controlling_gpujob(pod) or "",
            never_started=_refused_by_kubelet(status),
            disrupted=_disrupted(meta, status),
            reason=str(status.get("reason") or ""),
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            phase=status.get("phase") or "Pending",
            node=spec.get("nodeName") or None,
            deleting=bool(meta.get("deletionTimestamp")),
            deletion_at=parse_time(meta.get("deletionTimestamp")),
            created=parse_time(meta.get("creationTimestamp")),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
            gpus=gpus,
            message=message,
            uid=meta.get("uid", ""),
            version=_version(meta),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def live(self) -> bool:
        """Still holds (or may hold) its GPUs."""
        return self.phase not in TERMINAL_POD_PHASES

    @property
    def job(self) -> str | None:
        return self.labels.get(keys.LABEL_JOB_NAME)

    @property
    def job_uid(self) -> str | None:
        """UID of the GpuJob that created the pod: a job deleted and recreated under the same
        name is another job, whose pods must not be mistaken for the old one's."""
        return self.labels.get(keys.LABEL_JOB_UID)

    @property
    def bound_gpus(self) -> tuple[int, ...] | None:
        """GPU indices it holds (the extender's set or the kubelet's allocation, where
        believed), else those the admission planned for it."""
        return self.claim.held or self.planned_gpus

    @property
    def planned_gpus(self) -> tuple[int, ...] | None:
        """The GPUs admission planned, on a GpuJob's pod only."""
        if not self.controller_uid:
            return None
        return distinct_indices(self.annotations.get(keys.ANNOTATION_PLANNED_GPU_INDICES))

    @property
    def host(self) -> str | None:
        """Node it is bound to, else the one it was planned for (a GpuJob's pod only)."""
        if self.node:
            return self.node
        if not self.controller_uid:
            return None
        return self.annotations.get(keys.ANNOTATION_PLANNED_NODE) or None

    def with_deletion(self) -> PodFacts:
        """The pod as it is once a delete was sent."""
        return replace(self, deleting=True)


@dataclass(frozen=True, slots=True)
class Unwritten:
    """The API server's side of an admission not written yet.

    An admission without victims creates its pods first and writes its status with the job's
    next change (usually its pods running), at the latest ``LifecycleConfig.record_delay``
    seconds after: one status write per started job instead of two, the API server's costliest
    request on a GpuJob. The pods carry the admission (labels, planned GPUs); if the operator
    stops before the write, the next one finds pods of an admission the status does not name,
    deletes them and decides the job again (with a higher admission number: no pod name is
    reused)."""

    status: GpuJobStatus
    """The status the API server has."""
    resource_version: str
    """The job's version the admission was decided on: the write is conditional on it."""


@dataclass(frozen=True)
class JobFacts:
    """A GpuJob and its pods."""

    namespace: str
    name: str
    uid: str
    generation: int
    version: int
    """resourceVersion as a number."""
    resource_version: str
    deleting: bool
    job: GpuJob | None
    """None when the object cannot be read as a GpuJob (then ``error`` says why)."""
    status: GpuJobStatus
    """The status as the operator last read it from, or wrote it to, the API server; or the
    admission it carried out and has not written yet (see ``unwritten``)."""
    error: str = ""
    checkpoint: datetime | None = None
    """Latest checkpoint the job itself reported (annotation)."""
    pods: tuple[PodFacts, ...] = ()
    raw_meta: Mapping[str, Any] = field(default_factory=dict)
    unwritten: Unwritten | None = None
    """Set when ``status`` is an admission whose pods are created but whose status is not
    written yet: what the API server has instead, and the version the decision was taken on."""

    @property
    def submitter(self) -> str:
        """Who created the job, as the admission policy recorded it ("" when not recorded)."""
        annotations = self.raw_meta.get("annotations") or {}
        return str(annotations.get(keys.ANNOTATION_SUBMITTER) or "")

    @property
    def written(self) -> GpuJobStatus:
        """The status the API server has: what a status write is a patch from."""
        return self.unwritten.status if self.unwritten is not None else self.status

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> JobFacts:
        """Parse a GpuJob; an object the types refuse becomes facts with an error."""
        meta = raw.get("metadata") or {}
        job: GpuJob | None = None
        error = ""
        try:
            job = GpuJob.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            error = f"{where}: {first.get('msg', 'invalid')}"
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 1),
            version=_version(meta),
            resource_version=str(meta.get("resourceVersion", "")),
            deleting=bool(meta.get("deletionTimestamp")),
            job=job,
            status=job.status if job is not None else GpuJobStatus(),
            error=error,
            checkpoint=parse_time(
                (meta.get("annotations") or {}).get(keys.ANNOTATION_LAST_CHECKPOINT)
            ),
            # Without managedFields, which the operator never reads: the API server lists in them
            # every field of the spec it was given (a dict per env entry, volume, ...), which
            # would triple what a job costs in memory.
            raw_meta={k: v for k, v in meta.items() if k != "managedFields"},
        )

    @cached_property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def phase(self) -> JobPhase | None:
        return self.status.phase

    @cached_property
    def gpus(self) -> int:
        return self.job.total_gpus if self.job is not None else 0

    def pods_of(self, admission: int) -> list[PodFacts]:
        """Pods of one admission, by replica index."""
        return sorted(
            (p for p in self.pods if p.admission == admission),
            key=lambda p: (p.replica if p.replica is not None else -1, p.name),
        )

    def live_pods(self) -> list[PodFacts]:
        return [p for p in self.pods if p.live]

    def last_checkpoint(self) -> datetime | None:
        """Latest checkpoint the job or its pods reported."""
        times = [self.checkpoint]
        times += [parse_time(p.annotations.get(keys.ANNOTATION_LAST_CHECKPOINT)) for p in self.pods]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    def reference(self) -> dict[str, Any]:
        """The object reference events and owner references name."""
        return {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
        }


def owns(job: JobFacts, pod: PodFacts) -> bool:
    """Whether the pod belongs to the job (same name and, when the pod says, the same UID)."""
    return (
        pod.namespace == job.namespace
        and pod.job == job.name
        and pod.job_uid in (None, "", job.uid)
    )


def gone_by(pods: Iterable[PodFacts]) -> datetime | None:
    """When the live ``pods`` are all due gone: the latest of their deletion deadlines
    (None while one of them is not being deleted, or none is live)."""
    due: datetime | None = None
    for pod in pods:
        if not pod.live:
            continue
        if pod.deletion_at is None:
            return None
        due = pod.deletion_at if due is None else max(due, pod.deletion_at)
    return due


#: A node and GPU indices on it (empty: which ones is not known).
Spot = tuple[str, tuple[int, ...]]


def pod_ref(pod: PodFacts) -> str:
    """The name a pod goes by among the jobs a preemptor waits for (never a GpuJob's key:
    those have one ``/``)."""
    return f"{pod.namespace}/pod/{pod.name}"


def holds_any(pod: PodFacts, spots: Iterable[Spot]) -> bool:
    """Whether the pod may hold a GPU of ``spots``: on the same node, sharing an index (or
    with either side's indices not known)."""
    host = pod.host
    held = set(pod.bound_gpus or ())
    return any(
        node == host and (not held or not gpus or not held.isdisjoint(gpus)) for node, gpus in spots
    )


def placed_on(job: JobFacts) -> list[Spot]:
    """The GPUs the job's status plans or records for it."""
    return [(p.node, tuple(p.gpu_indices)) for p in job.status.placement]


def kept(pods: Iterable[PodFacts], since: datetime | None, stuck_after: float | None) -> bool:
    """Whether the GPUs of leaving ``pods`` were still kept for a job admitted at ``since``:
    once the pods outstay their deletion by ``stuck_after`` seconds they are kept for nobody
    (the preemptor waiting on them is released then), so a job admitted after that never
    waits for them (None: no such bound is applied)."""
    if since is None or stuck_after is None:
        return True
    due = gone_by(pods)
    return due is None or since <= due + timedelta(seconds=stuck_after)


def leaving_deadlines(
    leaving: Mapping[str, Iterable[str]],
    jobs: Mapping[str, JobFacts],
    pods: Iterable[PodFacts] = (),
) -> dict[str, datetime | None]:
    """Preemptor key -> when the pods it waits for (its victims' still leaving, pods of
    GpuJobs that are gone, by :func:`pod_ref`) are all due gone (None while one of them is
    not being deleted yet, or is not known)."""
    refs: dict[str, PodFacts] | None = None
    out: dict[str, datetime | None] = {}
    for preemptor, names in leaving.items():
        held: list[PodFacts] = []
        for name in names:
            victim = jobs.get(name)
            if victim is not None:
                held.extend(victim.pods_of(victim.status.admission))
                continue
            refs = refs if refs is not None else {pod_ref(p): p for p in pods}
            if name not in refs:
                held = []
                break
            held.append(refs[name])
        out[preemptor] = gone_by(held) if held else None
    return out


def leaving_victims(
    jobs: Iterable[JobFacts],
    pods: Iterable[PodFacts] = (),
    *,
    now: datetime | None = None,
    stuck_after: float | None = None,
) -> dict[str, list[str]]:
    """Preemptor key -> what still holds GPUs it is to run on: its victims (job keys) whose
    pods are on its planned GPUs, and live pods of GpuJobs that are gone (:func:`pod_ref`)
    on the planned GPUs of a job whose pods are not running yet.

    A queued preemptor (decided again this cycle: its new placement is the plan's to compare)
    waits for all its victims still leaving. A victim whose pods outstayed their deletion by
    ``stuck_after`` seconds before the preemptor's admission (``now`` for a queued one) is
    not waited for: its GPUs were no longer kept for it (:func:`kept`), and waiting would
    release it again and again (None: no such bound)."""
    jobs = list(jobs)
    by_key = {job.key: job for job in jobs}
    leaving: dict[str, list[str]] = {}
    for job in jobs:
        status = job.status
        if status.phase is not JobPhase.PREEMPTED or not status.preemptions:
            continue
        live = [p for p in job.pods_of(status.admission) if p.live]
        preemptor = status.preemptions[-1].preemptor
        found = by_key.get(preemptor)
        if live and (found is None or _waits_for(found, live, now, stuck_after)):
            leaving.setdefault(preemptor, []).append(job.key)
    for key, pod in _on_planned_gpus(jobs, pods, stuck_after):
        leaving.setdefault(key, []).append(pod_ref(pod))
    return leaving


def _waits_for(
    preemptor: JobFacts, live: list[PodFacts], now: datetime | None, stuck_after: float | None
) -> bool:
    """Whether a preemptor waits for its victim's ``live`` pods: they are on GPUs its status
    plans for it (a queued one: wherever they are) and were still kept for it when it was
    admitted."""
    status = preemptor.status
    if status.phase in (JobPhase.ADMITTED, JobPhase.RUNNING):
        spots = placed_on(preemptor)
        return any(holds_any(p, spots) for p in live) and kept(
            live, status.admitted_at, stuck_after
        )
    return kept(live, now, stuck_after)


def _on_planned_gpus(
    jobs: list[JobFacts], pods: Iterable[PodFacts], stuck_after: float | None
) -> list[tuple[str, PodFacts]]:
    """(job key, pod): live pods of GpuJobs that are gone (deleted while their pods still
    terminate, a victim among them) on the planned GPUs of an admitted job. No admission
    counted those pods when it planned, so the job's pods wait for them as for victims."""
    by_node: dict[str, list[JobFacts]] = {}
    for job in jobs:
        if job.status.phase is JobPhase.ADMITTED:
            for node in {p.node for p in job.status.placement}:
                by_node.setdefault(node, []).append(job)
    if not by_node:  # nothing admitted waits for its pods: no pod need be looked at
        return []
    uids = {job.uid for job in jobs}
    orphans = [
        p
        for p in pods
        if p.live and p.controller_uid and p.controller_uid not in uids and p.host in by_node
    ]
    found = []
    for pod in orphans:
        for job in by_node.get(pod.host or "", []):
            if holds_any(pod, placed_on(job)) and kept([pod], job.status.admitted_at, stuck_after):
                found.append((job.key, pod))
    return found
