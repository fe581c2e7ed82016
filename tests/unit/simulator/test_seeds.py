"""``gpusched simulate --seeds``: every policy replayed under each seed, each seed's report as a
run with ``--seed`` alone writes it, and a summary whose figures are checked against the
per-job records of each seed, worked out here."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from click.testing import CliRunner

from gpusched.commands.simulate import simulate
from gpusched.simulator.figures import Figures
from gpusched.simulator.model import TraceJob
from gpusched.simulator.seeds import SeedFigure, summarise
from gpusched.simulator.trace import write_trace

HOUR = 3600.0
# Philly's first jobs on three nodes: they queue, so the seed's priorities change the replay.
SLICE = ["--trace", "philly", "--limit", "300", "--nodes", "hgx-a100-sxm4-80gb-8gpu-8nic=3"]
POLICIES = ["--policies", "gpusched,best-fit"]


def _jobs(directory: Path, policy: str) -> list[dict[str, str]]:
    with (directory / f"jobs-{policy}.csv").open() as f:
        return list(csv.DictReader(f))


def _truth(rows: list[dict[str, str]]) -> dict[str, float]:
    """Figures of one replay worked out from its per-job records."""
    finished = [r for r in rows if r["end_s"]]
    started = [r for r in rows if r["first_start_s"]]

    def waited(low: int, high: int) -> float:
        waits = [
            float(r["first_start_s"]) - float(r["submit_s"])
            for r in started
            if low <= int(r["gpus"]) <= high
        ]
        return sum(waits) / len(waits) / HOUR

    return {
        "mean JCT (h)": sum(float(r["end_s"]) - float(r["submit_s"]) for r in finished)
        / len(finished)
        / HOUR,
        "queueing, 1 GPU (mean h)": waited(1, 1),
        "queueing, 5-8 GPUs (mean h)": waited(5, 8),
        "preemptions": float(sum(int(r["preemptions"]) for r in rows)),
        "makespan (h)": (
            max(float(r["end_s"]) for r in finished) - min(float(r["submit_s"]) for r in rows)
        )
        / HOUR,
    }


def test_each_seed_is_replayed_as_a_run_of_that_seed_alone_and_summarised_from_its_records(
    tmp_path: Path, traces_dir: Path
) -> None:
    out = tmp_path / "seeds"
    result = CliRunner().invoke(
        simulate, [*SLICE, *POLICIES, "--seeds", "0,1", "--workers", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    alone = tmp_path / "alone"
    result = CliRunner().invoke(simulate, [*SLICE, *POLICIES, "--seed", "1", "--out", str(alone)])
    assert result.exit_code == 0, result.output

    def figures(directory: Path) -> list[dict[str, Any]]:
        data = json.loads((directory / "results.json").read_text())
        return [{k: v for k, v in f.items() if k != "cpu_seconds"} for f in data["figures"]]

    assert figures(out / "seed-1") == figures(alone)
    report = (out / "seed-1" / "report.md").read_text()
    assert f"--seed 1 --out {out / 'seed-1'}" in report

    summary = json.loads((out / "seeds.json").read_text())
    assert summary["seeds"] == [0, 1]
    assert summary["policies"] == ["gpusched", "best-fit"]
    truth = {
        policy: [_truth(_jobs(out / f"seed-{s}", policy)) for s in (0, 1)]
        for policy in ("gpusched", "best-fit")
    }
    # The slice is one where the seed matters, or a mix-up of seeds would go unseen.
    assert truth["gpusched"][0]["mean JCT (h)"] != truth["gpusched"][1]["mean JCT (h)"]
    for policy, per_seed in truth.items():
        for name in per_seed[0]:
            got = summary["figures"][policy][name]
            expected = [t[name] for t in per_seed]
            assert got["values"] == pytest.approx(expected), (policy, name)
            assert got["mean"] == pytest.approx(sum(expected) / 2)
            assert (got["low"], got["high"]) == pytest.approx((min(expected), max(expected)))
    for name in truth["gpusched"][0]:
        first = [t[name] for t in truth["gpusched"]]
        other = [t[name] for t in truth["best-fit"]]
        diff = summary["differences"]["best-fit"][name]
        assert diff["values"] == pytest.approx([b - a for a, b in zip(first, other, strict=True)])
        # Every one of these figures is better lower.
        assert diff["better"] == sum(1 for a, b in zip(first, other, strict=True) if b < a)
        assert diff["worse"] == sum(1 for a, b in zip(first, other, strict=True) if b > a)
    text = (out / "seeds.md").read_text()
    assert "## gpusched" in text
    assert "## Against gpusched, seed by seed" in text


def _fig(policy: str, x: float | None) -> Figures:
    return cast(Figures, SimpleNamespace(policy=policy, x=x))


def test_a_difference_counts_as_better_by_each_figures_own_sense() -> None:
    lower = SeedFigure("lower", lambda f: cast(Any, f).x, "lower", 1)
    higher = SeedFigure("higher", lambda f: cast(Any, f).x, "higher", 1)
    runs = {
        0: [_fig("a", 10.0), _fig("b", 8.0)],
        1: [_fig("a", 10.0), _fig("b", 12.0)],
        2: [_fig("a", 10.0), _fig("b", 7.0)],
        3: [_fig("a", None), _fig("b", 7.0)],
    }
    summary = summarise(runs, (lower, higher))
    spread = summary.spreads["b"]["lower"]
    assert spread.values == (8.0, 12.0, 7.0, 7.0)
    assert spread.mean == pytest.approx(8.5)
    assert (spread.low, spread.high) == (7.0, 12.0)
    assert summary.spreads["a"]["lower"].mean == pytest.approx(10.0)  # the seed without it left out
    d = summary.differences["b"]["lower"]
    assert d.values == (-2.0, 2.0, -3.0, None)
    assert d.mean == pytest.approx(-1.0)
    assert (d.better, d.worse) == (2, 1)
    assert (
        summary.differences["b"]["higher"].better,
        summary.differences["b"]["higher"].worse,
    ) == (
        1,
        2,
    )
    assert "a" not in summary.differences


def test_seeds_that_replayed_different_policies_are_not_summarised() -> None:
    with pytest.raises(ValueError, match="seed 1 replayed"):
        summarise({0: [_fig("a", 1.0)], 1: [_fig("b", 1.0)]})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "0,x"], "whole numbers"),
        (["--seeds", "1,1"], "each seed once"),
        (["--seeds", ","], "at least one seed"),
        (["--seeds", "0,1", "--seed", "3"], "--seed or --seeds"),
        (["--workers", "2"], "use it with --seeds"),
        (["--seeds", "0,1", "--what-if-nodes", "hgx-h100-sxm-8gpu-8nic=1"], "not what-ifs"),
    ],
)
def test_bad_seed_options_are_refused_saying_why(
    tmp_path: Path, args: list[str], message: str
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("id,submit,duration,gpus\n")
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(trace),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=1",
            *args,
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_run_without_seeds_names_no_seed_on_its_lines(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.jsonl"
    write_trace(
        (TraceJob("j1", 0.0, 600.0, 1, 1, "team"), TraceJob("j2", 10.0, 600.0, 1, 2, "team")),
        trace,
    )
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(trace),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=1",
            "--policies",
            "gpusched,best-fit",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "gpusched: replayed in" in result.stderr
    assert "(seed" not in result.stderr
    assert ", seed " not in result.stderr
