"""``gpusched probe``: the device probe, as a DaemonSet process or a one-shot check.

``gpusched probe`` runs until SIGTERM on a GPU node (node name from ``$NODE_NAME``), publishing
labels and the NodeGpuTopology and serving metrics. ``gpusched probe --once --dry-run`` reads the
GPUs once and prints the labels and the object it would publish, without contacting the API
server, so an admin can check it on a GPU host before deploying. ``--fake FILE`` replaces NVML
and sysfs with a simulated node built from a ``topo -m`` matrix or a NodeGpuTopology YAML.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml

from gpusched.api import keys
from gpusched.commands.logs import configure_logging
from gpusched.commands.params import DURATION, POSITIVE_DURATION
from gpusched.core.health import APPLICATION_XIDS, HealthPolicy

DEFAULT_METRICS_PORT = 9402


def _xids(text: str | None) -> frozenset[int] | None:
    if text is None:
        return None
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise click.BadParameter(f"expected comma-separated XID numbers, got {text!r}") from err


@contextmanager
def _backend(fake: Path | None, faults: Path | None, node: str, sysfs_root: str) -> Iterator[Any]:
    """The NVML backend: pynvml and the host's sysfs, or a simulated node."""
    from gpusched.device_probe.nvml_backend import NvmlBackend
    from gpusched.device_probe.sysfs import Sysfs

    if fake is None:
        try:
            import pynvml
        except ImportError as err:
            raise click.ClickException(
                "the probe needs nvidia-ml-py: pip install 'gpusched[probe]'"
            ) from err
        yield NvmlBackend(pynvml, Sysfs(sysfs_root))
        return
    from gpusched.dev.fakenvml import FakeSourceError, FakeTopologyError, FaultError, fake_node

    try:
        simulated = fake_node(fake, node, faults_path=faults)
    except (FakeSourceError, FakeTopologyError, FaultError) as err:
        raise click.ClickException(str(err)) from err
    try:
        yield NvmlBackend(
            simulated.nvml, Sysfs(simulated.sysfs_root), source=simulated.topology.source
        )
    finally:
        simulated.close()


def _dry_run_document(result: Any, node: str) -> str:
    labels = result.labels
    own = {k: v for k, v in sorted(labels.items()) if not k.startswith(keys.GFD_PREFIX)}
    gfd = {k: v for k, v in sorted(labels.items()) if k.startswith(keys.GFD_PREFIX)}
    spec, _ = result.topology.to_api()
    summary = {
        "node": node,
        "nvml": result.status.conditions[0].message if result.status.conditions else "",
        "labels": own,
        "gfdCompatibleLabels": gfd,
        "gfdCompatibleLabelsNote": "applied only for keys GPU Feature Discovery does not manage",
        "taintWhenNoHealthyGpu": f"{keys.TAINT_NO_HEALTHY_GPU}=true:NoSchedule (--taint-unhealthy)",
    }
    obj = {
        "apiVersion": keys.API_VERSION,
        "kind": "NodeGpuTopology",
        "metadata": {"name": node},
        "spec": spec.to_k8s(),
        "status": result.status.to_k8s(),
    }
    return yaml.safe_dump_all([summary, obj], sort_keys=False)


