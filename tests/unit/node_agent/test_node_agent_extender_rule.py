"""The extender treats the GPUs the node agent saw a pod of another scheduler holding as taken."""

from __future__ import annotations

from gpusched.api import keys
from gpusched.core.scheduling import evaluate, gpu_request
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.scheduler.cache import ClusterCache


def _topology(node: str) -> dict[str, object]:
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", node)
    return {"metadata": {"name": node}, "spec": spec.to_k8s(), "status": status.to_k8s()}


def _pod(name: str, gpus: int, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": annotations},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_gpus_a_foreign_pod_really_holds_are_never_chosen_for_a_gpusched_pod() -> None:
    cache = ClusterCache()
    cache.replace_topologies([_topology("n1")])
    foreign = _pod("foreign", 2, {keys.ANNOTATION_ALLOCATED_GPU_INDICES: "0,1"})
    cache.replace_pods([foreign])
    view = cache.view("n1")
    assert view.busy == frozenset({0, 1})
    assert view.unaccounted == 0
    placement = evaluate(view, gpu_request(_pod("new", 6, {}))).placement
    assert placement is not None
    assert set(placement.gpus) == set(range(2, 8))


def test_a_foreign_pod_not_yet_seen_by_the_node_agent_only_reduces_the_count() -> None:
    cache = ClusterCache()
    cache.replace_topologies([_topology("n1")])
    cache.replace_pods([_pod("foreign", 2, {})])
    view = cache.view("n1")
    assert view.busy == frozenset()
    assert view.unaccounted == 2
