"""PCI addresses and the PCIe distance rule the probe applies to sysfs paths."""

from __future__ import annotations

import pytest

from gpusched.api.nodegputopology import LinkType
from gpusched.device_probe.pcie import (
    PciAddressError,
    PciPath,
    cpulist_from_mask,
    cpus_from_list,
    level_from_nvml,
    mask_from_cpulist,
    natural_key,
    normalize_bus_id,
    nvml_bus_id,
    pcie_distance,
)


@pytest.mark.parametrize(
    ("raw", "sysfs"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:B7:00.0", "0000:b7:00.0"),
        ("0001:3a:00.1", "0001:3a:00.1"),
        ("18:00.0", "0000:18:00.0"),
    ],
)
def test_bus_ids_are_normalised_to_the_sysfs_form(raw: str, sysfs: str) -> None:
    assert normalize_bus_id(raw) == sysfs
    assert normalize_bus_id(nvml_bus_id(sysfs)) == sysfs


@pytest.mark.parametrize("bad", ["", "GPU0", "0000:18:00", "100000000:18:00.0"])
def test_malformed_bus_ids_are_refused(bad: str) -> None:
    with pytest.raises(PciAddressError):
        normalize_bus_id(bad)


def _path(root: str, *chain: str, numa: int | None = 0) -> PciPath:
    return PciPath(root, tuple(chain[:-1]), chain[-1], numa)


SWITCH = ("0000:00:01.0", "0000:01:00.0")


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        # Two ports of one switch.
        (
            _path("pci0000:00", *SWITCH, "0000:02:00.0", "0000:03:00.0"),
            _path("pci0000:00", *SWITCH, "0000:02:01.0", "0000:04:00.0"),
            LinkType.PIX,
        ),
        # Two functions of one device on a root port.
        (
            _path("pci0000:00", "0000:00:02.0", "0000:05:00.0"),
            _path("pci0000:00", "0000:00:02.0", "0000:05:00.1"),
            LinkType.PIX,
        ),
        # Below two different switches under a common one.
        (
            _path(
                "pci0000:00",
                *SWITCH,
                "0000:02:00.0",
                "0000:06:00.0",
                "0000:07:00.0",
                "0000:08:00.0",
            ),
            _path(
                "pci0000:00",
                *SWITCH,
                "0000:02:01.0",
                "0000:09:00.0",
                "0000:0a:00.0",
                "0000:0b:00.0",
            ),
            LinkType.PXB,
        ),
        # Different root ports of one host bridge.
        (
            _path("pci0000:00", "0000:00:01.0", "0000:02:00.0"),
            _path("pci0000:00", "0000:00:03.0", "0000:0c:00.0"),
            LinkType.PHB,
        ),
        # Different host bridges, same NUMA node / different / unknown.
        (
            _path("pci0000:00", "0000:00:01.0", "0000:02:00.0"),
            _path("pci0000:80", "0000:80:01.0", "0000:81:00.0"),
            LinkType.NODE,
        ),
        (
            _path("pci0000:00", "0000:00:01.0", "0000:02:00.0"),
            _path("pci0000:80", "0000:80:01.0", "0000:81:00.0", numa=1),
            LinkType.SYS,
        ),
        (
            _path("pci0000:00", "0000:00:01.0", "0000:02:00.0", numa=None),
            _path("pci0000:80", "0000:80:01.0", "0000:81:00.0", numa=None),
            LinkType.SYS,
        ),
    ],
)
def test_pcie_distance_follows_the_topo_legend(a: PciPath, b: PciPath, level: LinkType) -> None:
    assert pcie_distance(a, b) is level
    assert pcie_distance(b, a) is level


def test_a_sysfs_path_is_parsed_from_the_root_complex_down() -> None:
    path = PciPath.from_sysfs_path(
        "/host/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:08.0/0000:1b:00.0", 0
    )
    assert path.root == "pci0000:17"
    assert path.bridges == ("0000:17:01.0", "0000:18:00.0", "0000:19:08.0")
    assert path.device == "0000:1b:00.0"
    with pytest.raises(PciAddressError):
        PciPath.from_sysfs_path("/sys/devices/platform/serial8250", None)


@pytest.mark.parametrize(
    ("value", "level"),
    [
        (0, LinkType.PIX),
        (10, LinkType.PIX),
        (20, LinkType.PXB),
        (30, LinkType.PHB),
        (40, LinkType.NODE),
        (50, LinkType.SYS),
        (77, LinkType.SYS),
    ],
)
def test_nvml_topology_levels_map_to_link_classes(value: int, level: LinkType) -> None:
    assert level_from_nvml(value) is level


def test_cpu_masks_and_lists_convert_both_ways() -> None:
    assert cpulist_from_mask([0x3, 0x1]) == "0-1,64"
    assert cpulist_from_mask([0, 0]) == ""
    assert cpus_from_list("0-2,5") == [0, 1, 2, 5]
    mask = mask_from_cpulist("0-47,96-143", 4)
    assert cpulist_from_mask(mask) == "0-47,96-143"


def test_nic_names_sort_naturally() -> None:
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_1"], key=natural_key) == [
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
    ]
