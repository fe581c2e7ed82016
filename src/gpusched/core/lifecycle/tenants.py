"""TenantQuotas: which one owns each namespace, what admission needs of each, and the status
the operator writes on them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpusched.api.gpujob import GpuJobSpec, GpuJobStatus, JobPhase
from gpusched.api.meta import Condition, ConditionStatus
from gpusched.api.tenantquota import PreemptionPolicy, TenantQuota, TenantQuotaStatus
from gpusched.core.admission import Tenant, TenantUsage


@dataclass(frozen=True)
class TenantMap:
    """Which TenantQuota owns each namespace (the oldest claim wins)."""

    owner: dict[str, str]
    conflicts: dict[str, list[str]]
    """TenantQuota name -> namespaces it names but an older TenantQuota owns."""


def tenant_map(quotas: Iterable[TenantQuota]) -> TenantMap:
    """Assign namespaces to TenantQuotas, oldest first (then by name)."""

    def age(q: TenantQuota) -> tuple[float, str]:
        created = q.metadata.creation_timestamp
        return (created.timestamp() if created else 0.0, q.metadata.name or "")

    owner: dict[str, str] = {}
    conflicts: dict[str, list[str]] = {}
    for quota in sorted(quotas, key=age):
        name = quota.metadata.name or ""
        for namespace in quota.spec.namespaces:
            if namespace in owner and owner[namespace] != name:
                conflicts.setdefault(name, []).append(namespace)
            else:
                owner.setdefault(namespace, name)
    return TenantMap(owner, conflicts)


_DEFAULT_POLICY = PreemptionPolicy()


@dataclass(frozen=True, slots=True)
class Protection:
    """How long a tenant's jobs are protected from preemption, from its TenantQuota's
    ``preemption`` bounds: what a job asks (``minRuntimeSeconds``,
    ``checkpointGracePeriodSeconds``) is capped by its tenant, and on borrowed GPUs a tenant
    taking back its guarantee waits at most ``borrowedProtectionSeconds`` for either."""

    max_min_runtime: int = _DEFAULT_POLICY.max_min_runtime_seconds
    max_grace: int = _DEFAULT_POLICY.max_checkpoint_grace_period_seconds
    borrowed: int = _DEFAULT_POLICY.borrowed_protection_seconds

    def min_runtime(self, spec: GpuJobSpec) -> int:
        """Seconds after its start during which the job is no victim."""
        return min(spec.min_runtime_seconds, self.max_min_runtime)

    def reclaim_min_runtime(self, spec: GpuJobSpec) -> int:
        """The same against a tenant reclaiming its guarantee (the job runs on borrowed GPUs)."""
        return min(self.min_runtime(spec), self.borrowed)

    def grace(self, spec: GpuJobSpec, *, reclaim: bool = False) -> int:
        """Seconds between the notice and the kill when the job's pods are deleted."""
        grace = min(spec.checkpoint_grace_period_seconds, self.max_grace)
        return min(grace, self.borrowed) if reclaim else grace


def protection_of(quota: TenantQuota | None) -> Protection:
    """The protection bounds of a tenant (the API's defaults without a TenantQuota)."""
    if quota is None:
        return Protection()
    policy = quota.spec.preemption
    return Protection(
        policy.max_min_runtime_seconds,
        policy.max_checkpoint_grace_period_seconds,
        policy.borrowed_protection_seconds,
    )


def class_not_allowed(quota: TenantQuota | None, class_name: str | None) -> str | None:
    """Why the tenant's jobs may not name ``class_name`` (None: they may).

    The chart's admission policy refuses such a job when it is created; this catches one
    created before its tenant narrowed ``allowedPriorityClasses`` (or without the policy)."""
    if not class_name:
        return None
    if class_name.startswith("system-"):
        return f"PriorityClass {class_name} is one of Kubernetes' own, not for GpuJobs"
    if quota is None or quota.spec.allowed_priority_classes is None:
        return None
    allowed = quota.spec.allowed_priority_classes
    if class_name in allowed:
        return None
    listed = ", ".join(allowed) if allowed else "none (only the cluster's default class)"
    return f"tenant {quota.metadata.name} allows the PriorityClasses {listed}, not {class_name}"


