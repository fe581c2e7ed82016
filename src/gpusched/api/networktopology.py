"""NetworkTopology: the cluster's network levels above the node, as node labels.

One cluster-scoped object named ``default`` lists the levels widest first (Kueue's Topology
order: block, rack, NVLink clique). gpusched places a gang in the narrowest level one of whose
domains holds it, keeps a gang's segments each inside one domain, and never gives a gang at a
whole-domain level (an NVLink clique) a domain with trays down.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from gpusched.api import keys
from gpusched.api.base import ApiModel, LenientApiModel
from gpusched.api.meta import ObjectMeta

#: The one NetworkTopology gpusched reads.
DEFAULT_NAME: Final = "default"
MAX_LEVELS: Final = 8

LabelKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]


class NetworkLevel(ApiModel):
    """One level: the node label whose value names a domain of it."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """What people call the level (``clique``, ``rack``, ``block``); used in messages."""
    node_label: LabelKey
    """Node label whose value names the domain, e.g. ``nvidia.com/gpu.clique`` (the device probe
    sets it on multi-node NVLink systems) or ``topology.kubernetes.io/rack``."""
    whole_domains: bool = False
    """Gangs placed in one domain of this level get only domains whose every node and GPU is
    up: set it for NVLink cliques, where a gang on a clique with trays down is half-bound. A
    gang that requires this level waits with reason ``DomainDegraded`` instead. Jobs placed by
    another level still use the healthy part."""


class NetworkTopologySpec(ApiModel):
    """The levels, widest first."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.levels.all(a, self.levels.exists_one(b, b.nodeLabel == "
                    "a.nodeLabel))",
                    "message": "each nodeLabel may name one level only",
                    "fieldPath": ".levels",
                    "reason": "FieldValueDuplicate",
                },
                {
                    "rule": "self.levels.all(a, self.levels.exists_one(b, b.name == a.name))",
                    "message": "each level name may be used once",
                    "fieldPath": ".levels",
                    "reason": "FieldValueDuplicate",
                },
            ]
        }
    )

    levels: list[NetworkLevel] = Field(min_length=1, max_length=MAX_LEVELS)
    """Network levels from the widest (a spine's block) to the narrowest (an NVLink clique or
    a rack). A domain of a narrower level should lie inside one domain of each wider level."""

    @model_validator(mode="after")
    def _distinct(self) -> NetworkTopologySpec:
        labels = [level.node_label for level in self.levels]
        if len(set(labels)) != len(labels):
            raise ValueError("spec.levels: each nodeLabel may name one level only")
        names = [level.name for level in self.levels]
        if len(set(names)) != len(names):
            raise ValueError("spec.levels: each level name may be used once")
        return self


class NetworkTopology(LenientApiModel):
    """The cluster's network levels (cluster-scoped; gpusched reads the one named
    ``default``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.metadata.name == '{DEFAULT_NAME}'",
                    "message": f"metadata.name must be '{DEFAULT_NAME}': gpusched reads one "
                    "NetworkTopology",
                    "reason": "FieldValueInvalid",
                }
            ]
        }
    )

    api_version: Literal["gpusched.io/v1alpha1"] = keys.API_VERSION
    kind: Literal["NetworkTopology"] = "NetworkTopology"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NetworkTopologySpec
