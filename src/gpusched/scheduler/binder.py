"""Bind: choose the exact GPUs and bind the pod to the node with them written on it.

How the guarantee that two pods never hold the same GPU is kept:

1. the set is chosen from the cache and *assumed* before any await, so concurrent binds on the
   same node see each other's choices;
2. one Binding call sets the pod's node *and* its ``gpusched.io/gpus`` / ``gpusched.io/gpu-indices``
   annotations atomically (the API server merges a Binding's annotations into the pod), with the
   pod's UID as precondition, and only if the pod has no node yet. So there is no state in which
   a pod has a node but no GPUs written, or GPUs written but the bind half-done: ownership rebuilt
   from annotations after a restart is always complete;
3. on failure, if the pod turns out bound anyway (a timeout whose request did land, or a retry
   of a bind that already happened), that is a success; otherwise the assumption is forgotten
   only when the API server refused the Binding (4xx): after a server error or a lost
   connection the Binding may still be stored, so its GPUs stay held until the watch says, or
   the bound reservations' TTL ends;
4. a restarted extender answers nothing until it has listed every bound pod.

A bind costs a single API call, made asynchronously (``gpusched.kubeasync``): the pod's request
is remembered from its filter call.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gpusched.api import keys
from gpusched.api.annotations import format_indices
from gpusched.api.extender import ExtenderBindingArgs
from gpusched.core.podgpus import gpu_claim
from gpusched.core.scheduling import GpuRequest, RequestError, evaluate, gpu_count, gpu_request
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.metrics import SchedulerMetrics
from gpusched.scheduler.cache import Assumption, ClusterCache
from gpusched.scheduler.pending import PendingPods

log = logging.getLogger(__name__)

#: Pods remembered between their filter and bind calls.
REMEMBERED_PODS = 5_000
#: Pods whose bind this process counted, remembered so a retried bind is counted once.
COUNTED_PODS = 5_000


#: API answers that say a Binding was not stored: the request itself was refused.
REFUSALS = frozenset({400, 403, 404, 409, 422})


def _refused(err: Exception) -> bool:
    """Whether a failed Binding call certainly stored nothing."""
    return isinstance(err, ApiError) and err.status in REFUSALS


@dataclass(frozen=True, slots=True)
class SeenPod:
    """What filter learnt about a pod, for its bind."""

    resource_version: str
    request: GpuRequest
    priorities: dict[str, int]
    """Node priorities from the filter verdicts, for the prioritize call that follows."""


class PodMemory:
    """Bounded map pod UID -> what its last filter call saw (oldest forgotten first)."""

    def __init__(self, capacity: int = REMEMBERED_PODS) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[str, SeenPod] = OrderedDict()

    def remember(
        self, pod: dict[str, Any], request: GpuRequest, priorities: dict[str, int]
    ) -> None:
        meta = pod.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return
        self._seen[uid] = SeenPod(version, request, priorities)
        self._seen.move_to_end(uid)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)

    def peek(self, uid: str) -> SeenPod | None:
        return self._seen.get(uid)

    def take(self, uid: str) -> SeenPod | None:
        return self._seen.pop(uid, None)


class BindError(Exception):
    """A bind that cannot succeed now; ``reason`` is the machine code for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Binder:
    """Performs binds against the API server, coordinating through the cache."""

    api: AsyncApi
    cache: ClusterCache
    metrics: SchedulerMetrics
    memory: PodMemory = field(default_factory=PodMemory)
    pending: PendingPods = field(default_factory=PendingPods)
    """Unbound gpusched pods, from the API server: only those are bound without a GET."""
    counted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """UIDs of the pods whose placement this process counted (oldest forgotten first)."""

    async def close(self) -> None:
        """Close the API connections."""
        await self.api.close()

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error for kube-scheduler."""
        try:
            await self._bind(args)
        except BindError as err:
            self.metrics.bind_errors.labels(err.reason).inc()
            log.info(
                "bind %s/%s to %s refused: %s", args.pod_namespace, args.pod_name, args.node, err
            )
            return str(err)
        except ApiError as err:
            self.metrics.bind_errors.labels("ApiError").inc()
            log.warning("bind %s/%s failed: %s", args.pod_namespace, args.pod_name, err)
            return f"API error while binding: {err}"
        return ""

    async def _bind(self, args: ExtenderBindingArgs) -> None:
        seen = self.memory.take(args.pod_uid)
        if seen is None or args.pod_uid not in self.pending:
            # Not known from the watch of gpusched's pending pods: ask the API server whose pod
            # it is (whatever the request or an earlier filter call said about it).
            pod = await self._get_pod(args)
            scheduler = (pod.get("spec") or {}).get("schedulerName")
            if scheduler != keys.SCHEDULER_NAME:
                raise BindError(
                    "NotGpuschedPod",
                    f"pod has schedulerName {scheduler!r}, not {keys.SCHEDULER_NAME!r}: "
                    "gpusched binds only its own pods",
                )
            if self._already_bound(pod, args):
                # A retry of a bind that landed: counted here if the attempt that landed was
                # not (its Binding call failed on this side after the API server took it).
                annotations = pod["metadata"].get("annotations") or {}
                placed = annotations.get(keys.ANNOTATION_TOPOLOGY_CLASS)
                if placed:
                    self._count(args.pod_uid, placed)
                return
            try:
                seen = SeenPod(pod["metadata"]["resourceVersion"], gpu_request(pod), {})
            except RequestError as err:
                raise BindError("InvalidRequest", str(err)) from err

        assumption = self.cache.assumptions.get(args.pod_uid)
        if assumption is None or assumption.node != args.node or not self.cache.holds(assumption):
            self.cache.forget(args.pod_uid)
            assumption = self._choose(args, seen.request)
        elif assumption.tentative:
            # Filter reserved this set for this node; the bind makes it a bind's reservation.
            assumption.tentative = False
            assumption.created_at = self.cache.clock()
        try:
            await self._create_binding(args, assumption)
        except (ApiError, aiohttp.ClientError, TimeoutError) as err:
            if not await self._bound_anyway(args, assumption):
                if self.cache.assumptions.get(args.pod_uid) is assumption:
                    if _refused(err):
                        self.cache.forget(args.pod_uid)
                    else:
                        # The Binding may have been stored all the same (a server error or a
                        # lost connection says nothing of the write): the GPUs stay held until
                        # the watch shows the pod, or for the bound reservations' TTL.
                        self.cache.mark_bound(args.pod_uid)
                if isinstance(err, ApiError):
                    raise
                raise BindError("BindUnanswered", f"the binding got no answer: {err!r}") from err
        self.cache.mark_bound(args.pod_uid)
        self._count(args.pod_uid, assumption.topology_class)

    def _count(self, uid: str, topology_class: str) -> None:
        """One placement of the class, once per pod."""
        if uid in self.counted:
            return
        self.counted[uid] = None
        while len(self.counted) > COUNTED_PODS:
            self.counted.popitem(last=False)
        self.metrics.placements.labels(topology_class).inc()

    @staticmethod
    def _already_bound(pod: dict[str, Any], args: ExtenderBindingArgs) -> bool:
        """True for a retried bind that already happened; BindError if bound elsewhere."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return False
        annotations = pod["metadata"].get("annotations") or {}
        if node == args.node and keys.ANNOTATION_GPU_INDICES in annotations:
            return True
        raise BindError("AlreadyBound", f"pod is already bound to node {node}")

    def _choose(self, args: ExtenderBindingArgs, request: GpuRequest) -> Assumption:
        """The best set on the node now, reserved at once (no await in between)."""
        verdict = evaluate(self.cache.view(args.node, excluding_uid=args.pod_uid), request)
        if verdict.placement is None:
            raise BindError("NoLongerFits", f"node {args.node} no longer fits: {verdict.reason}")
        assumption = Assumption(
            uid=args.pod_uid,
            key=f"{args.pod_namespace}/{args.pod_name}",
            node=args.node,
            gpus=verdict.placement.gpus,
            topology_class=verdict.placement.topology_class.value,
        )
        self.cache.assume(assumption)
        return assumption

    async def _get_pod(self, args: ExtenderBindingArgs) -> dict[str, Any]:
        try:
            pod = await self.api.request(
                "GET", f"/api/v1/namespaces/{args.pod_namespace}/pods/{args.pod_name}"
            )
        except ApiError as err:
            if err.status == 404:
                raise BindError("PodGone", "pod no longer exists") from err
            raise
        if pod["metadata"].get("uid") != args.pod_uid:
            raise BindError("PodGone", "pod was deleted and recreated")
        return pod

    async def _create_binding(self, args: ExtenderBindingArgs, assumption: Assumption) -> None:
        prepared = self.cache.topologies.get(args.node)
        uuids = [prepared.topology.gpu(i).uuid or "" for i in assumption.gpus] if prepared else []
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": args.pod_name,
                "uid": args.pod_uid,  # precondition: the pod we were asked to bind
                "annotations": {
                    keys.ANNOTATION_GPUS: ",".join(uuids),
                    keys.ANNOTATION_GPU_INDICES: format_indices(assumption.gpus),
                    keys.ANNOTATION_TOPOLOGY_CLASS: assumption.topology_class,
                },
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        await self.api.request(
            "POST",
            f"/api/v1/namespaces/{args.pod_namespace}/pods/{args.pod_name}/binding",
            binding,
        )

    async def _bound_anyway(self, args: ExtenderBindingArgs, assumption: Assumption) -> bool:
        """After a failed Binding call: whether the pod is bound to the node all the same.

        Whatever the answer, if the pod turns out bound (here, or elsewhere by an earlier
        attempt kube-scheduler gave up on), the GPUs it really holds are reserved until the
        watch confirms them, so they are never handed out meanwhile.
        """
        try:
            pod = await self._get_pod(args)
        except (BindError, ApiError):
            return False
        annotations = pod["metadata"].get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        try:
            held = gpu_claim(pod, gpu_count(pod)).assigned
        except RequestError:
            return False
        if not node or held is None:
            return False
        actual = Assumption(
            uid=args.pod_uid,
            key=assumption.key,
            node=node,
            gpus=held,
            topology_class=annotations.get(
                keys.ANNOTATION_TOPOLOGY_CLASS, assumption.topology_class
            ),
        )
        self.cache.assume(actual)
        self.cache.mark_bound(args.pod_uid)
        return bool(node == args.node)
