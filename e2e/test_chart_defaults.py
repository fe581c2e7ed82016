"""``helm install`` of the chart with its default values, its own pods run by a real kubelet:
the device probe publishes the node's topology and a GpuJob is placed on NVLinked GPUs.

Everything from the chart's rendered manifests down to each container's command line, its
environment, its ServiceAccount token and its ports is what a cluster would run; the kubelet
(built from the pinned release) runs the gpusched and kube-scheduler containers as processes, each
pod in a network namespace of its own (``RunProcesses``), and the node's GPUs are simulated from a
real ``nvidia-smi topo -m`` matrix handed to the probe through its environment. Other containers
(the job's) are make-believe, as on every fake-runtime node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpusched.api import keys
from gpusched.dev.chart import render
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.localcluster import LocalCluster, ensure_toolchain
from gpusched.dev.localcluster.components import gpusched_command
from gpusched.dev.localcluster.kubelet import RunProcesses, start_kubelet_node
from gpusched.dev.localcluster.topologies import fixture_path
from tests.cases.manifests import gpujob, tenantquota
from tests.integration.operator_harness import wait_for

NODE = "gpu-0"
FIXTURE = "hgx-h100-sxm-8gpu-8nic"
RELEASE, NAMESPACE = "gpusched", "gpusched-system"
#: The chart's component images (default repositories) and kube-scheduler's.
CHART_IMAGES = r"(^|/)(gpusched-(device-probe|scheduler|operator)|kube-scheduler)(:|@|$)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    toolchain = ensure_toolchain()
    cluster = LocalCluster(tmp_path_factory.mktemp("chart-defaults"), toolchain, pod_network=True)
    cluster.up()
    try:
        # gpusched's own command from this checkout, and the control plane's kube-scheduler.
        venv_bin = str(Path(gpusched_command()[0]).parent)
        kube_bin = str(Path(cluster.binary("kube-scheduler")).parent)
        start_kubelet_node(
            cluster,
            NODE,
            labels={"feature.node.kubernetes.io/pci-10de.present": "true"},
            run=RunProcesses(
                images=CHART_IMAGES,
                path=(venv_bin, kube_bin),
                env={"GPUSCHED_PROBE_FAKE": str(fixture_path(FIXTURE))},
            ),
        )
        yield cluster
    finally:
        cluster.down()


def test_helm_install_with_defaults_publishes_topology_and_places_a_job(
    cluster: LocalCluster,
) -> None:
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    wait_for(
        lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in (core.read_node(NODE).status.conditions or [])
        ),
        timeout=120,
        what="the kubelet node Ready",
    )
    # What a GPU node has besides gpusched: NVIDIA's runtime class and device plugin (here, its
    # advertised GPUs).
    client.NodeV1Api(api).create_runtime_class(
        {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
    )
    core.patch_node_status(NODE, {"status": {"capacity": {keys.GPU_RESOURCE: "8"}}})

    installed = render.helm(
        "install",
        RELEASE,
        str(chart_dir()),
        f"--namespace={NAMESPACE}",
        "--create-namespace",
        f"--kubeconfig={cluster.kubeconfig}",
        check=False,
    )
    assert installed.returncode == 0, installed.stderr

    topology = wait_for(
        lambda: _topology(custom),
        timeout=240,
        what=f"the chart's device probe to publish {NODE}'s NodeGpuTopology ({_pod_report(core)})",
    )
    assert len(topology["spec"]["gpus"]) == 8
    # The probe writes the NodeGpuTopology and the node's labels in two requests.
    labels = wait_for(
        lambda: (
            found
            if keys.LABEL_GPU_COUNT in (found := core.read_node(NODE).metadata.labels or {})
            else None
        ),
        timeout=60,
        what=f"the probe's labels on {NODE}",
    )
    assert labels[keys.LABEL_GPU_COUNT] == "8"
    assert labels[keys.LABEL_NVSWITCH] == "true"

    # The operator's validating webhook, through the chart's Service and certificate: a GpuJob
    # in a namespace no TenantQuota owns is refused, naming the field.
    core.create_namespace({"metadata": {"name": "nobody"}})
    refusal = wait_for(
        lambda: _refused(custom, "nobody", gpujob("stray")),
        timeout=120,
        what=f"the operator's webhook to refuse a job without a tenant ({_pod_report(core)})",
    )
    assert "metadata.namespace" in refusal

    custom.create_cluster_custom_object(
        keys.GROUP, keys.VERSION, "tenantquotas", tenantquota("team", namespaces=["team"])
    )
    core.create_namespace({"metadata": {"name": "team"}})
    job = gpujob("finetune", topology={"scope": "nvlink", "mode": "required"})
    custom.create_namespaced_custom_object(keys.GROUP, keys.VERSION, "team", "gpujobs", job)
    status = wait_for(
        lambda: (s := _job_status(custom)).get("phase") == "Running" and s,
        timeout=240,
        what=f"the GpuJob Running ({_pod_report(core)})",
    )
    (placement,) = status["placement"]
    assert placement["node"] == NODE
    assert placement["topologyClass"] == "nvlink"
    assert len(placement["gpuUuids"]) == 4
    (pod,) = core.list_namespaced_pod("team").items
    assert pod.metadata.annotations[keys.ANNOTATION_GPU_INDICES]
    assert pod.spec.node_name == NODE


def _refused(custom: Any, namespace: str, job: dict[str, Any]) -> str | None:
    """The refusal's message, or None (and the job deleted) when it was accepted: the webhook
    was not answering yet and failurePolicy Ignore let it through. None too while the API server
    answers 5xx (the CRD not served yet, for a moment after it is created)."""
    try:
        custom.create_namespaced_custom_object(keys.GROUP, keys.VERSION, namespace, "gpujobs", job)
    except client.ApiException as err:
        if err.status is not None and err.status >= 500:
            return None
        return str(err.body)
    custom.delete_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, "gpujobs", job["metadata"]["name"]
    )
    return None


def _topology(custom: Any) -> dict[str, Any] | None:
    try:
        return dict(
            custom.get_cluster_custom_object(keys.GROUP, keys.VERSION, "nodegputopologies", NODE)
        )
    except client.ApiException:
        return None


def _job_status(custom: Any) -> dict[str, Any]:
    job = custom.get_namespaced_custom_object(
        keys.GROUP, keys.VERSION, "team", "gpujobs", "finetune"
    )
    return dict(job.get("status") or {})


def _pod_report(core: Any) -> str:
    """The release's pods and their containers' states, for a failure message."""
    out = []
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        states = [
            f"{c.name}:{'ready' if c.ready else 'not ready'},restarts={c.restart_count}"
            for c in pod.status.container_statuses or []
        ]
        out.append(f"{pod.metadata.name} {pod.status.phase} {' '.join(states)}")
    return "; ".join(out) or "no pods"
