"""Node ranking shared by admission and the extender: a job never gets a worse topology class (or
a slower slowest pair) than a node available to it now offers; packing decides only among
equally wired nodes; the operator's plan and the extender's choice agree."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.api import GpuHealthState, TopologyMode, TopologyScope
from gpusched.core import NodeTopology, PreparedNode, prepare
from gpusched.core.admission import Node, Snapshot, Tenant, run_cycle
from gpusched.core.admission.pool import Pool, Request
from gpusched.core.placement import DEFAULT_POLICY, Placement, Policy, place
from gpusched.core.scheduling import GpuRequest, NodeView, filter_nodes, prioritize
from gpusched.dev.localcluster.topologies import fixture_topology
from tests.unit.core.admission_testdata import job
from tests.unit.core.core_testdata import class_of

H100 = "hgx-h100-sxm-8gpu-8nic"
A100 = "hgx-a100-sxm4-80gb-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
TREES = "pcie-8gpu-pix-pxb-two-switch-trees"
ALLSYS = "pcie-8x-rtx4090-2socket-allsys-2nic"
FLEET = (H100, A100, BRIDGED, TREES, ALLSYS)
SCOPE_ORDER = ("nvlink", "pcie-switch", "numa", "node")


def topology(fixture: str, name: str, unhealthy: tuple[int, ...] = ()) -> NodeTopology:
    base = fixture_topology(fixture, name)
    gpus = tuple(
        replace(g, health=GpuHealthState.UNHEALTHY, health_reason="Xid79")
        if g.index in unhealthy
        else g
        for g in base.gpus
    )
    return replace(base, gpus=gpus)


def admission_node(name: str, prepared: PreparedNode, busy: tuple[int, ...] = ()) -> Node:
    return Node(name=name, topology=prepared, busy=frozenset(busy))


def issue_cluster() -> list[tuple[str, PreparedNode]]:
    """Twelve idle HGX H100 nodes and one PCIe board (NVLink-bridged pairs) with a failed GPU."""
    nodes = [(f"h100-{i:02d}", prepare(topology(H100, f"h100-{i:02d}"))) for i in range(12)]
    nodes.append(("pcie-board", prepare(topology(BRIDGED, "pcie-board", unhealthy=(3,)))))
    return nodes


def plan(nodes: list[Node], gpus: int, policy: Policy = DEFAULT_POLICY) -> tuple[str, Placement]:
    """Where the admission cycle puts one replica of a fresh job."""
    snapshot = Snapshot(
        now=0.0,
        tenants=(Tenant("t", guaranteed=1000),),
        jobs=(job("t/j", "t", gpus, scope=policy.scope, mode=policy.mode),),
        nodes=tuple(nodes),
    )
    admission = run_cycle(snapshot).admission_of("t/j")
    assert admission is not None
    replica = admission.placement[0]
    chosen = next(n for n in nodes if n.name == replica.node)
    result = place(chosen.topology, gpus, policy, busy=chosen.busy)
    assert isinstance(result, Placement)
    assert result.gpus == replica.gpus
    return replica.node, result


def test_default_job_on_idle_h100s_and_a_pcie_board_that_lost_a_gpu_gets_nvlink() -> None:
    nodes = [admission_node(name, prepared) for name, prepared in issue_cluster()]
    node, placement = plan(nodes, 4)
    assert node.startswith("h100-")
    assert placement.topology_class is TopologyScope.NVLINK


def test_extender_passes_only_an_h100_on_the_same_cluster() -> None:
    views = [NodeView(name, prepared) for name, prepared in issue_cluster()]
    outcome = filter_nodes(views, GpuRequest(4, Policy()))
    assert len(outcome.fits) == 1
    assert outcome.fits[0].startswith("h100-")
    scores = prioritize(views, GpuRequest(4, Policy()))
    assert scores[outcome.fits[0]] == 10
    assert scores["pcie-board"] < min(scores[n] for n in scores if n.startswith("h100-"))


def test_small_job_fills_a_partly_used_node_of_the_same_wiring_first() -> None:
    h100 = prepare(topology(H100, "h"))
    nodes = [admission_node("empty", h100), admission_node("half", h100, busy=(0, 1, 2, 3))]
    assert plan(nodes, 2)[0] == "half"
    views = [NodeView("empty", h100), NodeView("half", h100, frozenset({0, 1, 2, 3}))]
    assert filter_nodes(views, GpuRequest(2, Policy())).fits == ("half",)


def test_packing_never_costs_the_job_bandwidth() -> None:
    """A partly used bridged board offers a 240 GB/s NVLink pair; an idle H100 a 370.8 GB/s
    one: the pair goes to the H100 although the bridged board is fuller."""
    h100 = prepare(topology(H100, "h"))
    bridged = prepare(topology(BRIDGED, "b"))
    nodes = [admission_node("idle-h100", h100), admission_node("used-pcie", bridged, busy=(0, 2))]
    node, placement = plan(nodes, 2)
    assert node == "idle-h100"
    assert placement.bottleneck_gbps is not None
    assert placement.bottleneck_gbps > 300
    views = [NodeView("idle-h100", h100), NodeView("used-pcie", bridged, frozenset({0, 2}))]
    assert filter_nodes(views, GpuRequest(2, Policy())).fits == ("idle-h100",)


def test_pods_with_soft_preferences_get_every_node_tied_for_the_best_rank() -> None:
    h100 = prepare(topology(H100, "h"))
    views = [NodeView(name, h100) for name in ("c", "a", "b")]
    views.append(NodeView("pcie", prepare(topology(ALLSYS, "pcie"))))
    single = filter_nodes(views, GpuRequest(4, Policy()))
    assert single.fits == ("a",)
    tied = filter_nodes(views, GpuRequest(4, Policy(), soft_preferences=True))
    assert tied.fits == ("a", "b", "c")


# --- the operator's plan and the extender's choice agree, and follow the rule --------------

NODE_STATES = st.lists(
    st.tuples(
        st.sampled_from(FLEET),
        st.sets(st.integers(0, 7), max_size=6),  # busy
        st.sets(st.integers(0, 7), max_size=2),  # unhealthy
    ),
    min_size=2,
    max_size=8,
)
POLICIES = st.builds(
    Policy,
    st.sampled_from(list(TopologyScope)),
    st.sampled_from(list(TopologyMode)),
)


def _independent_truth(
    cluster: list[tuple[str, PreparedNode, frozenset[int]]], k: int, policy: Policy
) -> tuple[set[str], dict[str, Placement]]:
    """Nodes the rule allows, computed from each node's placement and its links directly:
    scope met first, then the tightest class, then the fastest slowest pair, fewest Degraded,
    then fewest free GPUs left; anything tied after that is allowed."""
    placements: dict[str, Placement] = {}
    for name, prepared, busy in cluster:
        result = place(prepared, k, policy, busy=busy)
        if isinstance(result, Placement):
            placements[name] = result

    def key(name: str) -> tuple[bool, int, float, int, int]:
        p = placements[name]
        topo = next(pr.topology for n, pr, _ in cluster if n == name)
        klass = SCOPE_ORDER.index(class_of(topo, p.gpus)) if len(p.gpus) > 1 else 0
        scope_ok = klass <= SCOPE_ORDER.index(policy.scope.value)
        bottleneck = p.bottleneck_gbps if p.bottleneck_gbps is not None else float("inf")
        free = len(set(prepared_free(cluster, name))) - k
        return (scope_ok, -klass, bottleneck, -len(p.degraded_gpus), -free)

    if not placements:
        return set(), placements
    best = max(key(n) for n in placements)
    return {n for n in placements if key(n) == best}, placements


def prepared_free(cluster: list[tuple[str, PreparedNode, frozenset[int]]], name: str) -> list[int]:
    _, prepared, busy = next(c for c in cluster if c[0] == name)
    return [i for i in prepared.indices(prepared.placeable_mask) if i not in busy]


@settings(max_examples=200, deadline=None)
@given(states=NODE_STATES, k=st.sampled_from((1, 2, 4, 8)), policy=POLICIES)
def test_plan_and_extender_choose_a_node_the_rule_allows(
    states: list[tuple[str, set[int], set[int]]], k: int, policy: Policy
) -> None:
    cluster = [
        (
            f"n{i}",
            prepare(topology(fixture, f"n{i}", unhealthy=tuple(sorted(unhealthy)))),
            frozenset(busy),
        )
        for i, (fixture, busy, unhealthy) in enumerate(states)
    ]
    allowed, placements = _independent_truth(cluster, k, policy)
    if policy.required:
        allowed = {n for n in allowed if placements[n].scope_satisfied}

    outcome = filter_nodes(
        [NodeView(name, prepared, busy) for name, prepared, busy in cluster],
        GpuRequest(k, policy),
    )
    pool = Pool(
        [admission_node(name, prepared, tuple(busy)) for name, prepared, busy in cluster], []
    )
    choice, _ = pool.choose(Request(k, 1, policy, None, None, (), ()))
    if not allowed:
        assert outcome.fits == ()
        assert choice is None
        return
    assert len(outcome.fits) == 1
    assert outcome.fits[0] in allowed
    assert choice is not None
    assert choice.slot.name in allowed
    assert choice.rank == outcome.verdicts[outcome.fits[0]].rank


def test_nodes_equal_in_rank_across_hardware_kinds_tie_by_name() -> None:
    """A busy H100 whose free pair is Degraded ranks exactly like a mostly broken H100 whose
    only placeable pair is Degraded: the extender must look at both and pick by name."""
    base = fixture_topology(H100, "x")

    def health(unhealthy: set[int], degraded: set[int]) -> NodeTopology:
        gpus = tuple(
            replace(g, health=GpuHealthState.UNHEALTHY)
            if g.index in unhealthy
            else replace(g, health=GpuHealthState.DEGRADED)
            if g.index in degraded
            else g
            for g in base.gpus
        )
        return replace(base, gpus=gpus)

    busy = NodeView("b-busy", prepare(health(set(), {6, 7})), frozenset(range(6)))
    sick = NodeView("a-sick", prepare(health(set(range(6)), {6, 7})))
    outcome = filter_nodes([busy, sick], GpuRequest(2, Policy()))
    assert outcome.fits == ("a-sick",)
    tied = filter_nodes([busy, sick], GpuRequest(2, Policy(), soft_preferences=True))
    assert tied.fits == ("a-sick", "b-busy")
