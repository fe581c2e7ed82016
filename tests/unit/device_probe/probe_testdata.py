"""Shared helpers of the probe's unit tests: simulated nodes from the real ``topo -m`` fixtures
and the production backend over them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gpusched.dev.fakenvml import FakeNode
from gpusched.device_probe.nvml_backend import NvmlBackend
from gpusched.device_probe.sysfs import Sysfs

H100 = "hgx-h100-sxm-8gpu-8nic"
A100 = "hgx-a100-sxm4-80gb-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
TREES = "pcie-8gpu-pix-pxb-two-switch-trees"
RTX4090 = "pcie-8x-rtx4090-2socket-allsys-2nic"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
FIXTURES = (H100, A100, BRIDGED, TREES, RTX4090, WORKSTATION)

MakeNode = Callable[..., FakeNode]


def backend_for(fake: FakeNode) -> NvmlBackend:
    """The production backend over a fake node."""
    return NvmlBackend(fake.nvml, Sysfs(fake.sysfs_root), source=fake.topology.source)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
