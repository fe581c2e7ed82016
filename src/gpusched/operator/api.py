"""The API calls the operator makes, in one place (reads as plain JSON, writes with the
operator's field manager; failures come back as results, not exceptions, where the loop can
carry on)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.kube import body as kube_body

log = logging.getLogger(__name__)

COMPONENT = "gpusched-operator"


def _items(response: Any) -> list[dict[str, Any]]:
    payload = json.loads(response.data)
    return list(payload.get("items") or [])


class PodRefusedError(Exception):
    """The API server refused to create a pod: ``invalid`` (400/422: validation, an admission
    policy that denies it) says the pod can never be created as it is; otherwise (403: a full
    ResourceQuota, a policy about this moment) it may be accepted later."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def invalid(self) -> bool:
        return self.status in (400, 422)


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("message") or err.reason)
    except (TypeError, ValueError):
        return str(err.reason)


class OperatorApi:
    """Thin wrapper over the Kubernetes client for the operator's reads and writes."""

    def __init__(self, api: client.ApiClient, page_size: int = 2000) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.page_size = page_size

    # --- reads (consistent lists, straight from etcd) ---------------------------------------

    def _paged(self, call: Any, **kwargs: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token = None
        while True:
            response = call(limit=self.page_size, _continue=token, _preload_content=False, **kwargs)
            payload = json.loads(response.data)
            out.extend(payload.get("items") or [])
            token = (payload.get("metadata") or {}).get("continue")
            if not token:
                return out

    def list_custom(self, plural: str) -> list[dict[str, Any]]:
        return self._paged(
            self.custom.list_cluster_custom_object,
            group=keys.GROUP,
            version=keys.VERSION,
            plural=plural,
        )

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._paged(self.core.list_node)

    def list_priority_classes(self) -> list[dict[str, Any]]:
        return self._paged(self.scheduling.list_priority_class)

    def list_pods(self) -> list[dict[str, Any]]:
        """Pods that may hold GPUs or belong to a GpuJob: every non-terminal pod, plus the
        terminal pods of GpuJobs (their phase tells how the job ended)."""
        live = self._paged(
            self.core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        ours_done = self._paged(
            self.core.list_pod_for_all_namespaces,
            label_selector=keys.LABEL_JOB_NAME,
            field_selector="status.phase!=Pending,status.phase!=Running,status.phase!=Unknown",
        )
        return live + ours_done

    # --- writes ------------------------------------------------------------------------------

    def patch_job_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        """Merge-patch the job's status; with ``resource_version`` only if the job has not
        changed since it was read. Returns the new resourceVersion, None when the job changed or
        is gone."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            updated = self.custom.patch_namespaced_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                namespace,
                "gpujobs",
                name,
                body,
                field_manager=keys.FIELD_MANAGER_OPERATOR,
            )
        except ApiException as err:
            if err.status in (404, 409):
                log.info("status of %s/%s not written: %s", namespace, name, err.reason)
                return None
            raise
        assert isinstance(updated, dict)
        return str((updated.get("metadata") or {}).get("resourceVersion", ""))

    def patch_quota_status(self, name: str, status: dict[str, Any]) -> bool:
        try:
            self.custom.patch_cluster_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                "tenantquotas",
                name,
                {"status": status},
                field_manager=keys.FIELD_MANAGER_OPERATOR,
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def create_pod(self, manifest: dict[str, Any]) -> bool:
        """Create a pod; True if it exists afterwards (AlreadyExists counts as success)."""
        namespace = manifest["metadata"]["namespace"]
        try:
            self.core.create_namespaced_pod(
                namespace,
                kube_body(manifest),
                field_manager=keys.FIELD_MANAGER_OPERATOR,
            )
        except ApiException as err:
            if err.status == 409:
                # Ours only if the same job made it: a deleted job's pod of the same name may
                # still be terminating; then wait for it to go.
                return self._same_job(namespace, manifest)
            if err.status == 404:
                return False
            if err.status in (400, 403, 422):
                raise PodRefusedError(_message(err), err.status) from err
            raise
        return True

    def _same_job(self, namespace: str, manifest: dict[str, Any]) -> bool:
        name = manifest["metadata"]["name"]
        try:
            existing = self.core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        labels = (existing.metadata.labels if existing.metadata else None) or {}
        wanted = manifest["metadata"].get("labels", {}).get(keys.LABEL_JOB_UID)
        return bool(labels.get(keys.LABEL_JOB_UID) == wanted)

    def dry_run_pod(self, manifest: dict[str, Any]) -> str | None:
        """Let the API server validate and admit a pod without creating it; None if it would
        be accepted, else the server's message."""
        namespace = manifest["metadata"]["namespace"]
        try:
            self.core.create_namespaced_pod(namespace, kube_body(manifest), dry_run="All")
        except ApiException as err:
            if err.status in (400, 422):
                return _message(err)
            if err.status == 403:
                # Forbidden is about this moment (a full ResourceQuota, a terminating
                # namespace, a policy), not the template: do not fail the job for it; pod
                # creation will meet the same refusal and the gang is requeued with its text.
                log.info("dry run of %s refused for now: %s", namespace, _message(err))
                return None
            raise
        return None

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)
        except ApiException as err:
            if err.status != 404:
                raise

    def delete_job_pods(self, namespace: str, uid: str) -> None:
        """Delete every pod of a (deleted) GpuJob."""
        try:
            self.core.delete_collection_namespaced_pod(
                namespace, label_selector=f"{keys.LABEL_JOB_UID}={uid}"
            )
        except ApiException as err:
            if err.status != 404:
                log.warning("pods of deleted job %s/%s not deleted: %s", namespace, uid, err.reason)

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Merge labels and annotations into a pod's metadata (a gone pod is no error)."""
        metadata: dict[str, Any] = {}
        if labels:
            metadata["labels"] = labels
        if annotations:
            metadata["annotations"] = annotations
        try:
            self.core.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": metadata},
                field_manager=keys.FIELD_MANAGER_OPERATOR,
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def event(
        self,
        obj: dict[str, Any],
        kind: str,
        *,
        event_type: str,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        """Record a Kubernetes event on ``obj`` (best effort)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "name": f"{meta.get('name', 'gpusched')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", keys.API_VERSION),
                "kind": kind,
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(namespace, kube_body(body))
        except ApiException as err:
            log.info("event %s on %s not recorded: %s", reason, meta.get("name"), err.reason)
