"""The operator's validating webhook on the real API server, registered by the chart's own
ValidatingWebhookConfiguration (pointed at the local process instead of the Service): objects
that break a rule across objects are refused naming the field; an operator that does not answer
blocks nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses
from gpusched.dev.localcluster.processes import free_port
from gpusched.dev.localcluster.webhook import webhook_configuration, write_certificates
from tests.cases.manifests import gpujob
from tests.integration.operator_harness import OperatorProcess, Scenario, wait_for

G, V = keys.GROUP, keys.VERSION
#: TenantQuota-then-GpuJob pairs applied at once.
BURST = 24


class WebhookOperator(OperatorProcess):
    """The operator serving its webhook on a loopback port with a test CA's certificate."""

    def __init__(self, cluster: LocalCluster, cert_dir: Path) -> None:
        super().__init__(cluster)
        self.cert_dir = cert_dir
        self.webhook_port = free_port()

    def serve(self) -> None:
        self.start(
            extra=[f"--webhook-port={self.webhook_port}", f"--webhook-cert-dir={self.cert_dir}"]
        )


@pytest.fixture(scope="module")
def operator(
    local_cluster: LocalCluster,
    extender: SchedulerProcesses,
    tmp_path_factory: pytest.TempPathFactory,
    kube: Any,
) -> Iterator[WebhookOperator]:
    """This module's operator: the webhook's server, registered with the API server."""
    cert_dir = tmp_path_factory.mktemp("webhook-cert")
    ca_pem = write_certificates(cert_dir)
    process = WebhookOperator(local_cluster, cert_dir)
    process.serve()
    admission = client.AdmissionregistrationV1Api(kube)
    config = webhook_configuration("gpusched-operator-webhook-test", process.webhook_port, ca_pem)
    admission.create_validating_webhook_configuration(config)
    yield process
    admission.delete_validating_webhook_configuration(config["metadata"]["name"])
    process.kill()


def _refusal(create: Any) -> str:
    """The API server's message refusing ``create()`` (fails if it was accepted)."""
    with pytest.raises(client.ApiException) as refused:
        create()
    return str(json.loads(refused.value.body)["message"])


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return gpujob(name, gpusPerReplica=1, **spec)


def _wait_served(sc: Scenario, operator: WebhookOperator) -> None:
    """Until the webhook answers: a job in a namespace no tenant owns is refused."""
    namespace = sc.namespace("probe")

    def refused() -> bool:
        try:
            sc.custom.create_namespaced_custom_object(G, V, namespace, "gpujobs", _job("probe"))
        except client.ApiException:
            return True
        sc.custom.delete_namespaced_custom_object(G, V, namespace, "gpujobs", "probe")
        return False

    wait_for(refused, 60, f"the webhook to answer (log: {operator.log()[-1500:]})")


def test_a_tenant_quota_claiming_another_tenants_namespace_is_refused_naming_it(
    sc: Scenario, operator: WebhookOperator
) -> None:
    owner, namespace = sc.tenant("vision")
    _wait_served(sc, operator)
    fresh = sc.namespace("fresh")
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": "TenantQuota",
        "metadata": {"name": f"{sc.id}-thief"},
        "spec": {"namespaces": [fresh, namespace], "guaranteedGpus": 0},
    }
    message = _refusal(lambda: sc.custom.create_cluster_custom_object(G, V, "tenantquotas", body))
    assert "spec.namespaces[1]" in message
    assert owner in message


def test_a_tenant_tree_that_would_cycle_overcommit_or_orphan_namespaces_is_refused_naming_the_field(
    sc: Scenario, operator: WebhookOperator
) -> None:
    org = sc.quota("org", [], guaranteed=16)
    team = sc.quota("team", [sc.namespace("team")], guaranteed=12, parent=org)
    _wait_served(sc, operator)

    def quota(name: str, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": keys.API_VERSION,
            "kind": "TenantQuota",
            "metadata": {"name": name},
            "spec": spec,
        }

    # A second team would take the children past the parent's 16.
    second = quota(f"{sc.id}-second", parent=org, guaranteedGpus=8)
    message = _refusal(lambda: sc.custom.create_cluster_custom_object(G, V, "tenantquotas", second))
    assert "spec.guaranteedGpus" in message
    assert "20 GPUs together, more than its own 16" in message
    # The parent may not become its team's child.
    cycle = {"spec": {"parent": team}}
    message = _refusal(
        lambda: sc.custom.patch_cluster_custom_object(G, V, "tenantquotas", org, cycle)
    )
    assert "spec.parent" in message
    assert "cycle" in message
    # A child under a tenant that lists namespaces would leave them without a tenant.
    under = quota(f"{sc.id}-under", parent=team, guaranteedGpus=0)
    message = _refusal(lambda: sc.custom.create_cluster_custom_object(G, V, "tenantquotas", under))
    assert "spec.parent" in message
    assert "lists namespaces" in message


