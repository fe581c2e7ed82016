"""Wire types of the kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``).

The Go structs carry no JSON tags, so kube-scheduler sends and expects the Go field names
(``Pod``, ``NodeNames``, ``FailedNodes``, ...). With ``nodeCacheCapable: true`` requests carry
node names only, never whole Node objects, which is what keeps an HTTP extender fast.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 10


class _Wire(BaseModel):
    """Go field names on the wire; Python names in code."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict with the Go field names."""
        return self.model_dump(by_alias=True, mode="json")


class WireError(ValueError):
    """A request whose JSON does not have the protocol's shape; the message names the field."""


def _first_error(err: ValidationError, prefix: tuple[str, ...] = ()) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in (*prefix, *first["loc"])) or "request body"
    return f"{where}: {first['msg']}"


class _Shape(BaseModel):
    """The fields of a Kubernetes object that gpusched reads, with their wire types; every
    other field is accepted and left alone."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _ObjectMeta(_Shape):
    name: StrictStr = ""
    namespace: StrictStr = ""
    uid: StrictStr = ""
    resource_version: StrictStr = Field("", alias="resourceVersion")
    labels: dict[StrictStr, StrictStr] | None = None
    annotations: dict[StrictStr, StrictStr] | None = None


class _Resources(_Shape):
    limits: dict[StrictStr, StrictStr | StrictInt] | None = None
    requests: dict[StrictStr, StrictStr | StrictInt] | None = None


class _Container(_Shape):
    resources: _Resources | None = None


class _PodSpec(_Shape):
    scheduler_name: StrictStr | None = Field(None, alias="schedulerName")
    node_name: StrictStr | None = Field(None, alias="nodeName")
    containers: list[_Container] | None = None
    init_containers: list[_Container] | None = Field(None, alias="initContainers")
    affinity: dict[StrictStr, Any] | None = None
    topology_spread_constraints: list[dict[StrictStr, Any]] | None = Field(
        None, alias="topologySpreadConstraints"
    )


class PodShape(_Shape):
    """What a pod sent by kube-scheduler must look like where gpusched reads it."""

    metadata: _ObjectMeta | None = None
    spec: _PodSpec | None = None


class _NameOnly(_Shape):
    name: StrictStr = Field(min_length=1)


class _NamedObject(_Shape):
    metadata: _NameOnly

    @property
    def name(self) -> str:
        return self.metadata.name


class NodeList(_Shape):
    """A v1.NodeList, of which only the names are read."""

    items: list[_NamedObject] | None = None


_POD: Final = TypeAdapter(PodShape)


class ExtenderArgs(_Wire):
    """Arguments of ``filter`` and ``prioritize``."""

    pod: dict[str, Any] = Field(alias="Pod")
    """The pod being scheduled, as a v1.Pod JSON object."""
    node_names: list[StrictStr] | None = Field(None, alias="NodeNames")
    """Candidate nodes (nodeCacheCapable extenders)."""
    nodes: NodeList | None = Field(None, alias="Nodes")
    """Candidate nodes as a NodeList (extenders that are not nodeCacheCapable)."""

    @classmethod
    def from_wire(cls, data: Any) -> ExtenderArgs:
        """Validate a decoded request: the envelope, and the pod's fields gpusched reads (the
        pod itself stays a plain dict, as the rest of the extender reads pods from watches).
        Raises :class:`WireError` naming the first wrong field, e.g.
        ``Pod.metadata.annotations.gpusched.io/gang-size: Input should be a valid string``."""
        try:
            args = cls.model_validate(data)
        except ValidationError as err:
            raise WireError(_first_error(err)) from None
        try:
            _POD.validate_python(args.pod)
        except ValidationError as err:
            raise WireError(_first_error(err, ("Pod",))) from None
        return args

    def candidate_names(self) -> list[str]:
        """Node names from whichever form the scheduler sent."""
        if self.node_names is not None:
            return self.node_names
        items = (self.nodes.items if self.nodes is not None else None) or []
        return [item.name for item in items]


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


_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ExtenderBindingArgs(_Wire):
    """Arguments of ``bind``."""

    @classmethod
    def from_wire(cls, data: Any) -> ExtenderBindingArgs:
        """Validate a decoded request; :class:`WireError` names the first wrong field."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise WireError(_first_error(err)) from None

    # Names go into API paths: only what Kubernetes allows for them (DNS subdomains and labels).
    pod_name: str = Field(alias="PodName", min_length=1, max_length=253, pattern=_SUBDOMAIN)
    pod_namespace: str = Field(alias="PodNamespace", min_length=1, max_length=63, pattern=_LABEL)
    pod_uid: str = Field(alias="PodUID", min_length=1, max_length=128)
    node: str = Field(alias="Node", min_length=1, max_length=253, pattern=_SUBDOMAIN)


class ExtenderBindingResult(_Wire):
    """Result of ``bind``: an empty error means bound."""

    error: str = Field("", alias="Error")
