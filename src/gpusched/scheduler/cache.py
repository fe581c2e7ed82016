"""The extender's picture of the cluster: each node's wiring and health, and who holds which GPU.

Fed by watches (``watch.py``) and by the binder's own assumptions. It is touched only from the
event loop thread, so a bind can choose a set and assume it without awaiting in between: two
concurrent binds can never pick the same GPU. GPU ownership is derived from pod annotations
(``gpusched.io/gpu-indices`` on pods that have a node), which is also how the cache is rebuilt
after a restart.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.annotations import format_indices
from gpusched.api.networktopology import DEFAULT_NAME, NetworkTopology
from gpusched.api.nodegputopology import NodeGpuTopology
from gpusched.core import NodeTopology, PreparedNode, prepare
from gpusched.core.lifecycle.snapshot import core_levels
from gpusched.core.podgpus import GpuClaim, gpu_claim
from gpusched.core.scheduling import NodeView, RequestError, gpu_count

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: How long an assumption survives after its bind returned, waiting for the watch to confirm.
ASSUME_TTL_SECONDS = 120.0
#: How long an assumption whose bind never returned survives.
ABANDONED_BIND_SECONDS = 600.0
#: How long a reservation made at filter time waits for its bind (kube-scheduler binds within
#: milliseconds of its decision unless the pod failed a later stage; a retry re-filters).
TENTATIVE_SECONDS = 30.0


def settle_heap() -> None:
    """Move what is alive now (the synced cache, the placement memo) out of the garbage
    collector's scans.

    A full cache is millions of long-lived objects, and the placement memo keeps growing; a
    full collection that walks them all holds a filter call for 100 ms and more. Collecting and
    freezing again every few seconds keeps each collection to what was allocated since (acyclic
    objects dropped later are still freed by reference counting).
    """
    gc.collect()
    gc.freeze()


def pod_key(namespace: str, name: str) -> str:
    """``namespace/name``."""
    return f"{namespace}/{name}"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A bound, non-terminal pod that holds GPUs."""

    key: str
    uid: str
    node: str
    gpus: tuple[int, ...] | None
    """Indices it holds (trusted assignment and allocation), None when none is known."""
    count: int
    assigned: tuple[int, ...] | None = None
    """The extender's set as first seen bound; kept when the annotation later changes."""


@dataclass(slots=True)
class Assumption:
    """GPUs reserved by a bind that the watch has not confirmed yet."""

    uid: str
    key: str
    node: str
    gpus: tuple[int, ...]
    topology_class: str
    created_at: float = 0.0
    bound_at: float | None = None
    tentative: bool = False
    """Made by filter for the one node it passed; the bind confirms or replaces it."""


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's GPUs as the extender accounts them."""

    node: str
    model: str
    allocated: int
    """Held by bound pods or reserved by binds in flight."""
    free: int
    """Placeable and not held."""
    unavailable: int
    """Neither: unhealthy, unschedulable or in MIG mode."""
    largest_free_nvlink_set: int
    """The most free GPUs with NVLink between every pair: the largest ``nvlink``-scoped replica
    the node can take now."""


