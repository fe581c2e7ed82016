"""``gpusched device-plugin``: the node agent, gpusched's kubelet device plugin.

Runs beside the device probe on every GPU node (its own container in the probe's DaemonSet). It
advertises one ``nvidia.com/gpu`` device per GPU UUID with the probe's health judgement, answers
the kubelet's GetPreferredAllocation with the pod's annotated GPUs, refuses in Allocate any set
that is not the admitted pod's ``gpusched.io/gpus``, and checks the kubelet's PodResources against
the annotations. See docs/node-agent.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import click

from gpusched.api import keys
from gpusched.commands.logs import configure_logging
from gpusched.commands.params import POSITIVE_DURATION
from gpusched.node_agent.config import DEFAULT_DEVICE_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET

DEFAULT_METRICS_PORT = 9403


@click.command("device-plugin")
@click.option(
    "--node", envvar="NODE_NAME", required=True, help="This node ($NODE_NAME from spec.nodeName)."
)
@click.option(
    "--kubeconfig", type=click.Path(dir_okay=False), help="Default: $KUBECONFIG or in-cluster."
)
@click.option("--resource", default=keys.GPU_RESOURCE, show_default=True, help="Resource name.")
@click.option(
    "--device-plugin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DEVICE_PLUGIN_DIR,
    show_default=True,
    help="The kubelet's device-plugin directory (its kubelet.sock is there).",
)
@click.option("--socket-name", default="gpusched.sock", show_default=True)
@click.option(
    "--pod-resources-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_POD_RESOURCES_SOCKET,
    show_default=True,
)
@click.option(
    "--cdi-kind",
    default="nvidia.com/gpu",
    show_default=True,
    help="CDI devices handed out are KIND=<UUID>; empty: none.",
)
@click.option(
    "--visible-devices-env",
    default="NVIDIA_VISIBLE_DEVICES",
    show_default=True,
    help="Variable set to the GPU UUIDs; empty: none.",
)
@click.option(
    "--conflicting-sockets",
    default="nvidia-*.sock",
    show_default=True,
    help="Comma-separated globs of other plugins' sockets; while one is live, no registration.",
)
@click.option(
    "--drift-interval",
    type=POSITIVE_DURATION,
    default="30s",
    show_default=True,
    help="Time between checks (30s, 1m, or seconds).",
)
@click.option(
    "--metrics-port", default=DEFAULT_METRICS_PORT, show_default=True, help="0: no metrics."
)
@click.option("--metrics-address", default="0.0.0.0", show_default=True)
@click.option("--log-level", default="info", show_default=True)
def device_plugin(  # noqa: PLR0917 - one parameter per click option
    node: str,
    kubeconfig: str | None,
    resource: str,
    device_plugin_dir: Path,
    socket_name: str,
    pod_resources_socket: Path,
    cdi_kind: str,
    visible_devices_env: str,
    conflicting_sockets: str,
    drift_interval: float,
    metrics_port: int,
    metrics_address: str,
    log_level: str,
) -> None:
    """Serve gpusched's kubelet device plugin on this node."""
    configure_logging(log_level)
    try:
        from gpusched.kube import load_configuration
        from gpusched.kubeasync import AsyncApi
        from gpusched.metrics import NodeAgentMetrics
        from gpusched.node_agent.agent import NodeAgent
        from gpusched.node_agent.config import AgentConfig
    except ImportError as err:
        raise click.ClickException(
            f"the device plugin needs its extra: pip install 'gpusched[node-agent]' ({err})"
        ) from err
    if not cdi_kind and not visible_devices_env:
        raise click.UsageError("--cdi-kind and --visible-devices-env cannot both be empty")
    config = AgentConfig(
        node_name=node,
        resource=resource,
        device_plugin_dir=device_plugin_dir,
        socket_name=socket_name,
        pod_resources_socket=pod_resources_socket,
        cdi_kind=cdi_kind or None,
        visible_devices_env=visible_devices_env or None,
        conflicting_sockets=tuple(p.strip() for p in conflicting_sockets.split(",") if p.strip()),
        drift_interval=drift_interval,
    )
    metrics = NodeAgentMetrics()
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, metrics_address, registry=metrics.registry)
    agent = NodeAgent(config, AsyncApi(load_configuration(kubeconfig), connections=4), metrics)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger(__name__).info(
            "device plugin for %s on node %s (socket %s, metrics on :%s)",
            resource,
            node,
            config.socket_path,
            metrics_port or "-",
        )
        await agent.run(stop)

    asyncio.run(main())
