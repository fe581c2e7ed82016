"""The operator's validating webhook (kopf's ``@kopf.on.validate``): rules an object must meet
against other objects, refused at apply time naming the field.

- A TenantQuota may not claim a namespace another TenantQuota owns.
- A GpuJob may not be created in a namespace no TenantQuota owns, nor name a PriorityClass that
  does not exist (nor be changed to name one), nor have a pod template over
  ``MAX_TEMPLATE_BYTES`` of JSON (nor be changed to one): the operator keeps every job in
  memory. Its entries are bounded by the CRD, which holds while the webhook is down.

The rules are :mod:`gpusched.core.lifecycle.validation`; this module feeds them. Every replica
serves the webhook (standbys keep their store warm), reading its store, and confirms a refusal
with a fresh read of the API server first: a TenantQuota applied just before a GpuJob, in one
``kubectl apply``, may not have reached the store yet.

The chart registers the webhook with ``failurePolicy: Ignore``: when no replica answers (an
operator outage, an upgrade), GpuJobs and TenantQuotas are still accepted, and the operator
explains what these rules would have refused (the job waits with a reason; a namespace claimed
twice goes to the older TenantQuota, the newer one's status says so). Blocking every job of every
tenant on the operator's availability would be a worse failure than a late explanation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from gpusched.api import keys
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle.validation import (
    namespace_claim_refusal,
    priority_class_refusal,
    template_size_refusal,
    tree_refusal,
    unowned_namespace_refusal,
)
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.metrics import OperatorMetrics
from gpusched.operator import api as paths
from gpusched.operator.store import Store

log = logging.getLogger(__name__)

#: Webhook ids: the last segment of the URL path the API server posts reviews to.
TENANTQUOTA_HOOK = "tenantquotas"
GPUJOB_HOOK = "gpujobs"


class Validator:
    """The checks, over the store, confirmed by the API server before a refusal."""

    def __init__(self, store: Store, api: AsyncApi, metrics: OperatorMetrics) -> None:
        self.store = store
        self.api = api
        self.metrics = metrics

    async def tenant_quota(self, body: Mapping[str, Any]) -> None:
        """Raises :class:`kopf.AdmissionError` when the TenantQuota may not be applied."""
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        namespaces = list((body.get("spec") or {}).get("namespaces") or [])
        spec = body.get("spec") or {}
        parent = spec.get("parent")
        guaranteed = int(spec.get("guaranteedGpus") or 0)

        def refusal_among(quotas: Iterable[TenantQuota]) -> str | None:
            quotas = list(quotas)
            return namespace_claim_refusal(name, namespaces, quotas) or tree_refusal(
                name, parent, guaranteed, namespaces, quotas
            )

        refusal = refusal_among(self.store.quotas.values())
        if refusal is not None:
            refusal = refusal_among(await self._quotas())
        self._verdict("tenantquotas", refusal)

    async def gpujob(self, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
        """Raises :class:`kopf.AdmissionError` when the GpuJob may not be created (or changed
        to name a PriorityClass that does not exist). An existing job stays editable whatever
        its namespace's tenant became."""
        namespace = str((body.get("metadata") or {}).get("namespace") or "")
        spec = body.get("spec") or {}
        wanted = spec.get("priorityClassName")
        refusal = None
        if old is None or spec.get("template") != (old.get("spec") or {}).get("template"):
            # Not on every update: the operator's own writes to a job stored before the rule
            # (a finalizer, an annotation) must pass.
            refusal = template_size_refusal(spec.get("template"))
        if refusal is None and old is None:
            refusal = unowned_namespace_refusal(namespace, self.store.quotas.values())
            if refusal is not None:
                refusal = unowned_namespace_refusal(namespace, await self._quotas())
        if refusal is None and (
            old is None or wanted != (old.get("spec") or {}).get("priorityClassName")
        ):
            refusal = priority_class_refusal(wanted, self.store.priorities)
            if refusal is not None:
                refusal = priority_class_refusal(wanted, await self._priority_class(wanted))
        self._verdict("gpujobs", refusal)

    async def _quotas(self) -> list[TenantQuota]:
        items, _ = await self.api.list(paths.TENANTQUOTAS)
        return [TenantQuota.model_validate(item) for item in items]

    async def _priority_class(self, name: str | None) -> set[str]:
        if not name:
            return set()
        try:
            await self.api.request("GET", f"{paths.PRIORITY_CLASSES}/{name}")
        except ApiError as err:
            if err.status == 404:
                return set()
            raise
        return {name}

    def _verdict(self, resource: str, refusal: str | None) -> None:
        self.metrics.webhook_reviews.labels(resource, "refused" if refusal else "allowed").inc()
        if refusal is not None:
            raise kopf.AdmissionError(refusal, code=422)


def register(registry: kopf.OperatorRegistry, validator: Validator) -> None:
    """The validating handlers, under the ids (URL paths) the chart's
    ValidatingWebhookConfiguration posts to."""

    @kopf.on.validate(
        keys.GROUP,
        keys.VERSION,
        "tenantquotas",
        id=TENANTQUOTA_HOOK,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    async def validate_tenant_quota(body: Mapping[str, Any], **_: Any) -> None:
        await validator.tenant_quota(body)

    @kopf.on.validate(
        keys.GROUP,
        keys.VERSION,
        "gpujobs",
        id=GPUJOB_HOOK,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    async def validate_gpujob(body: Mapping[str, Any], **kwargs: Any) -> None:
        await validator.gpujob(body, kwargs.get("old"))  # the object before an UPDATE
