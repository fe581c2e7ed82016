"""TenantQuota: who owns which namespaces, and how many GPUs they are promised and may borrow."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from gpusched.api import keys
from gpusched.api.base import LABEL_VALUE_PATTERN, ApiModel, GpuModel, LenientApiModel
from gpusched.api.meta import Condition, ObjectMeta

MAX_MODELS: Final = 32
#: The least fair-share weight: 1 : 100,000 against the largest keeps weighted borrowing (GPUs
#: over weight) a finite, comparable number; a weight near zero would rank as infinity.
MIN_WEIGHT: Final = 0.01
MAX_NAMESPACES: Final = 256


class WithinTenantPreemption(StrEnum):
    """Whether a tenant's jobs may preempt the tenant's own jobs."""

    LOWER_PRIORITY = "LowerPriority"
    """A blocked job may evict preemptible jobs of the same tenant with lower priority."""
    NEVER = "Never"
    """Jobs of this tenant wait for each other."""


class ReclaimPolicy(StrEnum):
    """Whether a tenant below its guarantee may take GPUs back from borrowers."""

    ANY = "Any"
    """Evict preemptible borrowed jobs of other tenants, whatever their priority."""
    LOWER_PRIORITY = "LowerPriority"
    """Evict only borrowed jobs with lower priority than the blocked job."""
    NEVER = "Never"
    """Wait for borrowers to finish."""


class PreemptionPolicy(ApiModel):
    """How this tenant's blocked jobs may make room."""

    within_tenant: WithinTenantPreemption = WithinTenantPreemption.LOWER_PRIORITY
    """Preemption among the tenant's own jobs."""
    reclaim_borrowed: ReclaimPolicy = ReclaimPolicy.ANY
    """Reclaiming guaranteed GPUs lent to other tenants."""
    max_min_runtime_seconds: int = Field(3600, ge=0, le=7 * 24 * 3600)
    """The most of a job's ``minRuntimeSeconds`` this tenant's jobs get: a job asking more is
    protected this long."""
    max_checkpoint_grace_period_seconds: int = Field(600, ge=0, le=24 * 3600)
    """The most of a job's ``checkpointGracePeriodSeconds`` this tenant's jobs get."""
    borrowed_protection_seconds: int = Field(300, ge=0, le=24 * 3600)
    """On borrowed GPUs, the longest a job's minimum runtime protects it, and the longest its
    grace period lasts, when another tenant takes back its guarantee: lent GPUs come back
    within this (plus one admission cycle), whatever the job asked."""


class UserLimits(ApiModel):
    """What any one submitter of the tenant may hold at once. The submitter is the user the
    API server authenticated when the GpuJob was created (recorded by the chart's admission
    policy in the ``gpusched.io/submitter`` annotation)."""

    max_gpus: int | None = Field(None, ge=1, le=1_000_000)
    """Most GPUs one user's admitted jobs hold together. Unset: no cap."""
    max_jobs: int | None = Field(None, ge=1, le=1_000_000)
    """Most jobs of one user holding GPUs at once. Unset: no cap."""


class BudgetPeriod(StrEnum):
    """The calendar period (UTC) a budget is spent over; spending starts again at its turn."""

    DAY = "Day"
    WEEK = "Week"
    """Monday to Sunday."""
    MONTH = "Month"


