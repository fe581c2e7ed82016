"""The job-speed model: how much slower a job runs when its GPUs are worse wired.

``slowdown(link, gpus)`` is the run time of a ``gpus``-GPU data-parallel job whose worst link is
``link``, divided by its run time inside one NVLink island. A 1-GPU job never communicates
(1.0); NVLink is the baseline (1.0). The derivation, figures and sources are in
``docs/simulator-speed-model.md``; in short:

1. Communication model: ``s(L) = 1 + c * (B_nvlink / B_L - 1)`` -- a step is compute plus an
   all-reduce that takes ``B_nvlink / B_L`` times longer over link ``L``, ``c`` being the
   all-reduce's share of the step over NVLink (no overlap). ``B_L`` are measured nccl-tests bus
   bandwidths (:data:`BANDWIDTHS_GBPS`, sources in docs/simulator-speed-model.md).
2. ``c`` is fitted to measured step times: on Pollux's AWS g4dn.12xlarge profiles (4x T4 per node,
   PCIe only, 50 Gbps network) the step-time ratio of spread placements ("11", "22", "1111",
   "13", ...) over the consolidated one ("2", "3", "4") at equal GPUs and per-GPU batch is
   ``s(network) / s(host)``: the geometric mean over the six models of each model's median.
3. ``s(network) = 1 + c * (B_nvlink / B_net - 1)`` with the g4dn network (50 Gbps).
4. Gavel's consolidated / unconsolidated V100 throughputs are a second, independent estimate of
   ``s(network)`` over a well-wired server; :func:`calibrate` reports it next to the model.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpusched.simulator.model import LINK_ORDER, Link

PLACEMENT_DIR: Final = Path("placement-slowdown")
POLLUX_DIR: Final = PLACEMENT_DIR / "pollux-aws-g4dn-t4"
GAVEL_FILE: Final = PLACEMENT_DIR / "gavel" / "simulation_throughputs.json"

#: All-reduce bus bandwidth per worst link inside a node, GB/s (nccl-tests / NCCL figures):
#: NVLink: A100 NVLink pair, 208 GB/s (NVIDIA/nccl-tests#178; below the 370-480 GB/s of an
#: H100 NVSwitch board, so conservative). PCIe switch: 4x A40 under one socket with PCIe P2P,
#: 36.6 GB/s (NVIDIA/nccl-tests#74). NUMA (host bridge): the same A100 box when the ring must
#: cross PCIe through the host, ~20 GB/s (NVIDIA/nccl-tests#178). Socket (SYS): the NUMA figure
#: scaled by NCCL's own inter-socket vs PCIe Gen3 model, SKL_QPI_BW 10 / PCI_BW 12 (nccl
#: src/graph/topo.h, as quoted in reference/gpu-topology.md).
BANDWIDTHS_GBPS: Final[Mapping[Link, float]] = {
    Link.NVLINK: 208.0,
    Link.PCIE_SWITCH: 36.6,
    Link.NUMA: 20.0,
    Link.SOCKET: 20.0 * 10.0 / 12.0,
}
#: The Pollux testbed's network: 50 Gbps Ethernet (AWS g4dn.12xlarge), in GB/s.
POLLUX_NETWORK_GBPS: Final = 50.0 / 8.0
#: The link class assumed between the GPUs of one g4dn.12xlarge (PCIe through the host bridge).
POLLUX_HOST_LINK: Final = Link.NUMA
#: Step time of a job spread over two leaf (top-of-rack) switches over the same job under one,
#: sharing the leaf-to-aggregation links with another job: 1.70 s / 1.53 s for a 64-GPU GPT-3
#: variant beside a 16-GPU BERT job (Alibaba, Crux, SIGCOMM'24, section 2.2; measured). Alibaba
#: HPN (SIGCOMM'24, section 9.1) measures 1.149x for a 2,300-GPU job over 19 segments against 3.
#: The model charges it once per switch tier crossed above the leaf: crossing the core (no
#: published measurement; a 1:1 core as in the Lingjun dataset's network) pays it twice.
CROSS_TIER_MEASURED: Final = 1.70 / 1.53
#: Pollux profiles have 4 GPUs per node: the consolidated placements are "2", "3" and "4".
POLLUX_GANGS: Final = (2, 3, 4)


class SpeedModelError(ValueError):
    """A speed model that is not monotone, or data that cannot calibrate one."""


@dataclass(frozen=True)
class SpeedModel:
    """Slowdown per worst link of a multi-GPU job, with where the numbers came from."""

    factors: Mapping[Link, float]
    """Slowdown of a job of 2+ GPUs whose worst link is the key (NVLink: 1.0)."""
    comm_intensity: float = 0.0
    """``c``: the all-reduce's share of a step over NVLink."""
    network_over_host: float = 1.0
    """Measured ``s(network) / s(host)`` on the Pollux T4 testbed."""
    gavel_network: float | None = None
    """Gavel's V100 consolidated / unconsolidated throughput (cross-check of ``s(network)``)."""
    sources: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        missing = [link for link in LINK_ORDER if link not in self.factors]
        if missing:
            raise SpeedModelError(f"no slowdown for {', '.join(missing)}")
        if self.factors[Link.NVLINK] != 1.0:
            raise SpeedModelError("NVLink is the baseline: its slowdown must be 1.0")
        previous = 1.0
        for link in LINK_ORDER:
            value = self.factors[link]
            if not value >= previous:
                raise SpeedModelError(
                    f"slowdown {value} for {link} is below {previous} for a better link"
                )
            previous = value

    def slowdown(self, link: Link, gpus: int) -> float:
        """Run time over the NVLink run time (>= 1; 1.0 for 1-GPU jobs and NVLink)."""
        if gpus <= 1:
            return 1.0
        return self.factors[link]


