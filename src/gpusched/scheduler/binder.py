"""Bind: choose the exact GPUs, write them on the pod, then bind it to the node.

Order matters for the guarantee that two pods never hold the same GPU:

1. choose the set from the cache and *assume* it before any await, so concurrent binds on the
   same node see each other's choices;
2. check the choice against the API server's current pods on the node, so a cache that lags (a
   restart, a slow watch) cannot hand out a GPU another pod holds;
3. annotate the pod (``gpusched.io/gpus``, ``gpusched.io/gpu-indices``) with a UID precondition,
   *then* create the Binding: a pod that has a node always already carries its GPUs, so the
   ownership rebuilt from annotations after a restart is complete;
4. on failure forget the assumption and remove the annotations (a pod without a node holds
   nothing either way), so a half-done bind leaves no GPU taken.

A retried bind of a pod already bound to the same node with its GPUs written is a success.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.api.extender import ExtenderBindingArgs
from gpusched.core.scheduling import RequestError, evaluate, gpu_request
from gpusched.metrics import SchedulerMetrics
from gpusched.scheduler.cache import TERMINAL_PHASES, Assumption, ClusterCache, parse_indices

log = logging.getLogger(__name__)

#: Attempts at choosing a set when the API server shows holders the cache did not know.
CHOOSE_ATTEMPTS = 3


class BindError(Exception):
    """A bind that cannot succeed now; ``reason`` is the machine code for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Binder:
    """Performs binds against the API server, coordinating through the cache."""

    api: client.ApiClient
    cache: ClusterCache
    metrics: SchedulerMetrics
    run_blocking: Callable[..., Any] = asyncio.to_thread

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)

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
        except ApiException as err:
            self.metrics.bind_errors.labels("ApiError").inc()
            log.warning("bind %s/%s failed: %s", args.pod_namespace, args.pod_name, err)
            return f"API error while binding: {err.status} {err.reason}"
        return ""

    async def _bind(self, args: ExtenderBindingArgs) -> None:
        pod = await self._get_pod(args)
        node = (pod.get("spec") or {}).get("nodeName")
        annotations = pod["metadata"].get("annotations") or {}
        if node:
            if node == args.node and keys.ANNOTATION_GPU_INDICES in annotations:
                return  # a retry of a bind that already happened
            raise BindError("AlreadyBound", f"pod is already bound to node {node}")
        try:
            request = gpu_request(pod)
        except RequestError as err:
            raise BindError("InvalidRequest", str(err)) from err

        assumption = self.cache.assumptions.get(args.pod_uid)
        if assumption is None or assumption.node != args.node:
            self.cache.forget(args.pod_uid)
            assumption = await self._choose(args, request)
        try:
            await self._write(args, assumption)
        except Exception:
            if not await self._bound_anyway(args):
                self.cache.forget(args.pod_uid)
                await self._unannotate(args)
                raise
        self.cache.mark_bound(args.pod_uid)
        self.metrics.placements.labels(assumption.topology_class).inc()

    async def _choose(self, args: ExtenderBindingArgs, request: Any) -> Assumption:
        key = f"{args.pod_namespace}/{args.pod_name}"
        for _ in range(CHOOSE_ATTEMPTS):
            verdict = evaluate(self.cache.view(args.node, excluding_uid=args.pod_uid), request)
            if verdict.placement is None:
                raise BindError(
                    "NoLongerFits", f"node {args.node} no longer fits: {verdict.reason}"
                )
            assumption = Assumption(
                uid=args.pod_uid,
                key=key,
                node=args.node,
                gpus=verdict.placement.gpus,
                topology_class=verdict.placement.topology_class.value,
            )
            # Reserved before the first await below: concurrent binds see it.
            self.cache.assume(assumption)
            holders = await self._holders_on_node(args)
            clash = {gpu: holder for gpu, holder in holders.items() if gpu in assumption.gpus}
            if not clash:
                return assumption
            self.cache.forget(args.pod_uid)
            log.warning("cache missed holders on %s: %s; choosing again", args.node, clash)
            for pod in holders.values():
                self.cache.apply_pod(pod)
        raise BindError("Conflict", f"GPUs on node {args.node} kept changing; retry")

    async def _get_pod(self, args: ExtenderBindingArgs) -> dict[str, Any]:
        try:
            response = await self.run_blocking(
                self.core.read_namespaced_pod,
                args.pod_name,
                args.pod_namespace,
                _preload_content=False,
            )
        except ApiException as err:
            if err.status == 404:
                raise BindError("PodGone", "pod no longer exists") from err
            raise
        pod: dict[str, Any] = json.loads(response.data)
        if pod["metadata"].get("uid") != args.pod_uid:
            raise BindError("PodGone", "pod was deleted and recreated")
        return pod

    async def _holders_on_node(self, args: ExtenderBindingArgs) -> dict[int, dict[str, Any]]:
        """GPU -> pod, for every other live pod on the node that carries an assignment."""
        response = await self.run_blocking(
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={args.node}",
            _preload_content=False,
        )
        holders: dict[int, dict[str, Any]] = {}
        for pod in json.loads(response.data).get("items") or []:
            meta = pod["metadata"]
            if meta.get("uid") == args.pod_uid:
                continue
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            indices = parse_indices(
                (meta.get("annotations") or {}).get(keys.ANNOTATION_GPU_INDICES)
            )
            for gpu in indices or ():
                holders[gpu] = pod
        return holders

    async def _write(self, args: ExtenderBindingArgs, assumption: Assumption) -> None:
        prepared = self.cache.topologies.get(args.node)
        uuids = [prepared.topology.gpu(i).uuid or "" for i in assumption.gpus] if prepared else []
        patch = {
            "metadata": {
                "uid": args.pod_uid,  # precondition: the pod we were asked to bind
                "annotations": {
                    keys.ANNOTATION_GPUS: ",".join(uuids),
                    keys.ANNOTATION_GPU_INDICES: ",".join(str(i) for i in assumption.gpus),
                    keys.ANNOTATION_TOPOLOGY_CLASS: assumption.topology_class,
                },
            }
        }
        await self.run_blocking(
            self.core.patch_namespaced_pod,
            args.pod_name,
            args.pod_namespace,
            patch,
            _preload_content=False,
        )
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=args.pod_name, uid=args.pod_uid),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=args.node),
        )
        await self.run_blocking(
            self.core.create_namespaced_pod_binding,
            args.pod_name,
            args.pod_namespace,
            binding,
            _preload_content=False,
        )

    async def _bound_anyway(self, args: ExtenderBindingArgs) -> bool:
        """Whether a bind whose call failed (e.g. timed out) took effect on the server."""
        try:
            pod = await self._get_pod(args)
        except (BindError, ApiException):
            return False
        annotations = pod["metadata"].get("annotations") or {}
        return (pod.get("spec") or {}).get("nodeName") == args.node and (
            keys.ANNOTATION_GPU_INDICES in annotations
        )

    async def _unannotate(self, args: ExtenderBindingArgs) -> None:
        patch = {
            "metadata": {
                "annotations": {
                    keys.ANNOTATION_GPUS: None,
                    keys.ANNOTATION_GPU_INDICES: None,
                    keys.ANNOTATION_TOPOLOGY_CLASS: None,
                }
            }
        }
        try:
            await self.run_blocking(
                self.core.patch_namespaced_pod,
                args.pod_name,
                args.pod_namespace,
                patch,
                _preload_content=False,
            )
        except ApiException as err:
            # Harmless: a pod without a node holds no GPU whatever its annotations say.
            log.info(
                "could not clear annotations of %s/%s: %s", args.pod_namespace, args.pod_name, err
            )
