"""The job-speed model: never faster on a worse link, and reproducible from the measured data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.simulator.model import LINK_ORDER, Link
from gpusched.simulator.speed import (
    BANDWIDTHS_GBPS,
    DEFAULT,
    SpeedModel,
    SpeedModelError,
    calibrate,
    fit,
    slowdown,
)

links = st.sampled_from(LINK_ORDER)
gpus = st.integers(min_value=0, max_value=1024)


@given(links, links, gpus)
def test_a_worse_link_is_never_faster(a: Link, b: Link, n: int) -> None:
    if LINK_ORDER.index(a) <= LINK_ORDER.index(b):
        assert 1.0 <= slowdown(a, n) <= slowdown(b, n)


@given(links, st.integers(min_value=0, max_value=1))
def test_single_gpu_jobs_never_slow_down(link: Link, n: int) -> None:
    assert slowdown(link, n) == 1.0


def test_nvlink_is_the_baseline_and_spread_costs() -> None:
    assert slowdown(Link.NVLINK, 8) == 1.0
    assert slowdown(Link.PCIE_SWITCH, 2) > 1.0
    assert slowdown(Link.NETWORK, 16) > slowdown(Link.SOCKET, 16)


@given(
    ratio=st.floats(min_value=0.5, max_value=3.3),
    bandwidths=st.lists(st.floats(min_value=1.0, max_value=500.0), min_size=4, max_size=4),
    network=st.floats(min_value=0.1, max_value=0.9),
    a=links,
    b=links,
    n=gpus,
)
def test_fitted_models_are_monotone(
    *, ratio: float, bandwidths: list[float], network: float, a: Link, b: Link, n: int
) -> None:
    ordered = sorted(bandwidths, reverse=True)
    table = dict(zip(LINK_ORDER[:4], ordered, strict=True))
    try:
        model = fit(ratio, bandwidths=table, network_gbps=min(ordered) * network)
    except SpeedModelError:
        return  # the ratio cannot come from these bandwidths
    if LINK_ORDER.index(a) <= LINK_ORDER.index(b):
        assert 1.0 <= model.slowdown(a, n) <= model.slowdown(b, n)


def test_a_non_monotone_model_is_refused() -> None:
    factors = dict(DEFAULT.factors)
    factors[Link.SOCKET] = factors[Link.NUMA] - 0.01
    with pytest.raises(SpeedModelError, match="below"):
        SpeedModel(factors=factors)
    with pytest.raises(SpeedModelError, match="cannot come from"):
        fit(10.0)


def test_fit_reproduces_the_measured_network_over_host_ratio() -> None:
    model = fit(1.5)
    assert model.factors[Link.NETWORK] / model.factors[Link.NUMA] == pytest.approx(1.5, rel=1e-3)
    assert fit(0.9).factors == dict.fromkeys(LINK_ORDER, 1.0)
    assert list(BANDWIDTHS_GBPS) == list(LINK_ORDER[:4])


def test_calibration_on_the_published_data_reproduces_the_committed_model(
    traces_dir: Path,
) -> None:
    if not (traces_dir / "placement-slowdown").is_dir():
        pytest.skip(f"no placement-slowdown data under {traces_dir}")
    model = calibrate(traces_dir)
    assert dataclasses.asdict(model) == dataclasses.asdict(DEFAULT)
