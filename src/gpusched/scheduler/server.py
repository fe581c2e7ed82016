"""The extender's HTTP service (aiohttp): filter, prioritize, bind, health and metrics.

kube-scheduler calls ``POST <urlPrefix>/<verb>`` for pods that request ``nvidia.com/gpu``.
Handlers parse the wire types, build a snapshot from the cache and call the pure decision
functions of ``gpusched.core.scheduling``. A malformed request is answered 400 with the reason;
an unexpected error 500 with its message; neither takes the process down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpusched.api import keys
from gpusched.api.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    WireError,
)
from gpusched.core.placement import RefusalReason
from gpusched.core.scheduling import (
    FilterOutcome,
    RequestError,
    filter_nodes,
    gpu_request,
    priorities,
    prioritize,
)
from gpusched.kubeasync import AsyncApi
from gpusched.kubewatch import Reflector
from gpusched.metrics import SchedulerMetrics, set_labelled_series
from gpusched.scheduler.binder import Binder
from gpusched.scheduler.cache import Assumption, ClusterCache, free_by_model, settle_heap
from gpusched.scheduler.pending import FIELD_SELECTOR, PendingPods

log = logging.getLogger(__name__)

#: Nodes in the largest cluster Kubernetes supports (its documented limit); a request naming
#: more is refused.
DEFAULT_MAX_NODES = 5_000
#: Largest pod kube-scheduler can send: the API server stores no object above etcd's default
#: request limit of 1.5 MiB.
MAX_POD_BYTES = 1536 * 1024
#: Largest node name (a DNS subdomain, 253 characters) with its quotes and comma.
MAX_NODE_NAME_BYTES = 256


def max_body_bytes(max_nodes: int) -> int:
    """The largest request kube-scheduler sends (``nodeCacheCapable``: the pod and node names)
    for a cluster of ``max_nodes``, with room for the envelope. Bigger bodies are refused (413)
    before they are read whole, so one request cannot hold the event loop or the memory."""
    return MAX_POD_BYTES + max_nodes * MAX_NODE_NAME_BYTES + 64 * 1024


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def export_inventory(cache: ClusterCache, metrics: SchedulerMetrics) -> None:
    """The free-GPU and per-node gauges, from one reading of the cache (every housekeeping
    tick, on the event loop: so it only reads; the series are built at scrape time)."""
    rows = cache.inventory()
    # A model whose last node left the cache goes, rather than showing its last count forever.
    free: dict[tuple[str, ...], float] = {
        (model,): count for model, count in free_by_model(rows).items()
    }
    set_labelled_series(metrics.free_gpus, free)
    metrics.node_inventory.publish(rows)


async def _json_body(request: web.Request) -> object:
    """The request's JSON body; ValueError (400) when it is not JSON or nested deeper than any
    extender request is (the decoder would otherwise fail with a RecursionError: a 500)."""
    text = await request.text()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("request body nested too deeply") from None


class Extender:
    """Cache, watches, binder and HTTP routes of one extender process."""

    def __init__(
        self,
        api: AsyncApi,
        metrics: SchedulerMetrics | None = None,
        *,
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> None:
        self.api = api
        self.cache = ClusterCache()
        self.metrics = metrics or SchedulerMetrics()
        self.pending = PendingPods()
        self.binder = Binder(api, self.cache, self.metrics, pending=self.pending)
        self.max_nodes = max_nodes
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------

    def start_watches(self) -> None:
        """List and watch NodeGpuTopology objects, bound pods, nodes and the network levels
        (tasks of the running loop, which is where the cache lives)."""
        cache = self.cache
        topologies = Reflector(
            "nodegputopologies",
            self.api,
            f"/apis/{keys.GROUP}/{keys.VERSION}/nodegputopologies",
            _Consumer(
                cache.replace_topologies,
                cache.apply_topology,
                lambda obj: cache.delete_topology(obj["metadata"]["name"]),
            ),
        )
        pods = Reflector(
            "pods",
            self.api,
            "/api/v1/pods",
            _Consumer(cache.replace_pods, cache.apply_pod, cache.delete_pod),
            params={"fieldSelector": "spec.nodeName!="},
            on_list=cache.listing_pods,
        )
        pending = Reflector(
            "pending-pods",
            self.api,
            "/api/v1/pods",
            self.pending,
            params={"fieldSelector": FIELD_SELECTOR},
        )
        # The network levels and the nodes' labels only order nodes ranked equal (the fullest
        # clique, rack or leaf first); scheduling does not wait for them, and a cluster without
        # the NetworkTopology CRD (an upgrade that did not add CRDs) has no levels while the
        # watch retries.
        nodes = Reflector(
            "nodes",
            self.api,
            "/api/v1/nodes",
            _Consumer(cache.replace_nodes, cache.apply_node, cache.delete_node),
            metadata_only=True,  # labels are all it reads; a node's status is most of it
        )
        levels = Reflector(
            "networktopologies",
            self.api,
            f"/apis/{keys.GROUP}/{keys.VERSION}/networktopologies",
            _Consumer(cache.replace_levels, cache.apply_levels, cache.delete_levels),
            max_backoff_seconds=300.0,
        )
        self._tasks.extend(
            [topologies.start(), pods.start(), pending.start(), nodes.start(), levels.start()]
        )

    async def _housekeeping(self) -> None:
        while not self.cache.ready:
            await asyncio.sleep(0.2)
        settle_heap()
        while True:
            await asyncio.sleep(5)
            self.cache.expire()
            export_inventory(self.cache, self.metrics)
            settle_heap()

    async def on_startup(self, app: web.Application) -> None:
        self.start_watches()
        self._tasks.append(asyncio.create_task(self._housekeeping()))

    async def on_cleanup(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.binder.close()

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(
            middlewares=[self._errors], client_max_size=max_body_bytes(self.max_nodes)
        )
        app.router.add_post("/filter", self._timed("filter", self.filter))
        app.router.add_post("/prioritize", self._timed("prioritize", self.prioritize))
        app.router.add_post("/bind", self._timed("bind", self.bind))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.on_startup.append(self.on_startup)
        app.on_cleanup.append(self.on_cleanup)
        return app

    def observability_app(self) -> web.Application:
        """Only health and metrics, for a listener outside the pod's loopback."""
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_endpoint)
        return app

    # --- plumbing ------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except ValueError as err:
            return web.json_response({"Error": f"malformed request: {err}"}, status=400)
        except Exception as err:
            log.exception("internal error on %s", request.path)
            return web.json_response({"Error": f"internal error: {err}"}, status=500)

    def _timed(self, verb: str, handler: Handler) -> Handler:
        histogram = self.metrics.request_seconds.labels(verb)

        async def timed(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            try:
                return await handler(request)
            finally:
                histogram.observe(time.perf_counter() - started)

        return timed

    def _require_ready(self) -> None:
        if not self.cache.ready:
            raise web.HTTPServiceUnavailable(
                text='{"Error": "gpusched extender cache is still syncing"}',
                content_type="application/json",
            )

    async def _args(self, request: web.Request) -> ExtenderArgs:
        """The validated arguments of filter or prioritize; WireError (400) names what is
        wrong, including more nodes than the largest supported cluster has."""
        args = ExtenderArgs.from_wire(await _json_body(request))
        count = len(args.candidate_names())
        if count > self.max_nodes:
            raise WireError(
                f"NodeNames: {count} nodes, more than the {self.max_nodes} this extender "
                "accepts (--max-nodes)"
            )
        return args

    # --- verbs ---------------------------------------------------------------------------

    async def filter(self, request: web.Request) -> web.Response:
        """The node ranked first for the pod's GPU set, or a reason for every node."""
        self._require_ready()
        args = await self._args(request)
        names = args.candidate_names()
        try:
            gpu = gpu_request(args.pod)
        except RequestError as err:
            refused = dict.fromkeys(names, f"{RefusalReason.INVALID_REQUEST.value}: {err}")
            # Counted like any other refusal: the refused-nodes panel shows a broken template.
            self.metrics.refused_nodes.labels(RefusalReason.INVALID_REQUEST.value).inc(len(names))
            result = ExtenderFilterResult(failed_and_unresolvable_nodes=refused)
            return web.json_response(result.to_wire())
        meta = args.pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid:
            # A pod filtered again gave up its earlier reservation.
            self.cache.forget_tentative(uid)
        # What is left is a bind of this pod whose outcome is not known: it must not count
        # against the pod itself (a bind that landed after all keeps the same GPUs).
        own = uid if uid in self.cache.assumptions else ""
        outcome = filter_nodes(self.cache.views(names, excluding_uid=own), gpu)
        self.binder.memory.remember(args.pod, gpu, priorities(outcome.verdicts))
        if len(outcome.fits) == 1 and uid in self.pending:
            self._reserve(outcome, uid, meta)
        for reason in (*outcome.failed.values(), *outcome.unresolvable.values()):
            self.metrics.refused_nodes.labels(reason.split(":", 1)[0]).inc()
        if outcome.fits:
            return web.json_response(ExtenderFilterResult(node_names=list(outcome.fits)).to_wire())
        result = ExtenderFilterResult(
            failed_nodes=outcome.failed,
            failed_and_unresolvable_nodes=outcome.unresolvable,
        )
        return web.json_response(result.to_wire())

    def _reserve(self, outcome: FilterOutcome, uid: str, meta: dict[str, Any]) -> None:
        """Hold the set filter chose until the pod's bind, so the next pod's filter (which
        kube-scheduler may send before this bind) sees it taken. Only for pods the API server
        lists as gpusched's and unbound: a request alone reserves nothing."""
        (node,) = outcome.fits
        placement = outcome.verdicts[node].placement
        if placement is None:
            return
        self.cache.assume(
            Assumption(
                uid=uid,
                key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                node=node,
                gpus=placement.gpus,
                topology_class=placement.topology_class.value,
                tentative=True,
            )
        )

    async def prioritize(self, request: web.Request) -> web.Response:
        """A 0..10 score per node: how well the best GPU set there is wired."""
        self._require_ready()
        args = await self._args(request)
        names = args.candidate_names()
        uid = (args.pod.get("metadata") or {}).get("uid", "")
        seen = self.binder.memory.peek(uid) if uid else None
        if seen is not None and all(name in seen.priorities for name in names):
            # Filter just decided these nodes for this pod; kube-scheduler asks again.
            scores = seen.priorities
        else:
            try:
                gpu = gpu_request(args.pod)
            except RequestError:
                scores = {}
            else:
                scores = prioritize(self.cache.views(names), gpu)
        return web.json_response([{"Host": name, "Score": scores.get(name, 0)} for name in names])

    async def bind(self, request: web.Request) -> web.Response:
        """Choose the GPUs, write them on the pod, bind it."""
        self._require_ready()
        args = ExtenderBindingArgs.from_wire(await _json_body(request))
        error = await self.binder.bind(args)
        return web.json_response(ExtenderBindingResult(error=error).to_wire())

    async def healthz(self, request: web.Request) -> web.Response:
        """Liveness: the process serves requests."""
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: the cache holds the initial lists."""
        if not self.cache.ready:
            return web.Response(status=503, text="cache syncing")
        return web.Response(text="ok")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        """Prometheus exposition."""
        # In a thread: on a large cluster the exposition is thousands of series, and the event
        # loop keeps answering filter calls meanwhile.
        body = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class _Consumer:
    """A reflector's consumer made of three cache methods."""

    def __init__(
        self,
        replace: Callable[[list[dict[str, Any]]], None],
        upsert: Callable[[dict[str, Any]], None],
        delete: Callable[[dict[str, Any]], None],
    ) -> None:
        self.replace, self.upsert, self.delete = replace, upsert, delete
