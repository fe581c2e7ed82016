"""What the operator does to the cluster, as data: the lifecycle and the admission plan return
these; the operator's executor applies them.

Every action names its object exactly (namespace, name, UID) and, where a decision rests on what
was read, the resourceVersion it was read at, so the executor can make the write conditional:
a decision taken on a stale read is dropped by the API server instead of applied. Applying an
action twice has the effect of applying it once (a pod of the same name and job counts as
created, a pod already gone as deleted), so a restart may redo any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from gpusched.api.gpujob import GpuJobStatus


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """Replace what differs in a GpuJob's status (a JSON merge patch)."""

    key: str
    namespace: str
    name: str
    uid: str
    status: GpuJobStatus
    """The status the job is to have."""
    patch: Mapping[str, Any]
    """Merge patch from the status last read (or written) to ``status``."""
    resource_version: str | None = None
    """Only if the job still has this resourceVersion (decisions: admission, preemption)."""
    deferred: bool = False
    """Not sent now: the job has this status in the operator's view from now on, and the API
    server gets it with the job's next status write (see
    :class:`~gpusched.core.lifecycle.facts.Unwritten`)."""


@dataclass(frozen=True, slots=True)
class CreatePod:
    """Create one pod of an admitted gang (its name is deterministic)."""

    job_key: str
    job_uid: str
    admission: int
    manifest: Mapping[str, Any]

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete a pod (``grace_seconds`` None: the pod's own grace period)."""

    namespace: str
    name: str
    uid: str
    grace_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class PatchPod:
    """Merge labels and annotations into a pod's metadata."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes event on a GpuJob (best effort)."""

    reference: Mapping[str, Any]
    reason: str
    message: str
    warning: bool = False


Action = WriteStatus | CreatePod | DeletePod | PatchPod | Event


class Stage(StrEnum):
    """What a step of a plan does; the executor's crash points are named after them."""

    MARK_VICTIMS = "mark-victims"
    EVICT = "evict"
    ADMIT = "admit"
    CREATE_PODS = "create-pods"
    SETTLE = "settle"
    PODS = "pods"


@dataclass(frozen=True, slots=True)
class Step:
    """Actions applied together (in parallel); with ``required``, a failed write ends the
    group here and the rest is decided again by the next cycle."""

    stage: Stage
    actions: tuple[Action, ...]
    required: bool = True


class Urgency(IntEnum):
    """How much waits on a group's writes. Only reports are held back under load (a cycle plans
    as many as :attr:`~gpusched.core.lifecycle.Refresh.reports` allows, the room the executor
    has for them), so a burst of waiting jobs' statuses never holds back admissions."""

    DECIDE = 0
    """Admissions and preemptions: jobs and GPUs wait on them."""
    SETTLE = 1
    """Records of admitted, running and ending jobs, and their pods."""
    REPORT = 2
    """A waiting job's status and events (why it waits, its position, its expected start):
    what ``gpusched explain`` also answers from the operator's view."""


@dataclass(frozen=True, slots=True)
class Group:
    """Steps applied in order, touching the jobs in ``jobs`` (no other group of the same
    cycle touches them)."""

    jobs: frozenset[str]
    steps: tuple[Step, ...]
    urgency: Urgency = Urgency.SETTLE

    def actions(self) -> list[Action]:
        return [a for step in self.steps for a in step.actions]
