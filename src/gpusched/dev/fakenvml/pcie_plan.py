"""A PCIe tree that reproduces a topology's PCIe distances, for the fake NVML and fake sysfs.

A ``topo -m`` matrix gives distances (PIX, PXB, PHB, NODE, SYS), not the tree behind them, but
the probe reads NIC distances and NUMA nodes from sysfs paths. So the fake needs a tree whose
paths give back the matrix's distances under the probe's own rule
(:func:`gpusched.device_probe.pcie.pcie_distance`). The classes are nested (devices at PIX lie
inside one PXB tree, which lies under one host bridge, inside one NUMA node), so grouping the
devices by "at most this distance" at each level gives the tree: one root complex per host-bridge
group, one root port per switch tree, a switch per PIX group.

Some real matrices cannot come from any tree (a box that prints SYS between devices on the same
NUMA node, typical of VMs and some AMD platforms). The plan keeps every GPU's NUMA node (it is
published data), chooses each NIC's sysfs NUMA node to reproduce as many of its cells as
possible, and lists whatever still differs in :attr:`PciePlan.mismatches`. GPU-to-GPU answers
of the fake NVML come from the matrix itself, so only the sysfs fallback could see those.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from gpusched.api.nodegputopology import LinkType
from gpusched.core import NodeTopology
from gpusched.device_probe.pcie import PciPath, pcie_distance

DeviceKey = tuple[Literal["gpu", "nic"], int]

_RANK: Final[dict[LinkType, int]] = {
    LinkType.PIX: 1,
    LinkType.PXB: 2,
    LinkType.PHB: 3,
    LinkType.NODE: 4,
    LinkType.SYS: 5,
}
#: NVSwitch chips the fake puts on switch boards (HGX H100 has four); only their bus ids show.
FAKE_NVSWITCHES: Final = 4


class FakeTopologyError(ValueError):
    """The topology cannot be modelled by the fake (names what and why)."""


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    """One endpoint of the fake PCIe tree."""

    key: DeviceKey
    name: str
    bus_id: str
    root: str
    bridges: tuple[str, ...]
    numa_node: int | None

    @property
    def path(self) -> PciPath:
        """Its position as the probe parses it from sysfs."""
        return PciPath(self.root, self.bridges, self.bus_id, self.numa_node)


@dataclass(frozen=True)
class PciePlan:
    """Bus ids, sysfs positions and NVSwitch bus ids of a fake node."""

    devices: dict[DeviceKey, PlannedDevice]
    known: dict[tuple[DeviceKey, DeviceKey], LinkType]
    """Distances the topology states (GPU pairs without NVLink, or with ``pcie``; NIC-GPU)."""
    nvswitch_bus_ids: tuple[str, ...] = ()
    mismatches: tuple[str, ...] = field(default=())
    """Stated distances the tree gives differently, as ``GPU0-NIC1: SYS stated, NODE in tree``."""

    def gpu(self, index: int) -> PlannedDevice:
        """The planned GPU ``index``."""
        return self.devices[("gpu", index)]

    def nic(self, index: int) -> PlannedDevice:
        """The planned NIC ``index``."""
        return self.devices[("nic", index)]

    def tree_level(self, a: DeviceKey, b: DeviceKey) -> LinkType:
        """Distance of two devices in the tree."""
        return pcie_distance(self.devices[a].path, self.devices[b].path)

    def gpu_level(self, a: int, b: int) -> LinkType:
        """What NVML's common-ancestor call answers: the stated distance, else the tree's."""
        ka: DeviceKey = ("gpu", a)
        kb: DeviceKey = ("gpu", b)
        return self.known.get(_pair(ka, kb)) or self.tree_level(ka, kb)


def _pair(a: DeviceKey, b: DeviceKey) -> tuple[DeviceKey, DeviceKey]:
    return (a, b) if a <= b else (b, a)


def _name(key: DeviceKey) -> str:
    return f"{'GPU' if key[0] == 'gpu' else 'NIC'}{key[1]}"


class _UnionFind:
    def __init__(self, items: Iterable[DeviceKey]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: DeviceKey) -> DeviceKey:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: DeviceKey, b: DeviceKey) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _groups(members: list[DeviceKey], uf: _UnionFind) -> list[list[DeviceKey]]:
    """Members split by union-find root, each group and the list ordered by first member."""
    by_root: dict[DeviceKey, list[DeviceKey]] = {}
    for m in members:
        by_root.setdefault(uf.find(m), []).append(m)
    return sorted(by_root.values(), key=lambda g: g[0])


class _Buses:
    """Hands out unique bus numbers (spilling into further PCI domains past 0xff)."""

    def __init__(self) -> None:
        self.next = 0x10

    def take(self) -> tuple[int, int]:
        value = self.next
        self.next += 1
        return value // 0x100, value % 0x100


def _bdf(domain: int, bus: int, device: int = 0) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def plan_pcie(topology: NodeTopology) -> PciePlan:
    """Lay out a PCIe tree for the topology's GPUs and NICs (see the module docstring)."""
    keys: list[DeviceKey] = [("gpu", g.index) for g in topology.gpus]
    keys += [("nic", n.index) for n in topology.nics]
    known: dict[tuple[DeviceKey, DeviceKey], LinkType] = {}
    for link in topology.links:
        level = link.pcie if link.type is LinkType.NV else link.type
        if level is not None:
            known[_pair(("gpu", link.a), ("gpu", link.b))] = level
    for nl in topology.nic_links:
        known[_pair(("nic", nl.nic), ("gpu", nl.gpu))] = nl.type

    finders = {rank: _UnionFind(keys) for rank in (1, 2, 3, 4)}
    for (a, b), level in known.items():
        for rank, uf in finders.items():
            if _RANK[level] <= rank:
                uf.union(a, b)

    gpu_numa = {g.index: g.numa_node for g in topology.gpus}
    devices: dict[DeviceKey, PlannedDevice] = {}
    buses = _Buses()
    for socket in _groups(keys, finders[4]):
        for host_bridge in _groups(socket, finders[3]):
            domain, root_bus = buses.take()
            root = f"pci{domain:04x}:{root_bus:02x}"
            port = 0
            for tree in _groups(host_bridge, finders[2]):
                port += 1
                root_port = _bdf(domain, root_bus, port)
                pix_groups = _groups(tree, finders[1])
                placements: list[tuple[DeviceKey, tuple[str, ...]]] = []
                if len(tree) == 1:
                    placements.append((tree[0], (root_port,)))
                else:
                    upstream = _bdf(*buses.take())
                    for group in pix_groups:
                        if len(pix_groups) == 1:
                            placements += [
                                (member, (root_port, upstream, _bdf(*buses.take())))
                                for member in group
                            ]
                            continue
                        down = _bdf(*buses.take())
                        inner = _bdf(*buses.take())
                        placements += [
                            (member, (root_port, upstream, down, inner, _bdf(*buses.take())))
                            for member in group
                        ]
                for key, bridges in placements:
                    kind, index = key
                    name = (
                        f"GPU{index}"
                        if kind == "gpu"
                        else next(n.name for n in topology.nics if n.index == index)
                    )
                    devices[key] = PlannedDevice(
                        key=key,
                        name=name,
                        bus_id=_bdf(*buses.take()),
                        root=root,
                        bridges=bridges,
                        numa_node=gpu_numa[index] if kind == "gpu" else None,
                    )

    _choose_nic_numa(topology, devices, known)
    mismatches = []
    for (a, b), level in sorted(known.items()):
        got = pcie_distance(devices[a].path, devices[b].path)
        if got is not level:
            mismatches.append(f"{_name(a)}-{_name(b)}: {level.value} stated, {got.value} in tree")

    switch_ids: tuple[str, ...] = ()
    if topology.nvswitch or any(g.nvswitch_links for g in topology.gpus):
        switch_ids = tuple(_bdf(*buses.take()) for _ in range(FAKE_NVSWITCHES))
    return PciePlan(devices, known, switch_ids, tuple(mismatches))


