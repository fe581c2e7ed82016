"""Effective bandwidth of a GPU pair, from its link class and the GPUs' generation.

``nvidia-smi topo -m`` and NVML say *how* two GPUs are connected (``NV12``, ``PIX``, ``SYS``), not
how fast that is: an NVLink of an H100 carries more than one of a V100, and a PCIe hop is worth
what the GPU's PCIe generation gives it. The placement engine ranks sets by what a collective will
actually get, so it needs one number per pair. We take NCCL's calibrated per-link figures
(``src/graph/topo.h``: ``SM60_NVLINK_BW`` ... ``SM100_NVLINK_BW``, ``PCI_BW``) so our ranking agrees
with the transport NCCL will pick; the figures and their sources are tabled in docs/placement.md.

All figures are effective unidirectional GB/s per GPU pair. The hot path compares integers, so
:func:`to_units` turns them into tenths of a GB/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from gpusched.api.nodegputopology import LinkType

#: Effective x16 bandwidth per PCIe generation (NCCL's ``PCI_BW`` scaled by generation, GB/s).
PCIE_X16_GBPS: Final[dict[int, float]] = {3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}


@dataclass(frozen=True, slots=True)
class Generation:
    """What the bandwidth model needs to know about a GPU architecture."""

    name: str
    """Architecture family, e.g. ``hopper``; ``unknown`` when neither model nor capability says."""
    sm: int
    """Compute capability as NCCL writes it (``major * 10 + minor``)."""
    nvlink_gbps: float
    """Effective bandwidth of one NVLink of this generation (NCCL ``SM<sm>_NVLINK_BW``)."""
    pcie_gen: int
    """PCIe generation of the GPU's host interface."""
    known: bool = True
    """False for the documented default used when the model is not known."""


PASCAL: Final = Generation("pascal", 60, 18.0, 3)
VOLTA: Final = Generation("volta", 70, 20.0, 3)
TURING: Final = Generation("turing", 75, 20.0, 3)
AMPERE: Final = Generation("ampere", 80, 20.0, 4)
AMPERE_GA10X: Final = Generation("ampere-ga10x", 86, 12.0, 4)
ADA: Final = Generation("ada", 89, 20.0, 4)
HOPPER: Final = Generation("hopper", 90, 20.6, 5)
BLACKWELL: Final = Generation("blackwell", 100, 40.1, 5)

#: Every known generation by name.
GENERATIONS_BY_NAME: Final[dict[str, Generation]] = {
    g.name: g for g in (PASCAL, VOLTA, TURING, AMPERE, AMPERE_GA10X, ADA, HOPPER, BLACKWELL)
}

#: Used when a GPU's model and compute capability are both unknown (e.g. a bare ``topo -m`` paste):
#: NCCL's own fallback per-link figure (the sm80 one) and PCIe Gen4, the most common data-centre
#: pairing. Wrong by a constant factor at worst, and the factor is the same for every pair of the
#: node, so the ranking of sets on that node is unaffected.
UNKNOWN_GENERATION: Final = Generation("unknown", 80, 20.0, 4, known=False)

# Product-name patterns, most specific first. Only the architecture matters here, so one pattern
# per family is enough; anything unmatched falls back to UNKNOWN_GENERATION.
_MODEL_PATTERNS: Final[tuple[tuple[re.Pattern[str], Generation], ...]] = tuple(
    (re.compile(pattern, re.IGNORECASE), gen)
    for pattern, gen in (
        (r"\bG?B[123]00\b|RTX\s*50\d0|RTX\s*PRO\s*\d+\s*Blackwell", BLACKWELL),
        (r"\bG?H(100|200|800|20)\b", HOPPER),
        (r"\bL40S?\b|\bL4\b|\bL20\b|RTX\s*40\d0|RTX\s*\d000\s*Ada", ADA),
        (r"\bA(100|800|30)\b", AMPERE),
        (r"\bA(2|10G?|16|40)\b|RTX\s*A\d000|RTX\s*30\d0", AMPERE_GA10X),
        (r"\bT4\b|RTX\s*20\d0|Quadro\s*RTX|TITAN\s*RTX", TURING),
        (r"\bV100\b|TITAN\s*V\b", VOLTA),
        (r"\bP100\b", PASCAL),
    )
)


def generation_for_sm(sm: int) -> Generation:
    """Generation by compute capability, with NCCL's thresholds (sm86 is its own class)."""
    if sm >= 100:
        return BLACKWELL
    if sm >= 90:
        return HOPPER
    if sm == 86:
        return AMPERE_GA10X
    if sm >= 89:
        return ADA
    if sm >= 80:
        return AMPERE
    if sm >= 75:
        return TURING
    if sm >= 70:
        return VOLTA
    if sm >= 60:
        return PASCAL
    return UNKNOWN_GENERATION


