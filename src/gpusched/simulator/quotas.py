"""TenantQuotas for a replay: the real CRD kind, read from YAML and validated by the same model
the operator uses, turned into the admission core's tenants by the operator's own conversion.

A trace's tenant names a namespace: a job belongs to the TenantQuota whose ``namespaces`` list
it (oldest first, as in the cluster), or to the TenantQuota of that name; a job of no quota
stays queued (``NoTenant`` in gpusched).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle.tenants import core_tenant, tenant_map
from gpusched.simulator.model import Workload


class QuotaError(ValueError):
    """A TenantQuota file that cannot be used."""


def load_tenant_quotas(path: Path) -> tuple[TenantQuota, ...]:
    """Every TenantQuota in a (multi-document) YAML file; anything else in it is refused."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise QuotaError(f"{path}: not YAML ({exc})") from None
    quotas = []
    for number, document in enumerate(documents, 1):
        # A manifest is a mapping; a plain string or a list (a file that is YAML but no
        # manifest) has no kind to look at.
        if not isinstance(document, dict):
            what = "a list" if isinstance(document, list) else f"the plain value {document!r}"
            raise QuotaError(
                f"{path}: document {number}: {what}, not a TenantQuota manifest (a mapping with "
                "apiVersion, kind, metadata and spec)"
            )
        items: Any = document.get("items", []) if document.get("kind") == "List" else [document]
        if not isinstance(items, list):
            raise QuotaError(f"{path}: document {number}: items: not a list")
        for item in items:
            try:
                quotas.append(TenantQuota.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise QuotaError(f"{path}: document {number}: {where}: {first['msg']}") from None
    if not quotas:
        raise QuotaError(f"{path}: no TenantQuota in it")
    return tuple(quotas)


def with_quotas(workload: Workload, quotas: tuple[TenantQuota, ...]) -> Workload:
    """The workload with its tenants replaced by ``quotas``."""
    owners = tenant_map(quotas).owner
    names = {q.metadata.name for q in quotas}
    jobs = tuple(replace(j, tenant=owners.get(j.tenant, j.tenant)) for j in workload.jobs)
    return Workload(
        workload.name,
        jobs,
        tuple(core_tenant(q) for q in quotas),
        (*workload.notes, f"TenantQuotas from a file: {', '.join(sorted(n or '' for n in names))}"),
    )
