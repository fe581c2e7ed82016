"""The operator process, a kopf operator: kopf hosts it (start-up, cleanup, liveness probe,
validating webhook) and watches six kinds into the store; the admission loop, the Lease, the
pod watches and ``explain``'s answers are tasks it starts, and every write goes through
:mod:`gpusched.kubeasync`.

kopf runs standalone (no KopfPeering: the Lease elects one leader and keeps the standbys' stores
warm) and writes nothing on anyone's objects: only ``@kopf.on.event``, ``on.validate`` and
operator-level handlers are registered, so kopf keeps no progress, diff-base or finalizer.
``docs/architecture.md`` says what kopf does here, what it does not, and the measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client

from gpusched.core.lifecycle import JobFacts
from gpusched.kube import load_configuration
from gpusched.kubeasync import AsyncApi
from gpusched.metrics import OperatorMetrics
from gpusched.operator.answers import AnswerServer
from gpusched.operator.api import OperatorApi
from gpusched.operator.decide import OperatorConfig
from gpusched.operator.feeds import KindFeed
from gpusched.operator.leader import LeaderElector
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.runtimes import DEFAULT_NAME, RuntimeBook
from gpusched.operator.store import Store
from gpusched.operator.watches import WATCHED, feeds, reflectors
from gpusched.operator.webhooks import Validator, register

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How to run the operator process."""

    kubeconfig: Path | None = None
    config: OperatorConfig = field(default_factory=OperatorConfig)
    metrics_port: int = 8080
    """0: no metrics endpoint."""
    resync: float = 30.0
    leader_elect: bool = False
    lease_namespace: str = "gpusched-system"
    """Namespace of the leader Lease and of the run-time history ConfigMap."""
    identity: str | None = None
    runtime_history: str | None = DEFAULT_NAME
    """ConfigMap keeping finished jobs' run times across restarts (None: kept in memory)."""
    health_port: int = 8081
    """kopf's liveness endpoint (``/healthz``); 0: none."""
    webhook_port: int = 0
    """The validating webhook's HTTPS port; 0: no webhook."""
    webhook_cert_dir: Path | None = None
    """Directory with the webhook's ``tls.crt`` and ``tls.key`` (reloaded when they change)."""
    stuck_after: float = 120.0
    """Seconds without the admission loop coming round before liveness fails."""
    explain_port: int = 8082
    """Port of ``gpusched explain``'s answers (:mod:`gpusched.operator.answers`); 0: none."""


