"""Bandwidth model: generations by model or capability, and the order of link classes."""

from __future__ import annotations

import pytest

from gpusched.api.nodegputopology import LinkType
from gpusched.core.bandwidth import (
    AMPERE,
    AMPERE_GA10X,
    BLACKWELL,
    DEFAULT_BANDWIDTH,
    GENERATIONS_BY_NAME,
    HOPPER,
    UNKNOWN_GENERATION,
    VOLTA,
    Generation,
    find_model_in_text,
    generation_for,
    to_units,
)

PCIE_ORDER = (LinkType.PIX, LinkType.PXB, LinkType.PHB, LinkType.NODE, LinkType.SYS)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", HOPPER),
        ("NVIDIA H200", HOPPER),
        ("NVIDIA A100-SXM4-80GB", AMPERE),
        ("NVIDIA A100 80GB PCIe", AMPERE),
        ("NVIDIA A40", AMPERE_GA10X),
        ("NVIDIA GeForce RTX 3090", AMPERE_GA10X),
        ("NVIDIA B200", BLACKWELL),
        ("Tesla V100-SXM2-32GB", VOLTA),
    ],
)
def test_generation_is_inferred_from_the_product_name(model: str, expected: Generation) -> None:
    assert generation_for(model) == expected


def test_compute_capability_wins_over_the_model_name() -> None:
    assert generation_for("NVIDIA A100", "9.0") == HOPPER


def test_unknown_model_falls_back_to_the_documented_default() -> None:
    gen = generation_for(None)
    assert gen is UNKNOWN_GENERATION
    assert not gen.known
    assert gen.nvlink_gbps == 20.0
    assert gen.pcie_gen == 4
    assert generation_for("Mystery Accelerator 9000") is UNKNOWN_GENERATION


@pytest.mark.parametrize("gen", list(GENERATIONS_BY_NAME.values()), ids=lambda g: g.name)
def test_pcie_levels_are_strictly_ordered_and_below_a_four_link_nvlink_bond(
    gen: Generation,
) -> None:
    figures = [DEFAULT_BANDWIDTH.pair_gbps(level, 0, gen, gen) for level in PCIE_ORDER]
    assert figures == sorted(figures, reverse=True)
    assert len(set(figures)) == len(figures)
    assert DEFAULT_BANDWIDTH.pair_gbps(LinkType.NV, 4, gen, gen) > figures[0]


def test_nvlink_bandwidth_scales_with_links_and_generation() -> None:
    h100 = DEFAULT_BANDWIDTH.pair_gbps(LinkType.NV, 18, HOPPER, HOPPER)
    a100 = DEFAULT_BANDWIDTH.pair_gbps(LinkType.NV, 12, AMPERE, AMPERE)
    assert h100 == pytest.approx(18 * 20.6)
    assert a100 == pytest.approx(12 * 20.0)
    assert DEFAULT_BANDWIDTH.pair_gbps(LinkType.NV, 6, AMPERE, AMPERE) == pytest.approx(a100 / 2)


def test_mixed_generations_run_at_the_slower_gpu() -> None:
    mixed = DEFAULT_BANDWIDTH.pair_gbps(LinkType.NV, 4, HOPPER, VOLTA)
    assert mixed == pytest.approx(4 * 20.0)
    assert DEFAULT_BANDWIDTH.pcie_gbps(LinkType.PIX, HOPPER, VOLTA) == 12.0


def test_sys_is_capped_by_the_inter_socket_link() -> None:
    assert DEFAULT_BANDWIDTH.pcie_gbps(LinkType.SYS, HOPPER, HOPPER) == 10.0


def test_units_keep_tenths_and_never_reach_zero() -> None:
    assert to_units(370.8) == 3708
    assert to_units(0.001) == 1


def test_model_is_found_in_a_machine_comment() -> None:
    text = "# machine: HGX/DGX-class 8x NVIDIA H100 80GB HBM3 (NV18 via NVSwitch), 2 NUMA nodes"
    found = find_model_in_text(text)
    assert found is not None
    assert generation_for(found) == HOPPER
    assert find_model_in_text("# machine: 8 PCIe GPUs, model not stated") is None
