"""The tenant tree, per-user caps and budgets on the real API server: the submitter recorded by
the chart's admission policies from the authenticated user, a user over the cap waiting while a
teammate runs, an organisation whose teams lend to each other and take their guarantee back,
and a budget's soft cap (condition, event) and hard cap (new jobs wait, running jobs go on),
with the operator running."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.kube import api_client
from tests.integration.operator_harness import G, Scenario, V, job_template, wait_for


def _as(cluster: LocalCluster, namespace: str, user: str) -> client.CustomObjectsApi:
    """A namespace editor's client (a ServiceAccount bound to ``edit`` there)."""
    return client.CustomObjectsApi(
        api_client(identities.namespace_editor(cluster, namespace, user))
    )


def _job(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "replicas": 1,
            "gpusPerReplica": gpus,
            "checkpointGracePeriodSeconds": 0,
            "template": job_template(),
        },
    }


def _submitter(custom: Any, namespace: str, name: str) -> str | None:
    obj = custom.get_namespaced_custom_object(G, V, namespace, "gpujobs", name)
    return (obj["metadata"].get("annotations") or {}).get(keys.ANNOTATION_SUBMITTER)


def test_the_submitter_is_the_authenticated_user_and_nobody_can_change_it(
    local_cluster: LocalCluster, kube: Any
) -> None:
    identities.install(local_cluster, identities.ACCESS)
    namespace = "submitter-policy"
    alice = _as(local_cluster, namespace, "alice")
    forged = {keys.ANNOTATION_SUBMITTER: "system:admin", "team": "x"}
    alice.create_namespaced_custom_object(G, V, namespace, "gpujobs", _job("forged", 1, forged))
    admin = client.CustomObjectsApi(kube)
    expected = identities.user("alice", namespace)
    assert _submitter(admin, namespace, "forged") == expected
    got = admin.get_namespaced_custom_object(G, V, namespace, "gpujobs", "forged")
    assert got["metadata"]["annotations"]["team"] == "x"  # other annotations kept
    for who in (alice, admin):
        for value in ("someone-else", None):
            patch = {"metadata": {"annotations": {keys.ANNOTATION_SUBMITTER: value}}}
            with pytest.raises(ApiException) as refused:
                who.patch_namespaced_custom_object(G, V, namespace, "gpujobs", "forged", patch)
            assert refused.value.status in (403, 422)
            assert "metadata.annotations[gpusched.io/submitter]" in str(refused.value.body)
    assert _submitter(admin, namespace, "forged") == expected
    wide = local_cluster.kubectl("get", "gj", "forged", "-n", namespace, "-o", "wide").stdout
    assert "SUBMITTER" in wide
    assert expected in wide
    # Other changes are accepted.
    alice.patch_namespaced_custom_object(
        G, V, namespace, "gpujobs", "forged", {"metadata": {"labels": {"a": "b"}}}
    )