def fit(
    network_over_host: float,
    *,
    bandwidths: Mapping[Link, float] = BANDWIDTHS_GBPS,
    network_gbps: float = POLLUX_NETWORK_GBPS,
    host_link: Link = POLLUX_HOST_LINK,
    gavel_network: float | None = None,
    cross_tier: float = CROSS_TIER_MEASURED,
    sources: tuple[str, ...] = (),
) -> SpeedModel:
    """The model whose network-over-host ratio is the measured one (see the module docstring).

    With ``r_L = B_nvlink / B_L``: ``c = (F - 1) / ((r_net - 1) - F (r_host - 1))``; a measured
    ratio F <= 1 gives ``c = 0`` (no slowdown anywhere)."""
    nvlink = bandwidths[Link.NVLINK]
    ratio = {link: nvlink / bw for link, bw in bandwidths.items()}
    ratio[Link.NETWORK] = nvlink / network_gbps
    for link, value in ratio.items():
        if value < 1.0:
            raise SpeedModelError(f"bandwidth of {link} is above NVLink's")
    big_f = network_over_host
    room = (ratio[Link.NETWORK] - 1.0) - big_f * (ratio[host_link] - 1.0)
    if big_f <= 1.0:
        c = 0.0
    elif room <= 0:
        raise SpeedModelError(
            f"a network/host ratio of {big_f:.3f} cannot come from these bandwidths "
            f"(at most {(ratio[Link.NETWORK] - 1.0) / (ratio[host_link] - 1.0):.3f})"
        )
    else:
        c = (big_f - 1.0) / room
    factors = {link: round(1.0 + c * (ratio[link] - 1.0), 4) for link in ratio}
    # Above the leaf: the network's factor times the measured cost of each tier crossed.
    network = 1.0 + c * (ratio[Link.NETWORK] - 1.0)
    tier = cross_tier if c > 0 else 1.0  # communication that costs nothing costs nothing
    factors[Link.CROSS_LEAF] = round(network * tier, 4)
    factors[Link.CROSS_AGGREGATION] = round(network * tier**2, 4)
    return SpeedModel(
        factors=factors,
        comm_intensity=round(c, 5),
        network_over_host=round(big_f, 4),
        gavel_network=None if gavel_network is None else round(gavel_network, 4),
        sources=sources,
    )


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pollux_network_over_host(traces_dir: str | Path) -> dict[str, float]:
    """Per model: median step-time ratio of spread over consolidated placements at equal GPUs
    (2, 3 or 4) and equal per-GPU batch size."""
    folder = Path(traces_dir) / POLLUX_DIR
    files = sorted(folder.glob("*-placements.csv"))
    if not files:
        raise SpeedModelError(f"{folder}: no *-placements.csv files")
    out: dict[str, float] = {}
    for path in files:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        step = {(r["placement"], int(r["local_bsz"])): float(r["step_time"]) for r in rows}
        ratios = [
            time / step[(str(gpus), batch)]
            for (placement, batch), time in step.items()
            if len(placement) > 1
            and (gpus := sum(int(d) for d in placement)) in POLLUX_GANGS
            and (str(gpus), batch) in step
        ]
        if not ratios:
            raise SpeedModelError(f"{path}: no spread placement with a consolidated twin")
        out[path.name.removesuffix("-placements.csv")] = statistics.median(ratios)
    return out


