"""Run gpusched's components on a local cluster as real processes, under the chart's identities.

Tests, benchmarks and the demo start components the way the Helm chart runs them: as separate
processes, each authenticated as the chart's ServiceAccount for it, with exactly the RBAC and
admission policies the chart renders (:mod:`gpusched.dev.localcluster.identities`), so that
running them proves those identities sufficient.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpusched.dev.localcluster import identities
from gpusched.dev.localcluster.cluster import ClusterError, LocalCluster
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running

SYSTEM_NAMESPACE = "gpusched-system"


def gpusched_command() -> list[str]:
    """How to run this checkout's ``gpusched`` CLI."""
    return [sys.executable, "-m", "gpusched"]


def wait_http_ok(url: str, record: ProcessRecord, timeout: float = 60.0) -> None:
    """Block until ``url`` answers 200, failing early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(record):
            log = Path(record.log).read_text(errors="replace")[-3000:]
            raise ClusterError(f"{record.name} exited during start-up:\n{log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise ClusterError(f"{record.name} not ready at {url} after {timeout:.0f}s")


@dataclass
class SchedulerProcesses:
    """The extender and the kube-scheduler serving the ``gpusched`` profile."""

    extender: ProcessRecord
    kube_scheduler: ProcessRecord
    url: str
    kubeconfig: Path

    def stop(self, cluster: LocalCluster) -> None:
        """Stop the kube-scheduler, then the extender (no scheduler is left calling it)."""
        cluster.stop_process(self.kube_scheduler)
        cluster.stop_process(self.extender)

    def restart_extender(self, cluster: LocalCluster, *, kill: bool = True) -> None:
        """Stop the extender (SIGKILL by default, like a crash) and start it again."""
        if kill:
            os.killpg(self.extender.pid, signal.SIGKILL)
        cluster.stop_process(self.extender)
        port = int(self.url.rsplit(":", 1)[1])
        self.extender = _spawn_extender(cluster, self.kubeconfig, port)
        wait_http_ok(f"{self.url}/readyz", self.extender)


def _spawn_extender(
    cluster: LocalCluster, kubeconfig: Path, port: int, metrics_port: int = 0
) -> ProcessRecord:
    return cluster.spawn(
        "gpusched-extender",
        [
            *gpusched_command(),
            "scheduler",
            "serve",
            f"--kubeconfig={kubeconfig}",
            "--address=127.0.0.1",
            f"--port={port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics_port}",
        ],
    )


@dataclass
class ExtenderProcess:
    """A running extender."""

    record: ProcessRecord
    url: str
    kubeconfig: Path


def start_extender_only(
    cluster: LocalCluster, *, admin: bool = False, metrics_port: int = 0
) -> ExtenderProcess:
    """Start the extender (as the chart's extender identity unless ``admin``); return once its
    cache is synced. ``metrics_port``: also serve health and metrics there, as in the chart."""
    kubeconfig = (
        cluster.kubeconfig if admin else identities.kubeconfig(cluster, identities.EXTENDER)
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    record = _spawn_extender(cluster, kubeconfig, port, metrics_port)
    wait_http_ok(f"{url}/readyz", record)
    if metrics_port:
        wait_http_ok(f"http://127.0.0.1:{metrics_port}/readyz", record)
    return ExtenderProcess(record, url, kubeconfig)


def start_gpusched_kube_scheduler(
    cluster: LocalCluster, extender: ExtenderProcess, *, admin: bool = False
) -> ProcessRecord:
    """A kube-scheduler serving the ``gpusched`` profile through ``extender``, as the chart's
    kube-scheduler identity (a ServiceAccount of its own, not the extender's)."""
    from gpusched.scheduler.config import kube_scheduler_config

    kubeconfig = (
        cluster.kubeconfig if admin else identities.kubeconfig(cluster, identities.KUBE_SCHEDULER)
    )
    config = kube_scheduler_config(
        extender.url, kubeconfig=str(kubeconfig), leader_elect=False, qps=500, burst=1000
    )
    return cluster.start_scheduler("gpusched-kube-scheduler", config)


def start_scheduler(
    cluster: LocalCluster, *, admin: bool = False, metrics_port: int = 0
) -> SchedulerProcesses:
    """Start the gpusched extender and its kube-scheduler; return once both serve."""
    extender = start_extender_only(cluster, admin=admin, metrics_port=metrics_port)
    scheduler = start_gpusched_kube_scheduler(cluster, extender, admin=admin)
    return SchedulerProcesses(extender.record, scheduler, extender.url, extender.kubeconfig)
