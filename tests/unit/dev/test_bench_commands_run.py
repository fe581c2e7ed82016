"""Every benchmark that runs in-process prints its figures, as text and as JSON, at a tiny size.

The text report is what docs/benchmarks.md tells a reader to run (`gpusched bench admission
--trials 5`), but tests of a benchmark usually read its ``--json`` object only: a figure renamed
in the JSON and not in the text report once made the plain command crash after all its work
(a KeyError at the last line). Each command runs here both ways on a workload small enough for
the unit suite; the benchmarks that start a local cluster are left to their integration tests.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from gpusched.cli import main

#: The smallest arguments that still take each benchmark through all of its stages.
IN_PROCESS: dict[str, list[str]] = {
    "placement": [
        *("--states", "1", "--nodes", "20"),
        *("--arrivals", "20", "--heuristic-samples", "2"),
    ],
    "gangs": ["--nodes", "40", "--trials", "1", "--decisions", "3"],
    "extender": ["--nodes", "20", "--iterations", "3"],
    "admission": ["--nodes", "12", "--tenants", "3", "--jobs", "40", "--trials", "1"],
    "operator-cycle": ["--nodes", "12", "--tenants", "3", "--jobs", "40", "--trials", "1"],
    "explain": ["--nodes", "12", "--tenants", "3", "--jobs", "40", "--trials", "1"],
}

#: Benchmarks that start a local control plane (tests/integration runs them).
ON_A_CLUSTER = {
    "admission-e2e",
    "apiserver-cost",
    "kueue-scenario",
    "node-agent",
    "probe",
    "scheduling",
}


def test_every_benchmark_is_run_here_or_needs_a_cluster() -> None:
    bench = main.get_command(click.Context(main), "bench")
    assert isinstance(bench, click.Group)
    names = set(bench.list_commands(click.Context(bench)))
    assert names == set(IN_PROCESS) | ON_A_CLUSTER


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_the_text_report_prints_without_error(name: str) -> None:
    result = CliRunner().invoke(main, ["bench", name, *IN_PROCESS[name]])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert len(result.output.splitlines()) >= 3, result.output


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_the_json_report_is_one_object(name: str) -> None:
    result = CliRunner().invoke(main, ["bench", name, "--json", *IN_PROCESS[name]])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert isinstance(json.loads(result.output), dict)
