"""GpuJobs and pods as the API server would hand them to the lifecycle."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, TopologyScope
from gpusched.core.admission import Admission, AdmitReason, Preemption, ReplicaPlan
from gpusched.core.lifecycle import JobFacts, LifecycleConfig, PodFacts

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CONFIG = LifecycleConfig(pods_ready_timeout=300, backoff_base=10, backoff_max=600)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(
    name: str = "train",
    *,
    namespace: str = "ns",
    replicas: int = 2,
    gpus: int = 4,
    status: dict[str, Any] | None = None,
    generation: int = 1,
    version: int = 10,
    deleting: bool = False,
    **spec: Any,
) -> JobFacts:
    """A GpuJob (``status`` in API form)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "generation": generation,
        "resourceVersion": str(version),
        "creationTimestamp": stamp(NOW - timedelta(hours=1)),
    }
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW)
    raw = {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "gpusPerReplica": gpus,
            "checkpointGracePeriodSeconds": 30,
            "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
            **spec,
        },
        "status": status or {},
    }
    return JobFacts.from_api(raw)


def admitted_status(
    admission: int = 1,
    *,
    nodes: tuple[str, ...] = ("n0", "n1"),
    tenant: str = "t",
    admitted_at: datetime = NOW - timedelta(seconds=60),
    **extra: Any,
) -> dict[str, Any]:
    """Status of a job admitted with its plan on ``nodes`` (one replica each)."""
    return {
        "phase": "Admitted",
        "tenant": tenant,
        "admission": admission,
        "admittedAt": stamp(admitted_at),
        "submittedAt": stamp(NOW - timedelta(hours=1)),
        "placement": [
            {"replica": r, "node": n, "gpuIndices": [0, 1, 2, 3]} for r, n in enumerate(nodes)
        ],
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "WithinGuarantee",
                "message": "placed",
                "lastTransitionTime": stamp(admitted_at),
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Placed",
                "message": "placed",
                "lastTransitionTime": stamp(admitted_at),
            },
        ],
        **extra,
    }


def pod(
    facts: JobFacts,
    replica: int,
    *,
    admission: int = 1,
    phase: str = "Running",
    node: str | None = "n0",
    deleting: bool = False,
    due: datetime = NOW,
    created: datetime = NOW - timedelta(seconds=50),
    annotations: dict[str, str] | None = None,
    tenant: str = "t",
    exit_code: int | None = None,
    rejected: str | None = None,
    status_extra: dict[str, Any] | None = None,
) -> PodFacts:
    """A pod of the job's gang (``rejected``: the kubelet's reason for refusing to admit it,
    which fails the pod before any container is created)."""
    meta: dict[str, Any] = {
        "name": f"{facts.name}-{admission}-{replica}",
        "namespace": facts.namespace,
        "uid": f"pod-{facts.name}-{admission}-{replica}",
        "resourceVersion": "5",
        "creationTimestamp": stamp(created),
        "labels": {
            keys.LABEL_JOB_NAME: facts.name,
            keys.LABEL_JOB_UID: facts.uid,
            keys.LABEL_TENANT: tenant,
            keys.LABEL_REPLICA_INDEX: str(replica),
            keys.LABEL_ADMISSION: str(admission),
        },
        "annotations": annotations or {},
        "ownerReferences": [
            {
                "apiVersion": keys.API_VERSION,
                "kind": "GpuJob",
                "name": facts.name,
                "uid": facts.uid,
                "controller": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = stamp(due)  # the deletion's time plus its grace period
    status: dict[str, Any] = {"phase": phase}
    if rejected is not None:
        status.update(
            phase="Failed",
            reason=rejected,
            message="Pod was rejected: Allocate failed due to no healthy devices present",
        )
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}
        ]
    status.update(status_extra or {})
    raw = {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [{"name": "main", "resources": {"limits": {keys.GPU_RESOURCE: "4"}}}],
        },
        "status": status,
    }
    return PodFacts.from_api(raw)


def with_pods(facts: JobFacts, *pods: PodFacts) -> JobFacts:
    return replace(facts, pods=tuple(pods))


def admission(key: str = "ns/train", victims: tuple[Preemption, ...] = ()) -> Admission:
    """The admission of a two-replica gang, one replica on each of n0 and n1 (NVLink)."""
    plans = (
        ReplicaPlan(0, "n0", (0, 1, 2, 3), TopologyScope.NVLINK, 90.0),
        ReplicaPlan(1, "n1", (4, 5, 6, 7), TopologyScope.NVLINK, 90.0),
    )
    return Admission(key, "t", AdmitReason.WITHIN_GUARANTEE, "placed", plans, victims)


def condition(status: GpuJobStatus, type_: str) -> tuple[str, str] | None:
    """(status, reason) of one condition."""
    for c in status.conditions:
        if c.type == type_:
            return c.status.value, c.reason
    return None