def test_a_gpujob_in_a_namespace_no_tenant_owns_is_refused_naming_the_namespace(
    sc: Scenario, operator: WebhookOperator
) -> None:
    _wait_served(sc, operator)
    orphan = sc.namespace("orphan")
    message = _refusal(
        lambda: sc.custom.create_namespaced_custom_object(G, V, orphan, "gpujobs", _job("j"))
    )
    assert "metadata.namespace" in message
    assert orphan in message


def test_a_gpujob_naming_a_missing_priority_class_is_refused_naming_the_field(
    sc: Scenario, operator: WebhookOperator
) -> None:
    _, namespace = sc.tenant("nlp")
    _wait_served(sc, operator)
    job = _job("urgent", priorityClassName=f"{sc.id}-no-such-class")
    message = _refusal(
        lambda: sc.custom.create_namespaced_custom_object(G, V, namespace, "gpujobs", job)
    )
    assert "spec.priorityClassName" in message


def test_a_gpujob_changed_to_name_a_missing_priority_class_is_refused_naming_the_field(
    sc: Scenario, operator: WebhookOperator
) -> None:
    _, namespace = sc.tenant("renamed")
    _wait_served(sc, operator)
    sc.custom.create_namespaced_custom_object(G, V, namespace, "gpujobs", _job("renamed"))
    change = {"spec": {"priorityClassName": f"{sc.id}-no-such-class"}}
    message = _refusal(
        lambda: sc.custom.patch_namespaced_custom_object(
            G, V, namespace, "gpujobs", "renamed", change
        )
    )
    assert "spec.priorityClassName" in message


def _reviews(operator: WebhookOperator, resource: str) -> float:
    """Reviews the operator answered for one resource, from its /metrics."""
    return operator.total("gpusched_operator_webhook_reviews_total", resource=resource)


def test_an_edit_no_rule_reads_is_never_sent_to_the_operator(
    sc: Scenario, operator: WebhookOperator
) -> None:
    """The chart's match conditions: labels and annotations (a workload writes its checkpoint
    annotation as often as it checkpoints) cost no review; a create and a change of what a rule
    reads do. A review is counted before the API server answers, so the counts are exact."""
    owner, namespace = sc.tenant("quiet")
    _wait_served(sc, operator)
    jobs, quotas = _reviews(operator, "gpujobs"), _reviews(operator, "tenantquotas")
    sc.custom.create_namespaced_custom_object(G, V, namespace, "gpujobs", _job("quiet"))
    assert _reviews(operator, "gpujobs") == jobs + 1
    for i in range(3):
        checkpoint = {
            "metadata": {
                "annotations": {keys.ANNOTATION_LAST_CHECKPOINT: f"2026-01-01T00:0{i}:00Z"}
            }
        }
        sc.custom.patch_namespaced_custom_object(G, V, namespace, "gpujobs", "quiet", checkpoint)
        label = {"metadata": {"labels": {"edited": str(i)}}}
        sc.custom.patch_cluster_custom_object(G, V, "tenantquotas", owner, label)
    assert _reviews(operator, "gpujobs") == jobs + 1
    assert _reviews(operator, "tenantquotas") == quotas
    sc.custom.patch_cluster_custom_object(
        G, V, "tenantquotas", owner, {"spec": {"guaranteedGpus": 1}}
    )
    assert _reviews(operator, "tenantquotas") == quotas + 1


def test_gpujobs_applied_right_after_their_tenant_quotas_are_accepted(
    sc: Scenario, operator: WebhookOperator
) -> None:
    """`kubectl apply` of a TenantQuota and then a job, many at once: a job's review may come
    before its TenantQuota reached the operator's store. A refusal is checked against the API
    server first, so every job is accepted."""
    _wait_served(sc, operator)
    namespaces = [sc.namespace(f"burst{i}") for i in range(BURST)]

    def apply(i: int) -> None:
        sc.quota(f"burst{i}", [namespaces[i]])
        sc.custom.create_namespaced_custom_object(G, V, namespaces[i], "gpujobs", _job("first"))

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        list(pool.map(apply, range(BURST)))


def test_an_operator_that_does_not_answer_blocks_no_gpujob(
    sc: Scenario, operator: WebhookOperator
) -> None:
    """failurePolicy Ignore: with the webhook down, even a job it would refuse is accepted
    (the operator explains it later)."""
    _wait_served(sc, operator)
    orphan = sc.namespace("down")
    operator.kill()
    try:
        sc.custom.create_namespaced_custom_object(G, V, orphan, "gpujobs", _job("accepted"))
        assert sc.job(orphan, "accepted")["metadata"]["name"] == "accepted"
    finally:
        operator.serve()
