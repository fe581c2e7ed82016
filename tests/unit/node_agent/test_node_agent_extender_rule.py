"""The extender treats the GPUs the node agent saw a pod of another scheduler holding as taken."""

from __future__ import annotations

import pytest

from gpusched.api import keys
from gpusched.core.nodeagent import (
    KubeletPod,
    NodeState,
    node_gpus,
    pod_gpus,
    preferred_allocation,
)
from gpusched.core.scheduling import evaluate, gpu_request
from gpusched.dev.localcluster.topologies import FIXTURE_NAMES, fixture_objects
from gpusched.scheduler.cache import ClusterCache


def _topology(node: str, fixture: str = "hgx-h100-sxm-8gpu-8nic") -> dict[str, object]:
    spec, status = fixture_objects(fixture, node)
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


def test_the_extender_avoids_the_gpus_the_node_agent_gives_a_foreign_pod_it_cannot_see_yet() -> (
    None
):
    """Until the node agent writes which GPUs a pod of another scheduler holds, the extender
    knows only their number; the node agent hands out the GPUs placement chooses last, so the
    usual next pods (one GPU, or all the rest) land beside the foreign pod, not on it."""
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", "n1")
    gpus = node_gpus(spec, status)
    foreign = pod_gpus(_pod("foreign", 1, {}))
    snapshot = NodeState(
        "n1",
        {foreign.key: foreign},
        {foreign.key: KubeletPod("ns", "foreign", {"c": frozenset()})},
        gpus,
    )
    given = preferred_allocation(snapshot, [g.uuid for g in gpus], [], 1)
    assert given.ok
    held = {g.index for g in gpus if g.uuid in given.devices}
    cache = ClusterCache()
    cache.replace_topologies([_topology("n1")])
    cache.replace_pods([_pod("foreign", 1, {})])
    for k in (1, 7):
        placement = evaluate(cache.view("n1"), gpu_request(_pod("new", k, {}))).placement
        assert placement is not None
        assert not held & set(placement.gpus)


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_on_every_wiring_a_pod_placed_before_the_node_agent_reports_misses_the_foreign_gpus(
    fixture: str,
) -> None:
    """Whatever the foreign pod's size and the next pod's, the set the extender chooses
    while it knows only how many GPUs the foreign pod holds avoids the ones it holds."""
    spec, status = fixture_objects(fixture, "n1")
    gpus = node_gpus(spec, status)
    for size in range(1, len(gpus)):
        foreign = pod_gpus(_pod("foreign", size, {}))
        snapshot = NodeState(
            "n1",
            {foreign.key: foreign},
            {foreign.key: KubeletPod("ns", "foreign", {"c": frozenset()})},
            gpus,
        )
        given = preferred_allocation(snapshot, [g.uuid for g in gpus], [], size)
        held = {g.index for g in gpus if g.uuid in given.devices}
        cache = ClusterCache()
        cache.replace_topologies([_topology("n1", fixture)])
        cache.replace_pods([_pod("foreign", size, {})])
        for k in range(1, len(gpus) - size + 1):
            placement = evaluate(cache.view("n1"), gpu_request(_pod("new", k, {}))).placement
            if placement is not None:
                assert not held & set(placement.gpus), (fixture, size, k)