def connection_info(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the ``kubernetes`` configuration the rest of the operator uses
    (``--kubeconfig``, ``$KUBECONFIG``, the pod's service account), read afresh on each login so
    a rotated service-account token is picked up when kopf logs in again after a 401."""
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook(configuration)
    header = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _, token = header.rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, for an operator without change-detection handlers: none.

    kopf builds every object's "essence" (a deep copy of the body without its status) and
    fetches the last one on every event, to compute a diff that only ``on.create/update/field``
    handlers and daemons use. None is registered here (only event, validating and
    operator-level handlers), so building it is waste: about 6 % of the operator's CPU while
    500 jobs are admitted. Registering a change handler would need kopf's default storage back.
    """

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> None:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


class Host:
    """The operator's parts, and the kopf handlers that start, feed, probe and stop them."""

    def __init__(self, options: RunOptions, metrics: OperatorMetrics) -> None:
        self.options = options
        self.metrics = metrics
        self.client = AsyncApi(
            load_configuration(options.kubeconfig), on_request=metrics.count_request
        )
        self.api = OperatorApi(self.client)
        self.leader = (
            LeaderElector(self.client, options.lease_namespace, options.identity)
            if options.leader_elect
            else None
        )
        self.store = Store(on_job_deleted=self._job_deleted)
        self.loop = AdmissionLoop(
            self.api,
            self.store,
            options.config,
            metrics,
            leader=self.leader,
            runtimes=RuntimeBook(self.client, options.lease_namespace, options.runtime_history),
            resync=options.resync,
        )
        self.answers = (
            AnswerServer(self.loop, metrics, options.explain_port, leader=self.leader)
            if options.explain_port
            else None
        )
        self.feeds = {feed.name: feed for feed in feeds(self.store, metrics)}
        self.halt = asyncio.Event()
        """Stops the admission loop (kopf's cleanup sets it)."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop_task: asyncio.Task[None] | None = None
        self.registry = kopf.OperatorRegistry()
        self._register()

    def settings(self) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        settings.posting.enabled = False  # events go through OperatorApi, inside the plan
        # CRDs are scanned so that a NetworkTopology CRD installed later is watched then.
        settings.scanning.disabled = False
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 5
        settings.watching.chunk_size = 2000  # a paged list, as kubewatch's
        settings.queueing.worker_limit = None  # a limit deadlocks kopf's index barrier (#1243)
        settings.persistence.diffbase_storage = NoDiffBase()
        if self.options.webhook_port:
            certs = self.options.webhook_cert_dir or Path(".")
            settings.admission.server = kopf.WebhookServer(
                addr="0.0.0.0",
                port=self.options.webhook_port,
                certfile=certs / "tls.crt",
                pkeyfile=certs / "tls.key",
            )
        return settings

    def _register(self) -> None:
        registry = self.registry
        kopf.on.login(registry=registry)(self._login)
        kopf.on.startup(registry=registry)(self._startup)
        kopf.on.cleanup(registry=registry)(self._cleanup)
        # No retries: a failing probe must answer 500 now, not after kopf's backoff.
        kopf.on.probe(id="admission", errors=kopf.ErrorsMode.PERMANENT, registry=registry)(
            self._probe
        )
        for watched in WATCHED:
            if watched.resource is not None:
                handler = _feeding(self.feeds[watched.name])
                kopf.on.event(*watched.resource, id=f"feed-{watched.name}", registry=registry)(
                    handler
                )
        if self.options.webhook_port:
            register(registry, Validator(self.store, self.client, self.metrics))

    # --- kopf's operator-level handlers --------------------------------------------------

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return connection_info(load_configuration(self.options.kubeconfig))

    async def _startup(self, **_: Any) -> None:
        """Before kopf's watches start: LIST the kopf-fed kinds into the store (kopf says
        neither when a kind is listed nor what a list dropped), then start the pod watches,
        the Lease and the admission loop."""
        await asyncio.gather(*(feed.anchor(self.client) for feed in self.feeds.values()))
        for reflector in reflectors(self.client, self.store, self.metrics):
            self._spawn(reflector.run(), f"watch-{reflector.name}")
        if self.leader is not None:
            self._spawn(self.leader.run(), "lease")
        self.loop_task = asyncio.create_task(self.loop.run(self.halt), name="admission")
        if self.answers is not None:
            await self.answers.start()
        for feed in self.feeds.values():
            feed.start_reconcile()

    async def _cleanup(self, **_: Any) -> None:
        """Let the admission loop finish its cycle and its writes, then stop the rest."""
        self.halt.set()
        if self.answers is not None:
            await self.answers.stop()
        if self.loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self.loop_task, timeout=30)
        for feed in self.feeds.values():
            feed.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _probe(self, **_: Any) -> Mapping[str, Any]:
        """On the event loop (async), so a blocked loop cannot answer at all."""
        return self.loop.health(self.options.stuck_after)

    # --- the rest ------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _job_deleted(self, job: JobFacts) -> None:
        """A GpuJob deleted has its pods deleted at once (the garbage collector would, later)."""
        if self.loop.leading():
            self._spawn(self.api.delete_job_pods(job.namespace, job.uid), "delete-pods")

    async def close(self) -> None:
        await self.client.close()


def _feeding(feed: KindFeed) -> Callable[..., Awaitable[None]]:
    """A kopf event handler handing its kind's events to ``feed``."""

    async def on_event(event: Mapping[str, Any], **_: Any) -> None:
        feed.take(event)

    on_event.__name__ = f"feed_{feed.name}"
    return on_event


async def serve(options: RunOptions, stop: asyncio.Event) -> None:
    """Run under kopf until ``stop`` is set (or kopf is signalled)."""
    metrics = OperatorMetrics()
    if options.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port, registry=metrics.registry)
        log.info("metrics on :%d/metrics", options.metrics_port)
    host = Host(options, metrics)
    try:
        await kopf.operator(
            registry=host.registry,
            settings=host.settings(),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=(
                f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None
            ),
            stop_flag=stop,
        )
    finally:
        await host.close()


def run(options: RunOptions) -> None:
    """Run until SIGTERM / SIGINT (kopf handles both)."""
    asyncio.run(serve(options, asyncio.Event()))
