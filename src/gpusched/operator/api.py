"""The API calls the operator makes, in one place, over :mod:`gpusched.kubeasync`.

Writes carry their preconditions (the object's UID, and for decisions the resourceVersion they
were taken on) and come back as results the executor can act on: the object as the API server
now has it, or why not.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from gpusched.api import keys
from gpusched.kubeasync import MERGE_PATCH, ApiError, AsyncApi

log = logging.getLogger(__name__)

COMPONENT: Final = "gpusched-operator"
GPUJOBS: Final = f"/apis/{keys.GROUP}/{keys.VERSION}/gpujobs"
TENANTQUOTAS: Final = f"/apis/{keys.GROUP}/{keys.VERSION}/tenantquotas"
NETWORKTOPOLOGIES: Final = f"/apis/{keys.GROUP}/{keys.VERSION}/networktopologies"
TOPOLOGIES: Final = f"/apis/{keys.GROUP}/{keys.VERSION}/nodegputopologies"
PODS: Final = "/api/v1/pods"
NODES: Final = "/api/v1/nodes"
PRIORITY_CLASSES: Final = "/apis/scheduling.k8s.io/v1/priorityclasses"
FIELD_MANAGER: Final = {"fieldManager": keys.FIELD_MANAGER_OPERATOR}


def job_path(namespace: str, name: str) -> str:
    return f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{namespace}/gpujobs/{name}"


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


@dataclass(frozen=True, slots=True)
class Refused:
    """A write the API server turned down, and why (``code`` is the HTTP status)."""

    code: int
    message: str

    @property
    def stale(self) -> bool:
        """The object changed or went since it was read (the decision no longer holds)."""
        return self.code in (404, 409) or (self.code == 422 and "metadata.uid" in self.message)


def _refused(err: ApiError) -> Refused:
    return Refused(err.status, err.message)


class OperatorApi:
    """Reads and writes of the operator (one event loop)."""

    def __init__(self, api: AsyncApi) -> None:
        self.api = api

    async def patch_job_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | Refused:
        """Merge-patch a GpuJob's status, only on the job with ``uid`` (and, when given, only
        if it still has ``resource_version``). Returns the job as it is now."""
        meta: dict[str, Any] = {"uid": uid}
        if resource_version:
            meta["resourceVersion"] = resource_version
        try:
            return await self.api.request(
                "PATCH",
                job_path(namespace, name) + "/status",
                {"metadata": meta, "status": status},
                params=FIELD_MANAGER,
                content_type=MERGE_PATCH,
            )
        except ApiError as err:
            if err.status in (404, 409, 422):
                log.info("status of %s/%s not written: %s", namespace, name, err)
                return _refused(err)
            raise

    async def patch_quota_status(
        self, name: str, uid: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | Refused:
        try:
            return await self.api.request(
                "PATCH",
                f"{TENANTQUOTAS}/{name}/status",
                {"metadata": {"uid": uid}, "status": status},
                params=FIELD_MANAGER,
                content_type=MERGE_PATCH,
            )
        except ApiError as err:
            if err.status in (404, 409, 422):
                return _refused(err)
            raise

    async def create_pod(self, manifest: Mapping[str, Any]) -> dict[str, Any] | Refused:
        """Create a pod; the pod as created, or why not. A pod of the same name made by the
        same GpuJob (a retry, a restart halfway) is returned as if created now."""
        namespace = manifest["metadata"]["namespace"]
        try:
            return await self.api.request(
                "POST", pods_path(namespace), manifest, params=FIELD_MANAGER
            )
        except ApiError as err:
            if err.status == 409:
                return await self._same_job(namespace, manifest, err)
            if err.status in (400, 403, 404, 422):
                return _refused(err)
            raise

    async def _same_job(
        self, namespace: str, manifest: Mapping[str, Any], conflict: ApiError
    ) -> dict[str, Any] | Refused:
        """Ours only if the same job made it: a deleted job's pod of the same name may still be
        terminating; then wait for it to go."""
        name = manifest["metadata"]["name"]
        try:
            existing = await self.api.request("GET", f"{pods_path(namespace)}/{name}")
        except ApiError as err:
            if err.status == 404:
                return _refused(err)
            raise
        labels = (existing.get("metadata") or {}).get("labels") or {}
        wanted = (manifest["metadata"].get("labels") or {}).get(keys.LABEL_JOB_UID)
        if labels.get(keys.LABEL_JOB_UID) == wanted:
            return existing
        return _refused(conflict)

    async def dry_run_pod(self, manifest: Mapping[str, Any]) -> str | None:
        """Let the API server validate and admit a pod without creating it; None if it would
        be accepted, else the server's message."""
        namespace = manifest["metadata"]["namespace"]
        try:
            await self.api.request("POST", pods_path(namespace), manifest, params={"dryRun": "All"})
        except ApiError as err:
            if err.status in (400, 422):
                return err.message
            if err.status in (403, 404):
                # Forbidden is about this moment (a full ResourceQuota, a terminating
                # namespace, a policy), not the template: do not fail the job for it; pod
                # creation will meet the same refusal and release the gang with its text.
                log.info("dry run in %s refused for now: %s", namespace, err.message)
                return None
            raise
        return None

    async def delete_pod(
        self, namespace: str, name: str, uid: str, grace_seconds: int | None
    ) -> dict[str, Any] | Refused:
        """Delete a pod, only the one with ``uid`` when given; the pod as it is now (with its
        deletionTimestamp), or why not (404: already gone)."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            return await self.api.request("DELETE", f"{pods_path(namespace)}/{name}", options)
        except ApiError as err:
            if err.status in (404, 409):
                return _refused(err)
            raise

    async def patch_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
    ) -> dict[str, Any] | Refused:
        """Merge labels and annotations into the metadata of the pod with ``uid``."""
        metadata: dict[str, Any] = {}
        if uid:
            metadata["uid"] = uid
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        try:
            return await self.api.request(
                "PATCH",
                f"{pods_path(namespace)}/{name}",
                {"metadata": metadata},
                params=FIELD_MANAGER,
                content_type=MERGE_PATCH,
            )
        except ApiError as err:
            if err.status in (404, 409, 422):
                return _refused(err)
            raise

    async def delete_job_pods(self, namespace: str, uid: str) -> None:
        """Delete every pod of a deleted GpuJob (the garbage collector would, later)."""
        try:
            await self.api.request(
                "DELETE",
                pods_path(namespace),
                params={"labelSelector": f"{keys.LABEL_JOB_UID}={uid}"},
            )
        except ApiError as err:
            if err.status != 404:
                log.warning("pods of deleted job %s/%s not deleted: %s", namespace, uid, err)

    async def event(
        self,
        reference: Mapping[str, Any],
        *,
        warning: bool,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        """Record a Kubernetes event on the object ``reference`` names (best effort)."""
        namespace = reference.get("namespace") or "default"
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{reference.get('name', 'gpusched')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": dict(reference),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", body)
        except ApiError as err:
            log.info("event %s on %s not recorded: %s", reason, reference.get("name"), err)