def _parse_sm(compute_capability: str) -> int | None:
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_capability)
    if match is None:
        return None
    return int(match.group(1)) * 10 + int(match.group(2))


def generation_from_model(model: str) -> Generation | None:
    """The generation a product name belongs to, or None when no known family matches."""
    for pattern, gen in _MODEL_PATTERNS:
        if pattern.search(model):
            return gen
    return None


def generation_for(model: str | None, compute_capability: str | None = None) -> Generation:
    """Generation of a GPU: compute capability wins (NVML reports it exactly), then the model name.

    An unknown GPU gets :data:`UNKNOWN_GENERATION` rather than an error: a node must stay placeable
    even when the probe could not read the model.
    """
    if compute_capability:
        sm = _parse_sm(compute_capability)
        if sm is not None:
            gen = generation_for_sm(sm)
            if gen.known:
                return gen
    if model:
        gen_from_model = generation_from_model(model)
        if gen_from_model is not None:
            return gen_from_model
    return UNKNOWN_GENERATION


def find_model_in_text(text: str) -> str | None:
    """The first GPU family named in free text (e.g. a ``# machine:`` comment), or None.

    Returns the matched words as written, which :func:`generation_for` maps back to a generation.
    """
    best: tuple[int, str] | None = None
    for pattern, _gen in _MODEL_PATTERNS:
        match = pattern.search(text)
        if match is not None and (best is None or match.start() < best[0]):
            best = (match.start(), match.group(0))
    return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class BandwidthModel:
    """Turns a link class into effective GB/s for a pair of GPU generations.

    NCCL gives PIX and PXB the same figure and PHB/NODE the PCIe figure less the CPU's P2P overhead.
    We keep those figures but make every step of the PCIe hierarchy strictly slower than the one
    before it (``pxb_factor``, ``node_factor``): a path through more bridges shares more uplinks,
    and a strict order lets the engine prefer the shorter path when everything else is equal.
    """

    inter_cpu_gbps: float = 10.0
    """SMP interconnect between sockets; NCCL's ``SKL_QPI_BW`` (Skylake UPI), the conservative
    choice when the CPU is not known."""
    pxb_factor: float = 0.9
    """PXB relative to PIX: the pair shares at least one more switch uplink."""
    host_bridge_factor: float = 5.0 / 6.0
    """PHB relative to PIX: NCCL's ``INTEL_P2P_OVERHEAD`` (P2P through the CPU costs 6/5)."""
    node_factor: float = 0.9
    """NODE relative to PHB: one more host-bridge hop inside the socket."""
    sys_factor: float = 0.9
    """Upper bound of SYS relative to NODE, so SYS stays the slowest even on PCIe Gen3."""

    def pcie_gbps(self, level: LinkType, gen_a: Generation, gen_b: Generation) -> float:
        """Effective GB/s of a PCIe path of class ``level`` between two devices."""
        pcie = PCIE_X16_GBPS[min(gen_a.pcie_gen, gen_b.pcie_gen)]
        pix = pcie
        pxb = pix * self.pxb_factor
        phb = pix * self.host_bridge_factor
        node = phb * self.node_factor
        if level is LinkType.PIX:
            return pix
        if level is LinkType.PXB:
            return pxb
        if level is LinkType.PHB:
            return phb
        if level is LinkType.NODE:
            return node
        if level is LinkType.SYS:
            return min(self.inter_cpu_gbps, node * self.sys_factor)
        raise ValueError(f"{level} is not a PCIe level")

    def pair_gbps(
        self, link: LinkType, nvlinks: int, gen_a: Generation, gen_b: Generation
    ) -> float:
        """Effective GB/s between two GPUs joined by ``link`` (``nvlinks`` bonded links if NV).

        An NVLink bundle runs at the slower GPU's per-link rate. On NVSwitch boards ``nvlinks`` is
        the per-GPU link count ``nvidia-smi`` prints for every pair, which is what one GPU can push
        to any single peer through the switches.
        """
        if link is LinkType.NV:
            per_link = min(gen_a.nvlink_gbps, gen_b.nvlink_gbps)
            return max(nvlinks, 1) * per_link
        return self.pcie_gbps(link, gen_a, gen_b)


DEFAULT_BANDWIDTH: Final = BandwidthModel()

#: Integer bandwidth units per GB/s used on the hot path (tenths of a GB/s).
UNITS_PER_GBPS: Final = 10


def to_units(gbps: float) -> int:
    """GB/s as the integer unit the search compares (never 0 for a real link)."""
    return max(1, round(gbps * UNITS_PER_GBPS))


def from_units(units: int) -> float:
    """Integer units back to GB/s."""
    return units / UNITS_PER_GBPS
