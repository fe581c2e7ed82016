"""All three kinds can be created, read, have their status patched and be deleted through the
real API server, and a NodeGpuTopology goes away with its Node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.api import (
    GpuHealth,
    GpuHealthState,
    GpuInfo,
    GpuJob,
    GpuLink,
    JobPhase,
    LinkType,
    NodeGpuTopology,
    NodeGpuTopologySpec,
    NodeGpuTopologyStatus,
    TenantQuota,
    keys,
)
from tests.cases.manifests import gpujob, tenantquota

G, V = keys.GROUP, keys.VERSION


def _two_gpu_topology() -> NodeGpuTopologySpec:
    return NodeGpuTopologySpec(
        node_name="placeholder",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3", numa_node=0)
            for i in range(2)
        ],
        links=[GpuLink(a=0, b=1, type=LinkType.NV, nvlinks=18)],
        nvswitch=True,
        source="fake:test",
    )


def test_gpujob_create_get_patch_status_delete(kube: Any) -> None:
    api = client.CustomObjectsApi(kube)
    created = api.create_namespaced_custom_object(G, V, "default", "gpujobs", gpujob("crud-job"))
    assert created["metadata"]["uid"]
    fetched = GpuJob.model_validate(
        api.get_namespaced_custom_object(G, V, "default", "gpujobs", "crud-job")
    )
    assert fetched.spec.gpus_per_replica == 4
    status = fetched.status.model_copy(update={"phase": JobPhase.QUEUED, "tenant": "t", "gpus": 4})
    api.patch_namespaced_custom_object_status(
        G, V, "default", "gpujobs", "crud-job", {"status": status.to_k8s()}
    )
    after = GpuJob.model_validate(
        api.get_namespaced_custom_object(G, V, "default", "gpujobs", "crud-job")
    )
    assert after.status.phase is JobPhase.QUEUED
    assert after.status.tenant == "t"
    # The status subresource ignores spec changes and the main resource ignores status.
    assert after.metadata.generation == fetched.metadata.generation
    api.delete_namespaced_custom_object(G, V, "default", "gpujobs", "crud-job")
    with pytest.raises(ApiException) as gone:
        api.get_namespaced_custom_object(G, V, "default", "gpujobs", "crud-job")
    assert gone.value.status == 404


def test_tenantquota_create_get_patch_status_delete(kube: Any) -> None:
    api = client.CustomObjectsApi(kube)
    api.create_cluster_custom_object(G, V, "tenantquotas", tenantquota("crud-tenant"))
    quota = TenantQuota.model_validate(
        api.get_cluster_custom_object(G, V, "tenantquotas", "crud-tenant")
    )
    assert quota.spec.weight == 1.0
    assert quota.spec.preemption.reclaim_borrowed == "Any"
    status = quota.status.model_copy(update={"used_gpus": 6, "borrowed_gpus": 0, "running_jobs": 2})
    api.patch_cluster_custom_object_status(
        G, V, "tenantquotas", "crud-tenant", {"status": status.to_k8s()}
    )
    again = TenantQuota.model_validate(
        api.get_cluster_custom_object(G, V, "tenantquotas", "crud-tenant")
    )
    assert again.status.used_gpus == 6
    assert again.status.running_jobs == 2
    api.delete_cluster_custom_object(G, V, "tenantquotas", "crud-tenant")
    with pytest.raises(ApiException) as gone:
        api.get_cluster_custom_object(G, V, "tenantquotas", "crud-tenant")
    assert gone.value.status == 404


def test_nodegputopology_status_patch_and_garbage_collection_with_its_node(
    kube: Any, gpu_nodes: Callable[..., list[str]]
) -> None:
    (name,) = gpu_nodes(1, gpus=2, topology=_two_gpu_topology())
    api = client.CustomObjectsApi(kube)
    stored = NodeGpuTopology.model_validate(
        api.get_cluster_custom_object(G, V, "nodegputopologies", name)
    )
    assert stored.spec.node_name == name
    assert stored.metadata.owner_references[0]["kind"] == "Node"
    status = NodeGpuTopologyStatus(
        gpus=[
            GpuHealth(index=0, uuid="GPU-0"),
            GpuHealth(
                index=1,
                uuid="GPU-1",
                state=GpuHealthState.UNHEALTHY,
                reason="Xid79",
                message="GPU has fallen off the bus",
            ),
        ],
        healthy_gpus=1,
    )
    api.patch_cluster_custom_object_status(
        G, V, "nodegputopologies", name, {"status": status.to_k8s()}
    )
    patched = NodeGpuTopology.model_validate(
        api.get_cluster_custom_object(G, V, "nodegputopologies", name)
    )
    assert patched.status.gpus[1].state is GpuHealthState.UNHEALTHY
    assert patched.status.healthy_gpus == 1

    client.CoreV1Api(kube).delete_node(name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        remaining = api.list_cluster_custom_object(G, V, "nodegputopologies")["items"]
        if name not in {item["metadata"]["name"] for item in remaining}:
            return
        time.sleep(0.2)
    pytest.fail("NodeGpuTopology outlived its Node: garbage collection did not remove it")
