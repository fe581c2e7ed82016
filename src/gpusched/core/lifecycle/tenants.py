"""TenantQuotas: which one owns each namespace, what admission needs of each, and the status
the operator writes on them."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from gpusched.api.gpujob import GpuJobSpec, GpuJobStatus, JobPhase
from gpusched.api.meta import Condition, ConditionStatus
from gpusched.api.tenantquota import PreemptionPolicy, TenantQuota, TenantQuotaStatus
from gpusched.core.admission import Tenant, TenantUsage
from gpusched.core.admission.tree import TenantTree
from gpusched.core.lifecycle.spend import (
    Pricing,
    Run,
    decayed,
    exhausted_until,
    for_reading,
    meter,
)


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


def tree_problems(quotas: Iterable[TenantQuota]) -> dict[str, str]:
    """TenantQuota name -> why its place in the tenant tree is not taken as written: a parent
    that does not exist or a cycle of parents (it is a tenant of its own then), children whose
    guarantees add up to more than the parent's (their guarantees hold as written, the
    parent's cannot back them all), namespaces listed on a parent (their jobs wait)."""
    quotas = list(quotas)
    tree = TenantTree.of(core_tenant(q) for q in quotas)
    out = dict(tree.broken)
    by_name = {q.metadata.name or "": q for q in quotas}
    for parent, children in tree.children.items():
        quota = by_name[parent]
        total = sum(by_name[c].spec.guaranteed_gpus for c in children)
        problems = []
        if total > quota.spec.guaranteed_gpus:
            problems.append(
                f"its children's guarantees add up to {total} GPUs, more than its own "
                f"{quota.spec.guaranteed_gpus}"
            )
        if quota.spec.namespaces:
            problems.append(
                "it has child TenantQuotas, so the jobs of the namespaces it lists wait "
                "(NoTenant): move them to a child"
            )
        if problems:
            out[parent] = "; ".join(problems)
    return out


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
    # Worded as the chart's admission policy refuses it at apply time, naming both fields.
    listed = ", ".join(allowed) if allowed else "no PriorityClass (only the cluster's default)"
    return (
        f"spec.priorityClassName: tenant {quota.metadata.name} allows {listed}, not "
        f"{class_name} (its spec.allowedPriorityClasses)"
    )


def core_tenant(quota: TenantQuota, now: datetime | None = None) -> Tenant:
    """The TenantQuota as admission sees it (at ``now``: whether its budget is spent)."""
    spec = quota.spec
    status = quota.status
    until = (
        exhausted_until(spec.budget, status.period_start, status.period_cost, now, status.daily)
        if now is not None
        else None
    )
    limits = spec.per_user
    return Tenant(
        name=quota.metadata.name or "",
        guaranteed=spec.guaranteed_gpus,
        guaranteed_by_model=dict(spec.guaranteed_gpus_by_model),
        borrowing_limit=spec.borrowing_limit,
        weight=spec.weight,
        within_tenant=spec.preemption.within_tenant,
        reclaim=spec.preemption.reclaim_borrowed,
        user_max_gpus=limits.max_gpus if limits is not None else None,
        user_max_jobs=limits.max_jobs if limits is not None else None,
        budget_exhausted_until=until.timestamp() if until is not None else None,
        recent_borrowed=status.recent_borrowed_gpus,
        parent=spec.parent,
    )


@dataclass(frozen=True, slots=True)
class MeteredJob:
    """A job's run as metering sees it: its status when the cycle began and as it leaves it."""

    tenant: str | None
    gpus: int
    before: GpuJobStatus
    after: GpuJobStatus
    submitter: str = ""
    models: Mapping[str, int] = field(default_factory=dict)
    """GPU model -> GPUs the job holds (empty: not known; charged at the default price)."""


def runs_between(
    jobs: Iterable[MeteredJob], tenants: Collection[str], since: datetime, until: datetime
) -> list[Run]:
    """What the jobs of ``tenants`` ran between two times, from their start and finish times.

    Read from each job's status as it stood when the cycle began: a job this cycle preempts or
    requeues still counts up to now (its new status has forgotten that it started). A job not
    started then counts from the status the cycle leaves it in, whole: its pods started before
    this cycle saw them (the start is theirs), perhaps even ran to their end between two
    cycles, and a tenant metered meanwhile counted none of it."""
    out: list[Run] = []
    for job in jobs:
        if job.tenant not in tenants:
            continue
        status = job.before
        if status.started_at is not None:
            begin = max(status.started_at, since)
        elif job.after.started_at is not None:
            status = job.after
            begin = job.after.started_at
        else:
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
        if end > begin:
            models = dict(job.models) if sum(job.models.values()) == job.gpus else {"": job.gpus}
            out.append(Run(job.submitter, models, begin, end))
    return out


