"""Rules an object must meet against other objects, checked when it is applied (the operator's
validating webhook) so that ``kubectl apply`` refuses it naming the field, rather than the
operator explaining later why the job waits.

The CRD's schema and CEL rules check an object alone; these need others: which TenantQuota owns
a namespace, which PriorityClasses exist. They are pure: the webhook passes what its cache holds
and, before refusing, what a fresh read of the API server says (a TenantQuota applied a moment
before the job may not have reached the cache).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from gpusched.api.gpujob import MAX_TEMPLATE_BYTES
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle.tenants import tenant_map


def namespace_claim_refusal(
    name: str, namespaces: Sequence[str], others: Iterable[TenantQuota]
) -> str | None:
    """Why TenantQuota ``name`` may not claim ``namespaces``: one of them belongs to another
    TenantQuota (a namespace has one tenant, else whose guarantee would its jobs use?).

    ``others``: the TenantQuotas stored, this one's stored version among them when it is
    updated. A namespace belongs to the oldest TenantQuota listing it (:func:`tenant_map`):
    when two list it (one applied while the webhook was down), the owner stays editable and
    the other is told who owns it."""
    owners = tenant_map(others).owner
    for index, namespace in enumerate(namespaces):
        owner = owners.get(namespace)
        if owner is not None and owner != name:
            return (
                f"spec.namespaces[{index}]: namespace {namespace!r} belongs to TenantQuota "
                f"{owner!r}; a namespace has one tenant (remove it there first)"
            )
    return None


def unowned_namespace_refusal(namespace: str, quotas: Iterable[TenantQuota]) -> str | None:
    """Why a GpuJob may not be created in ``namespace``: no TenantQuota owns it, so nothing
    would ever admit the job."""
    if any(namespace in quota.spec.namespaces for quota in quotas):
        return None
    return (
        f"metadata.namespace: no TenantQuota owns namespace {namespace!r}, so the job could "
        "never be admitted; ask a cluster admin to add the namespace to a TenantQuota's "
        "spec.namespaces"
    )


def priority_class_refusal(name: str | None, priority_classes: Collection[str]) -> str | None:
    """Why a GpuJob may not name PriorityClass ``name``: it does not exist, so the job's pods
    would be refused."""
    if not name or name in priority_classes:
        return None
    return (
        f"spec.priorityClassName: PriorityClass {name!r} does not exist "
        "(kubectl get priorityclasses lists those that do)"
    )


def tree_refusal(
    name: str,
    parent: str | None,
    guaranteed: int,
    namespaces: Sequence[str],
    others: Iterable[TenantQuota],
) -> str | None:
    """Why TenantQuota ``name`` may not take this place in the tenant tree: it would be its own
    ancestor, its parent's children would be guaranteed more than the parent, its own children
    more than it, or it lists namespaces while other TenantQuotas are its children (jobs belong
    to the tenants at the bottom). A parent that does not exist yet is accepted (TenantQuotas
    are often applied together); the operator reports it until it does."""
    by_name = {q.metadata.name or "": q for q in others if q.metadata.name != name}
    if parent == name:
        return f"spec.parent: TenantQuota {name!r} cannot be its own parent"
    at = parent
    seen = {name}
    while at is not None and at in by_name:
        if at in seen:
            break
        seen.add(at)
        at = by_name[at].spec.parent
        if at == name:
            return (
                f"spec.parent: {parent!r} is already below TenantQuota {name!r}; parents may "
                "not form a cycle"
            )
    if parent is not None and parent in by_name:
        listed = by_name[parent].spec.namespaces
        if listed:
            return (
                f"spec.parent: TenantQuota {parent!r} lists namespaces "
                f"({', '.join(listed)}), whose jobs would then wait with no tenant; move them "
                "to a TenantQuota below it first"
            )
        siblings = [q for q in by_name.values() if q.spec.parent == parent]
        total = guaranteed + sum(q.spec.guaranteed_gpus for q in siblings)
        own = by_name[parent].spec.guaranteed_gpus
        if total > own:
            return (
                f"spec.guaranteedGpus: the children of TenantQuota {parent!r} would be "
                f"guaranteed {total} GPUs together, more than its own {own}"
            )
    children = sorted(q.metadata.name or "" for q in by_name.values() if q.spec.parent == name)
    if children:
        total = sum(by_name[c].spec.guaranteed_gpus for c in children)
        if total > guaranteed:
            return (
                f"spec.guaranteedGpus: its children ({', '.join(children)}) are guaranteed "
                f"{total} GPUs together, more than {guaranteed}"
            )
        if namespaces:
            return (
                f"spec.namespaces: TenantQuota {name!r} has child TenantQuotas "
                f"({', '.join(children)}); list the namespaces on them, where jobs belong"
            )
    return None


def template_size_refusal(template: Any) -> str | None:
    """Why a GpuJob's pod template is too large: over ``MAX_TEMPLATE_BYTES`` of compact JSON.

    The operator keeps every job in memory, so one job's size bounds what a namespace user can
    make it spend. The CRD bounds each list of the template (checked by the API server, even
    while the operator is down); its bytes, which no schema or CEL rule can measure, are
    checked here."""
    size = len(json.dumps(template, separators=(",", ":"), ensure_ascii=False).encode())
    if size <= MAX_TEMPLATE_BYTES:
        return None
    return (
        f"spec.template: {size} bytes of JSON, over the {MAX_TEMPLATE_BYTES} a GpuJob's pod "
        "template may take (the operator keeps every job in memory); move large data to a "
        "ConfigMap or Secret and mount it"
    )
