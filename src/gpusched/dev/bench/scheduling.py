"""``gpusched bench scheduling``: pods bound per second by kube-scheduler, with and without the
gpusched extender, on one local control plane in one run.

The same kube-scheduler binary runs over the same simulated cluster (kwok nodes wired like the
real fixtures, each with its NodeGpuTopology), alternately serving a plain profile with no
extender (the ``gpusched`` profile's in-tree plugins, MostAllocated on GPUs) and the ``gpusched``
profile with the extender, three times each by default; medians are reported. For each
measurement all pods are created first, with the scheduler stopped, and the scheduler is then
started, so the figure is scheduling throughput, not pod-creation speed: pods bound divided by
the time from the first bind to the last, observed through a watch. Each measurement also
reports how many nodes were left without any pod (whole nodes kept for large jobs) and the
load average of the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, default_state_dir, ensure_toolchain
from gpusched.dev.localcluster.binaries import default_progress, repo_root
from gpusched.dev.localcluster.components import start_extender_only, start_gpusched_kube_scheduler
from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready
from gpusched.dev.localcluster.topologies import FIXTURE_NAMES, fixture_objects
from gpusched.kube import body
from gpusched.kubeasync import AsyncApi
from gpusched.kubewatch import Reflector
from gpusched.scheduler.config import profile

SIZES = (1, 1, 2, 2, 4)


def _pod(name: str, scheduler: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


class BindWatcher:
    """Records when each pod of a namespace is first seen bound."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.bound_at: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        client = AsyncApi(api.configuration)
        reflector = Reflector(
            f"bench-{namespace}", client, f"/api/v1/namespaces/{namespace}/pods", self
        )
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(reflector.run())

        def run() -> None:  # the reflector's own event loop, beside the benchmark's threads
            with contextlib.suppress(asyncio.CancelledError):
                self._loop.run_until_complete(self._task)
            self._loop.run_until_complete(client.close())

        threading.Thread(target=run, name=f"watch-{namespace}", daemon=True).start()

    def replace(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.upsert(item)

    def upsert(self, item: dict[str, Any]) -> None:
        name, node = item["metadata"]["name"], (item.get("spec") or {}).get("nodeName")
        if node and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
            self.nodes[name] = node

    def delete(self, item: dict[str, Any]) -> None:
        """Deletions do not matter here."""

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._task.cancel)


def _create_pods(api: Any, namespace: str, scheduler: str, sizes: list[int]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespace(body({"metadata": {"name": namespace}}))

    def create(index: int) -> None:
        core.create_namespaced_pod(namespace, body(_pod(f"p-{index:05d}", scheduler, sizes[index])))

    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(create, range(len(sizes))))


