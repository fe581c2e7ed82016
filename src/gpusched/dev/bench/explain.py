"""``gpusched bench explain``: how long the answers to "when will my job start" take at scale.

Over the admission benchmark's busy cluster (default 1,000 nodes, 50 tenants, 10,000 queued
jobs), with predicted ends for running jobs and predicted run times for queued ones, each trial
times, side by side on the same snapshot:

* the admission cycle alone (what every operator cycle does), with one reservation per tenant;
* the cycle plus the forecast of every waiting job's expected start (what the operator does once
  per ``--forecast-interval``, and what it then writes into the jobs' status), with the jobs
  expected to arrive as the operator expects them with ``--forecast-arrivals-window`` set (the
  snapshot's jobs taken as submitted steadily over ``--arrivals-window``, default 12 h, which
  gives the most expected arrivals a forecast plays; the operator's default is off), and the
  same without them beside it;
* the answer the leading operator gives ``gpusched explain`` from that kept cycle, serialised
  as it sends it, for 20 waiting jobs drawn at random;
* the change that would start one of them sooner (each variant a cycle and a play of its own),
  which the CLI asks for after printing the answer;
* ``explain`` decided afresh (what the CLI does with ``--local`` or when no operator answers):
  the cycle, the play until the job is decided, and the change.

The API reads of the CLI's own decision (listing the cluster) and the HTTP hop to the operator
are not included: ``gpusched bench admission-e2e --steady-jobs`` times both on a real control
plane. Figures to record, never assertions.
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
from gpusched.core.admission.arrivals import WINDOW_SECONDS, expected_arrivals
from gpusched.core.admission.explain import counterfactual, describe, explain
from gpusched.dev.bench.admission import Workload, build_snapshot, percentile_ms

#: Waiting jobs explained from each snapshot's kept cycle (the operator's answer).
ASKS_PER_TRIAL = 20


def run(
    workload: Workload, trials: int, seed: int, window: float = WINDOW_SECONDS
) -> dict[str, Any]:
    cycle_s: list[float] = []
    forecast_s: list[float] = []
    alone_s: list[float] = []
    arrivals: list[int] = []
    answer_s: list[float] = []
    sooner_s: list[float] = []
    explain_s: list[float] = []
    reservations: list[int] = []
    known: list[float] = []
    counterfactuals = 0
    rng = random.Random(seed)
    for trial in range(trials):
        snapshot = build_snapshot(workload, seed + trial)
        snapshot = replace(snapshot, config=CycleConfig(reservations_per_tenant=1))
        # The snapshot's jobs taken as submitted steadily over the window: as many expected
        # arrivals as the operator would play at most (the cap), the costliest case.
        n = len(snapshot.jobs)
        steady = [
            replace(j, submitted_at=snapshot.now - window * (i + 0.5) / n)
            for i, j in enumerate(snapshot.jobs)
        ]
        expected = expected_arrivals(steady, snapshot.now, window)
        arrivals.append(len(expected))
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = Cycle(snapshot).run()
            cycle_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            alone = Cycle(snapshot)
            alone.run()
            alone.forecast()
            alone_s.append(time.perf_counter() - started)
            snapshot = replace(snapshot, arrivals=expected)
            started = time.perf_counter()
            cycle = Cycle(snapshot)
            cycle.run()
            forecast = cycle.forecast()
            kept = cycle.result()
            forecast_s.append(time.perf_counter() - started)
            waiting = [w.job for w in result.waiting]
            for key in rng.sample(waiting, min(ASKS_PER_TRIAL, len(waiting))):
                started = time.perf_counter()
                json.dumps(describe(cycle, kept, key, snapshot.now).to_dict(), default=str)
                answer_s.append(time.perf_counter() - started)
            key = rng.choice(waiting)
            told = describe(cycle, kept, key, snapshot.now)
            started = time.perf_counter()
            counterfactual(snapshot, cycle.jobs[key], told.expected_start)
            sooner_s.append(time.perf_counter() - started)
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
        "cycle_and_forecast_without_arrivals_p50_ms": percentile_ms(alone_s, 0.5),
        "cycle_and_forecast_without_arrivals_p99_ms": percentile_ms(alone_s, 0.99),
        "expected_arrivals": round(sum(arrivals) / len(arrivals), 1),
        "answer_p50_ms": percentile_ms(answer_s, 0.5),
        "answer_p99_ms": percentile_ms(answer_s, 0.99),
        "sooner_p50_ms": percentile_ms(sooner_s, 0.5),
        "sooner_p99_ms": percentile_ms(sooner_s, 0.99),
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
@click.option(
    "--arrivals-window",
    type=float,
    default=WINDOW_SECONDS,
    show_default=True,
    help="Seconds of submissions expected again ahead (the operator's "
    "--forecast-arrivals-window; 0: none).",
)
def explain_bench(
    *,
    as_json: bool,
    nodes: int,
    tenants: int,
    queued: int,
    trials: int,
    seed: int,
    arrivals_window: float,
) -> None:
    """Expected starts at scale: cycle, cycle + forecast, explain (p50 / p99 ms)."""
    workload = Workload(nodes, tenants, queued, runtimes=True)
    total = trials
    result = run(workload, total, seed, arrivals_window)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{queued} queued jobs, {tenants} tenants, {nodes} nodes, {trials} snapshots; "
        f"{result['reservations_per_cycle']} reservations per cycle, "
        f"{result['share_with_expected_start']:.0%} of waiting jobs with an expected start"
    )
    for name, text in (
        ("cycle", "cycle"),
        ("cycle_and_forecast", "cycle and forecast (the operator, every --forecast-interval)"),
        ("cycle_and_forecast_without_arrivals", "the same expecting nothing to arrive"),
        ("answer", "explain answered from the kept cycle (the operator's answer)"),
        ("sooner", "the change that starts a job sooner (asked apart)"),
        ("explain", "explain decided afresh (the CLI's --local: cycle, play, change)"),
    ):
        click.echo(f"{text}: p50 {result[name + '_p50_ms']} ms, p99 {result[name + '_p99_ms']} ms")
