"""Rules an object must meet against other objects, checked when it is applied (the operator's
validating webhook) so that ``kubectl apply`` refuses it naming the field, rather than the
operator explaining later why the job waits.

The CRD's schema and CEL rules check an object alone; these need others: which TenantQuota owns
a namespace, which PriorityClasses exist. They are pure: the webhook passes what its cache holds
and, before refusing, what a fresh read of the API server says (a TenantQuota applied a moment
before the job may not have reached the cache).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from gpusched.api.tenantquota import TenantQuota


def namespace_claim_refusal(
    name: str, namespaces: Sequence[str], others: Iterable[TenantQuota]
) -> str | None:
    """Why TenantQuota ``name`` may not claim ``namespaces``: one of them belongs to another
    TenantQuota (a namespace has one tenant, else whose guarantee would its jobs use?)."""
    owners = {
        namespace: other.metadata.name
        for other in others
        if other.metadata.name != name
        for namespace in other.spec.namespaces
    }
    for index, namespace in enumerate(namespaces):
        owner = owners.get(namespace)
        if owner is not None:
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
