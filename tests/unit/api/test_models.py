"""The Python API types refuse what the API server refuses, and round-trip what it stores."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpusched.api import GpuJob, NodeGpuTopology, TenantQuota, TopologyScope
from gpusched.api.base import ApiModel
from gpusched.api.networktopology import NetworkTopology
from tests.cases.manifests import INVALID, Invalid, gpujob, tenantquota

MODELS: dict[str, type[ApiModel]] = {
    "GpuJob": GpuJob,
    "TenantQuota": TenantQuota,
    "NetworkTopology": NetworkTopology,
}
PYTHON_CHECKED = [case for case in INVALID if not case.upstream]


@pytest.mark.parametrize("case", PYTHON_CHECKED, ids=[c.id for c in PYTHON_CHECKED])
def test_models_refuse_what_the_api_server_refuses(case: Invalid) -> None:
    model = MODELS[case.manifest["kind"]]
    with pytest.raises(ValidationError) as caught:
        model.model_validate(case.manifest)
    leaf = case.field.rsplit(".", 1)[-1].split("[")[0]
    assert leaf in str(caught.value)


def test_gpujob_defaults_match_the_documented_ones() -> None:
    job = GpuJob.model_validate(gpujob())
    assert job.spec.replicas == 1
    assert job.spec.topology.scope is TopologyScope.NODE
    assert job.spec.preemptible is True
    assert job.spec.checkpoint_grace_period_seconds == 30
    assert job.total_gpus == 4


def test_gpujob_round_trips_through_the_wire_form() -> None:
    manifest = gpujob(replicas=2, topology={"scope": "nvlink", "mode": "required"})
    job = GpuJob.model_validate(manifest)
    again = GpuJob.model_validate(job.to_k8s())
    assert again == job
    wire = job.to_k8s()
    assert wire["spec"]["gpusPerReplica"] == 4
    assert "gpus_per_replica" not in wire["spec"]


def test_tenantquota_accepts_model_guarantees_within_the_total() -> None:
    quota = TenantQuota.model_validate(
        tenantquota(guaranteedGpusByModel={"NVIDIA-H100-80GB-HBM3": 8}, borrowingLimit=8)
    )
    assert quota.spec.guaranteed_gpus_by_model == {"NVIDIA-H100-80GB-HBM3": 8}


def test_objects_read_back_from_a_newer_server_ignore_unknown_top_level_fields() -> None:
    manifest: dict[str, Any] = {**gpujob(), "metadata": {"name": "x", "managedFields": []}}
    job = GpuJob.model_validate(manifest)
    assert job.metadata.name == "x"


def test_node_topology_refuses_links_out_of_order() -> None:
    body = {
        "apiVersion": "gpusched.io/v1alpha1",
        "kind": "NodeGpuTopology",
        "metadata": {"name": "n"},
        "spec": {"nodeName": "n", "links": [{"a": 2, "b": 1, "type": "NV", "nvlinks": 12}]},
    }
    with pytest.raises(ValidationError, match="less than b"):
        NodeGpuTopology.model_validate(body)
