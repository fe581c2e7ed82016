"""``gpusched simulate`` end to end on a small trace in the generic format: every policy in one
report, a what-if diff, and clear refusals of bad invocations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


def _refused_in_one_line(args: list[str], *said: str) -> None:
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    for words in said:
        assert words in error, error


@pytest.mark.parametrize("option", ["--quotas", "--what-if-quotas"])
def test_a_quota_file_that_is_no_manifest_is_one_error_line(tmp_path: Path, option: str) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("just a string\n")
    args = ["--trace", str(_trace(tmp_path)), "--nodes", "hgx-h100-sxm-8gpu-8nic=1"]
    _refused_in_one_line(
        [*args, option, str(quotas), "--out", str(tmp_path / "out")],
        str(quotas),
        "not a TenantQuota manifest",
    )
    assert not (tmp_path / "out").exists(), "refused before anything was replayed"


def test_a_bad_what_if_node_pool_is_one_error_line(tmp_path: Path) -> None:
    args = ["--trace", str(_trace(tmp_path)), "--nodes", "hgx-h100-sxm-8gpu-8nic=1"]
    _refused_in_one_line(
        [*args, "--what-if-nodes", "garbage", "--out", str(tmp_path / "out")],
        "node pool entry 'garbage'",
    )


def test_an_out_directory_that_cannot_be_made_is_one_error_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = ["--trace", str(_trace(tmp_path)), "--nodes", "hgx-h100-sxm-8gpu-8nic=1"]
    _refused_in_one_line(
        [*args, "--out", str(blocker / "out")], f"--out {blocker / 'out'}: cannot make"
    )


def test_a_report_that_cannot_be_written_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that exists but refuses files (permissions, a full disk) fails only when
    the report is written."""
    from gpusched.commands import simulate as command

    def refuses(*_args: object, **_kwargs: object) -> Path:
        raise PermissionError(13, "Permission denied", str(tmp_path / "out" / "report.md"))

    monkeypatch.setattr(command, "write_report", refuses)
    args = ["--trace", str(_trace(tmp_path)), "--nodes", "hgx-h100-sxm-8gpu-8nic=1"]
    _refused_in_one_line(
        [*args, "--policies", "gpusched", "--out", str(tmp_path / "out")],
        "cannot write the report",
        "Permission denied",
    )


def _quota(name: str, guaranteed: int, *namespaces: str) -> str:
    return (
        "apiVersion: gpusched.io/v1alpha1\nkind: TenantQuota\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{guaranteedGpus: {guaranteed}, namespaces: [{', '.join(namespaces)}]}}\n"
    )


def test_what_if_quotas_own_the_trace_namespaces_not_the_base_quotas_tenants(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(_quota("first", 8, "team-0") + "---\n" + _quota("second", 8, "team-1"))
    changed = tmp_path / "changed.yaml"
    changed.write_text(_quota("merged", 16, "team-0", "team-1"))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(_trace(tmp_path)),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=2",
            "--quotas",
            str(base),
            "--what-if-quotas",
            str(changed),
            "--policies",
            "gpusched",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert [t["name"] for t in data["baseline"]["parameters"]["tenants"]] == ["first", "second"]
    assert [t["name"] for t in data["parameters"]["tenants"]] == ["merged"]
    (figures,) = data["figures"]
    assert figures["jobs"]["finished"] == len(JOBS), figures["jobs"]


def test_a_what_if_node_pool_gets_its_own_equal_shares_and_keeps_the_network(
    tmp_path: Path,
) -> None:
    topo = tmp_path / "topo.csv"
    topo.write_text(
        "ip,DSW,PSW,ASW\n" + "".join(f"10.0.0.{i},core,agg-{i % 2},leaf-{i}\n" for i in range(8))
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(_trace(tmp_path)),
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=2",
            "--network",
            str(topo),
            "--what-if-nodes",
            "hgx-h100-sxm-8gpu-8nic=4",
            "--policies",
            "gpusched",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    base_tenants = data["baseline"]["parameters"]["tenants"]
    assert [t["guaranteed"] for t in base_tenants] == [8, 8]
    assert [t["guaranteed"] for t in data["parameters"]["tenants"]] == [16, 16]
    (cluster,) = data["parameters"]["cluster"]
    assert cluster.endswith(f"on {tmp_path.name}"), cluster


def test_philly_what_if_quotas_on_a_what_if_pool_are_the_quotas_of_the_file(
    tmp_path: Path, traces_dir: Path
) -> None:
    changed = tmp_path / "changed.yaml"
    changed.write_text(_quota("everyone", 64, "6214e9", "11cb48", "6c71a0"))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        simulate,
        [
            "--trace",
            "philly",
            "--traces-dir",
            str(traces_dir),
            "--limit",
            "30",
            "--nodes",
            "hgx-h100-sxm-8gpu-8nic=4",
            "--what-if-nodes",
            "hgx-h100-sxm-8gpu-8nic=8",
            "--what-if-quotas",
            str(changed),
            "--policies",
            "best-fit",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["parameters"]["capacity"] == [64]
    assert [t["name"] for t in data["parameters"]["tenants"]] == ["everyone"]


def test_limit_replays_only_the_first_pods_of_openb(tmp_path: Path, traces_dir: Path) -> None:
    out = tmp_path / "out"
    args = ["--trace", "openb", "--traces-dir", str(traces_dir), "--policies", "best-fit"]
    result = CliRunner().invoke(simulate, [*args, "--limit", "50", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["parameters"]["jobs"] == 50
    assert data["figures"][0]["jobs"]["total"] == 50


def test_a_limit_that_selects_nothing_or_meets_the_fgd_demand_is_refused(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "out")]
    trace = ["--trace", str(_trace(tmp_path)), "--nodes", "hgx-h100-sxm-8gpu-8nic=1", *out]
    for bad in ("0", "-5"):
        result = CliRunner().invoke(simulate, [*trace, "--limit", bad])
        assert result.exit_code == 2, result.output
        assert "--limit" in result.output
    fgd = CliRunner().invoke(
        simulate, ["--trace", "openb", "--demand", "1.3", "--limit", "9", *out]
    )
    assert fgd.exit_code == 2, fgd.output
    assert "--limit does not apply to the FGD experiment" in fgd.output
    assert not (tmp_path / "out").exists(), "refused before anything was replayed"
