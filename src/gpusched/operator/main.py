"""The operator process: kopf watches wake the admission loop; a metrics endpoint; optional
leader election for several replicas.

kopf provides the watches (with reconnects and back-off) and the process life cycle; every
handler only wakes the loop, which does all reading and writing itself (see
:mod:`gpusched.operator.controller`). kopf's own persistence is not used: no handler writes
progress annotations or finalizers onto GpuJobs, so the operator's only writes are the ones the
cycle decides.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from gpusched.api import keys
from gpusched.kube import api_client, load_configuration
from gpusched.metrics import OperatorMetrics
from gpusched.operator.api import OperatorApi
from gpusched.operator.controller import Controller, OperatorConfig
from gpusched.operator.leader import LeaderElector
from gpusched.operator.loop import AdmissionLoop

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How to run the operator process."""

    kubeconfig: Path | None = None
    config: OperatorConfig = field(default_factory=OperatorConfig)
    metrics_port: int = 8080
    """0: no metrics endpoint."""
    resync: float = 5.0
    leader_elect: bool = False
    lease_namespace: str = "gpusched-system"
    identity: str | None = None


def connection_info(kubeconfig: Path | None) -> kopf.ConnectionInfo:
    """kopf credentials from the same kubeconfig (or in-cluster account) the client uses."""
    cfg = load_configuration(kubeconfig)
    token = None
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth:
        token = str(auth).removeprefix("Bearer ").strip()
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def build_registry(
    loop: AdmissionLoop, options: RunOptions, api: OperatorApi
) -> kopf.OperatorRegistry:
    """kopf handlers: every relevant change wakes the admission loop."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True  # no CRD/namespace discovery: fewer permissions
        settings.posting.enabled = False  # the cycle records its own events
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(options.kubeconfig)

    @kopf.on.event(keys.GROUP, keys.VERSION, "gpujobs", registry=registry)
    def gpujob_changed(**kwargs: Any) -> None:
        body = kwargs["body"]
        if kwargs["event"].get("type") == "DELETED":
            # Owner references let the garbage collector remove the pods too; this is faster.
            meta = body.get("metadata") or {}
            uid = meta.get("uid")
            if uid:
                api.delete_job_pods(meta.get("namespace", ""), uid)
        loop.wake()

    @kopf.on.event(keys.GROUP, keys.VERSION, "tenantquotas", registry=registry)
    def quota_changed(**_: Any) -> None:
        loop.wake()

    @kopf.on.event(keys.GROUP, keys.VERSION, "nodegputopologies", registry=registry)
    def topology_changed(**_: Any) -> None:
        loop.wake()

    @kopf.on.event("v1", "pods", labels={keys.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry)
    def pod_changed(**_: Any) -> None:
        loop.wake()

    return registry


def run(options: RunOptions) -> None:
    """Run until SIGTERM / SIGINT."""
    kube = api_client(options.kubeconfig)
    metrics = OperatorMetrics()
    if options.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port, registry=metrics.registry)
        log.info("metrics on :%d/metrics", options.metrics_port)
    api = OperatorApi(kube)
    controller = Controller(api, options.config, metrics)
    leader = (
        LeaderElector(kube, options.lease_namespace, options.identity)
        if options.leader_elect
        else None
    )
    loop = AdmissionLoop(controller, resync=options.resync, leader=leader)
    registry = build_registry(loop, options, api)

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, stop.set)
        watcher = asyncio.create_task(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)
        )
        cycles = asyncio.create_task(loop.run(stop))
        done, _ = await asyncio.wait({watcher, cycles}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await asyncio.gather(watcher, cycles, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    try:
        asyncio.run(main())
    finally:
        controller.close()
        kube.close()  # type: ignore[no-untyped-call]  # ApiClient.close is untyped upstream
