"""When a node can host one, two, ... replicas of a request (``Profile._node_times``) is kept by
what it depends on (the node's wiring, healthy GPUs and the order of its GPUs' free times) and
shared by nodes alike. Each node's answer must be the one a pool holding that node alone gives:
truth that no other node's answer can reach.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core import Policy, prepare
from gpusched.core.admission import Assignment, Node
from gpusched.core.admission.pool import Pool
from gpusched.core.admission.profile import Profile
from tests.unit.core.core_testdata import BRIDGED, DGX1, H100, RTX4090, TREES, topology

NOW = 1000.0


@st.composite
def held_clusters(
    draw: Any,
) -> tuple[list[Node], list[tuple[str, Assignment]], dict[str, float | None]]:
    """Nodes of real wirings (NVSwitch, NVLink-bridged pairs, PCIe switch trees, every pair
    across sockets, a hybrid cube mesh), some GPUs degraded, each GPU free now, free at one of
    two later times, or held for good."""
    nodes: list[Node] = []
    holdings: list[tuple[str, Assignment]] = []
    ends: dict[str, float | None] = {}
    for i in range(draw(st.integers(2, 6))):
        name = f"n{i}"
        wired = replace(
            topology(draw(st.sampled_from([H100, BRIDGED, TREES, RTX4090, DGX1]))),
            node_name=name,
        )
        degraded = draw(st.sets(st.integers(0, 7), max_size=3))
        if degraded:
            wired = wired.with_health(dict.fromkeys(degraded, GpuHealthState.DEGRADED))
        nodes.append(
            Node(
                name=name,
                topology=prepare(wired),
                model="H100",
                labels={"kubernetes.io/hostname": name},
            )
        )
        for gpu in range(8):
            free = draw(st.sampled_from(["now", "soon", "later", "never"]))
            if free == "now":
                continue
            key = f"{name}-{gpu}"
            holdings.append((key, Assignment(name, (gpu,))))
            ends[key] = {"soon": 1500.0, "later": 3000.0}.get(free)
    return nodes, holdings, ends


POLICIES = [
    Policy(scope, mode)
    for scope in TopologyScope
    for mode in (TopologyMode.REQUIRED, TopologyMode.PREFERRED)
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held_clusters(), st.randoms(use_true_random=False))
def test_each_nodes_replica_times_are_those_of_the_node_alone(
    cluster: tuple[list[Node], list[tuple[str, Assignment]], dict[str, float | None]],
    rng: Any,
) -> None:
    nodes, holdings, ends = cluster
    profile = Profile(Pool(nodes, holdings), NOW, ends)
    asked = [(node, k, policy) for node in nodes for k in (1, 2, 4) for policy in POLICIES]
    rng.shuffle(asked)  # any node may be the first of its kind to be asked
    for node, k, policy in asked:
        alone = Profile(Pool([node], [h for h in holdings if h[1].node == node.name]), NOW, ends)
        assert profile._node_times(node.name, k, policy, 2) == alone._node_times(
            node.name, k, policy, 2
        ), (node.name, k, policy)
