"""``gpusched bench probe``: footprint of the device probe on an 8-GPU node, and how fast a health
event reaches the API server.

One run measures, on the fake HGX H100 node (8 GPUs, NVSwitch, 8 NICs):

* **CPU per cycle, in process**: a steady-state cycle (health reads, judgement, comparison, no
  write) against a cycle that also re-reads the inventory (NVLinks, PCIe, NICs), side by side,
  with the NVML calls each makes;
* **the real process**: ``gpusched probe`` publishing to a local control plane, its resident
  memory (current and peak) and CPU from /proc, at the default 10 s interval and at 0.5 s, both
  running at the same time;
* **event latency**: time from an XID written to the fault file to the status showing it on the
  API server, for each of the 8 GPUs in turn (interval one hour, so only the event path counts).

The fake answers from memory, so NVML's own cost on a real host is not in these figures; the
counts of NVML calls say how much of it a cycle incurs. Figures are recorded in
docs/benchmarks.md; tests never assert timings.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import click

from gpusched.dev.bench import bench_cluster
from gpusched.dev.localcluster.topologies import fixture_path

FIXTURE = "hgx-h100-sxm-8gpu-8nic"


def _cpu_cycles(cycles: int, inventory: bool) -> dict[str, float]:
    """Mean CPU time and NVML calls of ``cycles`` probe cycles on a fake node, no cluster."""
    from gpusched.dev.fakenvml import fake_node
    from gpusched.device_probe.nvml_backend import NvmlBackend
    from gpusched.device_probe.probe import Probe, ProbeConfig
    from gpusched.device_probe.sysfs import Sysfs

    node = fake_node(fixture_path(FIXTURE), "bench-node")
    try:
        backend = NvmlBackend(node.nvml, Sysfs(node.sysfs_root), source="fake")
        probe = Probe(backend, ProbeConfig(node_name="bench-node"), watch_events=False)
        probe.cycle()  # first cycle reads the inventory either way
        calls_before = node.nvml.call_count()
        started = time.process_time()
        for _ in range(cycles):
            if inventory:
                probe.request_inventory()
            probe.cycle()
        cpu = (time.process_time() - started) / cycles
        calls = (node.nvml.call_count() - calls_before) / cycles
        probe.close()
    finally:
        node.close()
    return {"cpu_ms_per_cycle": cpu * 1000, "nvml_calls_per_cycle": calls}


def _proc(pid: int) -> tuple[int, int, float]:
    """(VmRSS kB, VmHWM kB, CPU seconds) of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss, hwm = (int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM"))
    stat = Path(f"/proc/{pid}/stat").read_text()
    parts = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, hwm, (int(parts[11]) + int(parts[12])) / ticks


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def _start(cluster: Any, node: str, *args: str) -> Any:
    from gpusched.dev.localprobes import start_fake_probe

    running = start_fake_probe(
        cluster,
        node,
        fixture_path(FIXTURE),
        args=(*args, "--log-level=warning"),
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if _metric(running.metrics_port, "gpusched_probe_cycles_total") >= 1:
                return running
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise click.ClickException(f"probe for {node} did not start; see {running.record.log}")
        time.sleep(0.2)


def _footprint(cluster: Any, seconds: float) -> dict[str, Any]:
    """RSS and CPU of two probe processes running side by side: the default reading interval,
    and a fast one that makes the per-cycle cost dominate."""
    variants = {"interval 10s (default)": "--interval=10", "interval 0.5s": "--interval=0.5"}
    running = {
        name: _start(cluster, f"bench-fp-{i}", flag)
        for i, (name, flag) in enumerate(variants.items())
    }
    time.sleep(5)  # past start-up and the first publication
    start = {
        name: (_proc(r.record.pid), _metric(r.metrics_port, "gpusched_probe_cycles_total"))
        for name, r in running.items()
    }
    time.sleep(seconds)
    figures: dict[str, Any] = {}
    for name, r in running.items():
        (rss, hwm, cpu), cycles = (
            _proc(r.record.pid),
            _metric(r.metrics_port, "gpusched_probe_cycles_total"),
        )
        (_, _, cpu0), cycles0 = start[name]
        figures[name] = {
            "rss_mib": round(rss / 1024, 1),
            "peak_rss_mib": round(hwm / 1024, 1),
            "cycles": int(cycles - cycles0),
            # No cycle in a window shorter than the probe's interval: nothing to divide by.
            "cpu_ms_per_cycle": (
                round((cpu - cpu0) / (cycles - cycles0) * 1000, 2) if cycles > cycles0 else None
            ),
            "cpu_percent": round((cpu - cpu0) / seconds * 100, 2),
            "api_writes": int(_metric(r.metrics_port, "gpusched_probe_api_writes_total")),
        }
        cluster.stop_process(r.record)
    return figures


def _event_latency(cluster: Any, kube: Any) -> dict[str, Any]:
    """Seconds from an XID in the fault file to the published status, per GPU."""
    from kubernetes import client

    running = _start(cluster, "bench-xid", "--interval=3600", "--resync=3600")
    custom = client.CustomObjectsApi(kube)
    latencies = []
    try:
        for gpu in range(8):
            written = time.monotonic()
            with running.faults.open("a") as handle:
                handle.write(json.dumps({"gpu": gpu, "xid": 79}) + "\n")
            while True:
                obj: Any = custom.get_cluster_custom_object(
                    "gpusched.io", "v1alpha1", "nodegputopologies", running.node
                )
                if obj["status"]["gpus"][gpu]["reason"] == "Xid79":
                    latencies.append(time.monotonic() - written)
                    break
                if time.monotonic() - written > 60:
                    raise click.ClickException(f"XID on GPU {gpu} never published")
                time.sleep(0.01)
    finally:
        cluster.stop_process(running.record)
    return {
        "samples": len(latencies),
        "median_s": round(statistics.median(latencies), 3),
        "max_s": round(max(latencies), 3),
    }


@click.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--cycles", default=300, show_default=True, help="In-process cycles per variant.")
@click.option("--seconds", default=30.0, show_default=True, help="Footprint sampling window.")
@click.option(
    "--cluster",
    "cluster_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="State dir of a running local cluster to use (default: start a fresh one).",
)
def probe(as_json: bool, cycles: int, seconds: float, cluster_dir: Path | None) -> None:
    """Device-probe footprint (RSS, CPU per cycle) and XID-to-API latency on an 8-GPU node."""
    from gpusched.dev.localcluster.nodes import add_gpu_nodes, delete_nodes, wait_nodes_ready

    figures: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "fixture": FIXTURE,
        "in_process": {
            "steady_cycle": _cpu_cycles(cycles, inventory=False),
            "cycle_with_inventory": _cpu_cycles(cycles, inventory=True),
        },
    }
    steady = figures["in_process"]["steady_cycle"]["cpu_ms_per_cycle"]
    full = figures["in_process"]["cycle_with_inventory"]["cpu_ms_per_cycle"]
    figures["in_process"]["inventory_cost_ratio"] = round(full / steady, 2)

    with (
        tempfile.TemporaryDirectory(prefix="gpusched-bench-probe-") as tmp,
        bench_cluster(cluster_dir, Path(tmp)) as cluster,
    ):
        kube = cluster.api_client()
        nodes = ["bench-fp-0", "bench-fp-1", "bench-xid"]
        try:
            add_gpu_nodes(kube, nodes)
            wait_nodes_ready(kube, nodes)
            figures["process"] = _footprint(cluster, seconds)
            figures["xid_to_api"] = _event_latency(cluster, kube)
        finally:
            delete_nodes(kube, nodes)

    if as_json:
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    ip = figures["in_process"]
    click.echo(f"fake {FIXTURE}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    for name in ("steady_cycle", "cycle_with_inventory"):
        row = ip[name]
        click.echo(
            f"  {name:22s} {row['cpu_ms_per_cycle']:7.2f} ms CPU/cycle, "
            f"{row['nvml_calls_per_cycle']:6.0f} NVML calls/cycle"
        )
    click.echo(f"  inventory cost ratio   {ip['inventory_cost_ratio']}x")
    for name, row in figures["process"].items():
        per_cycle = (
            f"{row['cpu_ms_per_cycle']} ms CPU/cycle over {row['cycles']} cycles"
            if row["cycles"]
            else "no cycle in the window (--seconds shorter than the probe's interval)"
        )
        click.echo(
            f"  process {name:22s} RSS {row['rss_mib']} MiB (peak {row['peak_rss_mib']}), "
            f"{per_cycle}, {row['cpu_percent']}% CPU, {row['api_writes']} API writes"
        )
    lat = figures["xid_to_api"]
    click.echo(f"  XID -> API status      median {lat['median_s']} s, max {lat['max_s']} s")
