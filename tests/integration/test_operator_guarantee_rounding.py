"""``--guarantee-rounding=up`` on the real control plane: a tenant two GPUs short of its
guarantee gets its next 8-GPU job started by taking a node's borrowers back (docs/quotas.md,
"Guarantees in whole jobs"); rounded down, the default, the same job would wait among
borrowers (`tests/unit/core/test_guarantee_rounding.py` decides both from the same cluster)."""

from __future__ import annotations

from gpusched.dev.localcluster import LocalCluster
from tests.integration.operator_harness import OperatorProcess, Scenario


def test_a_job_larger_than_what_is_left_of_the_guarantee_reclaims_when_rounding_up(
    sc: Scenario, operator: OperatorProcess, local_cluster: LocalCluster
) -> None:
    nodes = sc.nodes(2)
    _, owner_ns = sc.tenant("owner", guaranteed=10)
    _, borrower_ns = sc.tenant("borrower", guaranteed=0)
    operator.kill()  # the module's operator rounds down; this test's rounds up
    up = OperatorProcess(local_cluster)
    up.start(extra=["--guarantee-rounding=up"])
    try:
        sc.submit(owner_ns, "first", 8)
        first = sc.wait_phase(owner_ns, "first", "Running", timeout=90)
        full = first["placement"][0]["node"]
        small = [sc.submit(borrower_ns, f"s{i}", 1, grace=2) for i in range(2)]
        for name in small:
            running = sc.wait_phase(borrower_ns, name, "Running", timeout=90)
            assert running["placement"][0]["node"] != full

        sc.submit(owner_ns, "second", 8)
        second = sc.wait_phase(owner_ns, "second", "Running", timeout=90)
        assert {p["node"] for p in second["placement"]} == set(nodes) - {full}
        # Beyond the guarantee of 10 it still borrows: only the claim was rounded up.
        reserved = sc.condition(owner_ns, "second", "QuotaReserved")
        assert reserved is not None
        assert reserved["reason"] == "Borrowing"
        for name in small:
            record = sc.status(borrower_ns, name)["preemptions"][-1]
            assert (record["preemptor"], record["reason"]) == (
                f"{owner_ns}/second",
                "ReclaimGuarantee",
            )
    finally:
        up.kill()
