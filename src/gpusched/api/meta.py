"""Kubernetes object plumbing shared by the gpusched kinds: metadata and conditions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from gpusched.api.base import ApiModel, LenientApiModel


class ObjectMeta(LenientApiModel):
    """The parts of ``metadata`` gpusched reads; the API server owns the rest."""

    name: str | None = None
    """Object name."""
    namespace: str | None = None
    """Namespace of a namespaced object."""
    uid: str | None = None
    """Server-assigned unique id."""
    generation: int | None = None
    """Spec generation, bumped by the API server on each spec change."""
    resource_version: str | None = None
    """Opaque version for optimistic concurrency."""
    creation_timestamp: datetime | None = None
    """When the object was created."""
    deletion_timestamp: datetime | None = None
    """Set when deletion was requested."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Object labels."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Object annotations."""
    owner_references: list[dict[str, Any]] = Field(default_factory=list)
    """Owners, for garbage collection."""
    finalizers: list[str] = Field(default_factory=list)
    """Finalizers holding deletion."""


class ConditionStatus(StrEnum):
    """Whether a condition holds."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A standard Kubernetes condition (the shape of ``metav1.Condition``)."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    """Condition type in CamelCase, e.g. ``Admitted``."""
    status: ConditionStatus
    """``True``, ``False`` or ``Unknown``."""
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    """Machine-readable CamelCase reason for the last transition, e.g. ``QuotaExceeded``."""
    message: str = Field("", max_length=32768)
    """A sentence for humans saying what happened and what would change it."""
    last_transition_time: datetime
    """When the status last changed."""
    observed_generation: int | None = Field(None, ge=0)
    """The object generation the condition was computed from."""
