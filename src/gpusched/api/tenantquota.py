"""TenantQuota: who owns which namespaces, and how many GPUs they are promised and may borrow."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from gpusched.api import keys
from gpusched.api.base import ApiModel, LenientApiModel
from gpusched.api.meta import Condition, ObjectMeta

MAX_MODELS: Final = 32
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


DnsLabel = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
GpuCount = Annotated[int, Field(ge=0, le=1_000_000)]
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
        min_length=1,
        max_length=MAX_NAMESPACES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Namespaces whose GpuJobs belong to this tenant. A namespace belongs to at most one tenant;
    when two TenantQuotas name it, the older one keeps it."""
    guaranteed_gpus: int = Field(0, ge=0, le=1_000_000)
    """GPUs the tenant can always get back, preempting borrowers if needed."""
    guaranteed_gpus_by_model: dict[str, GpuCount] = Field(
        default_factory=dict,
        max_length=MAX_MODELS,
    )
    """Part of ``guaranteedGpus`` promised on a specific GPU model (``nvidia.com/gpu.product``
    value). The values may not add up to more than ``guaranteedGpus``."""
    borrowing_limit: int | None = Field(None, ge=0, le=1_000_000)
    """Ceiling on the GPUs the tenant may hold at once, guaranteed plus borrowed; at least
    ``guaranteedGpus``. Unset: the tenant may borrow any idle GPU."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Fair-share weight: idle GPUs are lent to tenants in proportion to their weights."""
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    """How the tenant's blocked jobs may make room, and how long its jobs are protected."""
    allowed_priority_classes: list[PriorityClassName] | None = Field(
        None, max_length=64, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """PriorityClasses the tenant's GpuJobs may name (refused at apply time otherwise; a job
    naming none gets the cluster's default class). Unset: any class but Kubernetes' own
    ``system-`` ones."""

    @model_validator(mode="after")
    def _limits_are_consistent(self) -> TenantQuotaSpec:
        if self.borrowing_limit is not None and self.borrowing_limit < self.guaranteed_gpus:
            raise ValueError("spec.borrowingLimit must be at least spec.guaranteedGpus")
        if sum(self.guaranteed_gpus_by_model.values()) > self.guaranteed_gpus:
            raise ValueError(
                "spec.guaranteedGpusByModel must not add up to more than spec.guaranteedGpus"
            )
        return self


class TenantQuotaStatus(ApiModel):
    """What the tenant holds and has used; written by the operator."""

    used_gpus: int = Field(0, ge=0)
    """GPUs held by the tenant's admitted and running jobs."""
    borrowed_gpus: int = Field(0, ge=0)
    """Part of ``usedGpus`` above the guarantee, i.e. lent by other tenants."""
    used_gpus_by_model: dict[str, int] = Field(default_factory=dict)
    """``usedGpus`` split by GPU model."""
    fair_share: float = Field(0.0, ge=0)
    """GPUs the tenant is entitled to now: its guarantee plus its weighted share of idle GPUs."""
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
    """Ready, and NamespaceConflict when a namespace is claimed by an older TenantQuota."""
    last_metered_at: datetime | None = None
    """When ``gpuSeconds`` was last brought up to date."""


class TenantQuota(LenientApiModel):
    """GPU quota of one tenant (cluster-scoped)."""

    api_version: Literal["gpusched.io/v1alpha1"] = keys.API_VERSION
    kind: Literal["TenantQuota"] = "TenantQuota"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TenantQuotaSpec
    status: TenantQuotaStatus = Field(default_factory=TenantQuotaStatus)