def _pod_nodes(api: Any, namespace: str) -> dict[str, str | None]:
    """Pod name -> node (None while unbound) of every pod in the namespace."""
    from kubernetes import client

    response: Any = client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return {
        pod["metadata"]["name"]: pod["spec"].get("nodeName")
        for pod in json.loads(response.data)["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def _churn(
    api: Any, namespace: str, scheduler: str, sizes: list[int], *, nodes: int, timeout: float = 600
) -> dict[str, Any]:
    """Jobs end and others arrive: delete every third pod, create as many new pods (sizes from
    the same mix), wait until all are bound, and count the nodes left without any pod: what a
    scheduler keeps whole for 8-GPU jobs once the cluster has holes to fill."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    ending = [f"p-{i:05d}" for i in range(0, len(sizes), 3)]

    def delete(name: str) -> None:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(delete, ending))
    deadline = time.monotonic() + timeout
    gone = set(ending)
    while gone & set(_pod_nodes(api, namespace)):
        if time.monotonic() > deadline:
            raise TimeoutError("ended pods not gone")
        time.sleep(1)
    rng = random.Random(len(sizes))
    arriving = [rng.choice(SIZES) for _ in ending]

    def create(index: int) -> None:
        pod = _pod(f"q-{index:05d}", scheduler, arriving[index])
        core.create_namespaced_pod(namespace, body(pod))

    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(create, range(len(arriving))))
    while True:
        placed = _pod_nodes(api, namespace)
        if all(placed.values()):
            break
        if time.monotonic() > deadline:
            raise TimeoutError("arriving pods not bound")
        time.sleep(1)
    return {
        "churn_pods_ended": len(ending),
        "churn_pods_arrived": len(arriving),
        "nodes_left_free_after_churn": nodes - len(set(placed.values())),
    }


def _cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each process of the cluster has used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for record in cluster.processes():
        try:
            fields = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[record.name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def _cpu_per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> dict[str, float]:
    """Milliseconds of CPU per bound pod, per process, between two readings."""
    return {
        name: round(1000 * (seconds - before.get(name, 0.0)) / max(1, pods), 2)
        for name, seconds in sorted(after.items())
        if seconds - before.get(name, 0.0) > 0
    }


def _measure(
    cluster: LocalCluster,
    api: Any,
    namespace: str,
    count: int,
    *,
    nodes: int,
    start: Any,
    timeout: float,
    churn: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    watcher = BindWatcher(api, namespace)
    started = time.monotonic()
    record = start()
    cpu_before = _cpu_seconds(cluster)
    deadline = started + timeout
    while len(watcher.bound_at) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    cpu_after = _cpu_seconds(cluster)
    watcher.stop()
    churned = churn() if churn is not None else {}
    cluster.stop_process(record)
    times = sorted(watcher.bound_at.values())
    bound = len(times)
    span = times[-1] - times[0] if bound > 1 else float("nan")
    used = len(set(watcher.nodes.values()))
    return {
        "bound": bound,
        "pods_per_s": round((bound - 1) / span, 1) if bound > 1 else 0.0,
        "seconds_first_to_last_bind": round(span, 2),
        "seconds_from_scheduler_start": round(times[-1] - started, 2) if times else None,
        "nodes_used": used,
        "nodes_left_free": nodes - used,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_ms_per_pod": _cpu_per_pod(cpu_before, cpu_after, bound),
        **churned,
    }


def _delete_pods(api: Any, namespace: str, timeout: float = 600) -> None:
    """Free the GPUs of a finished run before the next one starts."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    # Deleting the namespace lets the namespace controller remove the pods in batches; one
    # delete-collection call of thousands of pods outlives the request timeout.
    core.delete_namespace(namespace, _preload_content=False)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, limit=1).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {namespace} not gone after {timeout:.0f}s")
        time.sleep(1)


def _double_assignments(api: Any, namespace: str) -> int:
    from kubernetes import client

    holders: Counter[tuple[str, str]] = Counter()
    response: Any = client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    for pod in json.loads(response.data)["items"]:
        value = (pod["metadata"].get("annotations") or {}).get(keys.ANNOTATION_GPU_INDICES)
        node = pod["spec"].get("nodeName")
        if node and value:
            holders.update((node, gpu) for gpu in value.split(","))
    return sum(1 for n in holders.values() if n > 1)


def _extender_latency(url: str) -> dict[str, tuple[float, float]]:
    """(seconds, calls) per verb so far, from the extender's request histogram."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    figures: dict[str, tuple[float, float]] = {}
    for verb in ("filter", "prioritize", "bind"):
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith(f'gpusched_extender_request_duration_seconds_sum{{verb="{verb}"}}'):
                total = float(line.split()[-1])
            if line.startswith(
                f'gpusched_extender_request_duration_seconds_count{{verb="{verb}"}}'
            ):
                count = float(line.split()[-1])
        figures[verb] = (total, count)
    return figures


def _latency_since(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean milliseconds and calls per verb between two readings."""
    out: dict[str, float] = {}
    for verb, (total, count) in after.items():
        seconds = total - before[verb][0]
        calls = count - before[verb][1]
        out[f"{verb}_calls"] = calls
        out[f"{verb}_mean_ms"] = round(1000 * seconds / calls, 2) if calls else 0.0
    return out


