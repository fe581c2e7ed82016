"""The extender's pure decisions: reading a pod's request, filtering and scoring nodes."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.api import TopologyMode, TopologyScope, keys
from gpusched.core import prepare
from gpusched.core.placement import Policy
from gpusched.core.scheduling import (
    GpuRequest,
    NodeView,
    RequestError,
    evaluate,
    filter_nodes,
    gpu_count,
    gpu_request,
    prioritize,
)
from gpusched.dev.localcluster.topologies import fixture_topology

H100 = "hgx-h100-sxm-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
ALLSYS = "pcie-8x-rtx4090-2socket-allsys-2nic"


def view(
    fixture: str, name: str = "n", busy: tuple[int, ...] = (), unaccounted: int = 0
) -> NodeView:
    return NodeView(name, prepare(fixture_topology(fixture, name)), frozenset(busy), unaccounted)


def pod(
    limits: dict[str, Any],
    annotations: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"annotations": annotations or {}}, "spec": spec}


def test_gpu_count_sums_containers_and_honours_a_larger_init_container() -> None:
    body = pod({keys.GPU_RESOURCE: "2"})
    body["spec"]["containers"].append(
        {"name": "d", "resources": {"limits": {keys.GPU_RESOURCE: 1}}}
    )
    assert gpu_count(body) == 3
    body["spec"]["initContainers"] = [
        {"name": "i", "resources": {"limits": {keys.GPU_RESOURCE: "4"}}}
    ]
    assert gpu_count(body) == 4


def test_request_reads_scope_and_mode_annotations() -> None:
    request = gpu_request(
        pod(
            {keys.GPU_RESOURCE: "4"},
            {
                keys.ANNOTATION_TOPOLOGY_SCOPE: "nvlink",
                keys.ANNOTATION_TOPOLOGY_MODE: "required",
                keys.ANNOTATION_GANG_SIZE: "2",
            },
        )
    )
    assert request.gpus == 4
    assert request.policy == Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED, multi_node=True)


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        ({keys.ANNOTATION_TOPOLOGY_SCOPE: "rack"}, keys.ANNOTATION_TOPOLOGY_SCOPE),
        ({keys.ANNOTATION_TOPOLOGY_MODE: "maybe"}, keys.ANNOTATION_TOPOLOGY_MODE),
        ({keys.ANNOTATION_GANG_SIZE: "two"}, keys.ANNOTATION_GANG_SIZE),
    ],
)
def test_malformed_annotations_are_refused_naming_the_annotation(
    annotations: dict[str, str], field: str
) -> None:
    with pytest.raises(RequestError, match=field):
        gpu_request(pod({keys.GPU_RESOURCE: "1"}, annotations))


def test_fractional_gpu_quantity_is_refused() -> None:
    with pytest.raises(RequestError, match="whole number"):
        gpu_request(pod({keys.GPU_RESOURCE: "500m"}))


def test_node_without_topology_is_refused_as_unresolvable() -> None:
    verdict = evaluate(NodeView("bare", None), GpuRequest(1, Policy()))
    assert verdict.placement is None
    assert verdict.reason is not None
    assert verdict.reason.startswith("NoTopology")
    assert not verdict.resolvable


def test_required_scope_the_wiring_can_never_meet_is_unresolvable_but_busy_gpus_are_not() -> None:
    request = GpuRequest(4, Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED))
    never = evaluate(view(BRIDGED), request)
    assert never.placement is None
    assert never.reason is not None
    assert never.reason.startswith("ScopeUnsatisfiable")
    assert not never.resolvable
    pair = GpuRequest(2, Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED))
    blocked = evaluate(view(BRIDGED, busy=(0, 1, 4, 6)), pair)
    assert blocked.placement is None
    assert blocked.resolvable, "freeing GPUs would restore a bridged pair"


def test_unaccounted_gpus_reduce_what_fits() -> None:
    request = GpuRequest(4, Policy())
    assert evaluate(view(H100, unaccounted=4), request).placement is not None
    refused = evaluate(view(H100, unaccounted=5), request)
    assert refused.placement is None
    assert refused.resolvable


def test_filter_splits_refusals_into_resolvable_and_unresolvable_when_nothing_fits() -> None:
    request = GpuRequest(4, Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED))
    refused = [view(H100, "busy", busy=(0, 1, 2, 3, 4)), view(BRIDGED, "b"), NodeView("bare", None)]
    outcome = filter_nodes(refused, request)
    assert outcome.fits == ()
    assert set(outcome.failed) == {"busy"}
    assert set(outcome.unresolvable) == {"b", "bare"}
    fitting = filter_nodes([view(H100, "h"), *refused], request)
    assert fitting.fits == ("h",)
    assert set(fitting.verdicts) == {"h"}, "reasons are worked out only when nothing fits"


def test_planned_node_wins_when_it_fits_and_is_ignored_when_it_does_not() -> None:
    views = [view(H100, "a"), view(H100, "b")]
    planned = filter_nodes(views, GpuRequest(2, Policy(), planned_node="b"))
    assert planned.fits == ("b",)
    gone = filter_nodes(views, GpuRequest(2, Policy(), planned_node="c"))
    assert gone.fits == ("a",), "the plan is gone: the shared ranking decides"


def test_among_equal_nodes_the_one_in_the_fullest_rack_passes_the_filter() -> None:
    # Idle a0, a1 in rack r1 (names first); idle b0 and full b1 in rack r2: the pod goes to
    # b0, keeping r1 whole for a gang; with soft preferences every tied node passes.
    def in_rack(name: str, rack: str, busy: tuple[int, ...] = ()) -> NodeView:
        bare = view(H100, name, busy)
        return NodeView(name, bare.prepared, bare.busy, domains=(rack,))

    views = [in_rack("a0", "r1"), in_rack("a1", "r1"), in_rack("b0", "r2")]
    views.append(in_rack("b1", "r2", tuple(range(8))))
    assert filter_nodes(views, GpuRequest(1, Policy())).fits == ("b0",)
    soft = filter_nodes(views, GpuRequest(1, Policy(), soft_preferences=True))
    assert soft.fits == ("a0", "a1", "b0")
    # Without levels, the lowest name.
    flat = [NodeView(v.name, v.prepared, v.busy) for v in views]
    assert filter_nodes(flat, GpuRequest(1, Policy())).fits == ("a0",)


def test_nvlinked_node_outranks_an_all_pcie_node() -> None:
    scores = prioritize([view(H100, "h"), view(ALLSYS, "p")], GpuRequest(4, Policy()))
    assert scores["h"] > scores["p"]
    assert all(0 <= s <= 10 for s in scores.values())


def test_planned_gpus_are_used_while_free_and_replaced_when_taken() -> None:
    # 0 and 1 sit on different sockets: a set the engine itself would never pick.
    planned = GpuRequest(2, Policy(), planned_node="b", planned_gpus=(0, 1))
    honoured = evaluate(view(BRIDGED, "b"), planned)
    assert honoured.placement is not None
    assert honoured.placement.gpus == (0, 1)
    elsewhere = evaluate(view(BRIDGED, "other"), planned)
    assert elsewhere.placement is not None
    assert elsewhere.placement.gpus in {(0, 2), (1, 3), (4, 5), (6, 7)}
    taken = evaluate(view(BRIDGED, "b", busy=(1,)), planned)
    assert taken.placement is not None
    assert 1 not in taken.placement.gpus


def _gpujob_pod(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the operator creates a GpuJob's pod: controlled by the job."""
    body["metadata"]["labels"] = {keys.LABEL_JOB_UID: "job-uid"}
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": keys.API_VERSION, "kind": "GpuJob", "uid": "job-uid", "controller": True}
    ]
    return body


