"""``gpusched explain`` on the real control plane: what each node says to a waiting job."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpusched.cli import main
from gpusched.dev.localcluster import LocalCluster
from tests.integration.operator_harness import POOL, POOL_LABEL, Scenario


def _explain(cluster: LocalCluster, key: str) -> dict[str, object]:
    result = CliRunner().invoke(
        main,
        [
            "explain",
            key,
            f"--kubeconfig={cluster.kubeconfig}",
            f"--node-selector={POOL_LABEL}={POOL}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    explanation: dict[str, object] = json.loads(result.output)["explanation"]
    return explanation


def test_explain_names_the_scope_on_a_node_whose_wiring_can_never_meet_it(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    [node] = sc.nodes(1, fixture="pcie-8x-rtx4090-2socket-allsys-2nic")
    _, ns = sc.tenant("pcie", guaranteed=8)
    sc.submit(ns, "filler", 7)
    sc.wait_phase(ns, "filler", "Running")
    # One GPU is free; but no two GPUs of this board share NVLink, busy or not.
    sc.submit(ns, "paired", 2, topology={"scope": "nvlink", "mode": "required"})
    sc.wait_reason(ns, "paired", "NoFeasibleNodes")
    explanation = _explain(local_cluster, f"{ns}/paired")
    [verdict] = [v for v in explanation["nodes"] if v["node"] == node]  # type: ignore[attr-defined]
    assert verdict["reason"] == "ScopeUnsatisfiable", verdict
    assert "nvlink" in verdict["detail"]
    assert verdict["free_gpus"] == 1
