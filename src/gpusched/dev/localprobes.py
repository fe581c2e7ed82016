"""Device probes for the simulated nodes of a local cluster, run as the Helm chart runs them.

Each probe is a separate ``gpusched probe --fake`` process authenticated with a token of the
probe's ServiceAccount (RBAC from ``device-probe/rbac.yaml``), so whatever uses this (the
integration tests, the benchmark, a demo) also proves that RBAC sufficient. Faults are injected
by appending to the probe's fault file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpusched.dev.localcluster.binaries import repo_root
from gpusched.dev.localcluster.cluster import LocalCluster
from gpusched.dev.localcluster.components import gpusched_command, service_account_kubeconfig
from gpusched.dev.localcluster.processes import ProcessRecord, free_port

ACCOUNT: Final = "gpusched-device-probe"


def rbac_manifest() -> Path:
    """The probe's RBAC, as the chart ships it."""
    return repo_root() / "device-probe" / "rbac.yaml"


def probe_kubeconfig(cluster: LocalCluster) -> Path:
    """Apply the probe's RBAC and return a kubeconfig with a token of its ServiceAccount."""
    return service_account_kubeconfig(cluster, rbac_manifest(), ACCOUNT)


@dataclass
class FakeProbe:
    """A running probe process for one simulated node."""

    record: ProcessRecord
    node: str
    metrics_port: int
    faults: Path

    @property
    def metrics_url(self) -> str:
        """Its Prometheus endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def inject(self, **fault: Any) -> None:
        """Append one fault (see :mod:`gpusched.dev.fakenvml.faults`), e.g.
        ``inject(gpu=3, xid=79)`` or ``inject(gpu=2, remappedRows="pending")``."""
        with self.faults.open("a") as handle:
            handle.write(json.dumps(fault) + "\n")


def start_fake_probe(
    cluster: LocalCluster,
    node: str,
    topology: Path,
    *,
    kubeconfig: Path | None = None,
    faults: Path | None = None,
    args: tuple[str, ...] = (),
) -> FakeProbe:
    """Start ``gpusched probe --fake topology`` for ``node``; ``down()`` of the cluster stops it.

    ``topology`` is a ``topo -m`` matrix or a NodeGpuTopology YAML. The fault file defaults to
    ``<cluster>/probe-faults/<node>.jsonl`` and is created empty if absent.
    """
    if faults is None:
        faults = cluster.state_dir / "probe-faults" / f"{node}.jsonl"
    faults.parent.mkdir(parents=True, exist_ok=True)
    faults.touch()
    port = free_port()
    argv = [
        *gpusched_command(),
        "probe",
        f"--node={node}",
        f"--kubeconfig={kubeconfig or probe_kubeconfig(cluster)}",
        f"--fake={topology}",
        f"--fake-faults={faults}",
        f"--metrics-port={port}",
        "--metrics-address=127.0.0.1",
        *args,
    ]
    record = cluster.spawn(f"probe-{node}-{port}", argv)
    return FakeProbe(record, node, port, faults)
