"""The job-speed model: a multi-GPU job placed on a worse-wired set runs longer, by a factor
keyed on the worst link its GPUs cross. Derivation and sources: docs/simulator.md.

The factors come from two sets of measurements shipped with published simulators
(``placement-slowdown/`` of the traces):

* **Gavel** (V100, ``simulation_throughputs.json``): throughput with all workers in one NVLink
  server over throughput with the workers on different servers, for every job type at 2, 4 and
  8 workers. The median is the cost of the network against NVLink: :attr:`SpeedModel.network`.
* **Pollux** (T4, PCIe-only nodes, 50 Gb/s network): step time of a spread placement (``"22"``,
  ``"1111"``, ...) over the consolidated one (``"4"``) at the same per-GPU batch, for six models.
  The median is the cost of the network against PCIe; the network's cost against NVLink divided
  by it is the cost of PCIe against NVLink: :attr:`SpeedModel.pcie`.

No profile separates a PCIe switch from a host bridge, so ``pcie-switch`` and ``numa`` share the
PCIe factor. Crossing sockets costs the PCIe factor times 35/28 (nccl-tests bus bandwidth of
4 vs 8 RTX 5090 on PCIe, NVIDIA/nccl#1639), capped at the network's factor. A one-GPU job never
slows down. The model is deliberately simple and on the communication-heavy side (V100-class
GPUs gain the most from NVLink); ``--speed-model none`` replays without it.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpusched.simulator.model import Link

#: nccl-tests bus bandwidth on PCIe: 4 GPUs on one socket vs 8 across two (GB/s).
SAME_SOCKET_BUSBW: Final = 35.0
CROSS_SOCKET_BUSBW: Final = 28.0


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """Slowdown factors of multi-GPU jobs by worst link (1.0 = on NVLink)."""

    pcie: float
    network: float
    gavel_samples: int = 0
    pollux_samples: int = 0

    @property
    def socket(self) -> float:
        return min(self.network, self.pcie * SAME_SOCKET_BUSBW / CROSS_SOCKET_BUSBW)

    def factor(self, link: Link) -> float:
        """The slowdown of a multi-GPU job whose worst link is ``link``."""
        if link is Link.NVLINK:
            return 1.0
        if link in (Link.PCIE_SWITCH, Link.NUMA):
            return self.pcie
        if link is Link.SOCKET:
            return self.socket
        return self.network

    def __call__(self, link: Link, gpus: int) -> float:
        return 1.0 if gpus <= 1 else self.factor(link)

    def describe(self) -> dict[str, float]:
        return {link.value: round(self.factor(link), 3) for link in Link}


#: What :func:`calibrate` computes from the shipped measurements (kept here so a replay does not
#: need them; a test recomputes it).
DEFAULT: Final = SpeedModel(pcie=2.098, network=2.355, gavel_samples=57, pollux_samples=1833)


def calibrate(slowdown_dir: Path) -> SpeedModel:
    """Recompute the factors from ``placement-slowdown/`` (see the module docstring)."""
    throughputs: Any = json.loads(
        (slowdown_dir / "gavel" / "simulation_throughputs.json").read_text()
    )
    gavel: list[float] = []
    together, apart = throughputs["v100"], throughputs["v100_unconsolidated"]
    for key, value in together.items():
        other = apart.get(key)
        if not isinstance(value, dict) or not isinstance(other, dict):
            continue
        workers = int(key.rsplit(",", 1)[1].strip(" )"))
        if workers > 1:
            gavel.append(value["null"] / other["null"])
    pollux: list[float] = []
    for path in sorted((slowdown_dir / "pollux-aws-g4dn-t4").glob("*-placements.csv")):
        steps: dict[tuple[str, str], float] = {}
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                steps[(row["placement"], row["local_bsz"])] = float(row["step_time"])
        for (placement, batch), step in steps.items():
            gpus = sum(int(c) for c in placement)
            consolidated = steps.get((str(gpus), batch))
            if len(placement) > 1 and consolidated:
                pollux.append(step / consolidated)
    network = statistics.median(gavel)
    pcie = network / statistics.median(pollux)
    return SpeedModel(round(pcie, 3), round(network, 3), len(gavel), len(pollux))
