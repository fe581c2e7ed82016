"""The README's demo runs end to end and tears its cluster down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpusched.dev.localcluster import LocalCluster, default_state_dir


def test_demo_runs_the_examples_and_cleans_up() -> None:
    name = f"e2e-demo-{os.getpid()}"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpusched", "demo", "--name", name, "--no-wait"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        # Should the demo be killed (timeout), its cluster's processes live on in their own
        # process groups: stop them so they do not load the rest of the run.
        if (default_state_dir(name) / "state.json").exists():
            LocalCluster.attach(default_state_dir(name)).down()
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    # The probes published the fixtures' wiring.
    assert "NVIDIA A100-SXM4-80GB" in out
    # The extender put 2 GPUs on a bridged pair and explained the unsatisfiable request.
    pair = next(line for line in out.splitlines() if line.startswith("pod/pair:"))
    assert "(nvlink)" in pair
    assert "ScopeUnsatisfiable" in out
    # The failed GPU was reported and avoided.
    assert "GPU 5: Unhealthy (Xid79" in out
    assert "pod/rest: node a100-0, GPUs 4,6,7" in out
    # A real kubelet gave the container exactly its annotated GPUs; a stolen set was refused by
    # the API server, and a pod bound by hand got none of the reserved GPUs.
    assert "the container holds 4 GPUs, the same set" in out
    assert "NVIDIA_VISIBLE_DEVICES=GPU-" in out
    assert "pod-gpu-ownership" in out
    assert "got 2 GPUs from the node agent: none of trainer's" in out
    # The operator admitted, placed and preempted.
    assert "PreemptedBy" in out
    assert "WithinGuarantee" in out
    assert "export KUBECONFIG=" in out
    state_dir = Path(out.split("export KUBECONFIG=")[1].split()[0]).parent
    assert LocalCluster.attach(state_dir).status() == {}
