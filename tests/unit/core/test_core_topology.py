"""Topology model: validation, wiring hash, health, and lossless conversion to and from the API."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_testdata import ALL_TOPOLOGIES, BRIDGED, H100, WORKSTATION, topology

from gpusched.api.nodegputopology import (
    GpuHealth,
    GpuHealthState,
    GpuInfo,
    GpuLink,
    LinkType,
    NicInfo,
    NicLink,
    NodeGpuTopology,
    NodeGpuTopologySpec,
    NodeGpuTopologyStatus,
)
from gpusched.core import Gpu, Link, NodeTopology, TopologyError


def _full_api_object() -> NodeGpuTopology:
    spec = NodeGpuTopologySpec(
        node_name="gpu-node-7",
        gpus=[
            GpuInfo(
                index=i,
                uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab",
                model="NVIDIA H100 80GB HBM3",
                memory_mib=81559,
                pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
                numa_node=i // 2,
                cpu_affinity="0-47" if i < 2 else "48-95",
                compute_capability="9.0",
                mig_enabled=i == 3,
                nvlink_count=18,
                nvswitch_links=18,
            )
            for i in range(4)
        ],
        links=[
            GpuLink(
                a=a,
                b=b,
                type=LinkType.NV,
                nvlinks=18,
                pcie=LinkType.NODE if a // 2 == b // 2 else LinkType.SYS,
            )
            for a in range(4)
            for b in range(a + 1, 4)
        ],
        nics=[NicInfo(index=0, name="mlx5_0", numa_node=0), NicInfo(index=1, name="mlx5_1")],
        nic_links=[
            NicLink(nic=n, gpu=g, type=LinkType.PIX if g == n else LinkType.SYS)
            for n in range(2)
            for g in range(4)
        ],
        nvswitch=True,
        clique="1b2c3d4e-0000-1111-2222-333344445555.7",
        driver_version="570.124.06",
        cuda_driver_version="12.8",
        source="nvml",
        topology_hash="abc123",
    )
    status = NodeGpuTopologyStatus(
        gpus=[
            GpuHealth(index=0, uuid=spec.gpus[0].uuid),
            GpuHealth(
                index=1,
                uuid=spec.gpus[1].uuid,
                state=GpuHealthState.DEGRADED,
                reason="HwSlowdown",
                message="sustained hardware slowdown",
            ),
            GpuHealth(
                index=2,
                uuid=spec.gpus[2].uuid,
                state=GpuHealthState.UNHEALTHY,
                reason="Xid79",
                message="GPU fell off the bus",
            ),
            GpuHealth(
                index=3,
                uuid=spec.gpus[3].uuid,
                state=GpuHealthState.UNSCHEDULABLE,
                reason="RowRemapPending",
                message="reset needed",
            ),
        ],
        healthy_gpus=2,
    )
    return NodeGpuTopology(metadata={"name": "gpu-node-7"}, spec=spec, status=status)


def test_api_object_survives_a_round_trip_through_the_core_model() -> None:
    obj = _full_api_object()
    spec, status = NodeTopology.from_api_object(obj).to_api()
    assert spec.to_k8s() == obj.spec.to_k8s()
    assert status.to_k8s() == obj.status.to_k8s()


@pytest.mark.parametrize("name", ALL_TOPOLOGIES)
def test_parsed_topology_survives_a_round_trip_through_the_api(name: str) -> None:
    topo = topology(name)
    spec, status = topo.to_api()
    back = NodeTopology.from_api(spec, status)
    assert back == topo
    assert back.wiring_hash == topo.wiring_hash
    assert spec.topology_hash == topo.wiring_hash
    assert status.healthy_gpus == len(topo.gpus)


def test_health_comes_from_status_and_missing_entries_count_as_healthy() -> None:
    obj = _full_api_object()
    topo = NodeTopology.from_api(obj.spec, NodeGpuTopologyStatus(gpus=obj.status.gpus[1:2]))
    assert topo.gpu(0).health is GpuHealthState.HEALTHY
    assert topo.gpu(1).health is GpuHealthState.DEGRADED
    full = NodeTopology.from_api_object(obj)
    assert full.placeable_gpus == (0, 1)  # 2 Unhealthy, 3 Unschedulable and in MIG mode


def test_wiring_hash_ignores_identity_and_health_but_not_links() -> None:
    topo = topology(WORKSTATION)
    relabelled = replace(
        topo,
        gpus=tuple(replace(g, uuid=f"GPU-{g.index}", pci_bus_id="0000:01:00.0") for g in topo.gpus),
    )
    assert relabelled.wiring_hash == topo.wiring_hash
    sick = topo.with_health({0: GpuHealthState.UNHEALTHY})
    assert sick.wiring_hash == topo.wiring_hash
    assert sick.gpu(0).health is GpuHealthState.UNHEALTHY
    rewired = replace(
        topo,
        links=tuple(
            Link(lk.a, lk.b, LinkType.PIX) if (lk.a, lk.b) == (2, 3) else lk for lk in topo.links
        ),
    )
    assert rewired.wiring_hash != topo.wiring_hash


def test_with_health_refuses_unknown_gpus() -> None:
    with pytest.raises(TopologyError, match="unknown GPUs"):
        topology(BRIDGED).with_health({9: GpuHealthState.UNHEALTHY})


@pytest.mark.parametrize(
    ("gpus", "links", "message"),
    [
        ((Gpu(0), Gpu(0)), (), "listed twice"),
        ((Gpu(1), Gpu(0)), (), "increasing index"),
        ((Gpu(0), Gpu(1)), (Link(0, 2, LinkType.PIX),), "unknown GPU 2"),
        ((Gpu(0), Gpu(1)), (Link(1, 0, LinkType.PIX),), "a must be lower"),
        ((Gpu(0), Gpu(1)), (Link(0, 1, LinkType.NV),), "count > 0"),
        ((Gpu(0), Gpu(1)), (Link(0, 1, LinkType.PIX, nvlinks=2),), "count > 0"),
        ((Gpu(0), Gpu(1)), (Link(0, 1, LinkType.PIX), Link(0, 1, LinkType.PIX)), "twice"),
    ],
)
def test_inconsistent_topologies_are_refused(
    gpus: tuple[Gpu, ...], links: tuple[Link, ...], message: str
) -> None:
    with pytest.raises(TopologyError, match=message):
        NodeTopology("n", gpus, links)


def test_unreported_pair_stays_absent_in_the_model() -> None:
    topo = NodeTopology("n", (Gpu(0), Gpu(1), Gpu(2)), (Link(0, 1, LinkType.PIX),))
    assert topo.link(1, 0) == Link(0, 1, LinkType.PIX)
    assert topo.link(0, 2) is None


def test_placeable_excludes_unhealthy_unschedulable_and_mig() -> None:
    topo = topology(H100).with_health(
        {1: GpuHealthState.UNHEALTHY, 2: GpuHealthState.UNSCHEDULABLE, 3: GpuHealthState.DEGRADED}
    )
    topo = replace(topo, gpus=tuple(replace(g, mig_enabled=g.index == 4) for g in topo.gpus))
    assert topo.placeable_gpus == (0, 3, 5, 6, 7)


def test_from_topo_matrix_is_the_parser() -> None:
    from core_testdata import fixture_text

    parsed = NodeTopology.from_topo_matrix(fixture_text(BRIDGED), node_name=BRIDGED)
    assert parsed == topology(BRIDGED)