_GAVEL_KEY = re.compile(r"^\('(?P<job>.*)', (?P<scale>\d+)\)$")


def gavel_network(traces_dir: str | Path, gpu: str = "v100") -> float:
    """Geometric mean over Gavel's job types and scale factors (2, 4, 8) of consolidated over
    unconsolidated throughput on ``gpu`` (steps/s alone, without co-location)."""
    path = Path(traces_dir) / GAVEL_FILE
    data = json.loads(path.read_text())
    together, apart = data[gpu], data[f"{gpu}_unconsolidated"]
    ratios = []
    for key, runs in together.items():
        match = _GAVEL_KEY.match(key)
        if match is None or int(match["scale"]) < 2 or key not in apart:
            continue
        ratios.append(float(runs["null"]) / float(apart[key]["null"]))
    if not ratios:
        raise SpeedModelError(f"{path}: no multi-GPU job type measured both ways on {gpu}")
    return _geomean(ratios)


def calibrate(traces_dir: str | Path) -> SpeedModel:
    """Recompute the model from the measured files under ``traces_dir``."""
    per_model = pollux_network_over_host(traces_dir)
    return fit(
        _geomean(list(per_model.values())),
        gavel_network=gavel_network(traces_dir),
        sources=SOURCES,
    )


SOURCES: Final = (
    "Pollux placement profiles, AWS g4dn.12xlarge 4x T4 PCIe, 50 Gbps "
    "(petuum/adaptdl osdi21-artifact simulator/traces/*/placements.csv)",
    "Gavel simulation_throughputs.json (stanford-futuredata/gavel scheduler/)",
    "nccl-tests all_reduce_perf bus bandwidths: NVIDIA/nccl-tests#178, #74; "
    "NCCL topo.h SKL_QPI_BW / PCI_BW",
    "Crux (Cao et al., SIGCOMM'24) section 2.2: a job spread over two ToRs, 1.70 s against "
    "1.53 s per iteration",
)

#: The committed model: :func:`calibrate` on the published traces reproduces it (unit-tested).
DEFAULT: Final = SpeedModel(
    factors={
        Link.NVLINK: 1.0,
        Link.PCIE_SWITCH: 1.1133,
        Link.NUMA: 1.2275,
        Link.SOCKET: 1.2778,
        Link.NETWORK: 1.7812,
        Link.CROSS_LEAF: 1.9791,
        Link.CROSS_AGGREGATION: 2.199,
    },
    comm_intensity=0.0242,
    network_over_host=1.4511,
    gavel_network=2.2566,
    sources=SOURCES,
)


def slowdown(link: Link, gpus: int) -> float:
    """:meth:`SpeedModel.slowdown` of the :data:`DEFAULT` model."""
    return DEFAULT.slowdown(link, gpus)
