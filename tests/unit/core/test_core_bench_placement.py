"""The placement benchmark runs end to end and its quality figures hold (timings unchecked)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from core_testdata import fixtures_dir

from gpusched.cli import main


def test_benchmark_reports_every_figure_and_is_optimal_against_brute_force() -> None:
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "placement",
            "--json",
            "--fixtures",
            str(fixtures_dir()),
            "--states",
            "2",
            "--nodes",
            "300",
            "--arrivals",
            "150",
            "--heuristic-samples",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for key in (
        "cases",
        "optimal_fraction",
        "vs_gpuallocator",
        "vs_firstfit",
        "per_node_p99_ms",
        "prioritize_5000_nodes_ms",
        "fragmentation",
    ):
        assert key in figures
    assert figures["optimal_fraction"] == 1.0
    assert figures["vs_gpuallocator"]["worse"] == 0
    assert figures["vs_firstfit"]["worse"] == 0
    assert set(figures["fragmentation"]) >= {"gpusched", "firstfit", "gpuallocator"}
