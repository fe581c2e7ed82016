"""The operator process: watches feeding the store, the admission loop, leader election and a
metrics endpoint, on one event loop and one API client (:mod:`gpusched.kubeasync`).

Seven watches (GpuJobs, their pods, other GPU pods, nodes, NodeGpuTopologies, TenantQuotas,
PriorityClasses) list once and then follow changes; the loop decides over the store and writes
only what its decisions change. A GpuJob deleted has its pods deleted at once (the garbage
collector would, later).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.api import keys
from gpusched.kube import load_configuration
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.kubewatch import Reflector
from gpusched.metrics import OperatorMetrics
from gpusched.operator import api as paths
from gpusched.operator.api import OperatorApi
from gpusched.operator.decide import OperatorConfig
from gpusched.operator.leader import LeaderElector
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.runtimes import DEFAULT_NAME, RuntimeBook
from gpusched.operator.store import Store

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


class _Consumer:
    """A reflector's consumer made of three store methods."""

    def __init__(self, replace: Any, upsert: Any, delete: Any) -> None:
        self.replace, self.upsert, self.delete = replace, upsert, delete


def kind_not_installed(watch: str, err: BaseException) -> bool:
    """Whether ``err`` says the NetworkTopology CRD is not installed (a chart upgrade adds no
    CRD): the cluster then has no levels and admission goes on without them."""
    return watch == "networktopologies" and isinstance(err, ApiError) and err.status == 404


def reflectors(api: AsyncApi, store: Store, metrics: OperatorMetrics) -> list[Reflector]:
    """The watches that feed the store."""

    def failed(kind: str, err: BaseException) -> None:
        metrics.api_errors.labels(f"watch-{kind}").inc()
        if kind_not_installed(kind, err):
            # The watch keeps trying and finds the levels once the CRD is installed.
            store.replace_network([])

    def watch(name: str, path: str, consumer: _Consumer, **params: str) -> Reflector:
        return Reflector(name, api, path, consumer, params=params, on_error=failed)

    return [
        watch(
            "gpujobs",
            paths.GPUJOBS,
            _Consumer(store.replace_jobs, store.upsert_job, store.delete_job),
        ),
        watch(
            "jobpods",
            paths.PODS,
            _Consumer(store.replace_job_pods, store.upsert_job_pod, store.delete_job_pod),
            labelSelector=keys.LABEL_JOB_NAME,
        ),
        watch(
            "gpupods",
            paths.PODS,
            _Consumer(store.replace_gpu_pods, store.upsert_gpu_pod, store.delete_gpu_pod),
            labelSelector=f"!{keys.LABEL_JOB_NAME}",
            fieldSelector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        ),
        watch(
            "nodes",
            paths.NODES,
            _Consumer(store.replace_nodes, store.upsert_node, store.delete_node),
        ),
        watch(
            "nodegputopologies",
            paths.TOPOLOGIES,
            _Consumer(store.replace_topologies, store.upsert_topology, store.delete_topology),
        ),
        watch(
            "tenantquotas",
            paths.TENANTQUOTAS,
            _Consumer(store.replace_quotas, store.upsert_quota, store.delete_quota),
        ),
        watch(
            "networktopologies",
            paths.NETWORKTOPOLOGIES,
            _Consumer(store.replace_network, store.upsert_network, store.delete_network),
        ),
        watch(
            "priorities",
            paths.PRIORITY_CLASSES,
            _Consumer(store.replace_priorities, store.upsert_priority, store.delete_priority),
        ),
    ]


async def serve(options: RunOptions, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set."""
    metrics = OperatorMetrics()
    if options.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port, registry=metrics.registry)
        log.info("metrics on :%d/metrics", options.metrics_port)
    client = AsyncApi(
        load_configuration(options.kubeconfig),
        on_request=metrics.count_request,
    )
    api = OperatorApi(client)
    leader = (
        LeaderElector(client, options.lease_namespace, options.identity)
        if options.leader_elect
        else None
    )
    store = Store()
    runtimes = RuntimeBook(client, options.lease_namespace, options.runtime_history)
    loop = AdmissionLoop(
        api,
        store,
        options.config,
        metrics,
        leader=leader,
        runtimes=runtimes,
        resync=options.resync,
    )
    tasks: set[asyncio.Task[Any]] = set()

    def job_deleted(job: Any) -> None:
        if loop.leading():
            task = asyncio.create_task(api.delete_job_pods(job.namespace, job.uid))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    store.on_job_deleted = job_deleted
    watches = [r.start() for r in reflectors(client, store, metrics)]
    background = list(watches)
    if leader is not None:
        background.append(asyncio.create_task(leader.run(), name="lease"))
    try:
        await loop.run(stop)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, *tasks, return_exceptions=True)
        await client.close()


def run(options: RunOptions) -> None:
    """Run until SIGTERM / SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, stop.set)
        await serve(options, stop)

    asyncio.run(main())
