"""The operator's reading of the cluster at one moment: GpuJobs with their pods, TenantQuotas,
nodes, topologies and priorities, parsed once per cycle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.annotations import parse_indices
from gpusched.api.gpujob import GpuJob, JobPhase
from gpusched.api.tenantquota import TenantQuota
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


@dataclass
class PodInfo:
    """One pod as the operator needs it."""

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

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodInfo:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        try:
            gpus = gpu_count(pod)
        except RequestError:
            gpus = 0
        message = status.get("message") or status.get("reason") or ""
        for cs in status.get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated and terminated.get("exitCode"):
                message = (
                    f"container {cs.get('name')} exited with code {terminated.get('exitCode')}"
                    + (f" ({terminated.get('reason')})" if terminated.get("reason") else "")
                )
                break
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            phase=status.get("phase") or "Pending",
            node=spec.get("nodeName") or None,
            deleting=bool(meta.get("deletionTimestamp")),
            created=parse_time(meta.get("creationTimestamp")),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
            gpus=gpus,
            message=message,
        )

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
    def admission(self) -> int | None:
        value = self.labels.get(keys.LABEL_ADMISSION, "")
        return int(value) if value.isdigit() else None

    @property
    def replica(self) -> int | None:
        value = self.labels.get(keys.LABEL_REPLICA_INDEX, "")
        return int(value) if value.isdigit() else None

    @property
    def bound_gpus(self) -> tuple[int, ...] | None:
        """GPU indices the extender bound, else those the admission planned."""
        return parse_indices(self.annotations.get(keys.ANNOTATION_GPU_INDICES)) or parse_indices(
            self.annotations.get(keys.ANNOTATION_PLANNED_GPU_INDICES)
        )

    @property
    def host(self) -> str | None:
        """Node it is bound to, else the one it was planned for."""
        return self.node or self.annotations.get(keys.ANNOTATION_PLANNED_NODE) or None


@dataclass
class JobRecord:
    """A GpuJob and its pods."""

    raw: dict[str, Any]
    job: GpuJob | None
    """None when the object cannot be read as a GpuJob (then ``error`` says why)."""
    error: str = ""
    pods: list[PodInfo] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return str(self.raw["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.raw["metadata"]["name"])

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        return str(self.raw["metadata"].get("uid", ""))

    @property
    def generation(self) -> int:
        return int(self.raw["metadata"].get("generation") or 1)

    @property
    def resource_version(self) -> str:
        return str(self.raw["metadata"].get("resourceVersion", ""))

    @property
    def deleting(self) -> bool:
        return bool(self.raw["metadata"].get("deletionTimestamp"))

    @property
    def phase(self) -> JobPhase | None:
        return self.job.status.phase if self.job is not None else None

    def pods_of(self, admission: int) -> list[PodInfo]:
        """Pods of one admission, by replica index."""
        return sorted(
            (p for p in self.pods if p.admission == admission),
            key=lambda p: (p.replica if p.replica is not None else -1, p.name),
        )

    def live_pods(self) -> list[PodInfo]:
        return [p for p in self.pods if p.live]

    def last_checkpoint(self) -> datetime | None:
        """Latest checkpoint the job or its pods reported."""
        times = [
            parse_time(
                self.raw["metadata"].get("annotations", {}).get(keys.ANNOTATION_LAST_CHECKPOINT)
            )
        ]
        times += [parse_time(p.annotations.get(keys.ANNOTATION_LAST_CHECKPOINT)) for p in self.pods]
        known = [t for t in times if t is not None]
        return max(known) if known else None


def read_job(raw: dict[str, Any]) -> JobRecord:
    """Parse a GpuJob; an object the types refuse becomes a record with an error."""
    try:
        return JobRecord(raw, GpuJob.model_validate(raw))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JobRecord(raw, None, f"{where}: {first.get('msg', 'invalid')}")


@dataclass
class World:
    """Everything one cycle reads from the API server."""

    now: datetime
    jobs: list[JobRecord]
    quotas: list[TenantQuota]
    quota_raw: dict[str, dict[str, Any]]
    nodes: list[dict[str, Any]]
    topologies: dict[str, dict[str, Any]]
    priorities: dict[str, int]
    default_priority: int
    pods: list[PodInfo]
    """Every pod that may hold GPUs: live pods on nodes, and every pod of a GpuJob."""

    def job_pods(self) -> dict[tuple[str, str], list[PodInfo]]:
        out: dict[tuple[str, str], list[PodInfo]] = {}
        for pod in self.pods:
            if pod.job:
                out.setdefault((pod.namespace, pod.job), []).append(pod)
        return out


def build_world(
    now: datetime,
    *,
    jobs: Iterable[dict[str, Any]],
    quotas: Iterable[dict[str, Any]],
    nodes: list[dict[str, Any]],
    topologies: Iterable[dict[str, Any]],
    priority_classes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
) -> World:
    """Parse raw API objects into a :class:`World`."""
    pod_infos = [PodInfo.of(p) for p in pods]
    records = [read_job(raw) for raw in jobs]
    by_job: dict[tuple[str, str], list[PodInfo]] = {}
    for pod in pod_infos:
        if pod.job:
            by_job.setdefault((pod.namespace, pod.job), []).append(pod)
    for record in records:
        uid = record.raw["metadata"].get("uid")
        record.pods = [
            pod
            for pod in by_job.get((record.namespace, record.name), [])
            if pod.job_uid in (None, uid)
        ]
    quota_objects = []
    quota_raw = {}
    for raw in quotas:
        try:
            quota_objects.append(TenantQuota.model_validate(raw))
            quota_raw[raw["metadata"]["name"]] = raw
        except ValidationError:
            continue
    priorities: dict[str, int] = {}
    default = 0
    for pc in priority_classes:
        name = (pc.get("metadata") or {}).get("name")
        if not name:
            continue
        priorities[name] = int(pc.get("value") or 0)
        if pc.get("globalDefault"):
            default = priorities[name]
    return World(
        now=now,
        jobs=records,
        quotas=quota_objects,
        quota_raw=quota_raw,
        nodes=nodes,
        topologies={t["metadata"]["name"]: t for t in topologies},
        priorities=priorities,
        default_priority=default,
        pods=pod_infos,
    )
