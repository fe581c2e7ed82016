"""Hand-checked placements per fixture, refusals, health, policies and the public API."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import pytest
from core_testdata import (
    A100,
    BRIDGED,
    DGX1,
    H100,
    RTX4090,
    TREES,
    WORKSTATION,
    class_of,
    documented_objective,
    node,
    topology,
)

from gpusched.api.gpujob import TopologyMode, TopologyPolicy, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState, LinkType
from gpusched.core import (
    Placement,
    Policy,
    Refusal,
    RefusalReason,
    evaluate_set,
    parse_topo_matrix,
    place,
    prepare,
)
from gpusched.core.topology import NicLink

NVLINK_REQUIRED = Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED)
MULTI_NODE = Policy(multi_node=True)
ANY = Policy()


def placed(name: str, k: int, policy: Policy = ANY, busy: tuple[int, ...] = ()) -> Placement:
    result = place(node(name), k, policy, busy=busy)
    assert isinstance(result, Placement), result.reasons
    return result


def refused(name: str, k: int, policy: Policy = ANY, busy: tuple[int, ...] = ()) -> Refusal:
    result = place(node(name), k, policy, busy=busy)
    assert isinstance(result, Refusal), result
    return result


# --- NVSwitch boards: every pair NV, NUMA and NIC locality break ties -------------------------


def test_nvswitch_sets_stay_in_one_numa_node() -> None:
    for name in (H100, A100):
        for k in (2, 3, 4):
            result = placed(name, k)
            assert result.topology_class is TopologyScope.NVLINK
            assert len(result.numa_nodes) == 1


def test_nvswitch_four_gpus_go_to_the_socket_with_room() -> None:
    assert placed(H100, 4, busy=(0,)).gpus == (4, 5, 6, 7)


def test_nvswitch_small_request_fills_the_broken_socket_first() -> None:
    # GPU 0 is taken: two more from socket 0 keep socket 1 whole for a 4-GPU job.
    result = placed(H100, 2, busy=(0,))
    assert set(result.gpus) <= {1, 2, 3}
    assert placed(H100, 1, busy=(0,)).gpus[0] in {1, 2, 3}


def test_nvswitch_multi_node_job_takes_the_nic_local_gpus() -> None:
    # On the H100 board only GPUs 0, 2, 4 and 6 sit on a PCIe switch with NICs.
    assert placed(H100, 2, MULTI_NODE).gpus == (0, 2)
    assert placed(H100, 2).gpus == (0, 1)  # a single-node job does not care
    assert set(placed(H100, 4, MULTI_NODE).gpus) == {0, 1, 2, 3}


def test_nvswitch_bottleneck_follows_the_generation() -> None:
    assert placed(H100, 8).bottleneck_gbps == pytest.approx(370.8)
    assert placed(A100, 8).bottleneck_gbps == pytest.approx(240.0)
    assert placed(H100, 2).bottleneck_link == "NV18"


# --- NVLink-bridged boards ----------------------------------------------------------------------


def test_bridged_two_gpus_land_on_a_bridged_pair() -> None:
    result = placed(BRIDGED, 2)
    assert result.gpus == (0, 2)
    assert result.topology_class is TopologyScope.NVLINK


def test_bridged_four_gpus_take_two_pairs_in_one_numa_node() -> None:
    assert placed(BRIDGED, 4).gpus == (0, 1, 2, 3)
    assert placed(BRIDGED, 4, busy=(0,)).gpus == (4, 5, 6, 7)


def test_bridged_pair_is_chosen_over_orphans() -> None:
    assert placed(BRIDGED, 2, busy=(0, 1)).gpus == (4, 5)


def test_bridged_single_gpu_takes_an_orphan_first() -> None:
    assert placed(BRIDGED, 1, busy=(0,)).gpus == (2,)


def test_bridged_nvlink_required_refuses_with_the_reachable_class() -> None:
    result = refused(BRIDGED, 4, NVLINK_REQUIRED)
    assert result.reason is RefusalReason.SCOPE_UNSATISFIABLE
    assert result.best_class is TopologyScope.NODE
    assert any("NVLink island" in r for r in result.reasons)
    assert refused(BRIDGED, 2, NVLINK_REQUIRED, busy=(0, 1, 4, 6)).reason is (
        RefusalReason.SCOPE_UNSATISFIABLE
    )


# --- PCIe switch trees ------------------------------------------------------------------------


def test_pcie_four_gpus_stay_under_one_switch_tree() -> None:
    result = placed(TREES, 4)
    assert result.gpus == (0, 1, 2, 3)
    assert result.topology_class is TopologyScope.PCIE_SWITCH
    assert placed(TREES, 4, busy=(0,)).gpus == (4, 5, 6, 7)


def test_pcie_pair_prefers_the_single_switch() -> None:
    result = placed(TREES, 2)
    assert result.gpus == (0, 1)
    assert result.bottleneck_link == "PIX"
    assert placed(TREES, 3).gpus == (0, 1, 2)


def test_pcie_single_gpu_keeps_the_pix_pair_whole() -> None:
    assert placed(TREES, 1).gpus == (2,)


def test_pcie_switch_required_cannot_span_trees() -> None:
    result = refused(TREES, 5, Policy(TopologyScope.PCIE_SWITCH, TopologyMode.REQUIRED))
    assert result.reason is RefusalReason.SCOPE_UNSATISFIABLE
    preferred = placed(TREES, 5, Policy(TopologyScope.PCIE_SWITCH))
    assert not preferred.scope_satisfied
    assert preferred.topology_class is TopologyScope.NODE


# --- all-SYS PCIe box and the workstation ---------------------------------------------------------


def test_all_sys_box_keeps_sets_on_one_socket() -> None:
    result = placed(RTX4090, 4)
    assert result.gpus == (0, 1, 2, 3)
    assert result.topology_class is TopologyScope.NODE
    assert result.numa_nodes == (0,)
    assert 6 in placed(RTX4090, 2, MULTI_NODE).gpus  # the only GPU near a NIC


def test_all_sys_box_cannot_meet_a_numa_scope() -> None:
    result = refused(RTX4090, 2, Policy(TopologyScope.NUMA, TopologyMode.REQUIRED))
    assert result.best_class is TopologyScope.NODE


def test_workstation_pair_and_single_gpu() -> None:
    assert placed(WORKSTATION, 2).gpus == (0, 1)
    assert placed(WORKSTATION, 1).gpus == (2,)  # leaves the NVLink pair whole
    second = placed(WORKSTATION, 2, busy=(0,))
    assert second.gpus == (2, 3)
    assert second.topology_class is TopologyScope.NUMA


def test_preferred_scope_places_anyway_and_says_so() -> None:
    result = placed(WORKSTATION, 2, Policy(TopologyScope.NVLINK), busy=(1,))
    assert not result.scope_satisfied
    assert result.gpus == (2, 3)
    assert any("no free set qualifies" in r for r in result.reasons)


def test_hybrid_mesh_uses_double_links_and_quads() -> None:
    pair = placed(DGX1, 2)
    assert pair.bottleneck_link == "NV2"
    assert pair.gpus == (0, 3)
    quad = placed(DGX1, 4)
    assert quad.gpus == (0, 1, 2, 3)
    assert quad.topology_class is TopologyScope.NVLINK
    assert placed(DGX1, 8).topology_class is TopologyScope.NODE


# --- refusals -------------------------------------------------------------------------------------


def test_request_sizes_outside_the_node_are_refused_with_a_reason() -> None:
    assert refused(H100, 0).reason is RefusalReason.INVALID_REQUEST
    assert refused(H100, 9).reason is RefusalReason.REQUEST_EXCEEDS_NODE
    assert refused(WORKSTATION, 5).reason is RefusalReason.REQUEST_EXCEEDS_NODE
    busy = refused(H100, 7, busy=(0, 1))
    assert busy.reason is RefusalReason.NOT_ENOUGH_FREE_GPUS
    assert "in use: 0,1" in busy.reasons


def test_unhealthy_gpus_make_a_request_unplaceable() -> None:
    sick = prepare(
        topology(H100).with_health(
            {0: GpuHealthState.UNHEALTHY, 1: GpuHealthState.UNSCHEDULABLE}, {0: "Xid79"}
        )
    )
    result = place(sick, 7)
    assert isinstance(result, Refusal)
    assert result.reason is RefusalReason.NOT_ENOUGH_HEALTHY_GPUS
    assert any(
        "GPU 0 Unhealthy (Xid79)" in r and "GPU 1 Unschedulable" in r for r in result.reasons
    )
    chosen = place(sick, 6)
    assert isinstance(chosen, Placement)
    assert not {0, 1} & set(chosen.gpus)


def test_mig_gpus_are_never_placed() -> None:
    topo = topology(BRIDGED)
    mig = prepare(
        replace(topo, gpus=tuple(replace(g, mig_enabled=g.index == 0) for g in topo.gpus))
    )
    result = place(mig, 2)
    assert isinstance(result, Placement)
    assert result.gpus == (1, 3)


def test_degraded_gpu_is_avoided_when_an_equal_set_exists_and_penalised_otherwise() -> None:
    degraded = prepare(topology(H100).with_health({0: GpuHealthState.DEGRADED}))
    pair = place(degraded, 2)
    assert isinstance(pair, Placement)
    assert 0 not in pair.gpus
    everything = place(degraded, 8)
    healthy = place(node(H100), 8)
    assert isinstance(everything, Placement)
    assert isinstance(healthy, Placement)
    assert everything.degraded_gpus == (0,)
    assert everything.score < healthy.score


def test_degraded_bridged_pair_still_beats_a_sys_pair() -> None:
    degraded = prepare(topology(WORKSTATION).with_health({0: GpuHealthState.DEGRADED}))
    result = place(degraded, 2)
    assert isinstance(result, Placement)
    assert result.gpus == (0, 1)  # NVLink with a throttled GPU is still far faster than SYS


# --- score, explanation, API --------------------------------------------------------------------


def test_score_ranks_faster_sets_higher_across_nodes() -> None:
    scores = [placed(name, 2).score for name in (H100, A100, TREES, RTX4090)]
    assert scores == sorted(scores, reverse=True)
    assert all(0 <= s <= 100 for s in scores)


def test_score_prefers_the_fuller_node_for_equal_sets() -> None:
    empty = placed(H100, 2)
    partly_used = placed(H100, 2, busy=(0, 1, 2, 3))
    assert partly_used.score > empty.score


def test_chosen_set_scores_at_least_as_well_as_first_fit() -> None:
    best = placed(BRIDGED, 2)
    first_fit = evaluate_set(node(BRIDGED), (0, 1))
    assert best.objective > first_fit.objective
    assert best.score > first_fit.score


def test_evaluate_set_refuses_busy_or_empty_sets() -> None:
    with pytest.raises(ValueError, match="not free"):
        evaluate_set(node(H100), (0, 1), busy=(1,))
    with pytest.raises(ValueError, match="empty"):
        evaluate_set(node(H100), ())
    with pytest.raises(ValueError, match="no GPU 11"):
        place(node(H100), 2, busy=(11,))


def test_free_mask_and_busy_list_agree() -> None:
    n = node(BRIDGED)
    by_mask = place(n, 2, free_mask=n.mask((1, 3, 4, 6)))
    by_list = place(n, 2, busy=(0, 2, 5, 7))
    assert isinstance(by_mask, Placement)
    assert by_mask == by_list
    assert by_mask.gpus == (1, 3)


def test_reasons_explain_the_choice() -> None:
    result = placed(BRIDGED, 2, NVLINK_REQUIRED, busy=(0,))
    text = " | ".join(result.reasons)
    assert "every pair on NVLink" in text
    assert "NV12 at 240.0 GB/s" in text
    assert "scope nvlink (required) met" in text
    assert "NUMA node 0" in text


def test_json_form_has_the_documented_keys() -> None:
    data = placed(H100, 4).to_dict()
    assert {"gpus", "score", "topology_class", "reasons"} <= set(data)
    assert data["topology_class"] == "nvlink"
    refusal = refused(BRIDGED, 4, NVLINK_REQUIRED).to_dict()
    assert refusal["gpus"] == []
    assert refusal["reason"] == "ScopeUnsatisfiable"


def test_policy_from_the_gpujob_api() -> None:
    policy = Policy.from_api(
        TopologyPolicy(scope=TopologyScope.NUMA, mode=TopologyMode.REQUIRED), replicas=4
    )
    assert policy == Policy(TopologyScope.NUMA, TopologyMode.REQUIRED, multi_node=True)
    assert hash(policy) == hash(Policy(TopologyScope.NUMA, TopologyMode.REQUIRED, True))
    assert policy.required


def test_achieved_class_matches_the_link_list() -> None:
    for name in (H100, BRIDGED, TREES, WORKSTATION, DGX1):
        for k in range(1, len(topology(name).gpus) + 1):
            result = placed(name, k)
            assert result.topology_class.value == class_of(topology(name), result.gpus)


# --- more than 16 GPUs: the heuristic -----------------------------------------------------------


def _big_matrix(groups: int, size: int) -> str:
    n = groups * size
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tNUMA Affinity"
    rows = [header]
    for a in range(n):
        cells = [
            " X " if a == b else ("NV18" if a // size == b // size else "SYS") for b in range(n)
        ]
        rows.append(f"GPU{a}\t" + "\t".join(cells) + f"\t{a // size}")
    return "\n".join(rows) + "\n"


def test_heuristic_places_large_nodes_inside_one_switch_group() -> None:
    big = prepare(parse_topo_matrix(_big_matrix(3, 8), gpu_model="NVIDIA H100"))
    result = place(big, 8, busy=(0, 9))
    assert isinstance(result, Placement)
    assert result.search == "heuristic"
    assert set(result.gpus) == set(range(16, 24))
    required = place(big, 4, NVLINK_REQUIRED, busy=tuple(range(20)))
    assert isinstance(required, Placement)
    assert required.gpus == (20, 21, 22, 23)
    impossible = place(big, 5, NVLINK_REQUIRED, busy=tuple(range(20)))
    assert isinstance(impossible, Refusal)


def test_heuristic_matches_exact_on_a_sixteen_gpu_node() -> None:
    n = prepare(parse_topo_matrix(_big_matrix(4, 4), gpu_model="NVIDIA A100"))
    for k in (2, 3, 4, 6):
        exact = place(n, k, busy=(1, 6), exact=True)
        heuristic = place(n, k, busy=(1, 6), exact=False)
        assert isinstance(exact, Placement)
        assert isinstance(heuristic, Placement)
        assert heuristic.search == "heuristic"
        assert heuristic.objective == exact.objective


def test_heuristic_finds_a_required_set_behind_faster_dead_ends() -> None:
    # 18 GPUs (heuristic search): 0, 1 and 2 are joined by single NVLinks, and each also has a
    # four-link bridge to a GPU that reaches nothing else over NVLink. Growing greedily from any
    # GPU takes the fast bridge first and dead-ends, yet {0, 1, 2} meets the required scope.
    bonds = {(0, 1): "NV1", (0, 2): "NV1", (1, 2): "NV1", (0, 3): "NV4", (1, 4): "NV4"}
    bonds[(2, 5)] = "NV4"
    header = "\t" + "\t".join(f"GPU{i}" for i in range(18)) + "\tCPU Affinity\tNUMA Affinity"
    rows = [header]
    for a in range(18):
        cells = [" X " if a == b else bonds.get((min(a, b), max(a, b)), "SYS") for b in range(18)]
        rows.append("\t".join([f"GPU{a}", *cells, "0-7", "0"]))
    board = prepare(parse_topo_matrix("\n".join(rows) + "\n"))
    for mode in TopologyMode:
        result = place(board, 3, Policy(TopologyScope.NVLINK, mode))
        assert isinstance(result, Placement)
        assert result.search == "heuristic"
        assert result.gpus == (0, 1, 2)
        assert result.scope_satisfied


def test_a_scope_refusal_names_the_tightest_class_a_free_set_reaches() -> None:
    # 0-2: NV1 and PXB pairs (pcie-switch, slowest 20 GB/s); 3-5: PIX and PHB (numa, slowest
    # 20 GB/s but more in all, so the best set overall). No three GPUs are NVLinked pairwise.
    bonds = {(0, 1): "NV1", (0, 2): "PXB", (1, 2): "PXB", (3, 4): "PIX", (3, 5): "PHB"}
    bonds[(4, 5)] = "PHB"
    rows = ["\t" + "\t".join(f"GPU{i}" for i in range(6)) + "\tCPU Affinity\tNUMA Affinity"]
    for a in range(6):
        cells = [" X " if a == b else bonds.get((min(a, b), max(a, b)), "SYS") for b in range(6)]
        rows.append("\t".join([f"GPU{a}", *cells, "0-7", "0"]))
    board = prepare(parse_topo_matrix("\n".join(rows) + "\n"))
    refusal = place(board, 3, NVLINK_REQUIRED)
    assert isinstance(refusal, Refusal)
    assert refusal.best_class is TopologyScope.PCIE_SWITCH
    assert "best free set 0,1,2 reaches only pcie-switch" in refusal.reasons
    assert place(board, 3, Policy(TopologyScope.PCIE_SWITCH, TopologyMode.REQUIRED)).gpus == (
        0,
        1,
        2,
    )


def test_the_memo_never_answers_for_a_node_wired_differently() -> None:
    # Placements are shared between nodes of one wiring; NUMA nodes, NIC distances and the GPU
    # model are wiring: a node that differs in any of them gets its own answer.
    h100 = topology(H100)
    interleaved = replace(h100, gpus=tuple(replace(g, numa_node=g.index % 2) for g in h100.gpus))
    one_rail = replace(
        h100,
        nic_links=tuple(
            NicLink(nl.nic, nl.gpu, LinkType.PIX if nl.gpu == 7 else LinkType.SYS)
            for nl in h100.nic_links
        ),
    )
    older = replace(h100, gpus=tuple(replace(g, model="NVIDIA A100-SXM4-80GB") for g in h100.gpus))
    cases = [
        (interleaved, 4, ANY, (0, 2, 4, 6)),
        (one_rail, 1, MULTI_NODE, (7,)),
        (older, 2, ANY, None),
    ]
    for variant, k, policy, expected in cases:
        assert place(prepare(h100), k, policy) is not None  # the original's answer is memoised
        shared = place(prepare(variant), k, policy)
        assert isinstance(shared, Placement)
        free = variant.gpu_indices
        documented = documented_objective(variant, shared.gpus, policy, free, frozenset())
        assert shared.objective == documented
        best = max(
            (documented_objective(variant, s, policy, free, frozenset()), s)
            for s in combinations(free, k)
        )
        assert shared.objective == best[0]
        if expected is not None:
            assert shared.gpus == expected