def test_malformed_planned_gpus_are_refused_naming_the_annotation() -> None:
    with pytest.raises(RequestError, match=keys.ANNOTATION_PLANNED_GPU_INDICES):
        gpu_request(
            _gpujob_pod(pod({keys.GPU_RESOURCE: "2"}, {keys.ANNOTATION_PLANNED_GPU_INDICES: "a,b"}))
        )


def test_a_plan_is_read_only_from_a_gpujobs_pod() -> None:
    """planned-node and planned-gpu-indices on a plain pod choose nothing (only the operator
    plans, and only for the pods it creates)."""
    plan = {keys.ANNOTATION_PLANNED_NODE: "n7", keys.ANNOTATION_PLANNED_GPU_INDICES: "2,3"}
    plain = gpu_request(pod({keys.GPU_RESOURCE: "2"}, dict(plan)))
    assert (plain.planned_node, plain.planned_gpus) == (None, None)
    owned = gpu_request(_gpujob_pod(pod({keys.GPU_RESOURCE: "2"}, dict(plan))))
    assert (owned.planned_node, owned.planned_gpus) == ("n7", (2, 3))
    forged = _gpujob_pod(pod({keys.GPU_RESOURCE: "2"}, dict(plan)))
    forged["metadata"]["ownerReferences"][0]["uid"] = "another-job"
    assert gpu_request(forged).planned_node is None


