"""The expected-start accuracy figure on hand-built jobs, every value worked out by hand, and its
place in the report (table, plot, results.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.simulator.figures import (
    EstimateAccuracy,
    Figures,
    Series,
    estimate_accuracy,
    estimate_error,
    estimate_within,
    figures,
)
from gpusched.simulator.report import write_report
from tests.unit.simulator.estimate_testdata import ESTIMATED
from tests.unit.simulator.sim_testdata import run

H = 3600.0


def test_the_tolerance_is_an_hour_or_a_quarter_of_the_wait_remaining_when_told() -> None:
    within = {j.id: estimate_within(j) for j in ESTIMATED}
    assert within == {
        "e1": True,
        "e2": False,
        "e3": True,
        "e4": False,
        "e5": True,  # |3600 - 100| = 3500 <= 3600 (judged by the figure only if it waited > 1 h)
        "e6": None,
        "e7": None,
        "e8": True,
    }
    errors = {j.id: estimate_error(j) for j in ESTIMATED}
    assert errors == {
        "e1": 1800,
        "e2": 20000,
        "e3": -6000,
        "e4": -8000,
        "e5": 3500,
        "e6": None,
        "e7": None,
        "e8": 3600,
    }


def test_accuracy_counts_only_long_waits_that_were_told_an_expected_start() -> None:
    e = estimate_accuracy(ESTIMATED)
    assert (e.estimated, e.long_waits, e.judged, e.within) == (7, 6, 5, 3)
    assert e.share == pytest.approx(3 / 5)
    assert e.share_of_long_waits == pytest.approx(3 / 6)
    # Judged errors sorted: -8000, -6000, 1800, 3600, 20000; nearest rank of 5 values:
    # p10 rank 1, p25 rank 2, p50 rank 3, p75 rank 4, p90 rank 5.
    assert e.error_percentiles == ((10, -8000), (25, -6000), (50, 1800), (75, 3600), (90, 20000))
    assert e.error(50) == 1800
    assert e.error_cdf == Series((-8000, -6000, 1800, 3600, 20000), (0.2, 0.4, 0.6, 0.8, 1.0))


def test_a_policy_that_tells_nothing_has_no_accuracy_not_zero() -> None:
    e = figures(run()).estimates
    assert (e.estimated, e.judged, e.within, e.share) == (0, 0, 0, None)
    assert e.error_percentiles == tuple((p, None) for p in (10, 25, 50, 75, 90))


def test_the_figures_of_a_run_hold_its_accuracy_and_round_trip_through_json() -> None:
    f = figures(run(jobs=ESTIMATED))
    assert f.estimates == estimate_accuracy(ESTIMATED)
    assert Figures.from_json(json.loads(json.dumps(f.to_json()))) == f
    # A results.json written before the figure existed reads back as "told nothing".
    older = f.to_json()
    del older["estimates"]
    assert Figures.from_json(older).estimates == EstimateAccuracy.from_json(None)
    assert Figures.from_json(older).estimates.estimated == 0


def test_the_report_tables_and_plots_the_accuracy_of_policies_that_tell(tmp_path: Path) -> None:
    runs = [run("gpusched", jobs=ESTIMATED), run("best-fit")]
    md = write_report(runs, tmp_path, command="c", title="t").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| gpusched | 7 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        "gpusched",
        "7",
        "6",
        "5",
        "3 (60.0; 50.0)",
        " / ".join(f"{v / H:.2f}" for v in (-8000, -6000, 1800, 3600, 20000)),
    ]
    assert "No expected starts from: best-fit." in md
    assert "![Expected start error (CDF)](estimate_error.png)" in md
    assert (tmp_path / "estimate_error.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["figures"][0]["estimates"]["within"] == 3
    assert data["figures"][1]["estimates"]["judged"] == 0


def test_no_plot_when_no_policy_tells(tmp_path: Path) -> None:
    md = write_report([run("best-fit")], tmp_path, command="c", title="t").read_text()
    assert "No policy told jobs an expected start." in md
    assert not (tmp_path / "estimate_error.png").exists()