@click.command()
@click.option(
    "--node",
    envvar="NODE_NAME",
    help="Node to publish for (DaemonSet: $NODE_NAME from spec.nodeName). "
    "With --dry-run defaults to the host name.",
)
@click.option(
    "--kubeconfig", type=click.Path(dir_okay=False), help="Default: $KUBECONFIG or in-cluster."
)
@click.option(
    "--interval",
    type=POSITIVE_DURATION,
    default="10s",
    show_default=True,
    help="Time between readings (10s, 1m, or seconds).",
)
@click.option(
    "--resync",
    type=POSITIVE_DURATION,
    default="300s",
    show_default=True,
    help="Time between full re-reads.",
)
@click.option(
    "--telemetry-refresh",
    type=DURATION,
    default="600s",
    show_default=True,
    help="Least time between status writes due only to temperature or power.",
)
@click.option(
    "--metrics-port",
    default=DEFAULT_METRICS_PORT,
    show_default=True,
    help="Prometheus port (0: none).",
)
@click.option("--metrics-address", default="0.0.0.0", show_default=True)
@click.option("--once", is_flag=True, help="One cycle, then exit.")
@click.option("--dry-run", is_flag=True, help="Print what would be published; no API calls.")
@click.option(
    "--fake",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="GPUSCHED_PROBE_FAKE",
    help="Simulate the node from a topo -m matrix (.txt) or NodeGpuTopology (.yaml) "
    "[env GPUSCHED_PROBE_FAKE: a simulated node's hardware, under an unchanged command line].",
)
@click.option(
    "--fake-faults",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="GPUSCHED_PROBE_FAKE_FAULTS",
    help="With --fake: JSON-lines fault file, read as lines are appended.",
)
@click.option(
    "--sysfs-root", default="/sys", show_default=True, help="Where the host's /sys is mounted."
)
@click.option(
    "--ignore-xids",
    help="XIDs that never change health "
    f"[default: {','.join(map(str, sorted(APPLICATION_XIDS)))}, the application XIDs].",
)
@click.option("--fatal-xids", help="XIDs that are fatal even if listed as ignored.")
@click.option("--no-xid-health", is_flag=True, help="Count XIDs but never change health.")
@click.option(
    "--ecc-limit",
    default=0,
    show_default=True,
    help="Uncorrectable ECC errors tolerated.",
)
@click.option(
    "--throttle-sustain",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Time of hardware slowdown before a GPU is Degraded.",
)
@click.option(
    "--temperature-limit",
    type=int,
    help="Degraded from this many degrees C [default: the GPU's slowdown threshold].",
)
@click.option(
    "--taint-unhealthy/--no-taint-unhealthy",
    default=False,
    show_default=True,
    help=f"Taint {keys.TAINT_NO_HEALTHY_GPU}:NoSchedule when no GPU is Healthy or Degraded.",
)
@click.option(
    "--gfd-labels",
    type=click.Choice(["auto", "never"]),
    default="auto",
    show_default=True,
    help="auto: nvidia.com/ labels only where GPU Feature Discovery does not write them.",
)
@click.option("--log-level", default="info", show_default=True)
def probe(  # noqa: PLR0917 - one parameter per click option
    node: str | None,
    kubeconfig: str | None,
    interval: float,
    resync: float,
    telemetry_refresh: float,
    metrics_port: int,
    metrics_address: str,
    once: bool,
    dry_run: bool,
    fake: Path | None,
    fake_faults: Path | None,
    sysfs_root: str,
    ignore_xids: str | None,
    fatal_xids: str | None,
    no_xid_health: bool,
    ecc_limit: int,
    throttle_sustain: float,
    temperature_limit: int | None,
    taint_unhealthy: bool,
    gfd_labels: str,
    log_level: str,
) -> None:
    """Publish this node's GPU topology and health (labels and NodeGpuTopology)."""
    configure_logging(log_level)
    from gpusched.device_probe.probe import Probe, ProbeConfig, boot_time
    from gpusched.metrics import ProbeMetrics

    if dry_run and not once:
        raise click.UsageError("--dry-run goes with --once")
    if fake_faults is not None and fake is None:
        raise click.UsageError("--fake-faults needs --fake")
    if node is None:
        if not dry_run:
            raise click.UsageError("--node (or $NODE_NAME) is required")
        node = socket.gethostname()
    try:
        policy = HealthPolicy(
            xid_checks=not no_xid_health,
            ecc_uncorrected_limit=ecc_limit,
            throttle_sustain_seconds=throttle_sustain,
            temperature_limit_c=temperature_limit,
        ).with_xids(ignore=_xids(ignore_xids), fatal=_xids(fatal_xids) or ())
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    config = ProbeConfig(
        node_name=node,
        interval=interval,
        resync=resync,
        telemetry_refresh=telemetry_refresh,
        policy=policy,
        taint_unhealthy=taint_unhealthy,
        gfd_labels="never" if gfd_labels == "never" else "auto",
    )
    metrics = ProbeMetrics()
    with _backend(fake, fake_faults, node, sysfs_root) as backend:
        publisher = None
        if not dry_run:
            from gpusched.device_probe.publisher import Publisher
            from gpusched.kube import load_configuration
            from gpusched.kubeasync import BlockingApi

            publisher = Publisher(BlockingApi(load_configuration(kubeconfig)), node, metrics)
        runner = Probe(backend, config, publisher, metrics, boot=boot_time(), watch_events=not once)
        if once:
            result = runner.cycle()
            runner.close()
            if dry_run:
                click.echo(_dry_run_document(result, node), nl=False)
                return
            click.echo(
                json.dumps(
                    {
                        "node": node,
                        "outcome": result.outcome,
                        "writes": result.writes,
                        "gpus": len(result.topology.gpus),
                        "healthyGpus": result.status.healthy_gpus,
                    }
                )
            )
            if result.outcome in ("api-error", "node-missing", "error"):
                sys.exit(1)
            return
        if metrics_port:
            from prometheus_client import start_http_server

            start_http_server(metrics_port, metrics_address, registry=metrics.registry)
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        signal.signal(signal.SIGINT, lambda *_: runner.stop())
        logging.getLogger(__name__).info(
            "probing node %s every %.0fs (metrics on :%s)", node, interval, metrics_port or "-"
        )
        runner.run()
