"""Writes the part of a sysfs tree the probe reads, for a planned fake node.

Layout as on a Linux host: devices under ``devices/pciDDDD:BB/<root port>/.../<device>`` with
``numa_node``, ``local_cpulist``, ``vendor`` and ``class`` files; ``bus/pci/devices/<bdf>``
symlinks to them; RDMA NICs as ``class/infiniband/<name>`` symlinks to
``<device>/infiniband/<name>``, whose ``device`` link points back at the PCI function.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from gpusched.core import NodeTopology
from gpusched.dev.fakenvml.pcie_plan import PciePlan, PlannedDevice

_NVIDIA: Final = "0x10de"
_MELLANOX: Final = "0x15b3"
_CLASS_3D: Final = "0x030200"
_CLASS_INFINIBAND: Final = "0x020700"
_CLASS_BRIDGE: Final = "0x060400"


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n")


def _device_dir(root: Path, device: PlannedDevice) -> Path:
    return root.joinpath("devices", device.root, *device.bridges, device.bus_id)


def write_sysfs(plan: PciePlan, topology: NodeTopology, root: Path) -> Path:
    """Create the tree under ``root`` (which may exist and be empty); returns ``root``."""
    by_bus = root / "bus" / "pci" / "devices"
    by_bus.mkdir(parents=True, exist_ok=True)
    infiniband = root / "class" / "infiniband"
    infiniband.mkdir(parents=True, exist_ok=True)
    cpus = {g.index: g.cpu_affinity for g in topology.gpus}
    for device in plan.devices.values():
        directory = _device_dir(root, device)
        directory.mkdir(parents=True, exist_ok=True)
        for depth in range(1, len(device.bridges) + 1):
            bridge = root.joinpath("devices", device.root, *device.bridges[:depth])
            if not (bridge / "class").exists():
                _write(bridge / "class", _CLASS_BRIDGE)
        kind, index = device.key
        _write(directory / "numa_node", str(-1 if device.numa_node is None else device.numa_node))
        if kind == "gpu":
            _write(directory / "vendor", _NVIDIA)
            _write(directory / "class", _CLASS_3D)
            if cpus.get(index):
                _write(directory / "local_cpulist", str(cpus[index]))
        else:
            _write(directory / "vendor", _MELLANOX)
            _write(directory / "class", _CLASS_INFINIBAND)
            port = directory / "infiniband" / device.name
            port.mkdir(parents=True, exist_ok=True)
            (port / "device").symlink_to(os.path.relpath(directory, port))
            (infiniband / device.name).symlink_to(os.path.relpath(port, infiniband))
        (by_bus / device.bus_id).symlink_to(os.path.relpath(directory, by_bus))
    return root
