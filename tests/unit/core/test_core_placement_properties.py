"""Properties over every fixture x random busy / unhealthy / degraded GPUs x k = 1..8 x policy.

The exact search must return the brute-force optimum of the objective as docs/placement.md defines
it (computed here from the link list, not with the engine's own scoring), never a GPU that is
busy or not placeable, honour required scopes or say why not, and never pick a set whose slowest
pair is slower than what first fit or the device plugin's best-effort policy would pick.
"""

from __future__ import annotations

from itertools import combinations

from core_testdata import (
    ODD,
    PROPERTY_TOPOLOGIES,
    SCOPE_ORDER,
    bottleneck_units,
    brute_force,
    class_of,
    topology,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core import Placement, Policy, PreparedNode, Refusal, RefusalReason, place, prepare
from gpusched.core.baselines import first_fit, gpuallocator_best_effort

# Per GPU: what state it is in for one example.
FREE, BUSY, UNHEALTHY, UNSCHEDULABLE, DEGRADED, DEGRADED_BUSY = range(6)
STATE_WEIGHTS = st.sampled_from(
    [FREE] * 8 + [BUSY] * 4 + [UNHEALTHY, UNSCHEDULABLE, DEGRADED, DEGRADED_BUSY]
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, PreparedNode, tuple[int, ...], int, Policy]:
    name = draw(st.sampled_from(PROPERTY_TOPOLOGIES))
    topo = topology(name)
    states = draw(st.lists(STATE_WEIGHTS, min_size=len(topo.gpus), max_size=len(topo.gpus)))
    health = {}
    busy = []
    for gpu, state in zip(topo.gpu_indices, states, strict=True):
        if state == UNHEALTHY:
            health[gpu] = GpuHealthState.UNHEALTHY
        elif state == UNSCHEDULABLE:
            health[gpu] = GpuHealthState.UNSCHEDULABLE
        elif state in (DEGRADED, DEGRADED_BUSY):
            health[gpu] = GpuHealthState.DEGRADED
        if state in (BUSY, DEGRADED_BUSY):
            busy.append(gpu)
    node = prepare(topo.with_health(health) if health else topo)
    k = draw(st.integers(min_value=1, max_value=8))
    policy = Policy(
        scope=draw(st.sampled_from(list(TopologyScope))),
        mode=draw(st.sampled_from(list(TopologyMode))),
        multi_node=draw(st.booleans()),
    )
    return name, node, tuple(busy), k, policy


def _free(node: PreparedNode, busy: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i in node.topology.placeable_gpus if i not in busy)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_choice_is_the_brute_force_optimum_and_only_uses_free_healthy_gpus(
    scenario: tuple[str, PreparedNode, tuple[int, ...], int, Policy],
) -> None:
    _, node, busy, k, policy = scenario
    free = _free(node, busy)
    result = place(node, k, policy, busy=busy, use_cache=False)
    if k > len(free):
        assert isinstance(result, Refusal)
        assert result.reason in {
            RefusalReason.REQUEST_EXCEEDS_NODE,
            RefusalReason.NOT_ENOUGH_HEALTHY_GPUS,
            RefusalReason.NOT_ENOUGH_FREE_GPUS,
        }
        return
    reference = brute_force(node, k, policy, free)
    if reference is None:
        # Only a required scope can make a feasible count unplaceable, and then truly no set fits.
        assert policy.mode is TopologyMode.REQUIRED
        assert isinstance(result, Refusal)
        assert result.reason is RefusalReason.SCOPE_UNSATISFIABLE
        wanted = SCOPE_ORDER.index(policy.scope.value)
        tightest = min(SCOPE_ORDER.index(class_of(node.topology, c)) for c in combinations(free, k))
        assert tightest > wanted
        assert result.best_class is not None
        assert result.best_class.value == SCOPE_ORDER[tightest]
        return
    assert isinstance(result, Placement)
    assert (result.objective, result.gpus) == reference
    assert len(result.gpus) == k
    assert set(result.gpus) <= set(free)
    achieved = class_of(node.topology, result.gpus)
    assert result.topology_class.value == achieved
    if policy.mode is TopologyMode.REQUIRED:
        assert SCOPE_ORDER.index(achieved) <= SCOPE_ORDER.index(policy.scope.value)
        assert result.scope_satisfied
    assert place(node, k, policy, busy=busy) == result  # the memo returns the same answer


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_bottleneck_is_never_worse_than_first_fit_or_gpuallocator(
    scenario: tuple[str, PreparedNode, tuple[int, ...], int, Policy],
) -> None:
    _, node, busy, k, _ = scenario
    free = _free(node, busy)
    result = place(node, k, Policy(), busy=busy)
    if k > len(free):
        return
    assert isinstance(result, Placement)
    ours = bottleneck_units(node, result.gpus)
    ff = first_fit(free, k)
    alloc = gpuallocator_best_effort(node.topology, free, k)
    assert ff is not None
    assert alloc is not None
    assert ours >= bottleneck_units(node, ff)
    if not alloc.padding_bug:
        assert ours >= bottleneck_units(node, alloc.gpus)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_heuristic_returns_valid_sets_and_honours_required_scopes(
    scenario: tuple[str, PreparedNode, tuple[int, ...], int, Policy],
) -> None:
    _, node, busy, k, policy = scenario
    free = _free(node, busy)
    result = place(node, k, policy, busy=busy, exact=False, use_cache=False)
    if isinstance(result, Refusal):
        # Only when no set qualifies: the exact search refuses for the same reason.
        exact_refusal = place(node, k, policy, busy=busy, exact=True)
        assert isinstance(exact_refusal, Refusal)
        assert exact_refusal.reason is result.reason
        return
    assert len(result.gpus) == k
    assert set(result.gpus) <= set(free)
    if policy.mode is TopologyMode.REQUIRED:
        assert result.scope_satisfied
    exact = place(node, k, policy, busy=busy, exact=True)
    assert isinstance(exact, Placement)
    assert exact.objective >= result.objective


def test_every_busy_pattern_of_the_odd_board_gets_the_documented_optimum() -> None:
    # Exhaustive on the board whose traps (NV1 as fast as PHB, NODE across NUMA nodes, an N/A
    # pair) a random draw rarely reaches: every busy set, k = 1..4, every required scope.
    node = prepare(topology(ODD))
    gpus = node.topology.gpu_indices
    for busy_bits in range(1 << len(gpus)):
        busy = tuple(g for g in gpus if busy_bits >> g & 1)
        free = _free(node, busy)
        for k in range(1, min(4, len(free)) + 1):
            for scope in TopologyScope:
                policy = Policy(scope, TopologyMode.REQUIRED)
                result = place(node, k, policy, busy=busy, use_cache=False)
                reference = brute_force(node, k, policy, free)
                if reference is None:
                    assert isinstance(result, Refusal), (busy, k, scope)
                    tightest = min(
                        SCOPE_ORDER.index(class_of(node.topology, c)) for c in combinations(free, k)
                    )
                    assert result.best_class is not None
                    assert result.best_class.value == SCOPE_ORDER[tightest], (busy, k, scope)
                    continue
                assert isinstance(result, Placement), (busy, k, scope, reference)
                assert (result.objective, result.gpus) == reference, (busy, k, scope)
