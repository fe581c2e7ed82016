"""An :class:`OperatorApi` that reads but never writes, for ``gpusched explain``: the same
cycle runs, every write is dropped, so explaining changes nothing in the cluster."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpusched.operator.api import OperatorApi


class ReadOnlyApi(OperatorApi):
    """Reads through; writes succeed without reaching the API server."""

    def patch_job_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        return resource_version or "read-only"

    def patch_quota_status(self, name: str, status: dict[str, Any]) -> bool:
        return True

    def create_pod(self, manifest: dict[str, Any]) -> bool:
        return True

    def dry_run_pod(self, manifest: dict[str, Any]) -> str | None:
        return None  # validation is the operator's business; explain assumes valid specs

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        return None

    def delete_job_pods(self, namespace: str, uid: str) -> None:
        return None

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        return None

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
        return None