def _choose_nic_numa(
    topology: NodeTopology,
    devices: dict[DeviceKey, PlannedDevice],
    known: dict[tuple[DeviceKey, DeviceKey], LinkType],
) -> None:
    """Give each NIC the sysfs NUMA node that reproduces most of its stated distances, preferring
    the topology's own value, then "unknown", then its GPUs' nodes."""
    gpu_numas = sorted({g.numa_node for g in topology.gpus if g.numa_node is not None})
    for nic in topology.nics:
        key: DeviceKey = ("nic", nic.index)
        pairs = [(a if b == key else b, level) for (a, b), level in known.items() if key in (a, b)]
        candidates: list[int | None] = [nic.numa_node, None, *gpu_numas]
        best: tuple[int, int | None] | None = None
        for candidate in dict.fromkeys(candidates):
            trial = PlannedDevice(
                key,
                devices[key].name,
                devices[key].bus_id,
                devices[key].root,
                devices[key].bridges,
                candidate,
            )
            errors = sum(
                1
                for other, level in pairs
                if pcie_distance(trial.path, devices[other].path) is not level
            )
            if best is None or errors < best[0]:
                best = (errors, candidate)
        assert best is not None
        old = devices[key]
        devices[key] = PlannedDevice(key, old.name, old.bus_id, old.root, old.bridges, best[1])
