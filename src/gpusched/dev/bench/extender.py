"""``gpusched bench extender``: filter and prioritize latency over a 5,000-node cluster.

Runs what the HTTP handlers run for one call — decode the request JSON (5,000 node names),
validate the wire types, build the node views from the cache, decide, encode the answer — but
in-process, so the figure is the extender's own cost without the network. Requests no node can
host (whose answer carries a reason per node) are reported apart. The cache holds
simulated nodes wired like the six real fixtures, with random occupancy from bound pods; each
iteration asks for a different request (1, 2, 4 or 8 GPUs, several topology policies) and moves
some pods, so results are not all served from the placement memo. The first iteration after
start-up (cold caches) is reported separately.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

import click
from prometheus_client import generate_latest

from gpusched.api import keys
from gpusched.api.extender import ExtenderArgs, ExtenderFilterResult
from gpusched.core.placement import clear_placement_cache
from gpusched.core.prepared import clear_caches
from gpusched.core.scheduling import FilterOutcome, filter_nodes, gpu_request, prioritize
from gpusched.dev.localcluster.topologies import FIXTURE_NAMES, fixture_objects
from gpusched.metrics import SchedulerMetrics, new_registry
from gpusched.scheduler.cache import ClusterCache, settle_heap
from gpusched.scheduler.server import export_inventory

#: Requests between two heap settlements (the server settles every 5 s; at the p50 below that
#: is several hundred requests, so this is the pessimistic side).
SETTLE_EVERY = 50

POLICIES = (
    ("node", "preferred"),
    ("nvlink", "preferred"),
    ("nvlink", "required"),
    ("numa", "preferred"),
    ("pcie-switch", "required"),
)


def _pod(name: str, gpus: int, scope: str, mode: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "annotations": {
                keys.ANNOTATION_TOPOLOGY_SCOPE: scope,
                keys.ANNOTATION_TOPOLOGY_MODE: mode,
            },
        },
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [
                {"name": "main", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}
            ],
        },
    }


def _bound_pod(name: str, node: str, indices: list[int]) -> dict[str, Any]:
    body = _pod(name, len(indices), "node", "preferred")
    body["spec"]["nodeName"] = node
    body["metadata"]["annotations"][keys.ANNOTATION_GPU_INDICES] = ",".join(map(str, indices))
    body["status"] = {"phase": "Running"}
    return body


def build_cache(nodes: int, occupancy: float, rng: random.Random) -> tuple[ClusterCache, list[str]]:
    """A synced cache of ``nodes`` simulated nodes, ``occupancy`` of their GPUs held."""
    cache = ClusterCache()
    topologies = []
    names = []
    for i in range(nodes):
        fixture = FIXTURE_NAMES[i % len(FIXTURE_NAMES)]
        name = f"node-{i:05d}"
        spec, status = fixture_objects(fixture, name)
        topologies.append(
            {"metadata": {"name": name}, "spec": spec.to_k8s(), "status": status.to_k8s()}
        )
        names.append(name)
    cache.replace_topologies(topologies)
    pods = []
    for name in names:
        gpus = list(cache.topologies[name].topology.gpu_indices)
        held = [g for g in gpus if rng.random() < occupancy]
        if held:
            pods.append(_bound_pod(f"held-{name}", name, held))
    cache.replace_pods(pods)
    return cache, names


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _filter_answer(cache: ClusterCache, body: bytes) -> tuple[bytes, FilterOutcome]:
    """What the server's filter handler does with a request body, without the HTTP layer."""
    args = ExtenderArgs.from_wire(json.loads(body))
    request = gpu_request(args.pod)
    outcome = filter_nodes(cache.views(args.candidate_names()), request)
    if outcome.fits:
        answer = ExtenderFilterResult(node_names=list(outcome.fits))
    else:
        answer = ExtenderFilterResult(
            failed_nodes=outcome.failed, failed_and_unresolvable_nodes=outcome.unresolvable
        )
    return json.dumps(answer.to_wire()).encode(), outcome


def _housekeeping_and_scrape(
    cache: ClusterCache, rounds: int = 5
) -> tuple[list[float], list[float]]:
    """Milliseconds of the server's housekeeping tick on the event loop (reading the cache into
    the gauges) and of one Prometheus exposition (run in a thread by the server), ``rounds``
    times each; the first tick, which builds every node's view, is not counted."""
    metrics = SchedulerMetrics(new_registry())
    export_inventory(cache, metrics)
    ticks, scrapes = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        cache.expire()
        export_inventory(cache, metrics)
        t1 = time.perf_counter()
        generate_latest(metrics.registry)
        t2 = time.perf_counter()
        ticks.append((t1 - t0) * 1000)
        scrapes.append((t2 - t1) * 1000)
    return ticks, scrapes


