"""Wire types of the kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``).

The Go structs carry no JSON tags, so kube-scheduler sends and expects the Go field names
(``Pod``, ``NodeNames``, ``FailedNodes``, ...). With ``nodeCacheCapable: true`` requests carry
node names only, never whole Node objects, which is what keeps an HTTP extender fast.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 10


class _Wire(BaseModel):
    """Go field names on the wire; Python names in code."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict with the Go field names."""
        return self.model_dump(by_alias=True, mode="json")


class ExtenderArgs(_Wire):
    """Arguments of ``filter`` and ``prioritize``."""

    pod: dict[str, Any] = Field(alias="Pod")
    """The pod being scheduled, as a v1.Pod JSON object."""
    node_names: list[str] | None = Field(None, alias="NodeNames")
    """Candidate nodes (nodeCacheCapable extenders)."""
    nodes: dict[str, Any] | None = Field(None, alias="Nodes")
    """Candidate nodes as a NodeList (extenders that are not nodeCacheCapable)."""

    def candidate_names(self) -> list[str]:
        """Node names from whichever form the scheduler sent."""
        if self.node_names is not None:
            return self.node_names
        items = (self.nodes or {}).get("items") or []
        return [item["metadata"]["name"] for item in items]


class ExtenderFilterResult(_Wire):
    """Result of ``filter``."""

    node_names: list[str] = Field(default_factory=list, alias="NodeNames")
    """Nodes that can host the pod."""
    failed_nodes: dict[str, str] = Field(default_factory=dict, alias="FailedNodes")
    """Refused nodes whose refusal preemption might resolve, with the reason."""
    failed_and_unresolvable_nodes: dict[str, str] = Field(
        default_factory=dict, alias="FailedAndUnresolvableNodes"
    )
    """Refused nodes that no preemption can make fit, with the reason."""
    error: str = Field("", alias="Error")
    """Non-empty when the whole request failed."""


class HostPriority(_Wire):
    """One node's score from ``prioritize``."""

    host: str = Field(alias="Host")
    score: int = Field(alias="Score", ge=MIN_PRIORITY, le=MAX_PRIORITY)


class ExtenderBindingArgs(_Wire):
    """Arguments of ``bind``."""

    pod_name: str = Field(alias="PodName", min_length=1)
    pod_namespace: str = Field(alias="PodNamespace", min_length=1)
    pod_uid: str = Field(alias="PodUID", min_length=1)
    node: str = Field(alias="Node", min_length=1)


class ExtenderBindingResult(_Wire):
    """Result of ``bind``: an empty error means bound."""

    error: str = Field("", alias="Error")
