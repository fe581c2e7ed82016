"""The extender, running under its ServiceAccount against the real control plane, answers bad
input with a 400 naming the field (never a 500 and a traceback), refuses requests larger than a
real kube-scheduler sends for the largest supported cluster before reading them whole, and binds
only pods that asked for gpusched."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e.helpers import extender_knows
from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import ExtenderProcess, start_extender_only
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.scheduler.server import DEFAULT_MAX_NODES, max_body_bytes
from tests.integration.operator_harness import wait_for


@pytest.fixture(scope="module")
def extender_only(local_cluster: LocalCluster) -> Iterator[ExtenderProcess]:
    process = start_extender_only(local_cluster)
    yield process
    local_cluster.stop_process(process.record)


def post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def post_json(url: str, body: Any) -> tuple[int, str]:
    return post(url, json.dumps(body).encode())


def gpu_pod_body(name: str, scheduler: str = keys.SCHEDULER_NAME) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"Pod": {"metadata": "x"}, "NodeNames": ["a"]}, "Pod.metadata"),
        ({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}}, "Nodes.items.0.metadata"),
        (
            {
                "Pod": {"metadata": {"name": "p", "annotations": {keys.ANNOTATION_GANG_SIZE: 2}}},
                "NodeNames": ["a"],
            },
            f"Pod.metadata.annotations.{keys.ANNOTATION_GANG_SIZE}",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_wrong_inner_shapes_answer_400_naming_the_field(
    extender_only: ExtenderProcess, verb: str, body: dict[str, Any], field: str
) -> None:
    status, text = post_json(f"{extender_only.url}/{verb}", body)
    assert status == 400, text
    assert json.loads(text)["Error"].startswith(f"malformed request: {field}:")


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_deeply_nested_json_answers_400_not_500(extender_only: ExtenderProcess, verb: str) -> None:
    status, text = post(f"{extender_only.url}/{verb}", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400, text
    assert "nested too deeply" in json.loads(text)["Error"]


@pytest.mark.parametrize(
    ("name", "namespace"),
    [("../../../nodes/n1", "default"), ("p", "../kube-system"), ("p?dryRun=All", "default")],
)
def test_bind_refuses_names_that_are_no_kubernetes_names(
    extender_only: ExtenderProcess, name: str, namespace: str
) -> None:
    """Names go into API paths: anything Kubernetes would not accept as a name is refused
    before a request is built."""
    body = {"PodName": name, "PodNamespace": namespace, "PodUID": "u", "Node": "n1"}
    status, text = post_json(f"{extender_only.url}/bind", body)
    assert status == 400, text
    assert "Pod" in json.loads(text)["Error"]


def test_more_node_names_than_the_largest_cluster_answer_400(
    extender_only: ExtenderProcess,
) -> None:
    names = [f"n{i}" for i in range(DEFAULT_MAX_NODES + 1)]
    status, text = post_json(
        f"{extender_only.url}/filter", {"Pod": gpu_pod_body("p"), "NodeNames": names}
    )
    assert status == 400, text
    assert "NodeNames" in json.loads(text)["Error"]


def test_a_body_larger_than_kube_scheduler_sends_is_refused_and_the_process_serves_on(
    extender_only: ExtenderProcess,
) -> None:
    limit = max_body_bytes(DEFAULT_MAX_NODES)
    names = ["x" * 60] * (limit // 60)  # short of nodes, long on bytes: only the size is wrong
    body = json.dumps({"Pod": gpu_pod_body("p"), "NodeNames": names}).encode()
    assert len(body) > limit
    status, _ = post(f"{extender_only.url}/filter", body)
    assert status == 413
    with urllib.request.urlopen(f"{extender_only.url}/healthz", timeout=10) as response:
        assert response.status == 200
    # A real request of the largest cluster's size still goes through.
    names = [f"node-{i:05d}" for i in range(DEFAULT_MAX_NODES)]
    status, text = post_json(
        f"{extender_only.url}/filter", {"Pod": gpu_pod_body("p"), "NodeNames": names}
    )
    assert status == 200, text


def test_bind_refuses_a_pod_of_another_scheduler_even_after_a_forged_filter(
    extender_only: ExtenderProcess, kube: Any, gpu_nodes: Any
) -> None:
    node = "extender-input-h100"
    spec, status_ = fixture_objects("hgx-h100-sxm-8gpu-8nic", node)
    gpu_nodes(1, 8, names=[node], topology=spec, status=status_)
    wait_for(lambda: extender_knows(extender_only.url, [node]), 60, "the extender to see the node")
    core = client.CoreV1Api(kube)
    namespace = "extender-input"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        # Nothing schedules pods for this scheduler name, so the pod stays unbound.
        pod = core.create_namespaced_pod(namespace, gpu_pod_body("other", "someone-else"))
        forged = gpu_pod_body("other")  # claims gpusched, with the real pod's UID
        forged["metadata"].update(
            namespace=namespace,
            uid=pod.metadata.uid,
            resourceVersion=pod.metadata.resource_version,
        )
        post_json(f"{extender_only.url}/filter", {"Pod": forged, "NodeNames": [node]})
        status, text = post_json(
            f"{extender_only.url}/bind",
            {
                "PodName": "other",
                "PodNamespace": namespace,
                "PodUID": pod.metadata.uid,
                "Node": node,
            },
        )
        assert status == 200
        assert "schedulerName" in json.loads(text)["Error"]
        assert core.read_namespaced_pod("other", namespace).spec.node_name is None

        # A gpusched pod on the same path binds (so the refusal above is about the scheduler).
        own = core.create_namespaced_pod(namespace, gpu_pod_body("own"))
        status, text = post_json(
            f"{extender_only.url}/bind",
            {"PodName": "own", "PodNamespace": namespace, "PodUID": own.metadata.uid, "Node": node},
        )
        assert json.loads(text)["Error"] == "", text
        bound = wait_for(
            lambda: core.read_namespaced_pod("own", namespace).spec.node_name, 30, "own bound"
        )
        assert bound == node
    finally:
        core.delete_namespace(namespace, grace_period_seconds=0)
