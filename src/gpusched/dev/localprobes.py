"""Device probes for the simulated nodes of a local cluster, run as the Helm chart runs them.

Each probe is a separate ``gpusched probe --fake`` process authenticated with a token of the
chart's probe ServiceAccount bound to its node (RBAC and own-node policy as the chart renders
them), so whatever uses this (the integration tests, the benchmark, a demo) also proves that
identity sufficient. Faults are injected
by appending to the probe's fault file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpusched.dev.localcluster import identities
from gpusched.dev.localcluster.cluster import LocalCluster
from gpusched.dev.localcluster.components import gpusched_command
from gpusched.dev.localcluster.processes import ProcessRecord, free_port
from gpusched.dev.localcluster.topologies import nvl72_tray_objects

ACCOUNT: Final = identities.PROBE


def probe_kubeconfig(cluster: LocalCluster, node: str) -> Path:
    """A kubeconfig with a token of the chart's probe ServiceAccount bound to ``node``, as the
    projected token of the DaemonSet's pod on that node is: the chart's own-node policy lets it
    write only that Node's labels and taint and its NodeGpuTopology."""
    return identities.kubeconfig(cluster, ACCOUNT, node=node)


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
        f"--kubeconfig={kubeconfig or probe_kubeconfig(cluster, node)}",
        f"--fake={topology}",
        f"--fake-faults={faults}",
        f"--metrics-port={port}",
        "--metrics-address=127.0.0.1",
        *args,
    ]
    record = cluster.spawn(f"probe-{node}-{port}", argv)
    return FakeProbe(record, node, port, faults)


def start_tray_probes(
    cluster: LocalCluster,
    trays: Sequence[str],
    clique: str,
    directory: Path,
    *,
    args: tuple[str, ...] = (),
) -> list[FakeProbe]:
    """One probe per tray of an NVL72 rack, as the chart's DaemonSet runs one per node: each
    simulates a GB200 tray whose NVML reports the rack's NVLink ``clique``
    (``<clusterUUID>.<cliqueId>``) in its fabric information, so the probe, not the test,
    publishes the tray's NodeGpuTopology and its ``nvidia.com/gpu.clique`` label."""
    directory.mkdir(parents=True, exist_ok=True)
    probes = []
    for tray in trays:
        spec, _ = nvl72_tray_objects(tray, clique)
        source = directory / f"{tray}.yaml"
        source.write_text(json.dumps(spec.to_k8s()))
        probes.append(start_fake_probe(cluster, tray, source, args=args))
    return probes
