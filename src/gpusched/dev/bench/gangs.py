"""``gpusched bench gangs``: how long one gang decision takes over a large multi-level cluster.

A synthetic GB200 NVL72-style cluster (default 5,000 trays of 4 NVSwitch-connected GPUs; 18
trays per NVLink clique, one clique per rack, 8 racks per block; about one clique in ten with a
tray down) with a random share of its GPUs busy. Each trial builds the cycle's pool once, then
times gang decisions (``Pool.place_gang``, released after each): gangs of 2-32 replicas that
require a clique, a rack or a block, half of them in segments of 4 per clique. The same gangs
are timed on the same pool without the levels (only their own label), side by side: the ratio
is the price of the levels. Figures to record, never assertions.
"""

from __future__ import annotations

import gc
import json
import platform
import random
import time
from dataclasses import replace
from functools import cache
from typing import Any

import click

from gpusched.api import keys
from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core import Policy, parse_topo_matrix, prepare
from gpusched.core.admission import AcrossReplicas, Job, Level, Node
from gpusched.core.admission.pool import GangFailure, Pool, Request
from gpusched.core.topology import NodeTopology
from gpusched.dev.bench.admission import percentile_ms
from gpusched.simulator.cluster import GB200_TRAY_MATRIX

CLIQUE = keys.GFD_CLIQUE
RACK = "topology.kubernetes.io/rack"
BLOCK = "example.com/block"
TRAYS_PER_CLIQUE = 18
CLIQUES_PER_BLOCK = 8
LEVELS = (Level(CLIQUE, "clique", whole_domains=True), Level(RACK, "rack"), Level(BLOCK, "block"))


@cache
def tray() -> NodeTopology:
    """The tray's wiring, parsed once."""
    return parse_topo_matrix(GB200_TRAY_MATRIX, node_name="gb200-tray", gpu_model="GB200")


def build_nodes(
    count: int, busy_share: float, rng: random.Random
) -> tuple[list[Node], list[dict[str, str]]]:
    """The trays in service, and the labels of those out of service."""
    nodes: list[Node] = []
    down: list[dict[str, str]] = []
    degraded = {c for c in range(count // TRAYS_PER_CLIQUE + 1) if rng.random() < 0.1}
    for i in range(count):
        clique = i // TRAYS_PER_CLIQUE
        labels = {
            CLIQUE: f"c{clique:04d}",
            RACK: f"r{clique:04d}",
            BLOCK: f"b{clique // CLIQUES_PER_BLOCK:03d}",
        }
        if clique in degraded and i % TRAYS_PER_CLIQUE == 0:
            down.append(labels)
            continue
        busy = frozenset(g for g in range(4) if rng.random() < busy_share)
        name = f"tray-{i:05d}"
        nodes.append(
            Node(
                name=name,
                topology=prepare(replace(tray(), node_name=name)),
                model="GB200",
                labels=labels,
                busy=busy,
            )
        )
    return nodes, down


def gangs(count: int, rng: random.Random) -> list[Job]:
    """Gangs of whole or part trays, each requiring one of the levels."""
    out = []
    for i in range(count):
        replicas = rng.choice((2, 4, 8, 16, 32))
        gpus = rng.choice((2, 4, 4, 4))
        label = rng.choice((CLIQUE, RACK, BLOCK))
        segmented = label != CLIQUE and replicas >= 8 and rng.random() < 0.5
        across = AcrossReplicas(
            label, True, 4 if segmented else None, CLIQUE if segmented else None
        )
        out.append(
            Job(
                key=f"bench/g{i}",
                tenant="t",
                replicas=replicas,
                gpus_per_replica=gpus,
                policy=Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED, multi_node=True),
                across=across,
            )
        )
    return out


def _time(pool: Pool, jobs: list[Job]) -> tuple[list[float], int]:
    seconds = []
    placed = 0
    for job in jobs:
        request = Request.of(job)
        started = time.perf_counter()
        result = pool.place_gang(job.key, request)
        seconds.append(time.perf_counter() - started)
        if not isinstance(result, GangFailure):
            placed += 1
            pool.release(job.key)
    return seconds, placed


def run(nodes: int, trials: int, decisions: int, busy: float, seed: int) -> dict[str, Any]:
    levelled: list[float] = []
    flat: list[float] = []
    placed_levelled = placed_flat = 0
    for trial in range(trials):
        rng = random.Random(seed + trial)
        cluster, down = build_nodes(nodes, busy, rng)
        jobs = gangs(decisions, rng)
        gc.collect()
        gc.disable()
        try:
            seconds, placed = _time(Pool(cluster, [], LEVELS, down), jobs)
            levelled.extend(seconds)
            placed_levelled += placed
            seconds, placed = _time(Pool(cluster, []), jobs)
            flat.extend(seconds)
            placed_flat += placed
        finally:
            gc.enable()
    p99 = percentile_ms(levelled, 0.99)
    flat_p99 = percentile_ms(flat, 0.99)
    return {
        "nodes": nodes,
        "gpus": nodes * 4,
        "trials": trials,
        "decisions": len(levelled),
        "busy_share": busy,
        "levels_p50_ms": percentile_ms(levelled, 0.5),
        "levels_p99_ms": p99,
        "levels_placed": placed_levelled,
        "flat_p50_ms": percentile_ms(flat, 0.5),
        "flat_p99_ms": flat_p99,
        "flat_placed": placed_flat,
        "p99_ratio": round(p99 / flat_p99, 2) if flat_p99 else None,
        "python": platform.python_version(),
    }


@click.command("gangs")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", default=5000, show_default=True, help="Trays of 4 GPUs.")
@click.option("--trials", default=3, show_default=True, help="Clusters drawn.")
@click.option("--decisions", default=200, show_default=True, help="Gangs per cluster.")
@click.option("--busy", default=0.5, show_default=True, help="Share of GPUs busy.")
@click.option("--seed", default=1, show_default=True)
def gangs_bench(
    *, as_json: bool, nodes: int, trials: int, decisions: int, busy: float, seed: int
) -> None:
    """One gang decision over a multi-level cluster (p50 / p99 ms), with and without levels."""
    result = run(nodes, trials, decisions, busy, seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{result['decisions']} gang decisions over {nodes} trays ({result['gpus']} GPUs, "
        f"{busy:.0%} busy), {trials} clusters"
    )
    click.echo(
        f"with levels: p50 {result['levels_p50_ms']} ms, p99 {result['levels_p99_ms']} ms, "
        f"{result['levels_placed']} placed"
    )
    click.echo(
        f"without (own label only): p50 {result['flat_p50_ms']} ms, p99 "
        f"{result['flat_p99_ms']} ms, {result['flat_placed']} placed; p99 ratio "
        f"{result['p99_ratio']}"
    )
