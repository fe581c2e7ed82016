"""``gpusched explain`` reads the cluster, not the operator's memory: an admission whose pods
exist but whose status is not written yet (the operator's ``--record-delay``) is explained as the
operator holds it, not as a queued job."""

from __future__ import annotations

from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import JobPhase
from gpusched.operator.explainer import assume_unwritten_admissions, explain_job, render
from gpusched.operator.store import Store
from tests.unit.operator.test_store import job, pod


def _store(*pods: dict[str, Any]) -> Store:
    store = Store()
    store.upsert_job(job(5, phase="Queued"))
    for raw in pods:
        store.upsert_job_pod(raw)
    return store


def _running(raw: dict[str, Any]) -> dict[str, Any]:
    raw["spec"]["nodeName"] = "n0"
    raw["status"]["phase"] = "Running"
    return raw


def test_pods_of_a_newer_admission_are_held_as_the_operator_holds_them() -> None:
    store = _store(_running(pod(7)))
    assume_unwritten_admissions(store)
    facts = store.job("ns/a")
    assert facts.status.phase is JobPhase.ADMITTED
    assert facts.status.admission == 1
    assert facts.status.admitted_at is not None
    assert facts.unwritten is not None
    assert facts.written.phase is JobPhase.QUEUED
    explanation, status = explain_job(store, "ns/a")
    assert explanation.decision == "running"  # it holds its GPUs, it is not waiting
    assert status["phase"] == "Queued"  # what the API server says, shown as such
    assert explanation.reason == "AdmissionNotYetWritten"


def test_a_queued_job_without_pods_is_explained_as_waiting() -> None:
    store = _store()
    assume_unwritten_admissions(store)
    assert store.job("ns/a").unwritten is None
    explanation, _ = explain_job(store, "ns/a")
    assert explanation.decision != "running"


def test_terminating_pods_are_not_an_admission() -> None:
    old = _running(pod(7))
    old["metadata"]["deletionTimestamp"] = "2026-03-01T11:59:30Z"
    old["metadata"]["labels"][keys.LABEL_ADMISSION] = "1"
    store = _store(old)
    assume_unwritten_admissions(store)
    assert store.job("ns/a").unwritten is None


def test_explain_says_how_often_a_job_was_preempted_and_by_whom_last() -> None:
    store = _store()
    explanation, status = explain_job(store, "ns/a")
    assert not any("preempted" in line for line in render(explanation, status))
    status = {
        **status,
        "preemptionCount": 2,
        "preemptions": [
            {"time": "2026-03-01T10:00:00Z", "preemptor": "x/first", "reason": "HigherPriority"},
            {
                "time": "2026-03-01T11:00:00Z",
                "preemptor": "owner/gang",
                "reason": "ReclaimGuarantee",
                "message": "tenant owner reclaims guaranteed GPUs (0.01 GPU-hours lost)",
            },
        ],
    }
    lines = render(explanation, status)
    assert "  preempted 2 time(s)" in lines
    assert any(
        "by owner/gang (ReclaimGuarantee)" in line and "0.01 GPU-hours lost" in line
        for line in lines
    )
