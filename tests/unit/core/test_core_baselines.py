"""Baselines: first fit, and the device plugin's best-effort policy rebuilt from its description."""

from __future__ import annotations

from core_testdata import BRIDGED, H100, TREES, WORKSTATION, topology

from gpusched.api.nodegputopology import LinkType
from gpusched.core import Gpu, Link, NodeTopology
from gpusched.core.baselines import first_fit, gpuallocator_best_effort, pair_score


def test_first_fit_takes_the_lowest_free_indices() -> None:
    assert first_fit([5, 1, 3, 2], 2) == (1, 2)
    assert first_fit([1], 2) is None


def test_pair_score_adds_nvlink_points_to_the_pcie_level() -> None:
    bridged = topology(BRIDGED)
    # NV12 bridge plus the PCIe level, assumed NODE inside a socket when the matrix hides it.
    assert pair_score(bridged, 0, 2) == 1200 + 20
    assert pair_score(bridged, 0, 1) == 10
    trees = topology(TREES)
    assert (pair_score(trees, 0, 1), pair_score(trees, 0, 2), pair_score(trees, 0, 4)) == (
        50,
        40,
        10,
    )


def test_nvswitch_pairs_score_by_pcie_only() -> None:
    h100 = topology(H100)
    assert pair_score(h100, 0, 1) == 20  # same socket: NODE
    assert pair_score(h100, 0, 4) == 10  # across sockets: SYS


def test_best_effort_finds_bridged_pairs_and_switch_trees() -> None:
    result = gpuallocator_best_effort(topology(BRIDGED), list(range(8)), 2)
    assert result is not None
    assert result.gpus == (0, 2)
    trees = gpuallocator_best_effort(topology(TREES), list(range(8)), 4)
    assert trees is not None
    assert trees.gpus in {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert not trees.padding_bug


def test_single_gpu_requests_take_the_first_available() -> None:
    result = gpuallocator_best_effort(topology(WORKSTATION), [3, 1], 1)
    assert result is not None
    assert result.gpus == (1,)


def test_padding_can_win_and_is_reported() -> None:
    # GPUs 0-1 NVLinked far from the others; 2-4 share a PCIe switch. A request for 3 of these 5:
    # the partition {0,1,pad} + {2,3,4} outscores every complete one, and its padded set wins.
    gpus = tuple(Gpu(i) for i in range(5))
    links = []
    for a in range(5):
        for b in range(a + 1, 5):
            if (a, b) == (0, 1):
                links.append(Link(a, b, LinkType.NV, 12))
            elif a >= 2:
                links.append(Link(a, b, LinkType.PIX))
            else:
                links.append(Link(a, b, LinkType.SYS))
    result = gpuallocator_best_effort(NodeTopology("n", gpus, tuple(links)), range(5), 3)
    assert result is not None
    assert result.padding_bug
    assert result.gpus == (0, 1)


def test_too_few_gpus_returns_none() -> None:
    assert gpuallocator_best_effort(topology(BRIDGED), [0, 1], 3) is None
