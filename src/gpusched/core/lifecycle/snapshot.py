"""From settled jobs, TenantQuotas and nodes to the admission core's snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpusched.api.gpujob import GpuJob
from gpusched.api.networktopology import NetworkTopology
from gpusched.api.tenantquota import TenantQuota
from gpusched.core import Policy
from gpusched.core.admission import (
    AcrossReplicas,
    Assignment,
    CycleConfig,
    Job,
    JobState,
    Level,
    Node,
    Snapshot,
    Toleration,
)
from gpusched.core.lifecycle.facts import JobFacts, PodFacts
from gpusched.core.lifecycle.settle import JobContext, Settled
from gpusched.core.lifecycle.tenants import Protection, core_tenant
from gpusched.core.runtime import expected_end

#: Per node: GPU indices held by pods no accounted job explains, and the count of such GPUs
#: whose indices are unknown.
Busy = dict[str, tuple[set[int], int]]


def job_shape(job: GpuJob, protection: Protection | None = None) -> dict[str, Any]:
    """The spec-derived fields of a core Job (what the job asks for, within its tenant's
    protection bounds)."""
    protection = protection or Protection()
    spec = job.spec
    template_spec = spec.template.get("spec") or {}
    across = spec.topology.across_replicas
    selector = template_spec.get("nodeSelector") or {}
    tolerations = tuple(
        Toleration(
            key=t.get("key") or "",
            operator=t.get("operator") or "Equal",
            value=t.get("value") or "",
            effect=t.get("effect") or "",
        )
        for t in template_spec.get("tolerations") or []
        if isinstance(t, dict)
    )
    return {
        "replicas": spec.replicas,
        "gpus_per_replica": spec.gpus_per_replica,
        "policy": Policy.from_api(spec.topology, replicas=spec.replicas),
        "gpu_model": spec.gpu_model,
        "across": (
            AcrossReplicas(
                across.node_label,
                across.mode.value == "required",
                across.segment.replicas if across.segment else None,
                across.segment.node_label if across.segment else None,
                across.segment.mode.value == "required" if across.segment else True,
            )
            if across is not None
            else None
        ),
        "node_selector": tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        "tolerations": tolerations,
        "preemptible": spec.preemptible,
        "min_runtime_seconds": float(protection.min_runtime(spec)),
        "reclaim_min_runtime_seconds": float(protection.reclaim_min_runtime(spec)),
    }


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _submission(job: JobFacts, context: JobContext, submitted: datetime) -> dict[str, Any]:
    """The fields of a core Job that say what was submitted, by whom and when (the rest say
    what became of it)."""
    assert job.job is not None
    declared = job.job.spec.max_runtime_seconds
    return {
        "key": job.key,
        "tenant": context.tenant,
        "priority": context.priority,
        "submitted_at": submitted.timestamp(),
        "expected_runtime": context.runtime,
        "max_runtime_seconds": float(declared) if declared is not None else None,
        "submitter": job.submitter,
        **job_shape(job.job, context.protection),
    }


def core_job(job: JobFacts, done: Settled, context: JobContext, now: datetime) -> Job | None:
    """The job as admission sees it (None: it takes no part)."""
    if done.state is None or job.job is None:
        return None
    status = done.status
    checkpoint = job.last_checkpoint()
    # Creation time is the FIFO order users expect, and it never changes.
    submission = _submission(
        job, context, job.job.metadata.creation_timestamp or status.submitted_at or now
    )
    limit = submission["max_runtime_seconds"]
    admitted = done.state is JobState.ADMITTED
    started = status.started_at or status.admitted_at
    reservation = status.reservation if done.state is JobState.QUEUED else None
    return Job(
        **submission,
        state=done.state,
        placement=done.placement,
        started_at=_ts(status.started_at) if done.state is JobState.ADMITTED else None,
        last_checkpoint_at=_ts(checkpoint),
        not_before=_ts(status.requeue_at),
        reserved_for=done.reserved_for,
        expected_end=(
            expected_end(started.timestamp(), now.timestamp(), context.runtime, limit)
            if admitted and started is not None
            else None
        ),
        backfill_until=_ts(status.backfill_until) if admitted else None,
        reservation=(
            tuple(Assignment(p.node, tuple(p.gpu_indices)) for p in reservation.placement)
            if reservation is not None
            else ()
        ),
        reservation_start=reservation.start.timestamp() if reservation is not None else None,
        preemptions=status.preemption_count,
    )


def submitted_job(job: JobFacts, context: JobContext) -> Job | None:
    """The job as it was submitted, whatever became of it since: what the forecast's expected
    arrivals are made of (:mod:`gpusched.core.admission.arrivals`). None: no tenant owns it or
    its creation time is not known."""
    if job.job is None or context.tenant is None:
        return None
    created = job.job.metadata.creation_timestamp
    if created is None:
        return None
    return Job(**_submission(job, context, created))


def foreign_pods(
    pods: Iterable[PodFacts],
    jobs: Iterable[JobFacts],
    settled: Mapping[str, Settled],
) -> list[PodFacts]:
    """Live GPU pods on a node that no accounted job explains (other workloads, leftovers of
    a job's earlier admission or of a deleted job), bound or, a GpuJob's pod, planned
    (:func:`_on_a_node`)."""
    accounted: set[tuple[str, str, int]] = set()
    accounted_names: set[tuple[str, str, int]] = set()
    for job in jobs:
        done = settled.get(job.key)
        if done is None or done.state is None:
            continue
        current = done.status.admission
        accounted.add((job.namespace, job.uid, current))
        accounted_names.add((job.namespace, job.name, current))
    out = []
    for pod in pods:
        if not pod.live or pod.gpus <= 0 or not _on_a_node(pod):
            continue
        admission = pod.admission
        if pod.job and admission is not None:
            if pod.job_uid and (pod.namespace, pod.job_uid, admission) in accounted:
                continue
            if not pod.job_uid and (pod.namespace, pod.job, admission) in accounted_names:
                continue
        out.append(pod)
    return out


def _on_a_node(pod: PodFacts) -> bool:
    """Whether the pod holds GPUs on a node: bound to it, or a GpuJob's pod not bound yet
    (its Binding may be in flight), not being deleted, with its planned node and GPUs, which
    the extender binds it to and no other job may be planned on meanwhile."""
    if pod.node:
        return True
    return bool(pod.host and pod.planned_gpus and not pod.deleting)


def foreign_busy(pods: Iterable[PodFacts]) -> Busy:
    """Per node (bound, else planned), the GPUs ``pods`` hold: indices where believed, else a
    count."""
    busy: Busy = {}
    for pod in pods:
        host = pod.host
        assert host is not None
        indices, unknown = busy.setdefault(host, (set(), 0))
        gpus = pod.bound_gpus
        if gpus:
            indices.update(gpus)
        else:
            busy[host] = (indices, unknown + pod.gpus)
    return busy


def charged_pod_key(pod: PodFacts) -> str:
    """The key a charged pod has in the admission snapshot (never a GpuJob's: those have no
    ``/`` in their name)."""
    return f"{pod.namespace}/pod/{pod.name}"


def charged_pod(pod: PodFacts, tenant: str) -> Job:
    """A GPU pod in a tenant's namespace that is not a GpuJob's, as the admission core sees it:
    running on what it holds, charged to the tenant (usage, borrowing limit, guarantee), never
    a victim (the operator cannot requeue a pod it did not create). The chart's admission
    policy refuses such pods; this accounts for any made before it or without it."""
    assert pod.node is not None
    gpus = pod.bound_gpus
    started = pod.created.timestamp() if pod.created is not None else 0.0
    return Job(
        key=charged_pod_key(pod),
        tenant=tenant,
        replicas=1,
        gpus_per_replica=pod.gpus,
        preemptible=False,
        submitted_at=started,
        state=JobState.ADMITTED,
        placement=(
            Assignment(pod.node, tuple(gpus)) if gpus else Assignment(pod.node, (), pod.gpus),
        ),
        started_at=started,
    )


def core_levels(network: NetworkTopology | None) -> tuple[Level, ...]:
    """The cluster's network levels, narrowest first (the object lists them widest first)."""
    if network is None:
        return ()
    return tuple(
        Level(level.node_label, level.name, level.whole_domains)
        for level in reversed(network.spec.levels)
    )


def build_snapshot(
    jobs: Sequence[Job],
    quotas: Iterable[TenantQuota],
    nodes: Sequence[Node],
    now: datetime,
    config: CycleConfig,
    *,
    levels: tuple[Level, ...] = (),
    down_labels: Sequence[Mapping[str, str]] = (),
    arrivals: Sequence[Job] = (),
) -> Snapshot:
    """The admission core's input (``arrivals``: the jobs expected to be submitted later,
    :func:`gpusched.core.admission.arrivals.expected_arrivals`)."""
    return Snapshot(
        now=now.timestamp(),
        tenants=tuple(core_tenant(q, now) for q in quotas),
        jobs=tuple(jobs),
        nodes=tuple(nodes),
        config=config,
        levels=levels,
        down_labels=tuple(down_labels),
        arrivals=tuple(arrivals),
    )
