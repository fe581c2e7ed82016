"""The README's demo runs end to end and tears its cluster down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpusched.localcluster import LocalCluster


def test_demo_runs_the_examples_and_cleans_up() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpusched", "demo", "--name", "e2e-demo", "--no-wait"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "kubectl get gpujobs -A" in out
    for job in ("finetune-llama", "pretrain-vit", "sweep-lr-0001"):
        assert job in out
    assert "export KUBECONFIG=" in out
    state_dir = Path(out.split("export KUBECONFIG=")[1].split()[0]).parent
    assert LocalCluster.attach(state_dir).status() == {}
