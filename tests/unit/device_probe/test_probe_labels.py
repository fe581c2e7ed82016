"""Node labels from a topology: our own keys, GFD-compatible values, GFD's keys left to GFD."""

from __future__ import annotations

from dataclasses import replace

import pytest
from probe_testdata import A100, BRIDGED, H100, TREES, WORKSTATION

from gpusched.api import keys
from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core import NodeTopology, Policy, parse_topo_matrix, place, prepare
from gpusched.core.labels import (
    GFD_KEYS,
    gfd_labels,
    gfd_managed_keys,
    gpu_family,
    gpusched_labels,
    node_labels,
    sanitize_label_value,
)
from gpusched.dev.bench.placement import DGX1_LIKE_MATRIX
from gpusched.dev.localcluster.topologies import fixture_path


def _matrix(name: str, model: str | None = None) -> NodeTopology:
    return parse_topo_matrix(fixture_path(name).read_text(), node_name=name, gpu_model=model)


@pytest.mark.parametrize(
    ("fixture", "islands", "largest", "nvswitch", "numa"),
    [
        (H100, "1", "8", "true", "2"),
        (A100, "1", "8", "true", "2"),
        (BRIDGED, "4", "2", "false", "2"),
        (TREES, "8", "1", "false", None),
        (WORKSTATION, "3", "2", "false", "2"),
    ],
)
def test_wiring_labels_per_fixture(
    fixture: str, islands: str, largest: str, nvswitch: str, numa: str | None
) -> None:
    topology = _matrix(fixture)
    labels = gpusched_labels(topology)
    assert labels[keys.LABEL_NVLINK_ISLANDS] == islands
    assert labels[keys.LABEL_NVLINK_LARGEST_ISLAND] == largest
    assert labels[keys.LABEL_NVSWITCH] == nvswitch
    assert labels.get(keys.LABEL_NUMA_NODES) == numa
    assert labels[keys.LABEL_TOPOLOGY_HASH] == topology.wiring_hash
    assert labels[keys.LABEL_GPU_COUNT] == str(len(topology.gpus))
    assert labels[keys.LABEL_PROBED] == "true"


def test_largest_island_label_is_the_largest_set_with_nvlink_between_every_pair() -> None:
    # DGX-1's hybrid cube mesh joins all eight GPUs into one island, but no five of them are
    # NVLinked pairwise: an nvlink-scoped replica gets at most four.
    topology = parse_topo_matrix(DGX1_LIKE_MATRIX)
    labels = gpusched_labels(topology)
    assert labels[keys.LABEL_NVLINK_ISLANDS] == "1"
    assert labels[keys.LABEL_NVLINK_LARGEST_ISLAND] == "4"
    nvlink = Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED)
    assert place(prepare(topology), 4, nvlink).ok
    assert not place(prepare(topology), 5, nvlink).ok


def test_healthy_count_follows_health_and_wiring_labels_do_not() -> None:
    topology = _matrix(H100, "NVIDIA H100 80GB HBM3")
    sick = topology.with_health(
        {1: GpuHealthState.UNHEALTHY, 2: GpuHealthState.DEGRADED, 3: GpuHealthState.UNSCHEDULABLE}
    )
    before, after = gpusched_labels(topology), gpusched_labels(sick)
    assert (before[keys.LABEL_GPU_HEALTHY], after[keys.LABEL_GPU_HEALTHY]) == ("8", "6")
    assert {k: v for k, v in before.items() if k != keys.LABEL_GPU_HEALTHY} == {
        k: v for k, v in after.items() if k != keys.LABEL_GPU_HEALTHY
    }


def test_a_node_without_gpus_says_so() -> None:
    empty = NodeTopology(node_name="n", gpus=())
    assert gpusched_labels(empty) == {
        keys.LABEL_PROBED: "true",
        keys.LABEL_GPU_COUNT: "0",
        keys.LABEL_GPU_HEALTHY: "0",
    }
    assert gfd_labels(empty) == {}


def test_gfd_values_use_gfds_formats() -> None:
    topology = replace(
        _matrix(H100, "NVIDIA H100 80GB HBM3"),
        driver_version="550.107.02",
        cuda_driver_version="12.4",
        clique="7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1",
    )
    topology = replace(
        topology,
        gpus=tuple(replace(g, memory_mib=81559, compute_capability="9.0") for g in topology.gpus),
    )
    assert gfd_labels(topology, mig_capable=True) == {
        keys.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3",
        keys.GFD_COUNT: "8",
        keys.GFD_MEMORY: "81559",
        keys.GFD_FAMILY: "hopper",
        keys.GFD_COMPUTE_MAJOR: "9",
        keys.GFD_COMPUTE_MINOR: "0",
        keys.GFD_DRIVER_FULL: "550.107.02",
        keys.GFD_DRIVER_MAJOR: "550",
        keys.GFD_DRIVER_MINOR: "107",
        keys.GFD_DRIVER_REV: "02",
        keys.GFD_RUNTIME_MAJOR: "12",
        keys.GFD_RUNTIME_MINOR: "4",
        keys.GFD_RUNTIME_FULL: "12.4",
        keys.GFD_MIG_CAPABLE: "true",
        keys.GFD_CLIQUE: "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1",
    }


def test_unknown_values_are_left_out_rather_than_guessed() -> None:
    labels = gfd_labels(_matrix(TREES))
    assert labels == {keys.GFD_COUNT: "8"}


@pytest.mark.parametrize(
    ("capability", "family"),
    [
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("12.0", "blackwell"),
        ("4.0", "undefined"),
        ("x", None),
        (None, None),
    ],
)
def test_gpu_family_follows_gfd(capability: str | None, family: str | None) -> None:
    assert gpu_family(capability) == family


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("Tesla V100 (SXM2) 16GB", "Tesla-V100-SXM2-16GB"),
        ("  -odd- ", "odd"),
        ("x" * 80, "x" * 63),
    ],
)
def test_free_text_becomes_a_valid_label_value(text: str, value: str) -> None:
    assert sanitize_label_value(text) == value


def test_gfd_keys_are_left_to_gfd_when_it_runs_or_holds_the_product() -> None:
    assert gfd_managed_keys({keys.GFD_TIMESTAMP: "1724632719"}, []) == GFD_KEYS
    assert gfd_managed_keys({}, [keys.GFD_PRODUCT]) == GFD_KEYS
    assert gfd_managed_keys({}, [keys.GFD_MEMORY, "team"]) == {keys.GFD_MEMORY}
    assert gfd_managed_keys({}, []) == frozenset()


def test_node_labels_skip_what_is_left_alone() -> None:
    topology = _matrix(H100, "NVIDIA H100 80GB HBM3")
    everything = node_labels(topology)
    assert everything[keys.GFD_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    polite = node_labels(topology, leave_alone=GFD_KEYS)
    assert not any(k.startswith(keys.GFD_PREFIX) for k in polite)
    assert polite[keys.LABEL_GPU_MODEL] == "NVIDIA-H100-80GB-HBM3"