def run(
    nodes: int, pods: int, seed: int, runs: int = 3, progress: Any = default_progress
) -> dict[str, Any]:
    """Bring up a cluster, measure both schedulers ``runs`` times each, tear it down."""
    rng = random.Random(seed)
    sizes = [rng.choice(SIZES) for _ in range(pods)]
    if sum(sizes) > nodes * 8 * 0.9:
        raise click.UsageError(f"{pods} pods need {sum(sizes)} GPUs; {nodes} nodes are too few")
    cluster = LocalCluster(
        default_state_dir("bench-scheduling"), ensure_toolchain(progress), progress
    )
    cluster.up()
    results: list[dict[str, Any]] = []
    try:
        cluster.install_crds(repo_root() / "crds")
        api = cluster.api_client()
        progress(f"[bench] creating {nodes} simulated GPU nodes with their NodeGpuTopology")
        names = [f"node-{i:05d}" for i in range(nodes)]
        eight_gpu = [f for f in FIXTURE_NAMES if not f.startswith("workstation")]

        def create_node(index: int) -> None:
            spec, status = fixture_objects(eight_gpu[index % len(eight_gpu)], names[index])
            add_gpu_nodes(api, [names[index]], 8, topology=spec, status=status, parallelism=1)

        with ThreadPoolExecutor(max_workers=24) as pool:
            list(pool.map(create_node, range(nodes)))
        wait_nodes_ready(api, names, timeout=600)

        progress("[bench] starting the extender and waiting for its cache")
        extender = start_extender_only(cluster)
        plain_profile = {**profile(), "schedulerName": "plain"}

        def start_plain() -> Any:
            config = cluster.scheduler_config([plain_profile])
            return cluster.start_scheduler("plain-kube-scheduler", config)

        for run_index in range(runs):
            tag = f"{run_index + 1}/{runs}"
            progress(f"[bench] run {tag}: plain kube-scheduler, {pods} pods")
            _create_pods(api, f"bench-plain-{run_index}", "plain", sizes)
            plain_namespace = f"bench-plain-{run_index}"
            plain = _measure(
                cluster,
                api,
                plain_namespace,
                pods,
                nodes=nodes,
                start=start_plain,
                timeout=900,
                churn=functools.partial(_churn, api, plain_namespace, "plain", sizes, nodes=nodes),
            )
            progress(f"[bench] run {tag} plain: {plain}")
            _delete_pods(api, plain_namespace)

            progress(f"[bench] run {tag}: kube-scheduler with the gpusched extender, {pods} pods")
            namespace = f"bench-gpusched-{run_index}"
            _create_pods(api, namespace, keys.SCHEDULER_NAME, sizes)
            before = _extender_latency(extender.url)
            with_extender = _measure(
                cluster,
                api,
                namespace,
                pods,
                nodes=nodes,
                start=lambda: start_gpusched_kube_scheduler(cluster, extender),
                timeout=900,
                churn=functools.partial(
                    _churn, api, namespace, keys.SCHEDULER_NAME, sizes, nodes=nodes
                ),
            )
            with_extender.update(_latency_since(before, _extender_latency(extender.url)))
            with_extender["gpus_assigned_twice"] = _double_assignments(api, namespace)
            progress(f"[bench] run {tag} with extender: {with_extender}")
            _delete_pods(api, namespace)
            ratio = (
                with_extender["pods_per_s"] / plain["pods_per_s"] if plain["pods_per_s"] else 0.0
            )
            results.append(
                {
                    "without_extender": plain,
                    "with_extender": with_extender,
                    "throughput_ratio": round(ratio, 2),
                }
            )
    finally:
        cluster.down()

    def median(path: tuple[str, ...]) -> float:
        values = []
        for result in results:
            value: Any = result
            for key in path:
                value = value[key]
            values.append(float(value))
        return round(statistics.median(values), 2)

    return {
        "nodes": nodes,
        "gpus_per_node": 8,
        "pods": pods,
        "gpus_requested": sum(sizes),
        "mean_pod_gpus": round(statistics.mean(sizes), 2),
        "runs": results,
        "with_extender_pods_per_s": median(("with_extender", "pods_per_s")),
        "without_extender_pods_per_s": median(("without_extender", "pods_per_s")),
        "throughput_ratio": median(("throughput_ratio",)),
        "nodes_left_free_with_extender": median(("with_extender", "nodes_left_free")),
        "nodes_left_free_without_extender": median(("without_extender", "nodes_left_free")),
        "nodes_left_free_after_churn_with_extender": median(
            ("with_extender", "nodes_left_free_after_churn")
        ),
        "nodes_left_free_after_churn_without_extender": median(
            ("without_extender", "nodes_left_free_after_churn")
        ),
        "gpus_assigned_twice": sum(r["with_extender"]["gpus_assigned_twice"] for r in results),
    }


@click.command()
@click.option("--nodes", default=1000, show_default=True, help="Simulated 8-GPU nodes.")
@click.option("--pods", default=2000, show_default=True, help="GPU pods per scheduler run.")
@click.option("--seed", default=11, show_default=True)
@click.option("--runs", default=3, show_default=True, help="Runs of both schedulers (medians).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (progress goes to stderr).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON figures to this file.",
)
def scheduling(  # noqa: PLR0917 - click passes every option
    nodes: int, pods: int, seed: int, runs: int, as_json: bool, out: Path | None
) -> None:
    """Pods/s bound by kube-scheduler with the extender vs without it (local control plane)."""
    figures = run(nodes, pods, seed, runs)
    text = json.dumps(figures)
    if out is not None:
        out.write_text(text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(json.dumps(figures, indent=2))
