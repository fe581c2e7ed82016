"""The admission benchmark runs end to end on a small workload and reports its figures."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpusched.core.admission import JobState, run_cycle
from gpusched.dev.bench.admission import Workload, admission, build_snapshot


def test_benchmark_snapshot_is_busy_and_deterministic() -> None:
    workload = Workload(nodes=40, tenants=4, queued=200)
    first = build_snapshot(workload, seed=3)
    again = build_snapshot(workload, seed=3)
    assert [j.key for j in first.jobs] == [j.key for j in again.jobs]
    running = [j for j in first.jobs if j.state is JobState.ADMITTED]
    held = sum(j.total_gpus for j in running)
    assert 0.7 * 8 * 40 <= held <= 8 * 40
    assert sum(1 for j in first.jobs if j.state is JobState.QUEUED) == 200
    assert run_cycle(first).admissions == run_cycle(again).admissions


def test_benchmark_command_prints_cycle_percentiles() -> None:
    result = CliRunner().invoke(
        admission, ["--json", "--nodes", "40", "--tenants", "4", "--jobs", "200", "--trials", "2"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["queued_jobs"] == 200
    assert figures["cycle_p50_ms"] > 0
    assert figures["cycle_p99_ms"] >= figures["cycle_p50_ms"]
