"""``gpusched explain`` deciding itself predicts run times from the operator's history, so a
waiting job's expected start is the one the operator writes (not "unknown" where the running
jobs declare no limit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpusched.api import keys
from gpusched.core.runtime import JobKind, RuntimeHistory
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.operator.explainer import explain_job
from gpusched.operator.store import Store

STARTED = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _job(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"u-{name}",
            "generation": 1,
            "resourceVersion": "5",
            "creationTimestamp": _stamp(STARTED - timedelta(minutes=5)),
        },
        "spec": {
            "gpusPerReplica": 8,
            "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
        },
        "status": status,
    }


def _store() -> Store:
    store = Store()
    store.replace_nodes(
        [
            {
                "metadata": {"name": "gpu-1", "resourceVersion": "1", "labels": {}},
                "status": {
                    "allocatable": {keys.GPU_RESOURCE: "8"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        ]
    )
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", "gpu-1")
    store.upsert_topology(
        {
            "metadata": {"name": "gpu-1", "resourceVersion": "1"},
            "spec": spec.to_k8s(),
            "status": status.to_k8s(),
        }
    )
    store.upsert_quota(
        {
            "metadata": {"name": "team", "resourceVersion": "1"},
            "spec": {"namespaces": ["team"], "guaranteedGpus": 8},
        }
    )
    placement = [{"replica": 0, "node": "gpu-1", "gpuIndices": list(range(8))}]
    store.upsert_job(
        _job(
            "train",
            {
                "phase": "Running",
                "tenant": "team",
                "admission": 1,
                "admittedAt": _stamp(STARTED),
                "startedAt": _stamp(STARTED),
                "placement": placement,
            },
        )
    )
    store.upsert_job_pod(
        {
            "metadata": {
                "name": "train-1-0",
                "namespace": "team",
                "uid": "pod-train",
                "resourceVersion": "6",
                "creationTimestamp": _stamp(STARTED),
                "labels": {
                    keys.LABEL_JOB_NAME: "train",
                    keys.LABEL_JOB_UID: "u-train",
                    keys.LABEL_REPLICA_INDEX: "0",
                    keys.LABEL_ADMISSION: "1",
                    keys.LABEL_TENANT: "team",
                },
                "annotations": {keys.ANNOTATION_GPU_INDICES: "0,1,2,3,4,5,6,7"},
            },
            "spec": {
                "nodeName": "gpu-1",
                "containers": [{"name": "main", "resources": {"limits": {keys.GPU_RESOURCE: "8"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    store.upsert_job(_job("next", {"phase": "Queued", "tenant": "team"}))
    return store


def test_explain_deciding_itself_predicts_run_times_from_the_operators_history() -> None:
    history = RuntimeHistory()
    history.record(JobKind("team", "team", "train", 8), 3600.0)
    explanation, _ = explain_job(_store(), "team/next", sooner=False, history=history)
    assert explanation.decision == "waiting"
    assert explanation.expected_start == (STARTED + timedelta(hours=1)).timestamp()
    # Without it nobody can say when the running job ends.
    explanation, _ = explain_job(_store(), "team/next", sooner=False)
    assert explanation.expected_start is None
