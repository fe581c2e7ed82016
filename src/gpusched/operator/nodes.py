"""From Node and NodeGpuTopology objects to the admission core's nodes.

Nodes: every Ready, schedulable node that advertises ``nvidia.com/gpu`` and has a usable
NodeGpuTopology. The gpusched scheduler binds GPU pods only to nodes whose GPUs it can name, so a
node without one (no device probe there yet) is left out of admission rather than planned for
pods that would never bind. Its model is the ``nvidia.com/gpu.product`` label (what
``spec.gpuModel`` names), else ``gpusched.io/gpu.model``, else the topology's first GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.annotations import whole_number
from gpusched.api.nodegputopology import NodeGpuTopology
from gpusched.core import NodeTopology, TopologyError, prepare
from gpusched.core.admission import Node, Taint, count_only_topology
from gpusched.core.prepared import PreparedNode

log = logging.getLogger(__name__)


def _allocatable_gpus(node: Mapping[str, Any]) -> int:
    value = str(((node.get("status") or {}).get("allocatable") or {}).get(keys.GPU_RESOURCE, "0"))
    return whole_number(value) or 0


def _ready(node: Mapping[str, Any]) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_model(labels: Mapping[str, str], topology: NodeTopology | None) -> str | None:
    """The GPU model jobs name in ``spec.gpuModel``."""
    for key in (keys.GFD_PRODUCT, keys.LABEL_GPU_MODEL):
        if labels.get(key):
            return labels[key]
    if topology is not None and topology.gpus and topology.gpus[0].model:
        return topology.gpus[0].model.replace(" ", "-")
    return None


@dataclass(frozen=True)
class NodeView:
    """What admission reads of a Node object, and all it reads: the store wakes a cycle only
    when this changes. Kubelets write their Node's status every few minutes even when nothing
    changed (heartbeat times, images, volumes in use): on a cluster of 1,000 nodes that is
    several updates a second, each of which would otherwise start a cycle over every queued
    job."""

    name: str
    labels: Mapping[str, str]
    gpus: int
    """``nvidia.com/gpu`` allocatable."""
    schedulable: bool
    """Ready and not cordoned."""
    taints: tuple[Taint, ...]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> NodeView:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        return cls(
            name=meta.get("name") or "",
            labels=dict(meta.get("labels") or {}),
            gpus=_allocatable_gpus(raw),
            schedulable=not spec.get("unschedulable") and _ready(raw),
            taints=tuple(
                Taint(t.get("key") or "", t.get("value") or "", t.get("effect") or "")
                for t in spec.get("taints") or []
            ),
        )


@dataclass(frozen=True)
class _GpuNode:
    view: NodeView
    prepared: PreparedNode
    count_only: bool


class NodeReader:
    """Turns Node and NodeGpuTopology objects into core nodes, caching prepared topologies by
    resource version (the wiring is analysed once per hardware type anyway)."""

    def __init__(self, node_selector: Mapping[str, str] | None = None) -> None:
        self.node_selector = dict(node_selector or {})
        self._cache: dict[str, tuple[str, int, PreparedNode, bool]] = {}

    def _prepared(
        self, name: str, gpus: int, model_hint: str | None, topo: Mapping[str, Any] | None
    ) -> tuple[PreparedNode, bool]:
        version = (topo or {}).get("metadata", {}).get("resourceVersion", "") if topo else ""
        cached = self._cache.get(name)
        if cached is not None and cached[0] == version and cached[1] == gpus:
            return cached[2], cached[3]
        prepared: PreparedNode | None = None
        count_only = True
        if topo is not None:
            try:
                obj = NodeGpuTopology.model_validate(topo)
                topology = NodeTopology.from_api(obj.spec, obj.status)
                if topology.gpus:
                    prepared = prepare(topology)
                    count_only = False
            except (ValidationError, TopologyError) as err:
                log.warning(
                    "NodeGpuTopology %s unusable, treating node as count-only: %s", name, err
                )
        if prepared is None:
            prepared = prepare(count_only_topology(name, gpus, model_hint))
        self._cache[name] = (version, gpus, prepared, count_only)
        return prepared, count_only

    def _gpu_nodes(
        self, raw_nodes: Iterable[Mapping[str, Any]], topologies: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[_GpuNode]:
        """The GPU nodes the node selector admits, schedulable or not."""
        for raw in raw_nodes:
            view = NodeView.of(raw)
            labels = view.labels
            if any(labels.get(k) != v for k, v in self.node_selector.items()):
                continue
            topo = topologies.get(view.name)
            if view.gpus <= 0 and topo is None:
                continue
            prepared, count_only = self._prepared(
                view.name, view.gpus, labels.get(keys.GFD_PRODUCT), topo
            )
            yield _GpuNode(view, prepared, count_only)

    def down_labels(
        self, raw_nodes: Iterable[Mapping[str, Any]], topologies: Mapping[str, Mapping[str, Any]]
    ) -> list[dict[str, str]]:
        """Labels of GPU nodes out of service: not Ready, cordoned, or without a usable
        NodeGpuTopology. Their network domains are not whole (an NVLink clique with a tray
        down)."""
        return [
            dict(n.view.labels)
            for n in self._gpu_nodes(raw_nodes, topologies)
            if not n.view.schedulable or n.count_only
        ]

    def nodes(
        self,
        raw_nodes: Iterable[Mapping[str, Any]],
        topologies: Mapping[str, Mapping[str, Any]],
        busy: Mapping[str, tuple[set[int], int]],
    ) -> list[Node]:
        """Schedulable GPU nodes; ``busy`` gives per node the GPU indices held by pods outside
        any GpuJob and the count of such GPUs whose indices are unknown."""
        out = []
        for n in self._gpu_nodes(raw_nodes, topologies):
            view = n.view
            if not view.schedulable or n.count_only:
                # Count-only: the extender refuses it (NoTopology), nothing admitted could bind.
                continue
            indices, unknown = busy.get(view.name, (set(), 0))
            out.append(
                Node(
                    name=view.name,
                    topology=n.prepared,
                    model=node_model(view.labels, n.prepared.topology),
                    labels=dict(view.labels),
                    busy=frozenset(indices),
                    busy_count=unknown,
                    count_only=False,
                    taints=view.taints,
                )
            )
        return out
