"""``--lending-hold-seconds`` on the real control plane: a tenant that just asked for GPUs keeps
as many idle GPUs of its guarantee from borrowers, and the operator lends them once the tenant
has been quiet that long (docs/quotas.md, "Lending after a burst";
``tests/unit/core/test_lending_hold.py`` decides the same rule from snapshots)."""

from __future__ import annotations

import time
from datetime import datetime

from gpusched.dev.localcluster import LocalCluster
from tests.integration.operator_harness import OperatorProcess, Scenario

HOLD = 45


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_borrower_waits_for_the_gpus_a_lender_just_asked_for_then_gets_them(
    sc: Scenario, operator: OperatorProcess, local_cluster: LocalCluster
) -> None:
    sc.nodes(1)
    lender, lender_ns = sc.tenant("lender", guaranteed=8)
    _, borrower_ns = sc.tenant("borrower", guaranteed=0)
    operator.kill()  # the module's operator lends at the default hold; this one's is short
    held = OperatorProcess(local_cluster)
    held.start(extra=[f"--lending-hold-seconds={HOLD}"])
    try:
        asked = time.time()
        sc.submit(lender_ns, "first", 2)
        sc.wait_phase(lender_ns, "first", "Running", timeout=30)
        # 6 GPUs idle, 2 of them kept for the lender: a 6-GPU borrower waits.
        sc.submit(borrower_ns, "big", 6, grace=2)
        waiting = sc.wait_reason(borrower_ns, "big", "HeldForLenders", timeout=30)
        assert waiting["phase"] == "Queued"
        assert "kept for tenants that asked for GPUs" in waiting["message"]
        assert f"({lender} 2)" in waiting["message"]

        running = sc.wait_phase(borrower_ns, "big", "Running", timeout=HOLD + 60)
        # The hold counts from the lender job's creation (whole seconds, so up to 1 s early).
        assert _time(running["startedAt"]).timestamp() - asked >= HOLD - 1
        # Lent, not taken: the lender's job runs on.
        assert sc.status(lender_ns, "first")["phase"] == "Running"
        assert not sc.status(lender_ns, "first").get("preemptions")
    finally:
        held.kill()
