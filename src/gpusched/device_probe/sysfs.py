"""What the probe reads from sysfs: where each PCI device sits, its NUMA node and local CPUs,
and the RDMA NICs.

NVML knows GPUs only; NICs and the NUMA attachment of x86 GPUs come from sysfs, as they do for
``nvidia-smi`` and the NVIDIA device plugin. The root is configurable so the DaemonSet can mount
the host's ``/sys`` elsewhere and tests can point it at a generated tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpusched.device_probe.pcie import PciAddressError, PciPath, natural_key, normalize_bus_id


@dataclass(frozen=True, slots=True)
class SysfsNic:
    """An RDMA device (``/sys/class/infiniband/<name>``) and its PCI position."""

    name: str
    path: PciPath


class Sysfs:
    """Reads PCI placement from a sysfs tree rooted at ``root`` (``/sys`` on a host)."""

    def __init__(self, root: str | Path = "/sys") -> None:
        self.root = Path(root)

    def _device_dir(self, bus_id: str) -> Path | None:
        link = self.root / "bus" / "pci" / "devices" / normalize_bus_id(bus_id)
        if not link.exists():
            return None
        return Path(os.path.realpath(link))

    @staticmethod
    def _read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    @classmethod
    def _numa(cls, device_dir: Path) -> int | None:
        text = cls._read(device_dir / "numa_node")
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            return None
        return value if value >= 0 else None  # -1: the platform does not say

    def pci_path(self, bus_id: str) -> PciPath | None:
        """Position of a PCI device, or None when sysfs does not show it."""
        try:
            device_dir = self._device_dir(bus_id)
            if device_dir is None:
                return None
            return PciPath.from_sysfs_path(str(device_dir), self._numa(device_dir))
        except PciAddressError:
            return None

    def numa_node(self, bus_id: str) -> int | None:
        """NUMA node of a PCI device (None for -1 or absent)."""
        try:
            device_dir = self._device_dir(bus_id)
        except PciAddressError:
            return None
        return None if device_dir is None else self._numa(device_dir)

    def local_cpulist(self, bus_id: str) -> str | None:
        """CPUs local to a PCI device, as sysfs writes them (``0-47,96-143``)."""
        try:
            device_dir = self._device_dir(bus_id)
        except PciAddressError:
            return None
        if device_dir is None:
            return None
        text = self._read(device_dir / "local_cpulist")
        return text or None

    def rdma_nics(self) -> list[SysfsNic]:
        """RDMA devices with a PCI parent, in natural name order (``mlx5_2`` before ``mlx5_10``).

        SR-IOV virtual functions (a ``physfn`` link to their physical function) are left out:
        they share their NIC's port and PCIe position, and a node with virtual functions enabled
        has dozens of them, which would bury the NICs placement cares about.
        """
        directory = self.root / "class" / "infiniband"
        if not directory.is_dir():
            return []
        nics: list[SysfsNic] = []
        for entry in sorted(directory.iterdir(), key=lambda p: natural_key(p.name)):
            device = entry / "device"
            if not device.exists():
                continue
            real = Path(os.path.realpath(device))
            if (real / "physfn").is_symlink():
                continue
            try:
                nics.append(
                    SysfsNic(entry.name, PciPath.from_sysfs_path(str(real), self._numa(real)))
                )
            except PciAddressError:
                continue
        return nics