def run(nodes: int, iterations: int, occupancy: float, seed: int) -> dict[str, Any]:
    """Measure and return the figures."""
    rng = random.Random(seed)
    clear_caches()
    clear_placement_cache()
    started = time.perf_counter()
    cache, names = build_cache(nodes, occupancy, rng)
    build_seconds = time.perf_counter() - started
    settle_heap()
    filter_ms: list[float] = []
    refused_ms: list[float] = []
    prioritize_ms: list[float] = []
    settle_ms: list[float] = []
    for i in range(iterations):
        scope, mode = POLICIES[i % len(POLICIES)]
        pod = _pod(f"p{i}", rng.choice((1, 2, 4, 8)), scope, mode)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()

        t0 = time.perf_counter()
        _, outcome = _filter_answer(cache, body)
        t1 = time.perf_counter()
        # The prioritize endpoint (not called by the shipped profile, whose filter passes one
        # node): every node decided and ranked.
        args = ExtenderArgs.from_wire(json.loads(body))
        scores = prioritize(cache.views(args.candidate_names()), gpu_request(args.pod))
        json.dumps([{"Host": n, "Score": scores.get(n, 0)} for n in args.candidate_names()])
        t2 = time.perf_counter()

        (filter_ms if outcome.fits else refused_ms).append((t1 - t0) * 1000)
        prioritize_ms.append((t2 - t1) * 1000)
        # Cluster churn: a few pods end and a few start, so occupancy keeps changing.
        for _ in range(5):
            name = rng.choice(names)
            held = _bound_pod(f"held-{name}", name, [])
            if f"bench/held-{name}" in cache.pods:
                cache.delete_pod(held)
            else:
                gpus = list(cache.topologies[name].topology.gpu_indices)
                cache.apply_pod(_bound_pod(f"held-{name}", name, rng.sample(gpus, 2)))
        if i % SETTLE_EVERY == SETTLE_EVERY - 1:
            # The server's housekeeping does this every few seconds, between requests.
            t3 = time.perf_counter()
            settle_heap()
            settle_ms.append((time.perf_counter() - t3) * 1000)
    warm = filter_ms[1:]
    tick_ms, scrape_ms = _housekeeping_and_scrape(cache)
    return {
        "nodes": nodes,
        "iterations": iterations,
        "occupancy": occupancy,
        "cache_build_s": round(build_seconds, 2),
        "filter_cold_ms": round(filter_ms[0], 2) if filter_ms else None,
        "filter_p50_ms": round(statistics.median(warm), 2),
        "filter_p99_ms": round(_percentile(warm, 0.99), 2),
        "filter_max_ms": round(max(warm), 2),
        "filter_nothing_fits": len(refused_ms),
        "filter_nothing_fits_p50_ms": round(statistics.median(refused_ms), 2)
        if refused_ms
        else None,
        "prioritize_p50_ms": round(statistics.median(prioritize_ms[1:]), 2),
        "prioritize_p99_ms": round(_percentile(prioritize_ms[1:], 0.99), 2),
        "heap_settle_p50_ms": round(statistics.median(settle_ms), 2) if settle_ms else None,
        "housekeeping_tick_p50_ms": round(statistics.median(tick_ms), 2),
        "metrics_scrape_p50_ms": round(statistics.median(scrape_ms), 2),
        "policies": [f"{s}/{m}" for s, m in POLICIES],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


@click.command()
@click.option("--nodes", default=5000, show_default=True, help="Simulated nodes in the cache.")
@click.option("--iterations", default=200, show_default=True, help="Requests to time.")
@click.option("--occupancy", default=0.5, show_default=True, help="Share of GPUs held.")
@click.option("--seed", default=7, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def extender(nodes: int, iterations: int, occupancy: float, seed: int, as_json: bool) -> None:
    """Filter and prioritize latency for one pod over a large simulated cluster."""
    if iterations < 2:
        raise click.BadParameter("need at least 2 iterations", param_hint="--iterations")
    figures = run(nodes, iterations, occupancy, seed)
    if as_json:
        click.echo(json.dumps(figures))
        return
    for key, value in figures.items():
        click.echo(f"{key:22} {value}")
