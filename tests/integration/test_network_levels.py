"""Gangs in the cluster's network levels, on the real control plane: the NetworkTopology object
read by the operator, a clique with a tray out of service left alone by clique-scoped gangs, and
segments kept inside one rack.

The operator runs as a real process under the chart's operator identity; kwok runs the pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException

from gpusched.api import keys
from gpusched.cli import main
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.topologies import nvl72_tray_objects
from gpusched.dev.localprobes import start_tray_probes
from tests.integration.operator_harness import POOL, POOL_LABEL, OperatorProcess, Scenario, wait_for

CLIQUE = keys.GFD_CLIQUE
RACK = "topology.kubernetes.io/rack"


@pytest.fixture
def levels(sc: Scenario) -> Iterator[None]:
    """The NetworkTopology ``default``: racks, and NVLink cliques inside them (whole domains)."""
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": "NetworkTopology",
        "metadata": {"name": "default"},
        "spec": {
            "levels": [
                {"name": "rack", "nodeLabel": RACK},
                {"name": "clique", "nodeLabel": CLIQUE, "wholeDomains": True},
            ]
        },
    }
    with suppress(ApiException):
        sc.custom.delete_cluster_custom_object(
            "gpusched.io", "v1alpha1", "networktopologies", "default"
        )
    sc.custom.create_cluster_custom_object("gpusched.io", "v1alpha1", "networktopologies", body)
    yield
    with suppress(ApiException):
        sc.custom.delete_cluster_custom_object(
            "gpusched.io", "v1alpha1", "networktopologies", "default"
        )


def test_a_clique_gang_never_takes_a_clique_with_a_tray_down(
    sc: Scenario, levels: None, local_cluster: LocalCluster
) -> None:
    """Two cliques of three trays; one tray of clique b is cordoned. A 3-tray gang takes clique
    a; a 2-tray gang, which clique b's healthy trays would hold, waits with DomainDegraded
    naming the clique, and `explain` says so; once the tray is back it runs there."""
    a = sc.nodes(3, **{CLIQUE: f"{sc.id}-a", RACK: f"{sc.id}-r1"})
    b = sc.nodes(3, **{CLIQUE: f"{sc.id}-b", RACK: f"{sc.id}-r1"})
    sc.core.patch_node(b[0], {"spec": {"unschedulable": True}})
    _, ns = sc.tenant("team", guaranteed=48)
    clique = {"acrossReplicas": {"nodeLabel": CLIQUE, "mode": "required"}}
    sc.submit(ns, "big", 8, replicas=3, topology=clique)
    running = sc.wait_phase(ns, "big", "Running", timeout=90)
    assert {p["node"] for p in running["placement"]} == set(a)

    sc.submit(ns, "pair", 8, replicas=2, topology=clique)
    waiting = sc.wait_reason(ns, "pair", "DomainDegraded", timeout=60)
    assert f"clique {sc.id}-b" in waiting["message"]
    assert not sc.pods(ns, "pair")
    result = CliRunner().invoke(
        main, ["explain", f"{ns}/pair", f"--kubeconfig={local_cluster.kubeconfig}"]
    )
    assert result.exit_code == 0, result.output
    assert "DomainDegraded" in result.output

    sc.core.patch_node(b[0], {"spec": {"unschedulable": False}})
    running = sc.wait_phase(ns, "pair", "Running", timeout=90)
    assert {p["node"] for p in running["placement"]} <= set(b)


def test_each_segment_of_a_gang_runs_inside_one_rack(sc: Scenario, levels: None) -> None:
    """Four replicas in segments of two per rack; racks of three, two and one free nodes: each
    segment lands inside one rack, and the one-node rack is never used."""
    r1 = sc.nodes(3, **{RACK: f"{sc.id}-r1"})
    r2 = sc.nodes(2, **{RACK: f"{sc.id}-r2"})
    r3 = sc.nodes(1, **{RACK: f"{sc.id}-r3"})
    rack_of = {**dict.fromkeys(r1, "r1"), **dict.fromkeys(r2, "r2"), **dict.fromkeys(r3, "r3")}
    _, ns = sc.tenant("team", guaranteed=32)
    sc.submit(
        ns,
        "seg",
        8,
        replicas=4,
        topology={
            "acrossReplicas": {
                "nodeLabel": RACK,
                "mode": "preferred",
                "segment": {"replicas": 2, "nodeLabel": RACK},
            }
        },
    )
    running = sc.wait_phase(ns, "seg", "Running", timeout=90)
    by_replica = sorted(running["placement"], key=lambda p: p["replica"])
    racks = [rack_of[p["node"]] for p in by_replica]
    assert racks[0] == racks[1]
    assert racks[2] == racks[3]
    assert "r3" not in racks


def test_preferred_segments_no_rack_holds_give_way_to_the_gang(sc: Scenario, levels: None) -> None:
    """Segments of two replicas per rack, preferred, over racks of one free node each: no rack
    holds a segment, so the gang runs across racks instead of waiting; the same gang with
    segments required waits with the reason."""
    nodes = [sc.nodes(1, **{RACK: f"{sc.id}-r{i}"})[0] for i in range(4)]
    _, ns = sc.tenant("team", guaranteed=64)

    def segmented(mode: str) -> dict[str, object]:
        return {
            "acrossReplicas": {
                "nodeLabel": RACK,
                "mode": "preferred",
                "segment": {"replicas": 2, "nodeLabel": RACK, "mode": mode},
            }
        }

    sc.submit(ns, "strict", 8, replicas=2, topology=segmented("required"))
    waiting = sc.wait_reason(ns, "strict", "NoFeasibleNodes", timeout=60)
    assert "segments of 2" in waiting["message"]
    sc.submit(ns, "loose", 8, replicas=2, topology=segmented("preferred"))
    running = sc.wait_phase(ns, "loose", "Running", timeout=90)
    assert {p["node"] for p in running["placement"]} <= set(nodes)
    assert len({p["node"] for p in running["placement"]}) == 2


def test_two_nvl72_racks_one_with_trays_down(
    sc: Scenario, levels: None, operator: OperatorProcess
) -> None:
    """Two NVL72 racks of 18 four-GPU trays (one NVLink clique each); two trays of rack b are
    out of service. A 64-GPU clique gang runs inside rack a (the only whole clique); a 72-GPU
    clique gang then waits, its message naming clique b as not whole, with no pod created, and
    the operator's largest-gang gauge says what each level can still take; a gang in segments
    of two trays per rack keeps each segment in one rack."""
    cluster = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    racks = {}
    for rack, clique_id in (("a", 1), ("b", 2)):
        clique = f"{cluster}.{clique_id}"
        racks[rack] = sc.nodes(
            18,
            objects=partial(nvl72_tray_objects, clique=clique),
            product="NVIDIA-GB200",
            **{CLIQUE: clique, RACK: f"{sc.id}-{rack}"},
        )
    for name in racks["b"][:2]:
        sc.core.patch_node(name, {"spec": {"unschedulable": True}})
    _, ns = sc.tenant("team", guaranteed=144)
    clique = {"acrossReplicas": {"nodeLabel": CLIQUE, "mode": "required"}}

    sc.submit(ns, "g64", 4, replicas=16, topology=clique)
    running = sc.wait_phase(ns, "g64", "Running", timeout=120)
    assert {p["node"] for p in running["placement"]} <= set(racks["a"])

    sc.submit(ns, "g72", 4, replicas=18, topology=clique)
    waiting = sc.wait_reason(ns, "g72", "TopologyUnsatisfiable", timeout=60)
    assert f"not whole (nodes or GPUs down): clique {cluster}.2" in waiting["message"]
    assert not sc.pods(ns, "g72")

    # Rack a has 2 free trays; rack b 16 in service, but clique b is not whole.
    def gauge() -> dict[str, float] | None:
        values = operator.gauge("gpusched_largest_free_domain_gpus", "level")
        return values if values.get("clique") == 8 else None

    largest = wait_for(gauge, 30, "the largest-gang gauge after the 64-GPU gang")
    assert largest["rack"] == 64

    segmented = {
        "acrossReplicas": {
            "nodeLabel": RACK,
            "mode": "preferred",
            "segment": {"replicas": 2, "nodeLabel": RACK},
        }
    }
    sc.submit(ns, "seg", 4, replicas=6, topology=segmented)
    running = sc.wait_phase(ns, "seg", "Running", timeout=120)
    rack_of = {n: r for r, names in racks.items() for n in names}
    by_replica = sorted(running["placement"], key=lambda p: p["replica"])
    for start in range(0, 6, 2):
        assert rack_of[by_replica[start]["node"]] == rack_of[by_replica[start + 1]["node"]]
    assert not sc.pods(ns, "g72")


def test_tray_probes_publish_the_clique_and_a_failing_gpu_takes_it_from_clique_gangs(
    sc: Scenario, levels: None, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Four GB200 trays of one rack, each with its own device probe whose NVML reports the
    rack's NVLink clique: the probes publish each tray's NodeGpuTopology and clique label (the
    test writes neither). An Xid 79 on one tray's GPU, reported by its probe, takes the clique
    out of clique-scoped gangs: a three-tray gang that its healthy trays would hold waits with
    `DomainDegraded` naming the clique, and no pod is created."""
    clique = "1f6b0f0e-3a3c-4c43-9a8e-2b7e1c9d5a01.3"
    trays = [f"{sc.id}-tray{i}" for i in range(4)]
    sc.make_nodes(4, 4, names=trays, labels={POOL_LABEL: POOL, RACK: f"{sc.id}-rack"})
    probes = start_tray_probes(local_cluster, trays, clique, tmp_path / "trays")
    try:

        def published() -> bool:
            for tray in trays:
                if sc.core.read_node(tray).metadata.labels.get(CLIQUE) != clique:
                    return False
                with suppress(ApiException):
                    obj = sc.custom.get_cluster_custom_object(
                        "gpusched.io", "v1alpha1", "nodegputopologies", tray
                    )
                    if obj["spec"].get("clique") == clique and obj.get("status"):
                        continue
                return False
            return True

        wait_for(published, 90, "each tray's probe to publish the clique")
        _, ns = sc.tenant("team", guaranteed=16)
        clique_scoped = {"acrossReplicas": {"nodeLabel": CLIQUE, "mode": "required"}}

        probes[0].inject(gpu=1, xid=79)

        def unhealthy() -> bool:
            obj = sc.custom.get_cluster_custom_object(
                "gpusched.io", "v1alpha1", "nodegputopologies", trays[0]
            )
            return any(g.get("reason") == "Xid79" for g in obj["status"]["gpus"])

        wait_for(unhealthy, 60, "tray 0's probe to report GPU 1 unhealthy")
        sc.submit(ns, "three", 4, replicas=3, topology=clique_scoped)
        waiting = sc.wait_reason(ns, "three", "DomainDegraded", timeout=60)
        assert f"clique {clique}" in waiting["message"]
        assert not sc.pods(ns, "three")
    finally:
        for probe in probes:
            local_cluster.stop_process(probe.record)