class Budget(ApiModel):
    """A spending limit per period, in the cluster's pricing currency (the chart's
    ``operator.pricing``; without a price list every GPU-hour costs 1, so caps count
    GPU-hours)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.softCap) || !has(self.hardCap) "
                    "|| self.softCap <= self.hardCap",
                    "message": "softCap must not be above hardCap",
                    "fieldPath": ".softCap",
                    "reason": "FieldValueInvalid",
                }
            ]
        }
    )

    period: BudgetPeriod = BudgetPeriod.MONTH
    """Over what the caps count."""
    soft_cap: float | None = Field(None, ge=0, le=1e12)
    """Spending that sets the ``BudgetSoftCapReached`` condition, records an event and fires
    the ``GpuschedTenantBudgetSoftCap`` alert; nothing waits."""
    hard_cap: float | None = Field(None, ge=0, le=1e12)
    """Spending after which the tenant's new jobs wait (``BudgetExhausted``) until the next
    period; running jobs go on."""

    @model_validator(mode="after")
    def _soft_not_above_hard(self) -> Budget:
        soft, hard = self.soft_cap, self.hard_cap
        if soft is not None and hard is not None and soft > hard:
            raise ValueError("spec.budget.softCap must not be above spec.budget.hardCap")
        return self


DnsLabel = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
GpuCount = Annotated[int, Field(ge=0, le=1_000_000)]
QuotaName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
PriorityClassName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]


class TenantQuotaSpec(ApiModel):
    """The tenant's namespaces and GPU entitlements."""

    # The same rules as _limits_are_consistent, for the API server (CEL).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.borrowingLimit) "
                    "|| self.borrowingLimit >= self.guaranteedGpus",
                    "message": "borrowingLimit must be at least guaranteedGpus",
                    "fieldPath": ".borrowingLimit",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.guaranteedGpusByModel) || "
                    "self.guaranteedGpusByModel.map(m, self.guaranteedGpusByModel[m]).sum()"
                    " <= self.guaranteedGpus",
                    "message": "guaranteedGpusByModel must not add up to more than guaranteedGpus",
                    "fieldPath": ".guaranteedGpusByModel",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    namespaces: list[DnsLabel] = Field(
        default_factory=list,
        max_length=MAX_NAMESPACES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Namespaces whose GpuJobs belong to this tenant. A namespace belongs to at most one tenant;
    when two TenantQuotas name it, the older one keeps it. A TenantQuota that other TenantQuotas
    name as their ``parent`` lists none: jobs belong to the tenants below it."""
    parent: QuotaName | None = None
    """The TenantQuota this one is part of (an organisation over its teams): its borrowing
    limit, budget and per-user caps hold over all its children, and a child borrows a
    sibling's idle guarantee before any tenant outside the parent does. The children's
    guarantees should add up to at most the parent's. Unset: a tenant of its own."""
    guaranteed_gpus: int = Field(0, ge=0, le=1_000_000)
    """GPUs the tenant can always get back, preempting borrowers if needed."""
    guaranteed_gpus_by_model: dict[GpuModel, GpuCount] = Field(
        default_factory=dict,
        max_length=MAX_MODELS,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The API server's schema cannot constrain a map's keys; CEL can.
                    "rule": "self.all(m, size(m) <= 63 && m.matches('"
                    + LABEL_VALUE_PATTERN
                    + "'))",
                    "message": "each GPU model must be a label value as in the "
                    "nvidia.com/gpu.product node label (letters, digits, '-', '_', '.'; "
                    "at most 63 characters, starting and ending with a letter or digit)",
                }
            ]
        },
    )
    """Part of ``guaranteedGpus`` promised on a specific GPU model (``nvidia.com/gpu.product``
    value). The values may not add up to more than ``guaranteedGpus``."""
    borrowing_limit: int | None = Field(None, ge=0, le=1_000_000)
    """Ceiling on the GPUs the tenant may hold at once, guaranteed plus borrowed; at least
    ``guaranteedGpus``. Unset: the tenant may borrow any idle GPU."""
    weight: float = Field(
        1.0,
        ge=MIN_WEIGHT,
        le=1000,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The schema's minimum alone lets a whole 0 through (an integer is
                    # compared with the minimum as an integer).
                    "rule": f"double(self) >= {MIN_WEIGHT}",
                    "message": f"weight must be at least {MIN_WEIGHT}",
                }
            ]
        },
    )
    """Fair-share weight: idle GPUs are lent to tenants in proportion to their weights."""
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    """How the tenant's blocked jobs may make room, and how long its jobs are protected."""
    allowed_priority_classes: list[PriorityClassName] | None = Field(
        None, max_length=64, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """PriorityClasses the tenant's GpuJobs may name (refused at apply time otherwise; a job
    naming none gets the cluster's default class). Unset: any class but Kubernetes' own
    ``system-`` ones."""
    per_user: UserLimits | None = None
    """Caps on any one submitter's share of the tenant (jobs over it wait,
    ``UserCapExceeded``)."""
    budget: Budget | None = None
    """Spending caps per period (metered in ``status`` whether set or not)."""

    @model_validator(mode="after")
    def _limits_are_consistent(self) -> TenantQuotaSpec:
        if self.borrowing_limit is not None and self.borrowing_limit < self.guaranteed_gpus:
            raise ValueError("spec.borrowingLimit must be at least spec.guaranteedGpus")
        if sum(self.guaranteed_gpus_by_model.values()) > self.guaranteed_gpus:
            raise ValueError(
                "spec.guaranteedGpusByModel must not add up to more than spec.guaranteedGpus"
            )
        return self


class DaySpend(ApiModel):
    """GPU-hours and cost of one UTC day."""

    date: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
    """The day, ``YYYY-MM-DD``."""
    gpu_hours: float = Field(0.0, ge=0)
    """GPU-hours run that day."""
    cost: float = Field(0.0, ge=0)
    """What they cost, in ``status.currency``."""


class UserSpend(ApiModel):
    """One submitter's part of the tenant: held now, and spent in the budget period."""

    name: str = Field(max_length=512)
    """The authenticated user name; empty for jobs with no recorded submitter."""
    gpus: int = Field(0, ge=0)
    """GPUs held now by the user's admitted jobs."""
    jobs: int = Field(0, ge=0)
    """The user's jobs holding GPUs now."""
    gpu_hours: float = Field(0.0, ge=0)
    """GPU-hours in the current budget period."""
    cost: float = Field(0.0, ge=0)
    """Cost in the current budget period."""


MAX_DAYS: Final = 35
MAX_USERS: Final = 100


class TenantQuotaStatus(ApiModel):
    """What the tenant holds and has used; written by the operator."""

    used_gpus: int = Field(0, ge=0)
    """GPUs held by the tenant's admitted and running jobs."""
    borrowed_gpus: int = Field(0, ge=0)
    """Part of ``usedGpus`` above the guarantee, i.e. lent by other tenants."""
    used_gpus_by_model: dict[str, int] = Field(default_factory=dict)
    """``usedGpus`` split by GPU model."""
    fair_share: float = Field(0.0, ge=0)
    """GPUs the tenant is entitled to now: its guarantee (up to its demand) plus its weighted
    share of idle GPUs (up to its demand and borrowing limit)."""
    pending_jobs: int = Field(0, ge=0)
    """Jobs waiting for admission."""
    admitted_jobs: int = Field(0, ge=0)
    """Jobs holding GPUs: admitted, their pods starting or running."""
    running_jobs: int = Field(0, ge=0)
    """Jobs whose pods all run (part of ``admittedJobs``)."""
    gpu_seconds: float = Field(0.0, ge=0)
    """GPU-seconds consumed by the tenant's jobs since the quota was created."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready; NamespaceConflict (a namespace is claimed by an older TenantQuota) and
    TreeConflict (its parent is missing or part of a cycle); with a budget,
    BudgetSoftCapReached and BudgetExhausted (new jobs wait for the next period)."""
    last_metered_at: datetime | None = None
    """When ``gpuSeconds`` was last brought up to date."""
    currency: str = ""
    """Unit of the cost fields (the cluster's pricing currency)."""
    period_start: datetime | None = None
    """Start of the current budget period (the month, unless ``spec.budget.period`` says
    otherwise)."""
    period_gpu_hours: float = Field(0.0, ge=0)
    """GPU-hours run since ``periodStart``."""
    period_cost: float = Field(0.0, ge=0)
    """What they cost: what the budget's caps are compared with. A running total, kept to
    nine decimal places so that frequent meterings add up to what ran."""
    spent: float = Field(0.0, ge=0)
    """``periodCost`` rounded to the hundredth (a cent), for reading: the ``Spent`` printer
    column. The caps are compared with ``periodCost``."""
    gpu_hours_7d: float = Field(0.0, ge=0, alias="gpuHours7d")
    """GPU-hours of the last 7 days (today included), to the hundredth."""
    cost_7d: float = Field(0.0, ge=0, alias="cost7d")
    """What ``gpuHours7d`` cost, to the hundredth."""
    gpu_hours_30d: float = Field(0.0, ge=0, alias="gpuHours30d")
    """GPU-hours of the last 30 days (today included), to the hundredth."""
    cost_30d: float = Field(0.0, ge=0, alias="cost30d")
    """What ``gpuHours30d`` cost, to the hundredth (the ``Cost-30d`` printer column)."""
    daily: list[DaySpend] = Field(default_factory=list, max_length=MAX_DAYS)
    """GPU-hours and cost per UTC day, oldest first (the last 35 days)."""
    users: list[UserSpend] = Field(default_factory=list, max_length=MAX_USERS)
    """Per submitter, the most spending first (the first 100)."""
    recent_borrowed_gpus: float = Field(0.0, ge=0)
    """GPUs borrowed on average in the recent past (decayed with the operator's usage
    half-life); ranks borrowers when fair share has memory. 0 without."""


class TenantQuota(LenientApiModel):
    """GPU quota of one tenant (cluster-scoped)."""

    api_version: Literal["gpusched.io/v1alpha1"] = keys.API_VERSION
    kind: Literal["TenantQuota"] = "TenantQuota"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TenantQuotaSpec
    status: TenantQuotaStatus = Field(default_factory=TenantQuotaStatus)
