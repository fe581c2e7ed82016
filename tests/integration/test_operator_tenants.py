"""Which TenantQuota a job belongs to follows its namespace's owner, also when that changes."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from tests.integration.operator_harness import G, Scenario, V, wait_for


def test_job_moves_to_the_newer_tenant_quota_when_the_older_owner_is_deleted(
    sc: Scenario,
) -> None:
    sc.nodes(1)
    ns = sc.namespace("shared")
    # The older claim owns the namespace (creation time, then name, decides).
    older = sc.quota("a-older", [ns], guaranteed=8)
    newer = sc.quota("b-newer", [ns], guaranteed=8)
    sc.submit(ns, "train", 4, replicas=2)
    status = sc.wait_phase(ns, "train", "Running")
    assert status["tenant"] == older
    assert {p.metadata.labels[keys.LABEL_TENANT] for p in sc.pods(ns, "train")} == {older}

    sc.custom.delete_cluster_custom_object(G, V, "tenantquotas", older)
    wait_for(lambda: _gone(sc, older), 30, f"TenantQuota {older} to be deleted")
    status = wait_for(
        lambda: s if (s := sc.status(ns, "train")).get("tenant") == newer else None,
        30,
        f"the job's tenant to become {newer}",
    )
    assert status["phase"] == "Running"  # moving owner does not disturb the job
    wait_for(
        lambda: (
            {p.metadata.labels[keys.LABEL_TENANT] for p in sc.pods(ns, "train")} == {newer} or None
        ),
        30,
        f"the pods' tenant label to become {newer}",
    )

    def accounted() -> bool | None:
        usage = sc.quota_status(newer)
        return (usage.get("usedGpus"), usage.get("runningJobs")) == (8, 1) or None

    wait_for(accounted, 30, f"{newer} to account the job")
    assert [p.metadata.name for p in sc.pods(ns, "train")] == ["train-1-0", "train-1-1"]


def _gone(sc: Scenario, quota: str) -> bool | None:
    try:
        sc.custom.get_cluster_custom_object(G, V, "tenantquotas", quota)
    except ApiException as err:
        return err.status == 404 or None
    return None
