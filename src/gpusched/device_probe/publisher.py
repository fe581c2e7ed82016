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

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.device_probe.state import taints_with
from gpusched.metrics import ProbeMetrics

log = logging.getLogger(__name__)

PLURAL: Final = "nodegputopologies"
_APPLY: Final = "application/apply-patch+yaml"
_MERGE: Final = "application/merge-patch+json"


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
        api: client.ApiClient,
        node_name: str,
        metrics: ProbeMetrics,
        field_manager: str = keys.FIELD_MANAGER_PROBE,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.node_name = node_name
        self.metrics = metrics
        self.field_manager = field_manager

    # --- reads -------------------------------------------------------------------------------

    def read_node(self) -> NodeView | None:
        """The Node, or None when it does not exist."""
        try:
            response: Any = self.core.read_node(self.node_name, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        body = json.loads(response.data)
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
            obj: Any = self.custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, PLURAL, self.node_name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return obj if isinstance(obj, dict) else None

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
            self.core.patch_node(
                self.node_name,
                body,
                field_manager=self.field_manager,
                force=True,
                _content_type=_APPLY,
            )
        except ApiException as err:
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
        self._apply("topology", self.custom.patch_cluster_custom_object, body)

    def apply_status(self, status: dict[str, Any]) -> None:
        """Apply the status subresource."""
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "NodeGpuTopology",
            "metadata": {"name": self.node_name},
            "status": status,
        }
        self._apply("status", self.custom.patch_cluster_custom_object_status, body)

    def _apply(self, what: str, patch: Callable[..., Any], body: dict[str, Any]) -> None:
        """Server-side apply of the NodeGpuTopology (or its status), counted in the metrics."""
        self._count(what)
        try:
            patch(
                keys.GROUP,
                keys.VERSION,
                PLURAL,
                self.node_name,
                body,
                field_manager=self.field_manager,
                force=True,
                _content_type=_APPLY,
            )
        except ApiException:
            self._failed(what)
            raise

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
                self.core.patch_node(
                    self.node_name,
                    body,
                    field_manager=self.field_manager,
                    _content_type=_MERGE,
                )
                return True
            except ApiException as err:
                self._failed("taint")
                if err.status != 409:
                    raise
        log.warning("node %s kept changing while its taint was updated", self.node_name)
        return False
