"""The extender's HTTP service (aiohttp): filter, prioritize, bind, health and metrics.

kube-scheduler calls ``POST <urlPrefix>/<verb>`` for pods that request ``nvidia.com/gpu``.
Handlers parse the wire types, build a snapshot from the cache and call the pure decision
functions of ``gpusched.core.scheduling``. A malformed request is answered 400 with the reason;
an unexpected error 500 with its message; neither takes the process down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
)
from gpusched.core.scheduling import (
    RequestError,
    filter_nodes,
    gpu_request,
    priorities,
    prioritize,
)
from gpusched.kubeasync import AsyncApi
from gpusched.kubewatch import Reflector
from gpusched.metrics import SchedulerMetrics
from gpusched.scheduler.binder import Binder
from gpusched.scheduler.cache import ClusterCache, settle_heap

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Extender:
    """Cache, watches, binder and HTTP routes of one extender process."""

    def __init__(self, api: AsyncApi, metrics: SchedulerMetrics | None = None) -> None:
        self.api = api
        self.cache = ClusterCache()
        self.metrics = metrics or SchedulerMetrics()
        self.binder = Binder(api, self.cache, self.metrics)
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------

    def start_watches(self) -> None:
        """List and watch NodeGpuTopology objects and bound pods (tasks of the running loop,
        which is where the cache lives)."""
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
        )
        self._tasks.extend([topologies.start(), pods.start()])

    async def _housekeeping(self) -> None:
        while not self.cache.ready:
            await asyncio.sleep(0.2)
        settle_heap()
        while True:
            await asyncio.sleep(5)
            self.cache.expire()
            for model, free in self.cache.free_by_model().items():
                self.metrics.free_gpus.labels(model).set(free)
            self._export_inventory()

    def _export_inventory(self) -> None:
        """Per-node GPU gauges, rebuilt whole (no await in between: a scrape never sees them
        half done) so deleted nodes disappear."""
        gpus, largest = self.metrics.node_gpus, self.metrics.largest_free_nvlink_set
        gpus.clear()
        largest.clear()
        for row in self.cache.inventory():
            for state, count in (
                ("allocated", row.allocated),
                ("free", row.free),
                ("unavailable", row.unavailable),
            ):
                gpus.labels(row.node, row.model, state).set(count)
            largest.labels(row.node).set(row.largest_free_nvlink_set)

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
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
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
        except ValidationError as err:
            return web.json_response(
                {"Error": f"malformed request: {_first_error(err)}"}, status=400
            )
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

    # --- verbs ---------------------------------------------------------------------------

    async def filter(self, request: web.Request) -> web.Response:
        """Nodes that can host the pod's GPU set, with a reason for every other node."""
        self._require_ready()
        args = ExtenderArgs.model_validate(await request.json())
        names = args.candidate_names()
        try:
            gpu = gpu_request(args.pod)
        except RequestError as err:
            refused = dict.fromkeys(names, f"InvalidRequest: {err}")
            result = ExtenderFilterResult(failed_and_unresolvable_nodes=refused)
            return web.json_response(result.to_wire())
        outcome = filter_nodes(self.cache.views(names), gpu)
        # Prioritize is asked only about the nodes that pass filter.
        fitting = {name: outcome.verdicts[name] for name in outcome.fits}
        self.binder.memory.remember(args.pod, gpu, priorities(fitting))
        for reason in (*outcome.failed.values(), *outcome.unresolvable.values()):
            self.metrics.refused_nodes.labels(reason.split(":", 1)[0]).inc()
        if outcome.fits:
            # kube-scheduler reads per-node reasons only to explain an unschedulable pod and
            # to skip hopeless nodes in preemption; a pod that fits somewhere needs neither,
            # and leaving them out keeps the answer small on large clusters.
            return web.json_response(ExtenderFilterResult(node_names=list(outcome.fits)).to_wire())
        result = ExtenderFilterResult(
            failed_nodes=outcome.failed,
            failed_and_unresolvable_nodes=outcome.unresolvable,
        )
        return web.json_response(result.to_wire())

    async def prioritize(self, request: web.Request) -> web.Response:
        """A 0..10 score per node: how well the best GPU set there is wired."""
        self._require_ready()
        args = ExtenderArgs.model_validate(await request.json())
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
        args = ExtenderBindingArgs.model_validate(await request.json())
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
        body = generate_latest(self.metrics.registry)
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


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"