def test_gpu_count_follows_the_sidecar_rule() -> None:
    """Sidecars (restartable init containers) hold their GPUs beside the regular containers;
    a classic init container runs beside the sidecars started before it."""
    body = pod({keys.GPU_RESOURCE: "2"})
    body["spec"]["initContainers"] = [
        {"name": "s", "restartPolicy": "Always", "resources": {"limits": {keys.GPU_RESOURCE: 1}}},
        {"name": "i", "resources": {"limits": {keys.GPU_RESOURCE: "3"}}},
    ]
    assert gpu_count(body) == 4  # the init container beside the sidecar: 1 + 3 > 2 + 1
    body["spec"]["initContainers"][1]["resources"]["limits"][keys.GPU_RESOURCE] = "1"
    assert gpu_count(body) == 3  # sidecar + regular containers


def test_planned_gpus_naming_a_gpu_twice_are_refused_naming_the_annotation() -> None:
    """A plan that repeats an index names fewer GPUs than the pod requests: binding it would
    write a short assignment."""
    planned = {keys.ANNOTATION_PLANNED_NODE: "b", keys.ANNOTATION_PLANNED_GPU_INDICES: "3,3"}
    with pytest.raises(RequestError, match=f"{keys.ANNOTATION_PLANNED_GPU_INDICES}.*distinct"):
        gpu_request(_gpujob_pod(pod({keys.GPU_RESOURCE: "2"}, planned)))


def test_a_planned_set_naming_a_gpu_twice_is_chosen_afresh() -> None:
    request = GpuRequest(2, Policy(), planned_node="b", planned_gpus=(3, 3))
    verdict = evaluate(view(H100, "b"), request)
    assert verdict.placement is not None
    assert len(set(verdict.placement.gpus)) == 2


@pytest.mark.parametrize("value", ["²", "٣", "1²"])
def test_a_gpu_quantity_in_non_ascii_digits_is_refused_as_not_a_whole_number(value: str) -> None:
    """str.isdigit() accepts superscripts and other scripts' digits, which int() refuses."""
    with pytest.raises(RequestError, match="whole number"):
        gpu_request(pod({keys.GPU_RESOURCE: value}))


def test_a_gang_size_in_non_ascii_digits_is_refused_naming_the_annotation() -> None:
    with pytest.raises(RequestError, match=keys.ANNOTATION_GANG_SIZE):
        gpu_request(pod({keys.GPU_RESOURCE: "1"}, {keys.ANNOTATION_GANG_SIZE: "²"}))
