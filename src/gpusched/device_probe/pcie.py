"""PCI addresses and PCIe distances, as NVML and sysfs express them.

NVML writes bus ids as ``00000000:18:00.0`` (8-digit domain, upper-case hex), sysfs as
``0000:18:00.0``; everything the probe publishes uses the sysfs form. The distance between two
devices is read from their sysfs paths (``/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/...``)
with the rule ``nvidia-smi topo -m`` documents: PIX when the path crosses at most one PCIe switch,
PXB for several bridges below the host bridge, PHB through the host bridge, NODE between host
bridges of one NUMA node, SYS across NUMA nodes (or when the NUMA node is unknown).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpusched.api.nodegputopology import LinkType

_BDF: Final = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
_ROOT: Final = re.compile(r"pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}")

# nvmlGpuTopologyLevel_t values (nvml.h); the mapping is the one in the topo -m legend.
NVML_TOPOLOGY_LEVELS: Final[dict[int, LinkType]] = {
    0: LinkType.PIX,  # INTERNAL: two GPUs on one board, closer than one switch
    10: LinkType.PIX,  # SINGLE
    20: LinkType.PXB,  # MULTIPLE
    30: LinkType.PHB,  # HOSTBRIDGE
    40: LinkType.NODE,  # NODE (formerly CPU)
    50: LinkType.SYS,  # SYSTEM
}
LEVEL_TO_NVML: Final[dict[LinkType, int]] = {
    LinkType.PIX: 10,
    LinkType.PXB: 20,
    LinkType.PHB: 30,
    LinkType.NODE: 40,
    LinkType.SYS: 50,
}


class PciAddressError(ValueError):
    """A PCI bus id that is not ``[domain:]bus:device.function``."""


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:18:00.0`` or ``18:00.0`` -> ``0000:18:00.0`` (sysfs form, lower case)."""
    match = _BDF.fullmatch(bus_id.strip())
    if match is None:
        raise PciAddressError(f"not a PCI bus id: {bus_id!r}")
    domain = int(match.group(1) or "0", 16)
    if domain > 0xFFFF:
        raise PciAddressError(f"PCI domain of {bus_id!r} does not fit sysfs' 4 digits")
    return f"{domain:04x}:{match.group(2)}:{match.group(3)}.{match.group(4)}".lower()


def nvml_bus_id(bus_id: str) -> str:
    """``0000:18:00.0`` -> ``00000000:18:00.0``, the form NVML reports."""
    domain, rest = normalize_bus_id(bus_id).split(":", 1)
    return f"0000{domain}:{rest}".upper()


def level_from_nvml(value: int) -> LinkType:
    """PCIe class of an ``nvmlDeviceGetTopologyCommonAncestor`` answer (SYS if unknown)."""
    return NVML_TOPOLOGY_LEVELS.get(value, LinkType.SYS)


@dataclass(frozen=True, slots=True)
class PciPath:
    """Where a device sits: its root complex, the bridges above it, and its NUMA node."""

    root: str
    """``pci0000:17``."""
    bridges: tuple[str, ...]
    """Bus ids of the bridges from the root port down, the device itself excluded."""
    device: str
    numa_node: int | None = None

    @classmethod
    def from_sysfs_path(cls, path: str, numa_node: int | None = None) -> PciPath:
        """Parse a resolved sysfs device path (``.../pci0000:17/0000:17:01.0/0000:18:00.0``)."""
        parts = [p for p in path.split("/") if p]
        roots = [i for i, p in enumerate(parts) if _ROOT.fullmatch(p)]
        if not roots:
            raise PciAddressError(f"no PCI root complex in {path!r}")
        chain = [p for p in parts[roots[-1] + 1 :] if _BDF.fullmatch(p)]
        if not chain:
            raise PciAddressError(f"no PCI device below the root complex in {path!r}")
        return cls(
            root=parts[roots[-1]].lower(),
            bridges=tuple(b.lower() for b in chain[:-1]),
            device=chain[-1].lower(),
            numa_node=numa_node,
        )


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def pcie_distance(a: PciPath, b: PciPath) -> LinkType:
    """PCIe class between two devices from their sysfs positions.

    Below a common bridge, a PCIe switch shows as its upstream port with one downstream port per
    child, so two devices on one switch are one downstream port each away from the common
    upstream port: at most two bridges between them is PIX, more is PXB. No common bridge under
    the same root is PHB. Different root complexes are NODE on the same (known) NUMA node, SYS
    otherwise.
    """
    if a.root != b.root:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return LinkType.NODE
        return LinkType.SYS
    common = _common_prefix(a.bridges, b.bridges)
    if common == 0:
        return LinkType.PHB
    hops = (len(a.bridges) - common) + (len(b.bridges) - common)
    return LinkType.PIX if hops <= 2 else LinkType.PXB


def cpulist_from_mask(words: Sequence[int], bits_per_word: int = 64) -> str:
    """``[0x3, 0x1]`` -> ``0-1,64``: an NVML CPU affinity bitmask as a sysfs cpulist."""
    cpus = [
        w * bits_per_word + bit
        for w, word in enumerate(words)
        for bit in range(bits_per_word)
        if int(word) >> bit & 1
    ]
    ranges: list[str] = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        ranges.append(f"{cpus[i]}-{cpus[j]}" if j > i else f"{cpus[i]}")
        i = j + 1
    return ",".join(ranges)


def cpus_from_list(cpulist: str) -> list[int]:
    """``0-1,64`` -> ``[0, 1, 64]`` (raises ValueError on malformed input)."""
    cpus: list[int] = []
    for part in cpulist.strip().split(","):
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.extend(range(int(low), int(high) + 1))
        else:
            cpus.append(int(part))
    return cpus


def mask_from_cpulist(cpulist: str, words: int, bits_per_word: int = 64) -> list[int]:
    """The inverse of :func:`cpulist_from_mask`, ``words`` words long."""
    mask = [0] * words
    for cpu in cpus_from_list(cpulist):
        if cpu // bits_per_word < words:
            mask[cpu // bits_per_word] |= 1 << (cpu % bits_per_word)
    return mask


def natural_key(name: str) -> tuple[object, ...]:
    """Sort key that puts ``mlx5_2`` before ``mlx5_10``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))
