"""The node agent's decisions: the pod being admitted gets exactly its annotated GPUs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.api import keys
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core.nodeagent import (
    ContainerGpus,
    DriftKind,
    GpuEntry,
    KubeletPod,
    NodeState,
    PodGpus,
    RefusalReason,
    check_drift,
    pod_gpus,
    preferred_allocation,
    verify_allocation,
)

UUIDS = [f"GPU-{i:02d}" for i in range(8)]
GPUS = [GpuEntry(uuid, i, numa_node=i // 4) for i, uuid in enumerate(UUIDS)]


def pod(name: str, gpus: int, assigned: list[int] | None, **kwargs: Any) -> PodGpus:
    return PodGpus(
        namespace="ns",
        name=name,
        containers=kwargs.pop("containers", (ContainerGpus("main", gpus),)),
        assigned=tuple(UUIDS[i] for i in assigned) if assigned is not None else None,
        **kwargs,
    )


def listed(p: PodGpus, **devices: list[int]) -> KubeletPod:
    held = {c.name: frozenset() for c in p.containers if not c.init}
    held.update({name: frozenset(UUIDS[i] for i in idx) for name, idx in devices.items()})
    return KubeletPod(p.namespace, p.name, held)


def state(pods: list[PodGpus], kubelet: list[KubeletPod] | None) -> NodeState:
    return NodeState(
        node="n1",
        pods={p.key: p for p in pods},
        kubelet=None if kubelet is None else {k.key: k for k in kubelet},
        gpus=GPUS,
    )


def test_preferred_allocation_answers_the_admitted_pods_own_set_not_an_older_pending_one() -> None:
    first, second = pod("a", 4, [4, 5, 6, 7]), pod("b", 4, [0, 1, 2, 3])
    # The kubelet admits b (it lists b, not yet a): b's set, though a's is just as available.
    snapshot = state([first, second], [listed(second)])
    verdict = preferred_allocation(snapshot, UUIDS, [], 4)
    assert verdict.ok
    assert verdict.pod == "ns/b"
    assert set(verdict.devices) == set(UUIDS[:4])


def test_allocate_accepts_exactly_the_annotated_set() -> None:
    p = pod("a", 2, [2, 3])
    verdict = verify_allocation(state([p], [listed(p)]), [UUIDS[3], UUIDS[2]])
    assert verdict.ok
    assert verdict.pod == "ns/a"
    assert verdict.placed_by_gpusched


def test_allocate_refuses_another_pods_gpus_naming_both_pods() -> None:
    a, b = pod("a", 2, [0, 1]), pod("b", 2, [2, 3])
    verdict = verify_allocation(state([a, b], [listed(a)]), [UUIDS[2], UUIDS[3]])
    assert verdict.reason is RefusalReason.MISMATCH
    assert "ns/a" in verdict.message
    assert "ns/b" in verdict.message
    assert "GPU 2 (GPU-02)" in verdict.message


def test_allocate_refuses_a_set_only_partly_annotated() -> None:
    a = pod("a", 2, [0, 1])
    verdict = verify_allocation(state([a], [listed(a)]), [UUIDS[1], UUIDS[4]])
    assert verdict.reason is RefusalReason.MISMATCH


def test_nothing_is_allocated_without_the_kubelets_pod_resources() -> None:
    a = pod("a", 2, [0, 1])
    assert verify_allocation(state([a], None), UUIDS[:2]).reason is RefusalReason.NO_POD_RESOURCES
    assert preferred_allocation(state([a], None), UUIDS, [], 2).reason is (
        RefusalReason.NO_POD_RESOURCES
    )


def test_a_pod_deleted_after_bind_gets_nothing() -> None:
    gone = KubeletPod("ns", "deleted", {"main": frozenset()})
    verdict = verify_allocation(state([], [gone]), UUIDS[:2])
    assert verdict.reason is RefusalReason.POD_GONE
    assert "ns/deleted" in verdict.message


def test_an_allocated_pod_is_not_admitted_twice() -> None:
    a = pod("a", 2, [0, 1])
    verdict = verify_allocation(state([a], [listed(a, main=[0, 1])]), UUIDS[:2])
    assert verdict.reason is RefusalReason.NO_ADMITTING_POD


def test_containers_of_one_pod_split_its_set_without_sharing() -> None:
    a = pod("a", 4, [0, 1, 2, 3], containers=(ContainerGpus("x", 2), ContainerGpus("y", 2)))
    first = preferred_allocation(state([a], [listed(a)]), UUIDS, [], 2)
    assert first.ok
    assert set(first.devices) <= set(UUIDS[:4])
    after = state([a], [listed(a, x=[UUIDS.index(d) for d in first.devices])])
    second = preferred_allocation(after, [u for u in UUIDS if u not in first.devices], [], 2)
    assert second.ok
    assert set(second.devices) == set(UUIDS[:4]) - set(first.devices)
    assert verify_allocation(after, second.devices).ok
    assert verify_allocation(after, first.devices).reason is RefusalReason.MISMATCH


def test_assigned_gpus_the_kubelet_cannot_offer_fail_with_their_holder() -> None:
    a, other = pod("a", 2, [0, 1]), pod("other", 1, None)
    snapshot = state([a, other], [listed(a), listed(other, main=[1])])
    verdict = preferred_allocation(snapshot, [*UUIDS[2:], UUIDS[0]], [], 2)
    assert verdict.reason is RefusalReason.NOT_AVAILABLE
    assert "GPU 1 (GPU-01) is held by pod ns/other" in verdict.message


def test_a_pod_of_another_scheduler_gets_only_unreserved_gpus() -> None:
    reserved, foreign = pod("placed", 4, [4, 5, 6, 7]), pod("foreign", 2, None)
    snapshot = state([reserved, foreign], [listed(foreign)])
    verdict = preferred_allocation(snapshot, UUIDS, [], 2)
    assert verdict.ok
    assert not verdict.placed_by_gpusched
    assert set(verdict.devices) == {UUIDS[2], UUIDS[3]}
    assert verify_allocation(snapshot, verdict.devices).ok
    refused = verify_allocation(snapshot, [UUIDS[0], UUIDS[4]])
    assert refused.reason is RefusalReason.RESERVED
    assert "ns/placed" in refused.message


def test_a_pod_of_another_scheduler_may_use_gpus_of_finished_pods() -> None:
    done = pod("done", 4, [0, 1, 2, 3], live=False)
    foreign = pod("foreign", 8, None)
    snapshot = state([done, foreign], [listed(foreign)])
    assert preferred_allocation(snapshot, UUIDS, [], 8).ok


def test_malformed_assignment_is_refused_with_the_field() -> None:
    raw = {
        "metadata": {"name": "a", "namespace": "ns", "annotations": {keys.ANNOTATION_GPUS: "x,,y"}},
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [{"name": "m", "resources": {"limits": {keys.GPU_RESOURCE: "2"}}}],
        },
    }
    p = pod_gpus(raw)
    verdict = verify_allocation(state([p], [listed(p)]), UUIDS[:2])
    assert verdict.reason is RefusalReason.MALFORMED
    assert keys.ANNOTATION_GPUS in verdict.message


def test_pod_gpus_reads_containers_init_containers_and_assignment() -> None:
    raw = {
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "annotations": {keys.ANNOTATION_GPUS: "GPU-01,GPU-00"},
        },
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "initContainers": [
                {"name": "i", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}},
                {"name": "s", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "m", "resources": {"requests": {keys.GPU_RESOURCE: "2"}}}],
        },
        "status": {"phase": "Running"},
    }
    p = pod_gpus(raw)
    assert p.assigned == ("GPU-01", "GPU-00")
    assert p.containers == (
        ContainerGpus("i", 1, init=True),
        ContainerGpus("s", 0, init=False),
        ContainerGpus("m", 2),
    )
    assert p.live
    assert not pod_gpus({**raw, "status": {"phase": "Succeeded"}}).live


def test_drift_names_gpus_outside_the_assignment_and_reserved_ones_taken() -> None:
    a, b, foreign = pod("a", 2, [0, 1]), pod("b", 2, [2, 3]), pod("f", 1, None)
    snapshot = state(
        [a, b, foreign], [listed(a, main=[0, 4]), listed(b, main=[2, 3]), listed(foreign, main=[1])]
    )
    report = check_drift(snapshot)
    kinds = {d.pod: d.kind for d in report.drifts}
    assert kinds == {"ns/a": DriftKind.OUTSIDE_ASSIGNMENT, "ns/f": DriftKind.TAKES_RESERVED}
    assert report.allocated["ns/b"] == (UUIDS[2], UUIDS[3])
    assert report.checked == 3


def test_no_drift_while_a_pod_is_still_being_admitted() -> None:
    a = pod("a", 4, [0, 1, 2, 3], containers=(ContainerGpus("x", 2), ContainerGpus("y", 2)))
    assert check_drift(state([a], [listed(a, x=[0, 1])])).drifts == ()
    done = check_drift(state([a], [listed(a, x=[0, 1], y=[2])]))
    assert [d.kind for d in done.drifts] == [DriftKind.INCOMPLETE]


@st.composite
def nodes(draw: st.DrawFn) -> tuple[NodeState, PodGpus, list[str]]:
    """A node whose GPUs are split among pods (some unassigned), the kubelet admitting one pod
    while some others already hold their sets."""
    order = draw(st.permutations(range(8)))
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    pods, start = [], 0
    for i, size in enumerate(sizes):
        if start + size > 8:
            break
        pods.append(pod(f"p{i}", size, list(order[start : start + size]), created=f"t{i}"))
        start += size
    admitted = draw(st.sampled_from(pods))
    done = [p for p in pods if p is not admitted and draw(st.booleans())]
    held = {u for p in done for u in p.assigned or ()}
    kubelet = [listed(p, main=[UUIDS.index(u) for u in p.assigned or ()]) for p in done]
    available = [u for u in UUIDS if u not in held]
    return state(pods, [*kubelet, listed(admitted)]), admitted, available


@settings(max_examples=300, deadline=None)
@given(nodes(), st.data())
def test_only_the_admitted_pods_own_gpus_are_ever_preferred_or_accepted(
    node: tuple[NodeState, PodGpus, list[str]], data: st.DataObject
) -> None:
    snapshot, admitted, available = node
    truth = set(admitted.assigned or ())
    size = admitted.containers[0].gpus
    preferred = preferred_allocation(snapshot, available, [], size)
    assert preferred.ok
    assert set(preferred.devices) == truth
    assert verify_allocation(snapshot, preferred.devices).ok
    other = data.draw(st.sets(st.sampled_from(available), min_size=size, max_size=size))
    assert verify_allocation(snapshot, other).ok == (other == truth)


@pytest.mark.parametrize("health", ["Unhealthy", "Unschedulable", "Degraded"])
def test_only_unhealthy_gpus_are_unhealthy_to_the_kubelet(health: str) -> None:
    from gpusched.api.nodegputopology import (
        GpuHealth,
        GpuHealthState,
        GpuInfo,
        NodeGpuTopologySpec,
        NodeGpuTopologyStatus,
    )
    from gpusched.core.nodeagent import node_gpus

    spec = NodeGpuTopologySpec(
        node_name="n",
        gpus=[GpuInfo(index=i, uuid=UUIDS[i], model="H100", numa_node=i // 4) for i in range(2)],
    )
    status = NodeGpuTopologyStatus(gpus=[GpuHealth(index=1, state=GpuHealthState(health))])
    entries = node_gpus(spec, status)
    assert [(e.uuid, e.numa_node) for e in entries] == [(UUIDS[0], 0), (UUIDS[1], 0)]
    assert entries[1].healthy == (health != "Unhealthy")
    assert entries[1].state is GpuHealthState(health)
    assert entries[0].healthy
    assert entries[0].state is GpuHealthState.HEALTHY


def test_explain_tells_confirmed_drift_unconfirmed_and_foreign_pods_apart() -> None:
    from gpusched.core.nodeagent import Enforcement, enforcement

    placed = pod("a", 2, [0, 1])
    assert enforcement(placed).state is Enforcement.UNCONFIRMED
    confirmed = PodGpus("ns", "a", assigned=placed.assigned, allocated=(UUIDS[1], UUIDS[0]))
    assert enforcement(confirmed).state is Enforcement.CONFIRMED
    drifted = PodGpus("ns", "a", assigned=placed.assigned, allocated=(UUIDS[0], UUIDS[5]))
    check = enforcement(drifted)
    assert check.state is Enforcement.DRIFT
    assert UUIDS[5] in check.message
    assert UUIDS[1] in check.message
    foreign = PodGpus("ns", "f", allocated=(UUIDS[3],))
    assert enforcement(foreign).state is Enforcement.NOT_PLACED


def test_a_terminating_pod_is_not_admitted() -> None:
    a = pod("a", 2, [0, 1], deleting=True)
    verdict = verify_allocation(state([a], [listed(a)]), UUIDS[:2])
    assert verdict.reason is RefusalReason.POD_GONE


def test_node_agent_metrics_are_exactly_the_documented_ones() -> None:
    from pathlib import Path

    from prometheus_client import generate_latest

    from gpusched.metrics import NodeAgentMetrics

    metrics = NodeAgentMetrics()
    metrics.calls.labels("allocate", "refused", "Mismatch").inc()
    metrics.call_seconds.labels("allocate").observe(0.01)
    metrics.registered.set(1)
    metrics.registrations.inc()
    metrics.conflict.set(0)
    metrics.devices.labels("Healthy").set(8)
    metrics.drift_pods.labels("OutsideAssignment").set(0)
    metrics.drift_checks.labels("ok").inc()
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    docs = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    section = docs.split("## Node agent", 1)[1].split("\n## ", 1)[0]
    documented = {
        line.split("|")[1].strip("` ") for line in section.splitlines() if line.startswith("| `")
    }
    suffixes = ("_bucket", "_count", "_sum", "_created")
    names = {n for n in exported if not n.endswith(suffixes)} | {
        n.removesuffix("_bucket") for n in exported if n.endswith("_bucket")
    }
    assert names == documented


# --- GPU ownership a user could forge (the node agent believes only what gpusched wrote) -------


def _raw(
    name: str, *, scheduler: str | None, gpus: str, request: int, created: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {keys.GPU_RESOURCE: request}}}]
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": created,
            "annotations": {keys.ANNOTATION_GPUS: gpus},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def test_a_gpu_annotation_on_another_schedulers_pod_is_not_believed() -> None:
    """A pod created with ``nodeName`` (no scheduler) and the owner's UUIDs copied into
    ``gpusched.io/gpus`` is a pod gpusched did not place: it gets only unreserved GPUs."""
    owner = pod("owner", 2, [0, 1], created="2026-01-01T00:00:00Z")
    intruder = pod_gpus(
        _raw(
            "intruder",
            scheduler=None,
            gpus="GPU-00,GPU-01",
            request=2,
            created="2026-01-02T00:00:00Z",
        )
    )
    assert intruder.assigned is None
    assert intruder.ignored is not None
    snapshot = state([owner, intruder], [listed(intruder)])
    verdict = verify_allocation(snapshot, UUIDS[:2])
    assert verdict.reason is RefusalReason.RESERVED
    preferred = preferred_allocation(snapshot, UUIDS, [], 2)
    assert preferred.ok
    assert not set(preferred.devices) & {UUIDS[0], UUIDS[1]}


def test_a_younger_pod_claiming_an_older_pods_gpus_is_refused() -> None:
    """Two live pods never share a GPU: a ``schedulerName: gpusched`` pod created with
    ``nodeName`` and copied UUIDs is younger than the pod the extender bound, and gets none."""
    owner = pod("owner", 2, [0, 1], created="2026-01-01T00:00:00Z")
    copy = pod_gpus(
        _raw(
            "copy",
            scheduler=keys.SCHEDULER_NAME,
            gpus="GPU-01,GPU-00",
            request=2,
            created="2026-01-02T00:00:00Z",
        )
    )
    snapshot = state([owner, copy], [listed(copy)])
    for verdict in (
        verify_allocation(snapshot, UUIDS[:2]),
        preferred_allocation(snapshot, UUIDS, [], 2),
    ):
        assert verdict.reason is RefusalReason.CONFLICT
        assert "ns/owner" in verdict.message
    # The owner, admitted after a kubelet restart, still gets its GPUs.
    again = state([owner, copy], [listed(owner)])
    assert verify_allocation(again, UUIDS[:2]).ok


def test_an_assignment_naming_more_gpus_than_the_pod_requests_is_refused() -> None:
    greedy = pod_gpus(
        _raw(
            "greedy",
            scheduler=keys.SCHEDULER_NAME,
            gpus=",".join(UUIDS),
            request=1,
            created="2026-01-01T00:00:00Z",
        )
    )
    assert greedy.assigned is None
    verdict = verify_allocation(state([greedy], [listed(greedy)]), UUIDS[:1])
    assert verdict.reason is RefusalReason.MALFORMED
    assert "requests 1" in verdict.message


def test_explain_reports_no_drift_from_an_allocation_the_node_agent_did_not_write() -> None:
    from gpusched.core.nodeagent import Enforcement, enforcement

    raw = _raw("a", scheduler=keys.SCHEDULER_NAME, gpus="GPU-00,GPU-01", request=2, created="t")
    raw["metadata"]["annotations"][keys.ANNOTATION_ALLOCATED_GPUS] = "GPU-00,GPU-05"
    raw["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-annotate",
            "operation": "Update",
            "fieldsV1": {
                "f:metadata": {"f:annotations": {f"f:{keys.ANNOTATION_ALLOCATED_GPUS}": {}}}
            },
        }
    ]
    check = enforcement(pod_gpus(raw))
    assert check.state is Enforcement.UNCONFIRMED
    assert "kubectl-annotate" in check.message
    raw["metadata"]["managedFields"][0]["manager"] = keys.FIELD_MANAGER_NODE_AGENT
    assert enforcement(pod_gpus(raw)).state is Enforcement.DRIFT


def test_allocate_refuses_a_set_of_no_waiting_pod_while_the_oldest_waiting_is_gpuscheds() -> None:
    """Two pods appear to wait; the kubelet admits the oldest first. A set that is neither the
    oldest gpusched pod's nor free of reservations cannot be tied to a pod: Ambiguous, not
    handed to the younger pod gpusched did not place."""
    placed = pod("train", 2, [0, 1], created="2026-01-01T00:00:00Z")
    foreign = pod("other", 2, None, created="2026-01-01T00:00:05Z")
    snapshot = state([placed, foreign], [listed(placed), listed(foreign)])
    assert preferred_allocation(snapshot, UUIDS, [], 2).pod == "ns/train"
    verdict = verify_allocation(snapshot, [UUIDS[4], UUIDS[5]])
    assert verdict.reason is RefusalReason.AMBIGUOUS
    assert "ns/train" in verdict.message
    assert "ns/other" in verdict.message
    assert verify_allocation(snapshot, UUIDS[:2]).pod == "ns/train"


def test_allocate_gives_free_gpus_to_the_oldest_waiting_pod_gpusched_did_not_place() -> None:
    foreign = pod("other", 2, None, created="2026-01-01T00:00:00Z")
    placed = pod("train", 2, [0, 1], created="2026-01-01T00:00:05Z")
    snapshot = state([placed, foreign], [listed(placed), listed(foreign)])
    verdict = verify_allocation(snapshot, [UUIDS[4], UUIDS[5]])
    assert verdict.ok
    assert verdict.pod == "ns/other"
    assert not verdict.placed_by_gpusched
    assert verify_allocation(snapshot, [UUIDS[1], UUIDS[5]]).reason is RefusalReason.AMBIGUOUS


def _with_unschedulable(snapshot: NodeState, *indices: int) -> NodeState:
    """The node with GPUs ``indices`` judged Unschedulable by the probe (still healthy to the
    kubelet, so still offered by it)."""
    gpus = [
        GpuEntry(g.uuid, g.index, g.numa_node, state=GpuHealthState.UNSCHEDULABLE)
        if g.index in indices
        else g
        for g in snapshot.gpus
    ]
    return NodeState(snapshot.node, snapshot.pods, snapshot.kubelet, gpus)


def test_a_pod_gpusched_did_not_place_never_gets_an_unschedulable_gpu() -> None:
    foreign = pod("foreign", 6, None)
    snapshot = _with_unschedulable(state([foreign], [listed(foreign)]), 0, 7)
    preferred = preferred_allocation(snapshot, UUIDS, [], 6)
    assert preferred.ok
    assert set(preferred.devices) == set(UUIDS[1:7])
    refused = verify_allocation(snapshot, UUIDS[:6])
    assert refused.reason is RefusalReason.NO_NEW_WORK
    assert "GPU 0 (GPU-00)" in refused.message
    insisted = preferred_allocation(snapshot, UUIDS, [UUIDS[7]], 6)
    assert insisted.reason is RefusalReason.NO_NEW_WORK
    greedy = pod("foreign", 7, None)
    short = _with_unschedulable(state([greedy], [listed(greedy)]), 0, 7)
    assert preferred_allocation(short, UUIDS, [], 7).reason is RefusalReason.NO_NEW_WORK


def test_a_gpusched_pod_bound_to_a_gpu_since_judged_unschedulable_is_refused() -> None:
    placed = pod("a", 2, [0, 1])
    snapshot = _with_unschedulable(state([placed], [listed(placed)]), 1)
    preferred = preferred_allocation(snapshot, UUIDS, [], 2)
    assert preferred.reason is RefusalReason.NOT_AVAILABLE
    assert "GPU 1 (GPU-01) is Unschedulable" in preferred.message
    assert verify_allocation(snapshot, UUIDS[:2]).reason is RefusalReason.NOT_AVAILABLE
    assert verify_allocation(
        _with_unschedulable(state([placed], [listed(placed)]), 5), UUIDS[:2]
    ).ok


def test_a_pod_gpusched_did_not_place_gets_the_highest_free_gpus_degraded_first() -> None:
    """Placement breaks ties towards the lowest indices and avoids Degraded GPUs, so those are
    the GPUs it is least likely to choose while it does not yet know which ones such a pod
    holds."""
    reserved, foreign = pod("placed", 2, [6, 7]), pod("foreign", 2, None)
    snapshot = state([reserved, foreign], [listed(foreign)])
    preferred = preferred_allocation(snapshot, UUIDS, [], 2)
    assert set(preferred.devices) == {UUIDS[4], UUIDS[5]}
    gpus = [
        GpuEntry(g.uuid, g.index, g.numa_node, state=GpuHealthState.DEGRADED) if g.index == 1 else g
        for g in GPUS
    ]
    degraded = NodeState("n1", snapshot.pods, snapshot.kubelet, gpus)
    assert set(preferred_allocation(degraded, UUIDS, [], 2).devices) == {UUIDS[1], UUIDS[5]}


def _init_only(name: str, gpus: list[int], *, created: str, started: bool = False) -> PodGpus:
    """A gpusched pod whose only GPU user is a classic init container (which the kubelet's
    PodResources does not list)."""
    status: dict[str, Any] = {"phase": "Pending"}
    if started:
        status["startTime"] = "2026-01-01T00:01:00Z"
    return pod_gpus(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "creationTimestamp": created,
                "annotations": {keys.ANNOTATION_GPUS: ",".join(UUIDS[i] for i in gpus)},
            },
            "spec": {
                "schedulerName": keys.SCHEDULER_NAME,
                "initContainers": [
                    {"name": "check", "resources": {"limits": {keys.GPU_RESOURCE: len(gpus)}}}
                ],
                "containers": [{"name": "main"}],
            },
            "status": status,
        }
    )


def test_a_pod_whose_only_gpu_user_is_an_init_container_is_admitted_with_its_gpus() -> None:
    warmup = _init_only("warmup", [3], created="2026-01-01T00:00:00Z")
    snapshot = state([warmup], [listed(warmup)])
    preferred = preferred_allocation(snapshot, UUIDS, [], 1)
    assert preferred.ok
    assert preferred.devices == (UUIDS[3],)
    accepted = verify_allocation(snapshot, [UUIDS[3]])
    assert accepted.ok
    assert accepted.pod == "ns/warmup"
    assert verify_allocation(snapshot, [UUIDS[4]]).reason is RefusalReason.MISMATCH
    running = _init_only("warmup", [3], created="2026-01-01T00:00:00Z", started=True)
    after = verify_allocation(state([running], [listed(running)]), [UUIDS[3]])
    assert after.reason is RefusalReason.NO_ADMITTING_POD


def test_a_pod_admitted_right_after_an_init_only_pod_gets_its_own_gpus() -> None:
    """The kubelet lists an admitted init-only pod as holding nothing until its start is
    recorded; the next pod, which surely waits, is the one being admitted."""
    warmup = _init_only("warmup", [3], created="2026-01-01T00:00:00Z")
    placed = pod("placed", 1, [5], created="2026-01-01T00:00:05Z")
    foreign = pod("foreign", 1, None, created="2026-01-01T00:00:05Z")
    available = [u for u in UUIDS if u != UUIDS[3]]
    for later in (placed, foreign):
        snapshot = state([warmup, later], [listed(warmup), listed(later)])
        preferred = preferred_allocation(snapshot, available, [], 1)
        assert preferred.pod == later.key
        accepted = verify_allocation(snapshot, preferred.devices)
        assert accepted.ok
        assert accepted.pod == later.key


def test_no_drift_for_a_pod_whose_init_container_needed_more_gpus_than_its_main_one() -> None:
    """Assigned the init container's two GPUs, the running pod's listed main container holds
    the one it asked for: complete."""
    prep = pod(
        "prep",
        2,
        [0, 1],
        containers=(ContainerGpus("init", 2, init=True), ContainerGpus("main", 1)),
    )
    assert check_drift(state([prep], [listed(prep, main=[0])])).drifts == ()
    short = pod(
        "short",
        3,
        [0, 1, 2],
        containers=(ContainerGpus("init", 1, init=True), ContainerGpus("main", 3)),
    )
    drifts = check_drift(state([short], [listed(short, main=[0, 1])])).drifts
    assert [d.kind for d in drifts] == [DriftKind.INCOMPLETE]


def test_explain_confirms_a_pod_whose_init_container_needed_more_gpus_than_its_main_one() -> None:
    from gpusched.core.nodeagent import Enforcement, enforcement

    prep = PodGpus(
        "ns",
        "prep",
        containers=(ContainerGpus("init", 2, init=True), ContainerGpus("main", 1)),
        assigned=(UUIDS[0], UUIDS[1]),
        allocated=(UUIDS[1],),
    )
    assert enforcement(prep).state is Enforcement.CONFIRMED


def test_a_gpu_quantity_in_non_ascii_digits_is_read_as_no_gpus() -> None:
    """The API server admits no such quantity; if one is read anyway, it is no request."""
    raw = {
        "metadata": {"name": "odd", "namespace": "ns"},
        "spec": {"containers": [{"name": "m", "resources": {"limits": {keys.GPU_RESOURCE: "²"}}}]},
    }
    assert pod_gpus(raw).containers == (ContainerGpus("m", 0),)