def test_a_user_over_the_cap_waits_while_a_teammate_runs(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    sc.nodes(1)
    quota, ns = sc.tenant("capped", guaranteed=8, perUser={"maxGpus": 4})
    alice, bob = _as(local_cluster, ns, "alice"), _as(local_cluster, ns, "bob")
    alice.create_namespaced_custom_object(G, V, ns, "gpujobs", _job("a1", 4))
    sc.wait_phase(ns, "a1", "Running")
    alice.create_namespaced_custom_object(G, V, ns, "gpujobs", _job("a2", 2))
    waiting = sc.wait_reason(ns, "a2", "UserCapExceeded")
    user = identities.user("alice", ns)
    assert f"user {user} holds 4 of the 4 GPUs tenant {quota} allows one user" in str(
        waiting.get("message")
    )
    bob.create_namespaced_custom_object(G, V, ns, "gpujobs", _job("b1", 4))
    sc.wait_phase(ns, "b1", "Running")
    assert sc.status(ns, "a2")["reason"] == "UserCapExceeded"

    def users() -> dict[str, tuple[int, int]] | None:
        listed = {
            u["name"]: (u["gpus"], u["jobs"]) for u in sc.quota_status(quota).get("users", [])
        }
        expected = {user: (4, 1), identities.user("bob", ns): (4, 1)}
        return listed if listed == expected else None

    wait_for(users, 30, f"{quota}'s status to list both users")
    # alice's running job ends: her waiting job starts.
    sc.finish(ns, "a1")
    sc.wait_phase(ns, "a2", "Running")


def test_a_budget_alerts_at_its_soft_cap_and_holds_new_jobs_at_its_hard_cap(
    sc: Scenario,
) -> None:
    sc.nodes(2)
    # Without a price list a GPU-hour costs 1: 8 GPUs spend the soft cap in about 4 s and the
    # hard cap in about 9 s.
    budget = {"period": "Day", "softCap": 0.01, "hardCap": 0.02}
    quota, ns = sc.tenant("budget", guaranteed=16, budget=budget)
    sc.submit(ns, "first", 8)
    sc.wait_phase(ns, "first", "Running")

    def condition(type_: str) -> dict[str, Any] | None:
        for c in sc.quota_status(quota).get("conditions", []):
            if c["type"] == type_ and c["status"] == "True":
                return dict(c)
        return None

    soft = wait_for(lambda: condition("BudgetSoftCapReached"), 60, "the soft cap")
    assert "spent this day, cap 0.01 (alert only)" in soft["message"]
    wait_for(lambda: condition("BudgetExhausted"), 60, "the hard cap")
    # The events follow the status write that turns each condition.
    caps = {"BudgetSoftCapReached", "BudgetExhausted"}

    def budget_events() -> list[str] | None:
        found = [r for r, _ in sc.events("default", quota) if r.startswith("Budget")]
        return found if caps <= set(found) else None

    events = wait_for(budget_events, 30, "both budget events")
    assert events.count("BudgetSoftCapReached") == 1
    sc.submit(ns, "second", 1)
    waiting = sc.wait_reason(ns, "second", "BudgetExhausted")
    assert "spent its budget's hard cap for this period" in str(waiting.get("message"))
    assert sc.status(ns, "first")["phase"] == "Running"  # running jobs go on
    status = sc.quota_status(quota)
    assert status["currency"] == "GPU-hours"
    assert status["periodCost"] >= 0.02
    assert status["periodGpuHours"] == status["periodCost"]
    # Raising the cap lets the waiting job start.
    sc.custom.patch_cluster_custom_object(
        G, V, "tenantquotas", quota, {"spec": {"budget": {"hardCap": 1000.0}}}
    )
    sc.wait_phase(ns, "second", "Running")


def test_an_organisation_lends_between_its_teams_takes_back_and_caps_each_user(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    sc.nodes(2)  # 16 GPUs
    org = sc.quota("org", [], guaranteed=16, perUser={"maxGpus": 8})
    ns_a, ns_b = sc.namespace("team-a"), sc.namespace("team-b")
    team_a = sc.quota("team-a", [ns_a], guaranteed=8, parent=org)
    team_b = sc.quota("team-b", [ns_b], guaranteed=8, parent=org)
    alice, carol = _as(local_cluster, ns_a, "alice"), _as(local_cluster, ns_a, "carol")
    bob = _as(local_cluster, ns_b, "bob")

    # team-a takes its own guarantee and team-b's idle one (lent inside the organisation).
    alice.create_namespaced_custom_object(G, V, ns_a, "gpujobs", _job("a1", 8))
    sc.wait_phase(ns_a, "a1", "Running")
    carol.create_namespaced_custom_object(G, V, ns_a, "gpujobs", _job("a2", 8))
    sc.wait_phase(ns_a, "a2", "Running")
    # The organisation caps one user at 8 GPUs, across its teams.
    alice.create_namespaced_custom_object(G, V, ns_a, "gpujobs", _job("a3", 4))
    waiting = sc.wait_reason(ns_a, "a3", "UserCapExceeded")
    assert f"GPUs tenant {org} allows one user" in str(waiting.get("message"))

    # team-b comes back for its guarantee: one of team-a's borrowed jobs gives it back.
    bob.create_namespaced_custom_object(G, V, ns_b, "gpujobs", _job("b1", 8))
    sc.wait_phase(ns_b, "b1", "Running", timeout=90)
    preempted = [
        name
        for name in ("a1", "a2")
        if any(
            p.get("reason") == "ReclaimGuarantee"
            for p in sc.status(ns_a, name).get("preemptions", [])
        )
    ]
    assert len(preempted) == 1

    def standing() -> dict[str, int] | None:
        used = {q: sc.quota_status(q).get("usedGpus") for q in (org, team_a, team_b)}
        return used if used == {org: 16, team_a: 8, team_b: 8} else None

    wait_for(standing, 30, "the organisation and its teams to account 16, 8 and 8 GPUs")
    listed = local_cluster.kubectl("get", "tq", team_a, team_b).stdout
    assert "PARENT" in listed
    assert listed.count(org) == 2
