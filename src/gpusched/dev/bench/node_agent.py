"""``gpusched bench node-agent``: how long gpusched's device plugin holds up a pod's admission, and
its memory on an 8-GPU node.

The real ``gpusched device-plugin`` process runs against a local control plane, under its RBAC,
for a kwok node published as an HGX H100 (8 GPUs); the benchmark plays the kubelet over the unix
sockets (:mod:`gpusched.dev.kubelet_double`) and admits pods as a kubelet does: each pod is
bound with its GPUs (as the extender binds), listed by PodResources as being admitted, then asked
GetPreferredAllocation and Allocate. Rounds of eight 1-GPU pods fill the node; between rounds
they are deleted. ``--background-pods`` non-GPU pods are bound to the node and listed too (a
node's daemons), since every call reads the kubelet's list.

Reported: latency of GetPreferredAllocation and Allocate as the kubelet sees them (p50, p99,
max), and the plugin process's resident memory (current and peak) after the run. Figures are
recorded in docs/benchmarks.md; tests never assert timings.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from kubernetes import client

from gpusched.dev.bench import bench_cluster
from gpusched.kube import body

FIXTURE = "hgx-h100-sxm-8gpu-8nic"
NODE = "bench-node-agent"


def _proc_memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)

    def mib(key: str) -> float:
        return round(int(fields[key].split()[0]) / 1024, 1)

    return mib("VmRSS"), mib("VmHWM")


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49] * 1000, 2),
        "p99_ms": round(cuts[98] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "samples": len(ordered),
    }


def _run(cluster: Any, workdir: Path, rounds: int, background: int) -> dict[str, Any]:
    from gpusched.dev.kubelet_double import KubeletDouble
    from gpusched.dev.localcluster.nodes import add_gpu_nodes, delete_nodes, wait_nodes_ready
    from gpusched.dev.localcluster.topologies import fixture_objects
    from gpusched.dev.localnodeagent import (
        KubeletSockets,
        bind_like_extender,
        start_device_plugin,
    )

    kube = cluster.api_client()
    core = client.CoreV1Api(kube)
    spec, status = fixture_objects(FIXTURE, NODE)
    uuids = [g.uuid for g in sorted(spec.gpus, key=lambda g: g.index)]
    add_gpu_nodes(kube, [NODE], 8, topology=spec, status=status)
    wait_nodes_ready(kube, [NODE])
    namespace = f"bench-node-agent-{os.getpid()}"
    core.create_namespace(body({"metadata": {"name": namespace}}))
    kubelet = KubeletDouble(workdir / "kubelet")
    plugin = start_device_plugin(
        cluster,
        KubeletSockets(NODE, kubelet.device_plugin_dir, kubelet.pod_resources_socket),
        args=("--log-level=warning",),
    )
    preferred: list[float] = []
    allocate: list[float] = []
    try:
        kubelet.registered(timeout=120)
        for i in range(background):
            bind_like_extender(kube, namespace, f"daemon-{i}", NODE, [])
            kubelet.pods[f"{namespace}/daemon-{i}"] = {"main": []}
        with kubelet.plugin("gpusched.sock") as stub:
            for round_ in range(rounds):
                for slot, uuid in enumerate(uuids):
                    name = f"r{round_}-{slot}"
                    bind_like_extender(kube, namespace, name, NODE, [uuid])
                    kubelet.admitting(f"{namespace}/{name}")
                    free = uuids[slot:]
                    started = time.perf_counter()
                    got = kubelet.preferred(stub, free, 1)
                    preferred.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    kubelet.allocate(stub, got)
                    allocate.append(time.perf_counter() - started)
                    if got != [uuid]:
                        raise click.ClickException(f"{name}: preferred {got}, expected {uuid}")
                    kubelet.allocated(f"{namespace}/{name}", "main", got)
                for slot in range(len(uuids)):
                    name = f"r{round_}-{slot}"
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                    del kubelet.pods[f"{namespace}/{name}"]
        rss, peak = _proc_memory(plugin.record.pid)
    finally:
        cluster.stop_process(plugin.record)
        kubelet.stop()
        core.delete_namespace(namespace, grace_period_seconds=0)
        delete_nodes(kube, [NODE])
    return {
        "get_preferred_allocation": _percentiles(preferred),
        "allocate": _percentiles(allocate),
        "plugin_rss_mib": rss,
        "plugin_peak_rss_mib": peak,
        "listed_pods": background + len(uuids),
    }


@click.command("node-agent")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--rounds", default=50, show_default=True, help="Rounds of 8 one-GPU admissions.")
@click.option("--background-pods", default=30, show_default=True, help="Non-GPU pods on the node.")
@click.option(
    "--cluster",
    "cluster_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="State dir of a running local cluster to use (default: start a fresh one).",
)
def node_agent(as_json: bool, rounds: int, background_pods: int, cluster_dir: Path | None) -> None:
    """Device-plugin admission latency (GetPreferredAllocation, Allocate) and RSS, 8-GPU node."""
    with (
        tempfile.TemporaryDirectory(prefix="gpusched-bench-na-") as tmp,
        bench_cluster(cluster_dir, Path(tmp)) as cluster,
    ):
        figures = _run(cluster, Path(tmp), rounds, background_pods)
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "fixture": FIXTURE,
        **figures,
    }
    if as_json:
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    click.echo(
        f"fake {FIXTURE}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{figures['listed_pods']} pods listed by the kubelet"
    )
    for call in ("get_preferred_allocation", "allocate"):
        row = figures[call]
        click.echo(
            f"  {call:26s} p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
            f"max {row['max_ms']} ms ({row['samples']} calls)"
        )
    click.echo(
        f"  plugin process RSS {figures['plugin_rss_mib']} MiB "
        f"(peak {figures['plugin_peak_rss_mib']} MiB)"
    )
