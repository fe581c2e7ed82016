"""Comparisons that decide whether the probe writes: labels, ownership, status, taints, and the
merging of a GPU that cannot be read."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from probe_testdata import H100

from gpusched.api import keys
from gpusched.core import Gpu, NodeTopology, parse_topo_matrix
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.device_probe.state import (
    label_ownership,
    labels_in_place,
    merge_unreadable,
    nvml_condition,
    significant_status,
    taints_with,
)

MANAGER = keys.FIELD_MANAGER_PROBE
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _entry(manager: str, labels: list[str], operation: str = "Apply", sub: str = "") -> dict:
    fields = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}}
    entry = {"manager": manager, "operation": operation, "fieldsV1": fields}
    if sub:
        entry["subresource"] = sub
    return entry


def test_label_ownership_is_read_from_managed_fields() -> None:
    owners = label_ownership(
        [
            _entry(MANAGER, ["gpusched.io/gpu.count", "nvidia.com/gpu.count"]),
            _entry("gpu-feature-discovery", ["nvidia.com/gpu.product"], "Update"),
            _entry(MANAGER, ["ignored"], sub="status"),
            _entry(MANAGER, ["old-update"], "Update"),
        ],
        MANAGER,
    )
    assert owners.ours == {"gpusched.io/gpu.count", "nvidia.com/gpu.count"}
    assert owners.foreign == {"nvidia.com/gpu.product", "old-update"}


def test_labels_are_in_place_only_when_values_match_and_nothing_stale_is_ours() -> None:
    current = {"a": "1", "b": "2", "other": "x"}
    assert labels_in_place({"a": "1", "b": "2"}, current, owned={"a", "b"})
    assert not labels_in_place({"a": "1", "b": "3"}, current, owned={"a", "b"})
    assert not labels_in_place({"a": "1"}, current, owned={"a", "b"})  # b must be removed
    assert labels_in_place({"a": "1"}, current, owned={"a", "gone"})


def test_taints_are_added_and_removed_without_touching_others() -> None:
    others = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    added = taints_with(others, wanted=True)
    assert added == [
        *others,
        {"key": keys.TAINT_NO_HEALTHY_GPU, "value": "true", "effect": "NoSchedule"},
    ]
    assert taints_with(added, wanted=True) is None
    assert taints_with(added, wanted=False) == others
    assert taints_with(others, wanted=False) is None


def test_temperature_power_and_observation_time_alone_are_not_a_change() -> None:
    a = {
        "observedAt": "2026-11-21T12:00:00Z",
        "gpus": [{"index": 0, "state": "Healthy", "temperatureC": 40, "powerW": 70}],
        "healthyGpus": 1,
    }
    b = {
        "observedAt": "2026-11-21T12:05:00Z",
        "gpus": [{"index": 0, "state": "Healthy", "temperatureC": 44, "powerW": 95.5}],
        "healthyGpus": 1,
    }
    assert significant_status(a) == significant_status(b)
    c = {**b, "gpus": [{"index": 0, "state": "Degraded", "temperatureC": 44}]}
    assert significant_status(a) != significant_status(c)


def test_the_condition_time_moves_only_with_its_status() -> None:
    ready = nvml_condition(True, "NVML initialised", T0)
    later = nvml_condition(True, "NVML initialised", T0.replace(hour=13), [ready])
    assert later.last_transition_time == T0
    failed = nvml_condition(False, "Driver Not Loaded", T0.replace(hour=14), [later])
    assert failed.last_transition_time == T0.replace(hour=14)


def test_an_unreadable_gpu_keeps_what_was_known_of_it() -> None:
    known = parse_topo_matrix(fixture_path(H100).read_text(), node_name="n")
    known = replace(known, gpus=tuple(replace(g, uuid=f"GPU-{g.index}") for g in known.gpus))
    # The reading lost GPU 2: no identity, no links to it.
    reading = replace(
        known,
        gpus=tuple(Gpu(index=g.index) if g.index == 2 else g for g in known.gpus),
        links=tuple(lk for lk in known.links if 2 not in (lk.a, lk.b)),
        nic_links=tuple(nl for nl in known.nic_links if nl.gpu != 2),
    )
    merged = merge_unreadable(reading, {2}, known)
    assert merged.gpu(2).uuid == "GPU-2"
    assert merged.link(1, 2) == known.link(1, 2)
    assert merged.nic_link(2, 2) == known.nic_link(2, 2)
    assert merged.wiring_hash == known.wiring_hash
    # Another GPU now at index 2 (different UUID): nothing is carried over.
    swapped = replace(
        reading,
        gpus=tuple(Gpu(index=2, uuid="GPU-new") if g.index == 2 else g for g in reading.gpus),
    )
    assert merge_unreadable(swapped, {2}, known).gpu(2).uuid == "GPU-new"
    assert merge_unreadable(reading, {2}, None) is reading
    assert isinstance(merged, NodeTopology)