def stopped_running(before: GpuJobStatus, after: GpuJobStatus) -> bool:
    """Whether a job stopped running in this cycle (``before``: its status when the cycle
    began, ``after``: as the cycle leaves it): only this cycle's metering still sees it run."""
    return before.phase is JobPhase.RUNNING and after.phase is not JobPhase.RUNNING


def started_unmetered(
    before: GpuJobStatus, after: GpuJobStatus, last_metered: datetime | None
) -> bool:
    """Whether a job started in this cycle at a time (its pods' own start) before its tenant's
    last metering, which counted none of it: later meterings count only from then."""
    started = after.started_at
    return (
        before.started_at is None
        and started is not None
        and last_metered is not None
        and started < last_metered
    )


def stopped_runs(jobs: Iterable[MeteredJob], now: datetime) -> list[MeteredJob]:
    """The jobs that stopped running in this cycle, as runs that ended ``now`` (or when their
    pods did): what only this cycle can still count, kept when the tenant's status cannot be
    written now (its next metering sees them no longer running)."""
    out = []
    for job in jobs:
        if stopped_running(job.before, job.after):
            ended = job.after.finished_at or now
            out.append(replace(job, after=job.after.model_copy(update={"finished_at": ended})))
    return out


def meterable(
    status: GpuJobStatus, since: datetime | None, after: GpuJobStatus | None = None
) -> bool:
    """Whether :func:`runs_between` and :func:`quota_status` can count anything of a job whose
    status (when the cycle began) is ``status`` (and ``after`` as the cycle leaves it), for
    tenants last metered at ``since`` or later (None: no tenant was metered yet). Only a job
    running or finished after ``since`` can: one finished before was counted when its tenant
    was last metered; and one that started in this cycle. Lets the operator hand each tenant
    only the jobs that matter, as the store fills with finished jobs."""
    if status.started_at is None:
        # Started in this cycle: none of its run was counted yet, however long ago it ended.
        return (
            after is not None
            and after.started_at is not None
            and (
                after.phase is JobPhase.RUNNING
                or (
                    after.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED)
                    and after.finished_at is not None
                )
            )
        )
    if status.phase is JobPhase.RUNNING:
        return True
    return (
        status.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED)
        and status.finished_at is not None
        and since is not None
        and status.finished_at > since
    )


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
class QuotaEvent:
    """Something to record as an event on the TenantQuota."""

    reason: str
    message: str
    warning: bool


@dataclass(frozen=True, slots=True)
class QuotaUpdate:
    """The next status of a TenantQuota, and whether it says more than the metered time."""

    status: TenantQuotaStatus
    changed: bool
    """Something besides the metered figures (GPU-seconds, spending, recent borrowing)
    differs, or a job stopped."""
    urgent: bool = False
    """To be written now: a job stopped running (next cycle its status no longer says it ran,
    so its GPU-seconds up to now are counted only by this write), or never metered yet."""
    events: tuple[QuotaEvent, ...] = ()
    """Budget caps reached by this metering (recorded once, when the condition turns)."""


#: Status fields that move with time alone; written at the metering interval.
METERED_FIELDS = frozenset(
    {
        "gpuSeconds",
        "lastMeteredAt",
        "periodGpuHours",
        "periodCost",
        "spent",
        "gpuHours7d",
        "cost7d",
        "gpuHours30d",
        "cost30d",
        "daily",
        "users",
        "recentBorrowedGpus",
    }
)


