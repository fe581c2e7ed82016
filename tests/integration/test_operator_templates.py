"""Pod templates the API server refuses, and status that says only what is true.

A GpuJob's template is checked by a dry run of the pod it would create; a verdict is shared only
by jobs whose pods would be the same. Pods the API server refuses at creation fail the job with
the server's reason (an invalid pod) or release it at once (a namespace's ResourceQuota), and no
condition ever claims pods that do not exist.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from tests.integration.operator_harness import Scenario, job_template, wait_for

BAD_LABELS = {"team": "bad value!"}


def test_valid_job_is_not_failed_by_another_jobs_invalid_template_metadata(sc: Scenario) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("tmpl", guaranteed=8)
    sc.submit(ns, "bad", 1, template=job_template(labels=BAD_LABELS))
    bad = sc.wait_reason(ns, "bad", "InvalidPodTemplate")
    assert "bad value!" in bad["message"]
    # Same spec, no labels: its pods are valid.
    sc.submit(ns, "good", 1)
    good = sc.wait_phase(ns, "good", "Running")
    assert "dry-run" not in (good.get("message") or "")
    assert [p.metadata.name for p in sc.pods(ns, "good")] == ["good-1-0"]


def test_invalid_template_metadata_is_refused_after_a_valid_job_of_the_same_spec(
    sc: Scenario,
) -> None:
    sc.nodes(1)
    quota, ns = sc.tenant("tmpl", guaranteed=8)
    sc.submit(ns, "good", 1)
    sc.wait_phase(ns, "good", "Running")
    sc.submit(ns, "bad", 1, template=job_template(labels=BAD_LABELS))
    bad = sc.wait_phase(ns, "bad", "Failed")
    assert bad["reason"] == "InvalidPodTemplate"
    assert "bad value!" in bad["message"]
    assert not bad.get("admission"), "an invalid job is never admitted"
    assert not sc.pods(ns, "bad")
    wait_for(
        lambda: sc.quota_status(quota).get("runningJobs") == 1 or None,
        30,
        "the tenant to count the running job",
    )
    assert sc.quota_status(quota)["usedGpus"] == 1  # the invalid job holds nothing


@contextmanager
def refuse_real_pod_creates(kube: Any, namespace: str, label: str, value: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy that refuses creating pods labelled ``label=value`` in the
    namespace but lets dry runs through: the dry-run check passes, the real create fails."""
    admission = client.AdmissionregistrationV1Api(kube)
    name = f"refuse-{namespace}"
    message = f"pods labelled {label}={value} may not be created in {namespace}"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": (
                            f"request.dryRun == true || !has(object.metadata.labels) || "
                            f"!('{label}' in object.metadata.labels) || "
                            f"object.metadata.labels['{label}'] != '{value}'"
                        ),
                        "message": message,
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        _wait_policy_active(kube, namespace, label, value)
        yield message
    finally:
        with suppress(ApiException):
            admission.delete_validating_admission_policy_binding(name)
        with suppress(ApiException):
            admission.delete_validating_admission_policy(name)


def _wait_policy_active(kube: Any, namespace: str, label: str, value: str) -> None:
    """Policies take effect a moment after they are created: probe with a real create."""
    core = client.CoreV1Api(kube)
    probe = {
        "metadata": {"name": "policy-probe", "labels": {label: value}},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "x"}]},
    }
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            core.create_namespaced_pod(namespace, probe)
        except ApiException as err:
            if err.status == 422:
                return
            raise
        core.delete_namespaced_pod("policy-probe", namespace, grace_period_seconds=0)
        time.sleep(0.5)
    raise AssertionError("the admission policy never took effect")


def test_job_whose_pods_the_api_server_refuses_fails_with_the_servers_reason(
    sc: Scenario, kube: Any
) -> None:
    sc.nodes(1)
    quota, ns = sc.tenant("refused", guaranteed=8)
    with refuse_real_pod_creates(kube, ns, "team", "blocked") as message:
        sc.submit(ns, "blocked", 2, replicas=2, template=job_template(labels={"team": "blocked"}))
        failed = sc.wait_phase(ns, "blocked", "Failed", timeout=60)
        assert failed["reason"] == "InvalidPodTemplate"
        assert message in failed["message"]
        assert not sc.pods(ns, "blocked")
        reserved = sc.condition(ns, "blocked", "QuotaReserved")
        assert reserved is not None
        assert reserved["status"] == "False"
        # Its GPUs went back: the next job of the tenant runs on them.
        sc.submit(ns, "after", 8)
        sc.wait_phase(ns, "after", "Running", timeout=60)
        assert sc.status(ns, "blocked")["phase"] == "Failed"  # never retried
        wait_for(
            lambda: sc.quota_status(quota).get("runningJobs") == 1 or None,
            30,
            "the tenant to count the running job",
        )
        assert sc.quota_status(quota)["usedGpus"] == 8  # the refused job holds nothing


def _claims_pods(status: dict[str, Any]) -> list[str]:
    """Conditions or messages of the status that say pods were created."""
    claims = []
    for c in status.get("conditions") or []:
        if c.get("reason") == "PodsCreated" or "pods of the gang created" in c.get("message", ""):
            claims.append(f"{c['type']}={c['status']} {c['reason']}: {c.get('message')}")
    if status.get("reason") == "PodsCreated":
        claims.append(f"reason {status['reason']}: {status.get('message')}")
    return claims


def test_status_never_claims_pods_a_resource_quota_refused(sc: Scenario, kube: Any) -> None:
    sc.nodes(1)
    quota, ns = sc.tenant("quota", guaranteed=8)
    core = client.CoreV1Api(kube)
    core.create_namespaced_resource_quota(
        ns,
        {"metadata": {"name": "no-gpus"}, "spec": {"hard": {f"requests.{keys.GPU_RESOURCE}": "0"}}},
    )
    sc.submit(ns, "blocked", 4)
    # Watch the job through admissions and refusals: every look must be true.
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and status.get("requeueCount", 0) < 2:
        status = sc.status(ns, "blocked")
        assert not _claims_pods(status), (_claims_pods(status), sc.pods(ns, "blocked"))
        running = sc.quota_status(quota).get("runningJobs", 0)
        assert running == 0, f"runningJobs {running} while no pod exists"
        time.sleep(0.3)
    assert status.get("requeueCount", 0) >= 2, "the job was not released and readmitted"
    # Not failed for good: the namespace's quota refused the pods, not the template.
    refusals = [m for reason, m in sc.events(ns, "blocked") if reason == "PodsRefused"]
    assert refusals, "no PodsRefused event"
    assert all("exceeded quota" in m for m in refusals)
    ready = sc.condition(ns, "blocked", "PodsReady")
    assert ready is not None
    assert ready["reason"] in ("PodsRefused", "WaitingForPods")
    assert sc.status(ns, "blocked")["phase"] in ("Queued", "Admitted")
    assert not sc.pods(ns, "blocked")
    core.delete_namespaced_resource_quota("no-gpus", ns)
    sc.wait_phase(ns, "blocked", "Running", timeout=120)
    assert wait_for(
        lambda: sc.quota_status(quota).get("runningJobs") == 1 or None, 30, "runningJobs 1"
    )