@dataclass
class ClusterCache:
    """Nodes' topologies, GPU holders and in-flight assumptions."""

    clock: Any = time.monotonic
    topologies: dict[str, PreparedNode] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    by_node: dict[str, dict[str, PodRecord]] = field(default_factory=dict)
    """The same records indexed by node, so a view costs the node's pods, not the cluster's."""
    _pods_listed_at: float | None = field(default=None, repr=False)
    """When the last LIST of the bound pods was sent (None: not known)."""
    assumptions: dict[str, Assumption] = field(default_factory=dict)
    synced: set[str] = field(default_factory=set)
    topology_errors: dict[str, str] = field(default_factory=dict)
    levels: tuple[str, ...] = ()
    """Node labels of the cluster's network levels, narrowest first (the NetworkTopology
    ``default``; empty without one)."""
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Each node's labels (from the node watch)."""
    _views: dict[str, NodeView] = field(default_factory=dict)
    """Views computed since the node last changed: filter asks for hundreds of nodes per pod
    while only the few nodes touched by the last binds differ."""

    def _touch(self, node: str) -> None:
        self._views.pop(node, None)

    def _pop_assumption(self, uid: str) -> Assumption | None:
        assumption = self.assumptions.pop(uid, None)
        if assumption is not None:
            self._touch(assumption.node)
        return assumption

    # --- watch input ---------------------------------------------------------------------

    def apply_topology(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a node's NodeGpuTopology (prepared once per change)."""
        name = obj["metadata"]["name"]
        try:
            model = NodeGpuTopology.model_validate(obj)
            topology = NodeTopology.from_api(model.spec, model.status)
            self._touch(name)
            self.topologies[name] = prepare(topology)
        except (ValidationError, ValueError) as err:
            # A malformed object must not take down scheduling for every other node.
            self._touch(name)
            self.topologies.pop(name, None)
            self.topology_errors[name] = str(err).splitlines()[0]
            return
        self.topology_errors.pop(name, None)
        self.models[name] = model.spec.gpus[0].model if model.spec.gpus else "unknown"

    def apply_levels(self, obj: Mapping[str, Any]) -> None:
        """The NetworkTopology ``default`` was added or changed (others are not read)."""
        if (obj.get("metadata") or {}).get("name") != DEFAULT_NAME:
            return
        try:
            levels = core_levels(NetworkTopology.model_validate(obj))
        except ValidationError:
            levels = ()  # the API server refuses such objects; nothing to rank by
        self._set_levels(tuple(level.node_label for level in levels))

    def delete_levels(self, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") == DEFAULT_NAME:
            self._set_levels(())

    def replace_levels(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Initial list or re-list of NetworkTopology objects."""
        self._set_levels(())
        for obj in objects:
            self.apply_levels(obj)

    def _set_levels(self, levels: tuple[str, ...]) -> None:
        if levels != self.levels:
            self.levels = levels
            self._views.clear()

    def apply_node(self, obj: Mapping[str, Any]) -> None:
        """A node was added or its labels changed (its views are recomputed)."""
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        if self.node_labels.get(name) != labels:
            # Kept whole, so that levels naming other labels later need no re-list.
            self.node_labels[name] = labels
            self._touch(name)

    def delete_node(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and self.node_labels.pop(name, None) is not None:
            self._touch(name)

    def replace_nodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Initial list or re-list of nodes."""
        self.node_labels.clear()
        self._views.clear()
        for obj in objects:
            self.apply_node(obj)

    def delete_topology(self, name: str) -> None:
        """Forget a node's topology."""
        self._touch(name)
        self.topologies.pop(name, None)
        self.models.pop(name, None)
        self.topology_errors.pop(name, None)

    def replace_topologies(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Initial list or re-list: exactly these objects exist."""
        self._views.clear()
        self.topologies.clear()
        self.models.clear()
        self.topology_errors.clear()
        for obj in objects:
            self.apply_topology(obj)
        self.synced.add("topologies")

    def apply_pod(self, obj: Mapping[str, Any], previous: PodRecord | None = None) -> None:
        """Add, update or drop a pod according to its node, phase and annotations
        (``previous``: its record before a relist, whose bound set it keeps)."""
        meta = obj["metadata"]
        key = pod_key(meta["namespace"], meta["name"])
        node = (obj.get("spec") or {}).get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        try:
            count = gpu_count(obj)
        except RequestError:
            count = 0
        if not node or phase in TERMINAL_PHASES or count == 0:
            self._drop_pod(key, meta.get("uid", ""))
            return
        uid = meta.get("uid", "")
        claim = gpu_claim(obj, count)
        assigned = claim.assigned
        previous = self.pods.get(key) or previous
        if previous is not None and previous.uid == uid and previous.assigned is not None:
            # gpusched never changes a bound pod's set: a later value is not the extender's.
            if assigned != previous.assigned:
                log.warning(
                    "pod %s: %s changed after bind (%s -> %s); keeping the bound set",
                    key,
                    keys.ANNOTATION_GPU_INDICES,
                    format_indices(previous.assigned),
                    format_indices(assigned or ()),
                )
            assigned = previous.assigned
        claim = GpuClaim(assigned, claim.allocated, claim.ignored)
        if claim.ignored:
            log.debug("pod %s: %s", key, "; ".join(claim.ignored))
        gpus = claim.held
        record = PodRecord(key=key, uid=uid, node=node, gpus=gpus, count=count, assigned=assigned)
        self._unindex(key)
        self.pods[key] = record
        self.by_node.setdefault(node, {})[key] = record
        self._touch(node)
        assumption = self.assumptions.get(record.uid)
        if assumption is not None and gpus is not None:
            # The pod's real holding is known now, wherever an earlier bind attempt aimed.
            self._pop_assumption(record.uid)

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        """A pod is gone (or no longer matches the watch)."""
        meta = obj["metadata"]
        self._drop_pod(pod_key(meta["namespace"], meta["name"]), meta.get("uid", ""))

    def listing_pods(self) -> None:
        """A LIST of the bound pods is being sent: what it returns shows every pod bound by
        now that still exists."""
        self._pods_listed_at = self.clock()

    def replace_pods(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Initial list or re-list: exactly these pods exist. A bind that returned before the
        list was sent and whose pod it lacks was of a pod deleted since (while the watch was
        down, say): its GPUs are free again, not held until the reservation's TTL."""
        self._views.clear()
        before = self.pods
        self.pods = {}
        self.by_node.clear()
        listed: set[str] = set()
        for obj in objects:
            meta = obj["metadata"]
            listed.add(str(meta.get("uid") or ""))
            self.apply_pod(obj, before.get(pod_key(meta["namespace"], meta["name"])))
        since = self._pods_listed_at
        if since is not None:
            gone = [
                uid
                for uid, a in self.assumptions.items()
                if a.bound_at is not None and a.bound_at < since and uid not in listed
            ]
            for uid in gone:
                self._pop_assumption(uid)
        self.synced.add("pods")

    def _unindex(self, key: str) -> PodRecord | None:
        record = self.pods.pop(key, None)
        if record is not None:
            self._touch(record.node)
            on_node = self.by_node.get(record.node, {})
            on_node.pop(key, None)
            if not on_node:
                self.by_node.pop(record.node, None)
        return record

    def _drop_pod(self, key: str, uid: str) -> None:
        record = self._unindex(key)
        if record is not None:
            self._pop_assumption(record.uid)
        if uid:
            self._pop_assumption(uid)

    # --- assumptions (the binder) --------------------------------------------------------

    def assume(self, assumption: Assumption) -> None:
        """Reserve GPUs for a pod being bound."""
        if not assumption.created_at:
            assumption.created_at = self.clock()
        self._pop_assumption(assumption.uid)
        self.assumptions[assumption.uid] = assumption
        self._touch(assumption.node)

    def forget_tentative(self, uid: str) -> None:
        """Drop a filter-time reservation of a pod that is being scheduled again."""
        assumption = self.assumptions.get(uid)
        if assumption is not None and assumption.tentative:
            self._pop_assumption(uid)

    def holds(self, assumption: Assumption) -> bool:
        """Whether an assumption's GPUs are still placeable and held by nobody else."""
        view = self.view(assumption.node, excluding_uid=assumption.uid)
        prepared = view.prepared
        if prepared is None:
            return False
        placeable = set(prepared.indices(prepared.placeable_mask))
        gpus = assumption.gpus
        return view.free >= len(gpus) and all(g in placeable and g not in view.busy for g in gpus)

    def mark_bound(self, uid: str) -> None:
        """The bind call succeeded; keep the reservation until the watch confirms it."""
        assumption = self.assumptions.get(uid)
        if assumption is not None:
            assumption.bound_at = self.clock()

    def forget(self, uid: str) -> None:
        """The bind failed: release its reservation."""
        self._pop_assumption(uid)

    def expire(self) -> int:
        """Drop reservations of binds that returned long ago and were never confirmed, and of
        binds that never returned at all (no bind takes minutes)."""
        now = self.clock()
        stale = [
            uid
            for uid, a in self.assumptions.items()
            if (a.bound_at is not None and now - a.bound_at > ASSUME_TTL_SECONDS)
            or now - a.created_at > (TENTATIVE_SECONDS if a.tentative else ABANDONED_BIND_SECONDS)
        ]
        for uid in stale:
            self._pop_assumption(uid)
        return len(stale)

    # --- snapshot ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Both initial lists are in; answering before would risk handing out held GPUs."""
        return {"topologies", "pods"} <= self.synced

    def holders(self, node: str, *, excluding_uid: str = "") -> dict[int, str]:
        """GPU index -> pod key of every GPU held or reserved on ``node``."""
        held: dict[int, str] = {}
        for record in self.by_node.get(node, {}).values():
            if record.gpus is not None and record.uid != excluding_uid:
                for gpu in record.gpus:
                    held[gpu] = record.key
        for assumption in self.assumptions.values():
            if assumption.node == node and assumption.uid != excluding_uid:
                for gpu in assumption.gpus:
                    held[gpu] = assumption.key
        return held

    def view(self, node: str, *, excluding_uid: str = "") -> NodeView:
        """The node as placement sees it (``excluding_uid``: as if that pod held nothing)."""
        return self.views([node], excluding_uid=excluding_uid)[0]

    def views(self, nodes: Iterable[str], *, excluding_uid: str = "") -> list[NodeView]:
        """Views of several nodes, computed in one pass over the pods."""
        names = list(nodes)
        if excluding_uid:
            return self._compute_views(names, excluding_uid)
        cached = self._views
        missing = [name for name in names if name not in cached]
        if not missing:
            return [cached[name] for name in names]
        computed = dict(zip(missing, self._compute_views(missing, ""), strict=True))
        # Only nodes the cache knows are kept: a request naming nodes that do not exist must
        # not grow the cache.
        known = self.topologies
        cached.update((n, v) for n, v in computed.items() if n in known or n in self.by_node)
        return [cached.get(name) or computed[name] for name in names]

    def _compute_views(self, nodes: list[str], excluding_uid: str) -> list[NodeView]:
        assumed: dict[str, set[int]] = {}
        for assumption in self.assumptions.values():
            if assumption.uid != excluding_uid:
                assumed.setdefault(assumption.node, set()).update(assumption.gpus)
        out = []
        for name in nodes:
            held = set(assumed.get(name, ()))
            unaccounted = 0
            for record in self.by_node.get(name, {}).values():
                if record.uid == excluding_uid:
                    continue
                if record.gpus is not None:
                    held.update(record.gpus)
                elif record.uid not in self.assumptions:
                    unaccounted += record.count
            prepared = self.topologies.get(name)
            if held and prepared is not None:
                # Indices the node does not have (a stale or hand-edited annotation) hold nothing.
                held.intersection_update(prepared.wiring.indices)
            domains: tuple[str | None, ...] = ()
            if self.levels:
                labels = self.node_labels.get(name, {})
                domains = tuple(labels.get(label) for label in self.levels)
            out.append(NodeView(name, prepared, frozenset(held), unaccounted, domains))
        return out

    def inventory(self) -> list[NodeInventory]:
        """Each node's GPUs by state, and its largest free NVLink-connected set (the gauges
        behind the cluster dashboard: allocation, health and fragmentation)."""
        out = []
        for view in self.views(self.topologies):
            prepared = view.prepared
            assert prepared is not None
            wiring = prepared.wiring
            busy = prepared.mask(view.busy)
            available = prepared.placeable_mask & ~busy
            free = max(0, bin(available).count("1") - view.unaccounted)
            allocated = bin(busy).count("1") + min(view.unaccounted, bin(available).count("1"))
            largest = wiring.largest_nvlink_set(available)
            out.append(
                NodeInventory(
                    node=view.name,
                    model=self.models.get(view.name, "unknown"),
                    allocated=allocated,
                    free=free,
                    unavailable=wiring.n - allocated - free,
                    largest_free_nvlink_set=min(largest, free),
                )
            )
        return out

    def free_by_model(self) -> dict[str, int]:
        """Free placeable GPUs per GPU model (for the free-GPUs gauge)."""
        return free_by_model(self.inventory())


def free_by_model(rows: Iterable[NodeInventory]) -> dict[str, int]:
    """Free placeable GPUs per GPU model, summed over inventory rows."""
    free: dict[str, int] = {}
    for row in rows:
        free[row.model] = free.get(row.model, 0) + row.free
    return free
