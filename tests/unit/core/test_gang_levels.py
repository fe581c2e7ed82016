"""Gangs across the cluster's network levels: the narrowest level that holds the gang, best fit
among its domains, segments each inside one domain, degraded cliques left alone.

The property test checks the pool's choice against an exhaustive answer computed here from the
links (every disjoint packing of GPU sets on every node, every domain of every level)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import cache
from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core import NodeTopology, Policy, prepare
from gpusched.core.admission import (
    AcrossReplicas,
    Assignment,
    Cycle,
    Job,
    JobState,
    Level,
    Node,
    Snapshot,
    Tenant,
    WaitReason,
    run_cycle,
)
from gpusched.core.admission.domains import Domain, segments_in
from gpusched.core.admission.pool import GangFailure, Pool, Request
from tests.examples import examples
from tests.unit.core.admission_testdata import wiring
from tests.unit.core.core_testdata import BRIDGED, class_of, topology

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
BLOCK = "example.com/block"
LEVELS = (Level(CLIQUE, "clique", whole_domains=True), Level(RACK, "rack"), Level(BLOCK, "block"))


@cache
def _topology(kind: str) -> NodeTopology:
    return wiring("nvswitch") if kind == "nvswitch" else topology(BRIDGED)


def _node(
    name: str,
    labels: dict[str, str],
    kind: str = "nvswitch",
    busy: tuple[int, ...] = (),
    unhealthy: tuple[int, ...] = (),
) -> Node:
    topo = replace(_topology(kind), node_name=name)
    if unhealthy:
        topo = topo.with_health(dict.fromkeys(unhealthy, GpuHealthState.UNHEALTHY))
    return Node(
        name=name, topology=prepare(topo), model="H100", labels=labels, busy=frozenset(busy)
    )


def _gang(
    replicas: int,
    gpus: int,
    across: AcrossReplicas | None,
    scope: TopologyScope = TopologyScope.NODE,
) -> Job:
    mode = TopologyMode.REQUIRED if scope is not TopologyScope.NODE else TopologyMode.PREFERRED
    return Job(
        key="ns/gang",
        tenant="t",
        replicas=replicas,
        gpus_per_replica=gpus,
        policy=Policy(scope, mode, multi_node=replicas > 1),
        across=across,
    )


def _place(
    nodes: list[Node], job: Job, down: tuple[dict[str, str], ...] = ()
) -> list[tuple[str, tuple[int, ...]]] | GangFailure:
    pool = Pool(nodes, [], LEVELS, down)
    result = pool.place_gang(job.key, Request.of(job))
    if isinstance(result, GangFailure):
        return result
    return [(p.node, p.gpus) for p in result]


def _rack_nodes(racks: dict[str, int], *, clique_of_rack: bool = True) -> list[Node]:
    """Whole racks of idle NVSwitch nodes: ``{"r1": 2}`` is rack r1 with two nodes (one clique per
    rack, all in block b1)."""
    out = []
    for rack, count in racks.items():
        for i in range(count):
            labels = {RACK: rack, BLOCK: "b1"}
            if clique_of_rack:
                labels[CLIQUE] = f"c-{rack}"
            out.append(_node(f"{rack}-n{i}", labels))
    return out


def test_a_gang_goes_to_the_narrowest_level_that_holds_it() -> None:
    # Rack r1 has 2 nodes (one clique), r2 has 4: a 2 x 8 gang fits the clique of r1.
    nodes = _rack_nodes({"r1": 2, "r2": 4})
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(BLOCK, required=False)))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} == {"r1-n0", "r1-n1"}


def test_among_domains_that_hold_the_gang_the_fullest_wins() -> None:
    # Both racks hold a 2 x 4 gang; r2 has fewer free GPUs (one node half busy), so r2 wins and
    # r1 stays whole for a bigger gang.
    nodes = _rack_nodes({"r1": 2, "r2": 2})
    nodes[2] = replace(nodes[2], busy=frozenset({0, 1, 2, 3}))
    placed = _place(nodes, _gang(2, 4, AcrossReplicas(RACK, required=True)))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} <= {"r2-n0", "r2-n1"}


def test_a_required_level_is_never_left_for_a_narrower_domain_that_straddles_it() -> None:
    # Clique c-x spans racks r1 and r2 (a label set that does not nest): a gang that requires
    # one rack must not take it even though it is the narrowest level.
    nodes = [
        _node("a", {CLIQUE: "c-x", RACK: "r1", BLOCK: "b1"}),
        _node("b", {CLIQUE: "c-x", RACK: "r2", BLOCK: "b1"}),
        _node("c", {CLIQUE: "c-y", RACK: "r2", BLOCK: "b1"}),
    ]
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(RACK, required=True)))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} == {"b", "c"}


def test_a_required_level_is_never_left_for_a_narrower_domain_without_its_label() -> None:
    # Clique c-x's nodes carry no rack label: they lie in no rack, so a gang that requires one
    # rack goes to rack r1 although c-x is the fuller clique.
    nodes = [
        _node("x-n0", {CLIQUE: "c-x"}),
        _node("x-n1", {CLIQUE: "c-x"}),
        *(_node(f"r1-n{i}", {CLIQUE: "c-r1", RACK: "r1"}) for i in range(3)),
    ]
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(RACK, required=True)))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} <= {"r1-n0", "r1-n1", "r1-n2"}


def test_segments_one_domain_holds_go_to_the_fullest_such_domain() -> None:
    # Both r1 and r2 take the two segments of 2 replicas: r2, with fewer free GPUs (best fit).
    roomy = Domain("r1", ("a",), 40, 6)
    tight = Domain("r2", ("b",), 16, 4)
    part = Domain("r3", ("c",), 8, 2)
    assert segments_in([roomy, tight, part], 2, 2) == [(tight, 2)]
    # None takes all four: the ones taking the most first.
    assert segments_in([part, roomy], 2, 4) == [(roomy, 3), (part, 1)]
    assert segments_in([part], 2, 2) == []


def test_each_segment_stays_inside_one_rack() -> None:
    # 4 replicas of 8 GPUs in segments of 2 per rack; racks of 3, 2 and 1 nodes: the segments
    # go to r1 and r2 (two nodes each), never one replica in r3.
    nodes = _rack_nodes({"r1": 3, "r2": 2, "r3": 1}, clique_of_rack=False)
    job = _gang(4, 8, AcrossReplicas(BLOCK, required=True, segment_replicas=2, segment_label=RACK))
    placed = _place(nodes, job)
    assert not isinstance(placed, GangFailure)
    racks = [n.split("-")[0] for n, _ in placed]
    assert racks[0] == racks[1]
    assert racks[2] == racks[3]
    assert "r3" not in racks


def test_segments_take_the_fewest_racks() -> None:
    # 6 replicas in segments of 2; racks of 4, 2, 2 and 2 nodes: r1 takes two segments and one
    # other rack the third (two racks, not three).
    nodes = _rack_nodes({"r1": 4, "r2": 2, "r3": 2, "r4": 2}, clique_of_rack=False)
    job = _gang(6, 8, AcrossReplicas(BLOCK, required=True, segment_replicas=2, segment_label=RACK))
    placed = _place(nodes, job)
    assert not isinstance(placed, GangFailure)
    racks = [n.split("-")[0] for n, _ in placed]
    assert racks.count("r1") == 4
    assert len(set(racks)) == 2


def test_segments_that_fit_no_rack_wait_although_the_gpus_are_free() -> None:
    # Six free nodes in three racks of two; segments of 3 replicas of 8 GPUs fit no rack.
    nodes = _rack_nodes({"r1": 2, "r2": 2, "r3": 2}, clique_of_rack=False)
    job = _gang(3, 8, AcrossReplicas(BLOCK, required=True, segment_replicas=3, segment_label=RACK))
    placed = _place(nodes, job)
    assert isinstance(placed, GangFailure)
    assert placed.reason is WaitReason.NO_FEASIBLE_NODES
    assert "segments of 3" in placed.message


def test_preferred_segments_are_kept_where_racks_hold_them() -> None:
    # The racks of test_each_segment_stays_inside_one_rack: preferred segments are kept too.
    nodes = _rack_nodes({"r1": 3, "r2": 2, "r3": 1}, clique_of_rack=False)
    across = AcrossReplicas(
        BLOCK, required=True, segment_replicas=2, segment_label=RACK, segment_required=False
    )
    placed = _place(nodes, _gang(4, 8, across))
    assert not isinstance(placed, GangFailure)
    racks = [n.split("-")[0] for n, _ in placed]
    assert racks[0] == racks[1]
    assert racks[2] == racks[3]
    assert "r3" not in racks


def test_preferred_segments_no_rack_holds_give_way_to_the_gang_without_them() -> None:
    # Segments of 3 replicas fit no rack of two nodes: required, the gang waits although 48 GPUs
    # are free (test_segments_that_fit_no_rack_wait_although_the_gpus_are_free); preferred, it
    # runs inside the block on the fewest racks.
    nodes = _rack_nodes({"r1": 2, "r2": 2, "r3": 2}, clique_of_rack=False)
    across = AcrossReplicas(
        BLOCK, required=True, segment_replicas=3, segment_label=RACK, segment_required=False
    )
    placed = _place(nodes, _gang(3, 8, across))
    assert not isinstance(placed, GangFailure)
    assert len({n.split("-")[0] for n, _ in placed}) == 2


def test_a_segment_scoped_to_cliques_never_uses_a_clique_with_a_tray_down() -> None:
    # Two cliques of two trays in one rack, one tray of clique c0 unhealthy on one GPU: two
    # segments of 2 replicas per clique fit only once c0 is whole; the free healthy GPUs of c0
    # are not a clique for them.
    nodes = [
        _node("a0", {CLIQUE: "c0", RACK: "r0", BLOCK: "b0"}, unhealthy=(7,)),
        _node("a1", {CLIQUE: "c0", RACK: "r0", BLOCK: "b0"}),
        _node("b0", {CLIQUE: "c1", RACK: "r0", BLOCK: "b0"}),
        _node("b1", {CLIQUE: "c1", RACK: "r0", BLOCK: "b0"}),
    ]
    segmented = AcrossReplicas(RACK, required=True, segment_replicas=2, segment_label=CLIQUE)
    placed = _place(nodes, _gang(4, 4, segmented))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} == {"b0", "b1"}
    placed = _place(nodes, _gang(6, 4, segmented))
    assert isinstance(placed, GangFailure)


def test_a_one_gpu_job_among_equal_nodes_takes_the_fullest_rack() -> None:
    # Rack r1 (names first) is idle; rack r2 has one node half busy. Equal idle nodes everywhere:
    # the job goes to r2's idle node, keeping r1 whole for a gang of its two nodes.
    nodes = [
        _node("a0", {RACK: "r1", BLOCK: "b1"}),
        _node("a1", {RACK: "r1", BLOCK: "b1"}),
        _node("b0", {RACK: "r2", BLOCK: "b1"}),
        _node("b1", {RACK: "r2", BLOCK: "b1"}, busy=(0, 1, 2, 3, 4, 5, 6, 7)),
    ]
    assert _place(nodes, _gang(1, 1, None)) == [("b0", (0,))]
    # The same in a gang's domain: two replicas of one GPU, no level asked, stay in r2.
    pool = Pool(nodes, [], LEVELS)
    placed = pool.place_gang("ns/g", Request.of(_gang(2, 1, AcrossReplicas(BLOCK, required=True))))
    assert not isinstance(placed, GangFailure)
    assert {p.node for p in placed} == {"b0"}
    # Equal nodes in different states (other GPUs busy) compare the same way.
    nodes[0] = _node("a0", {RACK: "r1", BLOCK: "b1"}, busy=(0,))
    nodes[2] = _node("b0", {RACK: "r2", BLOCK: "b1"}, busy=(7,))
    placed = _place(nodes, _gang(1, 1, None))
    assert not isinstance(placed, GangFailure)
    assert [n for n, _ in placed] == ["b0"]


def test_a_clique_with_a_tray_down_is_no_clique_for_a_clique_gang() -> None:
    # Two cliques of 3 trays; c-r1 has one tray out of service. A 2 x 8 clique gang takes the
    # whole clique c-r2 although c-r1's two healthy trays are the best fit.
    nodes = _rack_nodes({"r1": 2, "r2": 3})
    down = ({CLIQUE: "c-r1", RACK: "r1", BLOCK: "b1"},)
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(CLIQUE, required=True)), down)
    assert not isinstance(placed, GangFailure)
    assert {n.split("-")[0] for n, _ in placed} == {"r2"}


def test_a_clique_gang_waits_with_the_degraded_clique_named() -> None:
    # One clique of 3 trays, one tray's GPU 0 unhealthy: a 2 x 8 gang would fit the two other
    # trays but waits, saying which clique is degraded.
    nodes = _rack_nodes({"r1": 3})
    nodes[0] = _node("r1-n0", dict(nodes[0].labels), unhealthy=(0,))
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(CLIQUE, required=True)))
    assert isinstance(placed, GangFailure)
    assert placed.reason is WaitReason.DOMAIN_DEGRADED
    assert "clique c-r1" in placed.message


def test_a_clique_gang_preempts_in_a_whole_clique_rather_than_take_a_degraded_free_one() -> None:
    # Clique c-r1 (2 trays) runs a low-priority job of the tenant; clique c-r2 has 3 trays, one
    # GPU of one tray down, and its two other trays free. The high-priority 2 x 8 clique gang
    # evicts the low job in c-r1 (priority preemption: it would otherwise wait for the tray).
    nodes = _rack_nodes({"r1": 2, "r2": 3})
    nodes[2] = _node("r2-n0", dict(nodes[2].labels), unhealthy=(0,))
    low = replace(
        _gang(2, 8, None),
        key="ns/low",
        state=JobState.ADMITTED,
        placement=(Assignment("r1-n0", tuple(range(8))), Assignment("r1-n1", tuple(range(8)))),
        started_at=86_000.0,
    )
    high = replace(_gang(2, 8, AcrossReplicas(CLIQUE, required=True)), key="ns/high", priority=10)
    tenant = Tenant("t", guaranteed=40)
    snapshot = Snapshot(
        now=86_400.0, tenants=(tenant,), jobs=(low, high), nodes=tuple(nodes), levels=LEVELS
    )
    result = run_cycle(snapshot)
    admission = result.admission_of("ns/high")
    assert admission is not None
    assert {p.node for p in admission.placement} == {"r1-n0", "r1-n1"}
    assert [v.victim for v in admission.victims] == ["ns/low"]


def test_jobs_not_scoped_to_the_clique_use_a_degraded_cliques_healthy_trays() -> None:
    nodes = _rack_nodes({"r1": 3})
    nodes[0] = _node("r1-n0", dict(nodes[0].labels), unhealthy=(0,))
    placed = _place(nodes, _gang(2, 8, AcrossReplicas(RACK, required=True)))
    assert not isinstance(placed, GangFailure)
    assert {n for n, _ in placed} == {"r1-n1", "r1-n2"}


def test_a_preferred_level_no_domain_holds_spreads_over_the_fewest_domains() -> None:
    # 5 x 8 GPUs; racks of 1, 2 and 3 nodes: r3 and r2 (two racks), not r1 and r3 plus r2.
    nodes = _rack_nodes({"r1": 1, "r2": 2, "r3": 3}, clique_of_rack=False)
    nodes = [replace(n, labels={RACK: n.labels[RACK]}) for n in nodes]
    placed = _place(nodes, _gang(5, 8, AcrossReplicas(RACK, required=False)))
    assert not isinstance(placed, GangFailure)
    assert {n.split("-")[0] for n, _ in placed} == {"r2", "r3"}


# --- property: the pool's choice is the exhaustive optimum -----------------------------------


@dataclass(frozen=True)
class Instance:
    nodes: list[Node]
    down: tuple[dict[str, str], ...]
    job: Job


def _labels_of(i: int, sizes: tuple[int, int, int]) -> dict[str, str]:
    clique = i // sizes[0]
    rack = clique // sizes[1]
    return {CLIQUE: f"c{clique}", RACK: f"r{rack}", BLOCK: f"b{rack // sizes[2]}"}


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    count = draw(st.integers(2, 64))
    sizes = (rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 3))
    all_labels = [_labels_of(i, sizes) for i in range(count + 2)]
    down_at = {i for i in range(count) if rng.random() < 0.05}
    nodes = []
    for i in range(count):
        if i in down_at:
            continue
        kind = rng.choice(("nvswitch", "bridged"))
        busy = tuple(g for g in range(8) if rng.random() < rng.choice((0.0, 0.2, 0.6)))
        unhealthy = (rng.randrange(8),) if rng.random() < 0.04 else ()
        nodes.append(_node(f"n{i:02d}", all_labels[i], kind, busy, unhealthy))
    down = tuple(all_labels[i] for i in sorted(down_at))
    replicas = rng.randint(2, 8)
    gpus = rng.choice((1, 2, 4, 8))
    scope = rng.choice((TopologyScope.NODE, TopologyScope.NVLINK))
    label = rng.choice((None, CLIQUE, RACK, BLOCK))
    across = None
    if label is not None:
        segment = rng.choice([s for s in range(1, replicas + 1) if replicas % s == 0])
        narrower = [lv.node_label for lv in LEVELS[: [lv.node_label for lv in LEVELS].index(label)]]
        seg_label = rng.choice([None, label, *narrower]) if segment < replicas else None
        across = AcrossReplicas(
            label,
            rng.random() < 0.7,
            segment if seg_label else None,
            seg_label,
            segment_required=rng.random() < 0.6,
        )
    return Instance(nodes, down, _gang(replicas, gpus, across, scope))


def _with_across(inst: Instance, across: AcrossReplicas) -> Instance:
    return replace(inst, job=replace(inst.job, across=across))


def _segments_fit(inst: Instance, names: set[str] | None = None) -> bool:
    """Whether the segment domains (of the nodes ``names``, all when None) take every segment,
    from the exhaustive capacities."""
    job, across = inst.job, inst.job.across
    assert across is not None
    assert across.segment_label is not None
    size = across.segment_replicas or 1
    parts: dict[str, int] = {}
    for n in inst.nodes:
        if names is None or n.name in names:
            seg = n.labels[across.segment_label]
            parts[seg] = parts.get(seg, 0) + _capacity(n, job)
    return (
        sum(c // size for v, c in parts.items() if v not in _broken(inst, across.segment_label))
        >= job.replicas // size
    )


def _broken(inst: Instance, label: str) -> set[str]:
    """Domains of ``label`` a gang or segment scoped to it may not use: at a whole-domain level,
    those with a node down or a GPU that cannot be placed on."""
    if not next((lv.whole_domains for lv in LEVELS if lv.node_label == label), False):
        return set()
    return {d[label] for d in inst.down if label in d} | {
        n.labels[label]
        for n in inst.nodes
        if not all(g.placeable for g in n.topology.topology.gpus)
    }


def _effective(inst: Instance) -> Instance:
    """The instance as the gang is placed: preferred segments become required when some
    placement keeps them (a domain of the level chain, or the cluster's segment domains when
    the gang's level is only preferred), else the gang has none."""
    across = inst.job.across
    if across is None or across.segment_label is None or across.segment_required:
        return inst
    kept = _with_across(inst, across.with_segments_required())
    if _expected(kept) is not None or (not across.required and _segments_fit(kept)):
        return kept
    return _with_across(inst, across.without_segments())


def _capacity(node: Node, job: Job) -> int:
    """Most disjoint sets of the job's size on the node's free placeable GPUs that meet its
    scope, by exhaustive search over the links."""
    topo = node.topology.topology
    free = [g.index for g in topo.gpus if g.placeable and g.index not in node.busy]
    k = job.gpus_per_replica
    order = ("nvlink", "pcie-switch", "numa", "node")
    limit = order.index(job.policy.scope.value) if job.policy.required else len(order) - 1
    sets = [s for s in combinations(free, k) if order.index(class_of(topo, s)) <= limit]

    @cache
    def most(available: frozenset[int], start: int) -> int:
        best = 0
        for i in range(start, len(sets)):
            if available.issuperset(sets[i]):
                best = max(best, 1 + most(available - set(sets[i]), i + 1))
        return best

    return most(frozenset(free), 0)


def _expected(inst: Instance) -> tuple[str, str] | None:
    """(level label, domain value) the gang must go to: the narrowest level of its chain with a
    domain that holds it (whole where the level asks), the one with the fewest free GPUs."""
    job, across = inst.job, inst.job.across
    labels = [lv.node_label for lv in LEVELS]
    if across is None:
        chain = labels
    elif across.required:
        chain = labels[: labels.index(across.node_label) + 1]
    else:
        chain = labels
    caps = {n.name: _capacity(n, job) for n in inst.nodes}
    free = {
        n.name: len([g for g in n.topology.topology.gpus if g.placeable and g.index not in n.busy])
        for n in inst.nodes
    }
    for label in chain:
        whole = next(lv for lv in LEVELS if lv.node_label == label).whole_domains
        for value in sorted(
            {n.labels[label] for n in inst.nodes},
            key=lambda v: (sum(free[n.name] for n in inst.nodes if n.labels[label] == v), v),
        ):
            members = [n for n in inst.nodes if n.labels[label] == value]
            if whole and (
                any(d.get(label) == value for d in inst.down)
                or any(not all(g.placeable for g in n.topology.topology.gpus) for n in members)
            ):
                continue
            if (
                across is not None
                and across.required
                and label != across.node_label
                and len({n.labels[across.node_label] for n in members}) != 1
            ):
                continue
            if sum(caps[n.name] for n in members) < job.replicas:
                continue
            if (
                across is not None
                and across.segment_label is not None
                and not _segments_fit(inst, {n.name for n in members})
            ):
                continue
            return label, value
    return None


@settings(
    max_examples=examples(1000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(instances())
def test_gang_placement_is_the_exhaustive_optimum(inst: Instance) -> None:
    placed = _place(inst.nodes, inst.job, inst.down)
    inst = _effective(inst)
    expected = _expected(inst)
    job, across = inst.job, inst.job.across
    by_name = {n.name: n for n in inst.nodes}
    if isinstance(placed, GangFailure):
        assert expected is None, f"{placed} but {expected} holds it"
        if across is not None and across.required:
            return
        # Preferred or no level: the gang waits only when the whole cluster cannot take it.
        caps = {n.name: _capacity(n, job) for n in inst.nodes}
        if across is not None and across.segment_label is not None:
            assert not _segments_fit(inst)
        else:
            assert sum(caps.values()) < job.replicas
        return
    assert len(placed) == job.replicas
    used: set[tuple[str, int]] = set()
    for name, gpus in placed:
        node = by_name[name]
        assert len(gpus) == job.gpus_per_replica
        for g in gpus:
            assert node.topology.topology.gpu(g).placeable
            assert g not in node.busy
            assert (name, g) not in used, "a GPU given twice"
            used.add((name, g))
        if job.policy.required:
            order = ("nvlink", "pcie-switch", "numa", "node")
            achieved = class_of(node.topology.topology, gpus)
            assert order.index(achieved) <= order.index(job.policy.scope.value)
    if expected is not None:
        label, value = expected
        assert {by_name[n].labels[label] for n, _ in placed} == {value}
    else:
        assert across is None or not across.required
    if across is not None and across.segment_label is not None:
        size = across.segment_replicas or 1
        broken = _broken(inst, across.segment_label)
        for start in range(0, job.replicas, size):
            segment = placed[start : start + size]
            values = {by_name[n].labels[across.segment_label] for n, _ in segment}
            assert len(values) == 1
            assert not values & broken, "a segment in a domain with nodes or GPUs down"
        if expected is not None:
            # As few segment domains as the domain's capacities allow.
            label, value = expected
            caps: dict[str, int] = {}
            for n in inst.nodes:
                if n.labels[label] == value and n.labels[across.segment_label] not in broken:
                    seg = n.labels[across.segment_label]
                    caps[seg] = caps.get(seg, 0) + _capacity(n, job)
            need, fewest = job.replicas // size, 0
            for c in sorted((c // size for c in caps.values()), reverse=True):
                if need <= 0:
                    break
                need -= c
                fewest += 1
            used_domains = {by_name[n].labels[across.segment_label] for n, _ in placed}
            assert len(used_domains) == fewest


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(instances(), st.lists(instances(), min_size=2, max_size=2))
def test_a_pool_that_held_and_freed_gangs_decides_like_a_fresh_one(
    inst: Instance, others: list[Instance]
) -> None:
    """The pool keeps domain and capacity memos across decisions: after gangs were placed and
    one released, every decision equals that of a new pool holding the same GPUs."""
    jobs = [
        inst.job,
        *(replace(o.job, key=f"ns/other{i}") for i, o in enumerate(others)),
    ]
    pool = Pool(inst.nodes, [], LEVELS, inst.down)
    held: dict[str, list[Assignment]] = {}
    for step, job in enumerate([*jobs, jobs[0]]):
        if step == len(jobs):
            pool.release(jobs[0].key)  # the first gang leaves, then asks again
            held.pop(jobs[0].key, None)
        fresh = Pool(
            inst.nodes, [(k, a) for k, items in held.items() for a in items], LEVELS, inst.down
        )
        want = fresh.place_gang(job.key, Request.of(job))
        got = pool.place_gang(job.key, Request.of(job))
        assert got == want
        if not isinstance(got, GangFailure):
            held[job.key] = [Assignment(p.node, p.gpus) for p in got]


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_the_largest_free_domain_of_each_level_is_counted_from_the_nodes(inst: Instance) -> None:
    free = {
        n.name: len([g for g in n.topology.topology.gpus if g.placeable and g.index not in n.busy])
        for n in inst.nodes
    }
    want = [("node", max(free.values(), default=0))]
    for level in LEVELS:
        best = 0
        for value in {n.labels[level.node_label] for n in inst.nodes}:
            members = [n for n in inst.nodes if n.labels[level.node_label] == value]
            broken = any(d.get(level.node_label) == value for d in inst.down) or any(
                not all(g.placeable for g in n.topology.topology.gpus) for n in members
            )
            if level.whole_domains and broken:
                continue
            best = max(best, sum(free[n.name] for n in members))
        want.append((level.title, best))
    assert Pool(inst.nodes, [], LEVELS, inst.down).largest_free() == tuple(want)


def test_the_capacity_oracle_counts_disjoint_sets() -> None:
    """The brute force above counts packings, not GPUs: a bridged board with one GPU of each
    NVLink pair busy holds no 2-GPU NVLink set although 4 GPUs are free."""
    job = _gang(2, 2, None, TopologyScope.NVLINK)
    assert _capacity(_node("x", _labels_of(0, (1, 1, 1)), "bridged", busy=(0, 1, 4, 6)), job) == 0
    assert _capacity(_node("y", _labels_of(0, (1, 1, 1)), "bridged"), job) == 4


def _two_racks(across: AcrossReplicas, n3_until: float, now: float) -> tuple[Snapshot, Job]:
    """Rack r1: n0 free, n1 busy until +1000; rack r2: n2 busy until +100, n3 until
    ``n3_until``; a gang of two 8-GPU replicas with ``across``."""
    nodes = [
        _node(name, {RACK: rack, BLOCK: "b1"})
        for name, rack in (("n0", "r1"), ("n1", "r1"), ("n2", "r2"), ("n3", "r2"))
    ]
    busy = [
        Job(
            key=f"other/{name}",
            tenant="other",
            replicas=1,
            gpus_per_replica=8,
            state=JobState.ADMITTED,
            placement=(Assignment(name, tuple(range(8))),),
            started_at=now - 10,
            expected_end=now + until,
        )
        for name, until in (("n1", 1000), ("n2", 100), ("n3", n3_until))
    ]
    gang = replace(_gang(2, 8, across), submitted_at=now - 1)
    snapshot = Snapshot(
        now=now,
        tenants=(Tenant("t", guaranteed=0), Tenant("other", guaranteed=64)),
        jobs=(*busy, gang),
        nodes=tuple(nodes),
        levels=LEVELS,
    )
    return snapshot, gang


def test_the_expected_start_of_a_segmented_gang_waits_for_a_whole_segment_in_one_rack() -> None:
    # Two replicas in one segment per rack: both must be in one rack, so the gang starts at
    # +1000 on r1 (unsegmented, n0 and n2 would have said +100).
    now = 10_000.0
    across = AcrossReplicas(BLOCK, required=True, segment_replicas=2, segment_label=RACK)
    snapshot, gang = _two_racks(across, 2000, now)
    cycle = Cycle(snapshot)
    cycle.run()
    assert cycle.forecast()[gang.key] == now + 1000
    fresh = Cycle(snapshot)
    fresh.run()
    plan = fresh.profile().earliest(Request.of(gang))
    assert plan is not None
    assert {p.node for p in plan.plans} == {"n0", "n1"}


def test_the_expected_start_of_a_gang_with_preferred_segments_takes_the_earlier_placement() -> None:
    # Required segments start at +1000 in rack r1; preferred, the gang starts at +100 on n0 and
    # n2 (two racks); with n3 also free by +100 it keeps a rack.
    now = 10_000.0
    across = AcrossReplicas(
        BLOCK, required=True, segment_replicas=2, segment_label=RACK, segment_required=False
    )

    def forecast(n3_until: float) -> tuple[float, set[str]]:
        snapshot, gang = _two_racks(across, n3_until, now)
        cycle = Cycle(snapshot)
        cycle.run()
        plan = cycle.profile().earliest(Request.of(gang))
        assert plan is not None
        assert cycle.forecast()[gang.key] == plan.start
        return plan.start - now, {p.node for p in plan.plans}

    assert forecast(2000) == (100, {"n0", "n2"})
    assert forecast(100) == (100, {"n2", "n3"})


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_a_forecast_plan_keeps_segments_and_the_required_domain(inst: Instance) -> None:
    """Where the forecast says a gang starts now, its plan is one the cycle could bind: free,
    disjoint GPUs, each segment inside one domain of its level (a whole one where the level asks
    for whole domains), all of it inside one domain of a required level."""
    from gpusched.core.admission.profile import Profile

    pool = Pool(inst.nodes, [], LEVELS, inst.down)
    request = Request.of(inst.job)
    found = Profile(pool, 0.0, {}).earliest(request)
    if found is None:
        return
    inst = _effective(inst)
    assert found.start == 0.0  # nothing held ends: what is free now is all there is
    by_name = {n.name: n for n in inst.nodes}
    used: set[tuple[str, int]] = set()
    for plan in found.plans:
        node = by_name[plan.node]
        free = {g.index for g in node.topology.topology.gpus if g.placeable} - set(node.busy)
        assert set(plan.gpus) <= free
        assert not used & {(plan.node, g) for g in plan.gpus}
        used |= {(plan.node, g) for g in plan.gpus}
    assert [p.replica for p in found.plans] == list(range(inst.job.replicas))
    across = inst.job.across
    if across is None:
        return
    labels = [by_name[p.node].labels for p in found.plans]
    if across.required:
        assert len({lb[across.node_label] for lb in labels}) == 1
    if across.segment_label is not None:
        size = across.segment_replicas or 1
        whole = next(
            (lv.whole_domains for lv in LEVELS if lv.node_label == across.segment_label), False
        )
        for first in range(0, len(labels), size):
            values = {lb[across.segment_label] for lb in labels[first : first + size]}
            assert len(values) == 1
            if whole:
                (value,) = values
                assert not pool.degraded(across.segment_label, value)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.lists(instances(), min_size=1, max_size=4), st.integers(0, 3))
def test_domain_free_gpus_are_counted_from_the_nodes_after_holds_releases_and_rollback(
    inst: Instance, others: list[Instance], undo: int
) -> None:
    """The pool keeps each domain's free GPUs as nodes change; after gangs are placed, some
    released and a journalled stretch rolled back, every node's domain counts equal a count
    made from the slots' free GPUs."""
    pool = Pool(inst.nodes, [], LEVELS, inst.down)
    jobs = [replace(o.job, key=f"ns/o{i}") for i, o in enumerate(others)]
    for job in jobs[:undo]:
        pool.place_gang(job.key, Request.of(job))
    pool.begin()
    for job in jobs[undo:]:
        pool.place_gang(job.key, Request.of(job))
    if jobs:
        pool.release(jobs[0].key)
    if undo % 2:
        pool.rollback()
    for name, slot in pool.slots.items():
        want = []
        for level in LEVELS:
            value = slot.node.labels.get(level.node_label)
            want.append(
                -1
                if value is None
                else sum(
                    s.free.bit_count()
                    for s in pool.slots.values()
                    if s.node.labels.get(level.node_label) == value
                )
            )
        assert pool.fullness(name) == tuple(want)