def _budget_conditions(
    quota: TenantQuota,
    old_conditions: Sequence[Condition],
    cost: float,
    currency: str,
    now: datetime,
) -> tuple[list[Condition], list[QuotaEvent]]:
    """``BudgetSoftCapReached`` and ``BudgetExhausted`` (only while a budget is set), and an
    event for each that turns true."""
    budget = quota.spec.budget
    conditions = [
        c for c in old_conditions if c.type not in ("BudgetSoftCapReached", "BudgetExhausted")
    ]
    if budget is None:
        return sorted(conditions, key=lambda c: c.type), []
    events: list[QuotaEvent] = []
    name = quota.metadata.name or ""
    spent = f"{cost:.2f} {currency} spent this {budget.period.value.lower()}"
    for type_, cap, reason, warning, effect in (
        ("BudgetSoftCapReached", budget.soft_cap, "BudgetSoftCapReached", False, "alert only"),
        ("BudgetExhausted", budget.hard_cap, "BudgetExhausted", True, "new jobs wait"),
    ):
        reached = cap is not None and cost >= cap
        was = any(c.type == type_ and c.status is ConditionStatus.TRUE for c in old_conditions)
        message = (
            f"{spent}, cap {cap:.2f} ({effect})" if cap is not None else f"{spent}; no cap set"
        )
        conditions = set_condition(
            [*conditions, *(c for c in old_conditions if c.type == type_)],
            type_,
            value=reached,
            reason=reason if reached else "WithinBudget",
            message=message,
            now=now,
        )
        if reached and not was:
            events.append(QuotaEvent(reason, f"tenant {name}: {message}", warning))
    return conditions, events


def quota_status(
    quota: TenantQuota,
    usage: TenantUsage,
    conflicts: Sequence[str],
    jobs: Sequence[MeteredJob],
    now: datetime,
    *,
    pricing: Pricing | None = None,
    half_life: float | None = None,
    members: Collection[str] = (),
    tree_problem: str | None = None,
) -> QuotaUpdate:
    """What the cycle writes on a TenantQuota: usage, GPU-seconds, spending against its
    budget, recent borrowing (with ``half_life`` seconds; None: no memory). A parent's spending
    is that of every tenant below it (``members``, itself included); ``tree_problem`` says why
    its place in the tenant tree was not taken as written."""
    pricing = pricing or Pricing()
    name = quota.metadata.name or ""
    mine = set(members) | {name}
    old = quota.status
    seconds = old.gpu_seconds
    last = old.last_metered_at
    runs = runs_between(jobs, mine, last, now) if last else []
    seconds += sum(run.gpus * (run.end - run.begin).total_seconds() for run in runs)
    spend = meter(
        budget=quota.spec.budget,
        old_period_start=old.period_start,
        old_period=(old.period_gpu_hours, old.period_cost),
        old_daily=old.daily,
        old_users=old.users,
        runs=runs,
        holding=usage.users,
        pricing=pricing,
        now=now,
    )
    recent = decayed(
        old.recent_borrowed_gpus,
        float(usage.borrowed),
        (now - last).total_seconds() if last is not None else 0.0,
        half_life,
    )
    # A job of the tenant stopped running in this cycle: its time up to now is counted only if
    # written now (next cycle its status no longer says it ran). Likewise a start this cycle
    # that dates from before the last metering: next cycle counts only from then.
    stopped = any(
        job.tenant in mine
        and (
            stopped_running(job.before, job.after) or started_unmetered(job.before, job.after, last)
        )
        for job in jobs
    )
    conditions, events = _budget_conditions(
        quota, old.conditions, spend.period_cost, pricing.currency, now
    )
    conditions = set_condition(
        conditions,
        "TreeConflict",
        value=tree_problem is not None,
        reason="TreeConflict" if tree_problem else "NoConflict",
        message=tree_problem or "its place in the tenant tree is taken as written",
        now=now,
    )
    conditions = set_condition(
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
        gpu_seconds=round(seconds, 6),  # a running total: tenths would drop 4 % of 1.04 s
        conditions=conditions,
        last_metered_at=now,
        currency=pricing.currency,
        period_start=spend.period_start,
        period_gpu_hours=spend.period_gpu_hours,
        period_cost=spend.period_cost,
        spent=for_reading(spend.period_cost),
        gpu_hours_7d=spend.gpu_hours_7d,
        cost_7d=spend.cost_7d,
        gpu_hours_30d=spend.gpu_hours_30d,
        cost_30d=spend.cost_30d,
        daily=spend.daily,
        users=spend.users,
        recent_borrowed_gpus=recent,
    )
    before = {k: v for k, v in old.to_k8s().items() if k not in METERED_FIELDS}
    after = {k: v for k, v in new.to_k8s().items() if k not in METERED_FIELDS}
    urgent = stopped or last is None or bool(events)
    return QuotaUpdate(new, before != after or urgent, urgent, tuple(events))
