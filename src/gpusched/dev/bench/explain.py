"""``gpusched bench explain``: how long the answers to "when will my job start" take at scale.

Over the admission benchmark's busy cluster (default 1,000 nodes, 50 tenants, 10,000 queued
jobs), with predicted ends for running jobs and predicted run times for queued ones, each trial
times, side by side on the same snapshot:

* the admission cycle alone (what every operator cycle does), with one reservation per tenant;
* the cycle plus the forecast of every waiting job's expected start (what the operator does once
  per ``--forecast-interval``, and what it then writes into the jobs' status);
* ``explain`` of one waiting job drawn at random: the cycle, the forecast and the
  counterfactual (each variant of the job is one more cycle and forecast).

The API reads ``gpusched explain`` makes before (listing the cluster) are not included: they
depend on the API server, not on gpusched (see ``bench apiserver-cost``). Figures to record,
never assertions.
"""

from __future__ import annotations

import gc
import json
import platform
import random
import time
from dataclasses import replace
from typing import Any

import click

from gpusched.core.admission import Cycle, CycleConfig
from gpusched.core.admission.explain import explain
from gpusched.dev.bench.admission import Workload, build_snapshot, percentile_ms


def run(workload: Workload, trials: int, seed: int) -> dict[str, Any]:
    cycle_s: list[float] = []
    forecast_s: list[float] = []
    explain_s: list[float] = []
    reservations: list[int] = []
    known: list[float] = []
    counterfactuals = 0
    rng = random.Random(seed)
    for trial in range(trials):
        snapshot = build_snapshot(workload, seed + trial)
        snapshot = replace(snapshot, config=CycleConfig(reservations_per_tenant=1))
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = Cycle(snapshot).run()
            cycle_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            cycle = Cycle(snapshot)
            cycle.run()
            forecast = cycle.forecast()
            forecast_s.append(time.perf_counter() - started)
            waiting = [w.job for w in result.waiting]
            key = rng.choice(waiting)
            started = time.perf_counter()
            answer = explain(snapshot, key)
            explain_s.append(time.perf_counter() - started)
        finally:
            gc.enable()
        reservations.append(len(result.reservations))
        known.append(sum(1 for v in forecast.values() if v is not None) / max(1, len(forecast)))
        counterfactuals += answer.counterfactual is not None

    return {
        "nodes": workload.nodes,
        "tenants": workload.tenants,
        "queued_jobs": workload.queued,
        "trials": trials,
        "cycle_p50_ms": percentile_ms(cycle_s, 0.5),
        "cycle_p99_ms": percentile_ms(cycle_s, 0.99),
        "cycle_and_forecast_p50_ms": percentile_ms(forecast_s, 0.5),
        "cycle_and_forecast_p99_ms": percentile_ms(forecast_s, 0.99),
        "explain_p50_ms": percentile_ms(explain_s, 0.5),
        "explain_p99_ms": percentile_ms(explain_s, 0.99),
        "reservations_per_cycle": round(sum(reservations) / len(reservations), 1),
        "share_with_expected_start": round(sum(known) / len(known), 3),
        "explains_with_counterfactual": counterfactuals,
        "python": platform.python_version(),
    }


@click.command("explain")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", default=1000, show_default=True)
@click.option("--tenants", default=50, show_default=True)
@click.option("--jobs", "queued", default=10_000, show_default=True, help="Queued jobs.")
@click.option("--trials", default=10, show_default=True, help="Snapshots (one of each per trial).")
@click.option("--seed", default=1, show_default=True)
def explain_bench(
    *, as_json: bool, nodes: int, tenants: int, queued: int, trials: int, seed: int
) -> None:
    """Expected starts at scale: cycle, cycle + forecast, explain (p50 / p99 ms)."""
    workload = Workload(nodes, tenants, queued, runtimes=True)
    total = trials
    result = run(workload, total, seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{queued} queued jobs, {tenants} tenants, {nodes} nodes, {trials} snapshots; "
        f"{result['reservations_per_cycle']} reservations per cycle, "
        f"{result['share_with_expected_start']:.0%} of waiting jobs with an expected start"
    )
    for name in ("cycle", "cycle_and_forecast", "explain"):
        click.echo(
            f"{name.replace('_', ' ')}: p50 {result[name + '_p50_ms']} ms, "
            f"p99 {result[name + '_p99_ms']} ms"
        )
