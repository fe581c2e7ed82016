"""``gpusched scheduler``: the kube-scheduler extender and its kube-scheduler configuration."""

from __future__ import annotations

import click
import yaml

from gpusched.commands.logs import configure_logging


@click.group()
def scheduler() -> None:
    """The topology-aware kube-scheduler extender."""


@scheduler.command()
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    default=None,
    help="Kubeconfig; default: in-cluster service account, else ~/.kube/config.",
)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Listen address (the extender sits beside kube-scheduler in one pod).",
)
@click.option("--port", default=8888, show_default=True, help="Listen port.")
@click.option(
    "--metrics-address",
    default="0.0.0.0",
    show_default=True,
    help="Listen address of the observability port.",
)
@click.option(
    "--metrics-port",
    default=0,
    show_default=True,
    help="A second port serving only /metrics, /healthz and /readyz (0: none), so Prometheus "
    "and the kubelet reach them while the verbs stay on loopback.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--max-nodes",
    default=5000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most nodes one request may name (the largest cluster served); bounds the request size.",
)
def serve(
    *,
    kubeconfig: str | None,
    address: str,
    port: int,
    metrics_address: str,
    metrics_port: int,
    log_level: str,
    max_nodes: int,
) -> None:
    """Serve filter / prioritize / bind, /healthz, /readyz and /metrics."""
    from aiohttp import web

    from gpusched.kube import load_configuration
    from gpusched.kubeasync import AsyncApi
    from gpusched.scheduler.server import Extender

    configure_logging(log_level)
    extender = Extender(AsyncApi(load_configuration(kubeconfig)), max_nodes=max_nodes)
    app = extender.app()
    if metrics_port:
        observability = web.AppRunner(extender.observability_app(), access_log=None)

        async def start_observability(_app: web.Application) -> None:
            await observability.setup()
            await web.TCPSite(observability, metrics_address, metrics_port).start()

        async def stop_observability(_app: web.Application) -> None:
            await observability.cleanup()

        app.on_startup.append(start_observability)
        app.on_cleanup.append(stop_observability)
    web.run_app(app, host=address, port=port, access_log=None, print=None)


@scheduler.command()
@click.option("--extender-url", default="http://127.0.0.1:8888", show_default=True)
@click.option("--kubeconfig", default=None, help="Kubeconfig path for kube-scheduler.")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True)
def config(extender_url: str, kubeconfig: str | None, leader_elect: bool) -> None:
    """Print the KubeSchedulerConfiguration serving the gpusched profile."""
    from gpusched.scheduler.config import kube_scheduler_config

    click.echo(
        yaml.safe_dump(
            kube_scheduler_config(extender_url, kubeconfig=kubeconfig, leader_elect=leader_elect),
            sort_keys=False,
        ),
        nl=False,
    )
