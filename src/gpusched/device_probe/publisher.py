"""The probe's Kubernetes calls: read its Node and NodeGpuTopology, apply labels, the object, its
status, and the optional taint.

Labels, the object and its status are written with server-side apply under the probe's own field
manager, so a label the probe stops applying is removed only if the probe owned it, and GFD's
labels are never touched. The label apply carries the Node's UID: if the Node was deleted (or
replaced by a new one of the same name) the server refuses it instead of creating a Node. Taints
are an atomic list, so the taint goes through a resourceVersion-guarded merge patch instead.
Every write is counted in ``gpusched_probe_api_writes_total``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from gpusched.api import keys
from gpusched.device_probe.state import taints_with
from gpusched.kubeasync import MERGE_PATCH, ApiError, BlockingApi
from gpusched.metrics import ProbeMetrics

log = logging.getLogger(__name__)

PLURAL: Final = "nodegputopologies"
#: Server-side apply; JSON is YAML, so the body is sent as JSON.
_APPLY: Final = "application/apply-patch+yaml"


class NodeMissingError(RuntimeError):
    """The Node this probe publishes for does not exist (or was replaced)."""


@dataclass(frozen=True)
class NodeView:
    """The parts of the Node the probe reads."""

    name: str
    uid: str
    resource_version: str
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    managed_fields: list[dict[str, Any]]


class Publisher:
    """Reads and writes one node's objects through an API client."""

    def __init__(
        self,
        api: BlockingApi,
        node_name: str,
        metrics: ProbeMetrics,
        field_manager: str = keys.FIELD_MANAGER_PROBE,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.metrics = metrics
        self.field_manager = field_manager

    @property
    def node_path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    @property
    def topology_path(self) -> str:
        return f"/apis/{keys.GROUP}/{keys.VERSION}/{PLURAL}/{self.node_name}"

    # --- reads -------------------------------------------------------------------------------

    def read_node(self) -> NodeView | None:
        """The Node, or None when it does not exist."""
        try:
            body = self.api.request("GET", self.node_path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        meta = body.get("metadata", {})
        return NodeView(
            name=meta["name"],
            uid=meta["uid"],
            resource_version=meta.get("resourceVersion", ""),
            labels=dict(meta.get("labels") or {}),
            taints=list((body.get("spec") or {}).get("taints") or []),
            managed_fields=list(meta.get("managedFields") or []),
        )

    def read_topology(self) -> dict[str, Any] | None:
        """The node's NodeGpuTopology as stored, or None."""
        try:
            return self.api.request("GET", self.topology_path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    # --- writes ------------------------------------------------------------------------------

    def _count(self, what: str) -> None:
        self.metrics.api_writes.labels(what).inc()

    def _failed(self, what: str) -> None:
        self.metrics.api_errors.labels(what).inc()

    def apply_labels(self, node: NodeView, labels: dict[str, str]) -> None:
        """Apply the full set of the probe's labels (keys left out are released or removed)."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "uid": node.uid, "labels": labels},
        }
        self._count("labels")
        try:
            self._server_side_apply(self.node_path, body)
        except ApiError as err:
            self._failed("labels")
            if err.status in (404, 409):
                raise NodeMissingError(
                    f"node {self.node_name} (uid {node.uid}) is gone: {err.reason}"
                ) from err
            raise

    def apply_topology(self, node: NodeView, spec: dict[str, Any]) -> None:
        """Create or update the NodeGpuTopology's spec, owned by the Node."""
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "NodeGpuTopology",
            "metadata": {
                "name": self.node_name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": node.uid,
                        "controller": False,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": spec,
        }
        self._apply("topology", self.topology_path, body)

    def apply_status(self, status: dict[str, Any]) -> None:
        """Apply the status subresource."""
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "NodeGpuTopology",
            "metadata": {"name": self.node_name},
            "status": status,
        }
        self._apply("status", self.topology_path + "/status", body)

    def _apply(self, what: str, path: str, body: dict[str, Any]) -> None:
        """Server-side apply of the NodeGpuTopology (or its status), counted in the metrics."""
        self._count(what)
        try:
            self._server_side_apply(path, body)
        except ApiError:
            self._failed(what)
            raise

    def _server_side_apply(self, path: str, body: dict[str, Any]) -> None:
        self.api.request(
            "PATCH",
            path,
            body,
            params={"fieldManager": self.field_manager, "force": True},
            content_type=_APPLY,
        )

    def update_taint(self, wanted: bool, attempts: int = 5) -> bool:
        """Add or remove the no-healthy-GPU taint, keeping every other taint.

        The taint list is atomic, so it is replaced whole under the Node's resourceVersion; when
        the Node changed in between (its own status heartbeats do), the Node is read again and
        the change recomputed. Returns whether the taint is now as wanted.
        """
        for _ in range(attempts):
            view = self.read_node()
            if view is None:
                raise NodeMissingError(f"node {self.node_name} does not exist")
            taints = taints_with(view.taints, wanted)
            if taints is None:
                return True
            body = {
                "metadata": {"resourceVersion": view.resource_version},
                "spec": {"taints": taints},
            }
            self._count("taint")
            try:
                self.api.request(
                    "PATCH",
                    self.node_path,
                    body,
                    params={"fieldManager": self.field_manager},
                    content_type=MERGE_PATCH,
                )
                return True
            except ApiError as err:
                self._failed("taint")
                if err.status != 409:
                    raise
        log.warning("node %s kept changing while its taint was updated", self.node_name)
        return False