def core_tenant(quota: TenantQuota) -> Tenant:
    spec = quota.spec
    return Tenant(
        name=quota.metadata.name or "",
        guaranteed=spec.guaranteed_gpus,
        guaranteed_by_model=dict(spec.guaranteed_gpus_by_model),
        borrowing_limit=spec.borrowing_limit,
        weight=spec.weight,
        within_tenant=spec.preemption.within_tenant,
        reclaim=spec.preemption.reclaim_borrowed,
    )


@dataclass(frozen=True, slots=True)
class MeteredJob:
    """A job's run as metering sees it: its status when the cycle began and as it leaves it."""

    tenant: str | None
    gpus: int
    before: GpuJobStatus
    after: GpuJobStatus


def gpu_seconds_between(
    jobs: Iterable[MeteredJob], tenant: str, since: datetime, until: datetime
) -> float:
    """GPU-seconds the tenant's jobs ran between two times, from their start and finish times.

    Read from each job's status as it stood when the cycle began: a job this cycle preempts or
    requeues still counts up to now (its new status has forgotten that it started)."""
    total = 0.0
    for job in jobs:
        if job.tenant != tenant:
            continue
        status = job.before
        started = status.started_at
        if started is None:
            continue
        if status.phase is JobPhase.RUNNING:
            end = until
        elif status.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) and status.finished_at:
            end = status.finished_at
        else:
            continue
        finished = job.after.finished_at  # finishing in this very cycle
        if finished is not None:
            end = min(end, finished)
        begin = max(started, since)
        if end > begin:
            total += (end - begin).total_seconds() * job.gpus
    return total


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    *,
    value: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """The conditions with one set; its transition time moves only when its status does."""
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


@dataclass(frozen=True, slots=True)
class QuotaUpdate:
    """The next status of a TenantQuota, and whether it says more than the metered time."""

    status: TenantQuotaStatus
    changed: bool
    """Something besides ``gpuSeconds`` / ``lastMeteredAt`` differs, or a job stopped."""
    urgent: bool = False
    """To be written now: a job stopped running (next cycle its status no longer says it ran,
    so its GPU-seconds up to now are counted only by this write), or never metered yet."""


def quota_status(
    quota: TenantQuota,
    usage: TenantUsage,
    conflicts: Sequence[str],
    jobs: Sequence[MeteredJob],
    now: datetime,
) -> QuotaUpdate:
    """What the cycle writes on a TenantQuota."""
    name = quota.metadata.name or ""
    old = quota.status
    seconds = old.gpu_seconds
    last = old.last_metered_at
    if last is not None:
        seconds += gpu_seconds_between(jobs, name, last, now)
    # A job of the tenant stopped running in this cycle: its time up to now is counted only if
    # written now (next cycle its status no longer says it ran).
    stopped = any(
        job.tenant == name
        and job.before.phase is JobPhase.RUNNING
        and job.after.phase is not JobPhase.RUNNING
        for job in jobs
    )
    conditions = set_condition(
        old.conditions,
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
    conditions = set_condition(
        conditions,
        "Ready",
        value=True,
        reason="Accounted",
        message="usage computed by the admission cycle",
        now=now,
    )
    new = TenantQuotaStatus(
        used_gpus=usage.used,
        borrowed_gpus=usage.borrowed,
        used_gpus_by_model=dict(usage.used_by_model),
        fair_share=usage.fair_share,
        pending_jobs=usage.pending,
        admitted_jobs=usage.admitted,
        running_jobs=usage.running,
        gpu_seconds=round(seconds, 1),
        conditions=conditions,
        last_metered_at=now,
    )
    metered = ("gpuSeconds", "lastMeteredAt")
    before = {k: v for k, v in old.to_k8s().items() if k not in metered}
    after = {k: v for k, v in new.to_k8s().items() if k not in metered}
    urgent = stopped or last is None
    return QuotaUpdate(new, before != after or urgent, urgent)
