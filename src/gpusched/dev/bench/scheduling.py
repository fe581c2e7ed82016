"""``gpusched bench scheduling``: pods bound per second by kube-scheduler, with and without the
gpusched extender, on one local control plane in one run.

The same kube-scheduler binary runs twice over the same simulated cluster (kwok nodes wired like
the real fixtures, each with its NodeGpuTopology): once serving a plain profile with no
extender, once serving the ``gpusched`` profile with the extender (filter, prioritize, bind).
For each run all pods are created first, with the scheduler stopped, and the scheduler is then
started, so the figure is scheduling throughput, not pod-creation speed: pods bound divided by
the time from the first bind to the last, observed through a watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import threading
import time
from collections import Counter
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


def _measure(
    cluster: LocalCluster, api: Any, namespace: str, count: int, *, start: Any, timeout: float
) -> dict[str, Any]:
    watcher = BindWatcher(api, namespace)
    started = time.monotonic()
    record = start()
    deadline = started + timeout
    while len(watcher.bound_at) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.stop()
    cluster.stop_process(record)
    times = sorted(watcher.bound_at.values())
    bound = len(times)
    span = times[-1] - times[0] if bound > 1 else float("nan")
    return {
        "bound": bound,
        "pods_per_s": round((bound - 1) / span, 1) if bound > 1 else 0.0,
        "seconds_first_to_last_bind": round(span, 2),
        "seconds_from_scheduler_start": round(times[-1] - started, 2) if times else None,
        "nodes_used": len(set(watcher.nodes.values())),
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


def _extender_latency(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    figures: dict[str, float] = {}
    for verb in ("filter", "prioritize", "bind"):
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith(f'gpusched_extender_request_duration_seconds_sum{{verb="{verb}"}}'):
                total = float(line.split()[-1])
            if line.startswith(
                f'gpusched_extender_request_duration_seconds_count{{verb="{verb}"}}'
            ):
                count = float(line.split()[-1])
        figures[f"{verb}_mean_ms"] = round(1000 * total / count, 2) if count else 0.0
    return figures


def run(nodes: int, pods: int, seed: int, progress: Any = default_progress) -> dict[str, Any]:
    """Bring up a cluster, measure both schedulers, tear it down."""
    rng = random.Random(seed)
    sizes = [rng.choice(SIZES) for _ in range(pods)]
    if sum(sizes) > nodes * 8 * 0.9:
        raise click.UsageError(f"{pods} pods need {sum(sizes)} GPUs; {nodes} nodes are too few")
    cluster = LocalCluster(
        default_state_dir("bench-scheduling"), ensure_toolchain(progress), progress
    )
    cluster.up()
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

        progress(f"[bench] plain kube-scheduler: {pods} pods")
        _create_pods(api, "bench-plain", "plain", sizes)
        plain_profile = {**profile(), "schedulerName": "plain"}

        def start_plain() -> Any:
            config = cluster.scheduler_config([plain_profile])
            return cluster.start_scheduler("plain-kube-scheduler", config)

        plain = _measure(cluster, api, "bench-plain", pods, start=start_plain, timeout=900)
        progress(f"[bench] plain: {plain}")
        progress("[bench] deleting the plain run's pods")
        _delete_pods(api, "bench-plain")

        progress(f"[bench] kube-scheduler with the gpusched extender: {pods} pods")
        _create_pods(api, "bench-gpusched", keys.SCHEDULER_NAME, sizes)
        with_extender = _measure(
            cluster,
            api,
            "bench-gpusched",
            pods,
            start=lambda: start_gpusched_kube_scheduler(cluster, extender),
            timeout=900,
        )
        with_extender.update(_extender_latency(extender.url))
        with_extender["gpus_assigned_twice"] = _double_assignments(api, "bench-gpusched")
        progress(f"[bench] with extender: {with_extender}")
    finally:
        cluster.down()
    ratio = with_extender["pods_per_s"] / plain["pods_per_s"] if plain["pods_per_s"] else None
    return {
        "nodes": nodes,
        "gpus_per_node": 8,
        "pods": pods,
        "gpus_requested": sum(sizes),
        "mean_pod_gpus": round(statistics.mean(sizes), 2),
        "without_extender": plain,
        "with_extender": with_extender,
        "with_extender_pods_per_s": with_extender["pods_per_s"],
        "without_extender_pods_per_s": plain["pods_per_s"],
        "throughput_ratio": round(ratio, 2) if ratio else None,
    }


@click.command()
@click.option("--nodes", default=1000, show_default=True, help="Simulated 8-GPU nodes.")
@click.option("--pods", default=2000, show_default=True, help="GPU pods per scheduler run.")
@click.option("--seed", default=11, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (progress goes to stderr).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON figures to this file.",
)
def scheduling(nodes: int, pods: int, seed: int, as_json: bool, out: Path | None) -> None:
    """Pods/s bound by kube-scheduler with the extender vs without it (local control plane)."""
    figures = run(nodes, pods, seed)
    text = json.dumps(figures)
    if out is not None:
        out.write_text(text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(json.dumps(figures, indent=2))
