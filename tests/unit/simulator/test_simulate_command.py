"""``gpusched simulate`` end to end on a small trace in the generic format: every policy in one
report, a what-if diff, and clear refusals of bad invocations."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpusched.commands.simulate import simulate
from gpusched.simulator.model import TraceJob
from gpusched.simulator.trace import write_trace

JOBS = tuple(
    TraceJob(
        f"j{i}",
        float(i * 30),
        600.0 + 37 * i,
        1 + (i % 3 == 0),
        [1, 2, 4, 8][i % 4],
        f"team-{i % 2}",
        priority=i % 2,
    )
    for i in range(24)
)


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.jsonl"
    write_trace(JOBS, path)
    return path


def test_simulate_writes_one_report_with_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(_trace(tmp_path)),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=2,pcie-8x-rtx4090-2socket-allsys-2nic=2",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    policies = [f["policy"] for f in data["figures"]]
    assert policies == ["gpusched", "kube-default", "kueue-like", "best-fit"]
    assert all(f["jobs"]["finished"] == len(JOBS) for f in data["figures"])
    report = (out / "report.md").read_text()
    assert "gpusched simulate --trace" in report
    for png in ("jct_cdf.png", "allocation.png"):
        assert (out / png).is_file()


def test_a_what_if_run_is_diffed_against_the_base(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(_trace(tmp_path)),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=1",
            "--what-if-nodes",
            "hgx-h100-sxm-8gpu-8nic=4",
            "--policies",
            "gpusched,best-fit",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["baseline"]["parameters"]["capacity"] == [8]
    assert data["parameters"]["capacity"] == [32]
    assert "## What-if" in (out / "report.md").read_text()


def test_bad_invocations_are_refused_saying_why(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    runner = CliRunner()
    no_nodes = runner.invoke(simulate, ["--trace", trace, "--out", str(tmp_path / "o")])
    assert no_nodes.exit_code != 0
    assert "give --nodes" in no_nodes.output
    bad_policy = runner.invoke(
        simulate, ["--trace", trace, "--nodes", "hgx-h100-sxm-8gpu-8nic=1", "--policies", "slurm"]
    )
    assert bad_policy.exit_code != 0
    assert "unknown policies ['slurm']" in bad_policy.output
    demand = runner.invoke(
        simulate, ["--trace", trace, "--nodes", "hgx-h100-sxm-8gpu-8nic=1", "--demand", "1.3"]
    )
    assert demand.exit_code != 0
    assert "--demand is the FGD experiment" in demand.output
