"""A Node update wakes the admission loop only when it changes what admission reads of the node:
kubelets write their Node's status every few minutes with nothing new (heartbeat times, images,
volumes in use), and on a large cluster each of those would otherwise start a cycle over every
queued job."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpusched.api import keys
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store


def _node() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-1",
            "resourceVersion": "100",
            "labels": {keys.GFD_PRODUCT: "H100", "rack": "r1"},
        },
        "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {keys.GPU_RESOURCE: "8", "cpu": "96"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "t0"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"},
            ],
            "images": [{"names": ["a"], "sizeBytes": 1}],
        },
    }


def _heartbeat(node: dict[str, Any]) -> None:
    node["metadata"]["resourceVersion"] = "101"
    for condition in node["status"]["conditions"]:
        condition["lastHeartbeatTime"] = "t1"
    node["status"]["images"].append({"names": ["b"], "sizeBytes": 2})
    node["status"]["volumesInUse"] = ["pvc-1"]
    node["status"]["allocatable"]["cpu"] = "95"
    node["metadata"].setdefault("annotations", {})["node.alpha.kubernetes.io/ttl"] = "0"


def _label(node: dict[str, Any]) -> None:
    node["metadata"]["labels"]["rack"] = "r2"


def _cordon(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True


def _taint(node: dict[str, Any]) -> None:
    node["spec"]["taints"][0]["effect"] = "NoExecute"


def _gpus(node: dict[str, Any]) -> None:
    node["status"]["allocatable"][keys.GPU_RESOURCE] = "0"


def _not_ready(node: dict[str, Any]) -> None:
    node["status"]["conditions"][1]["status"] = "False"


def _store_with_node() -> Store:
    store = Store()
    store.replace_nodes([_node()])
    store.changed.clear()
    return store


def _updated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    node = copy.deepcopy(_node())
    change(node)
    return node


def test_a_status_heartbeat_is_kept_without_waking_a_cycle() -> None:
    store = _store_with_node()
    changes = store.changes
    update = _updated(_heartbeat)
    store.upsert_node(update)
    assert store.nodes["gpu-1"] is update
    assert not store.changed.is_set()
    assert store.changes == changes


@pytest.mark.parametrize("change", [_label, _cordon, _taint, _gpus, _not_ready])
def test_a_change_admission_reads_wakes_a_cycle(change: Callable[[dict[str, Any]], None]) -> None:
    store = _store_with_node()
    store.upsert_node(_updated(change))
    assert store.changed.is_set()


def test_a_new_node_wakes_a_cycle() -> None:
    store = _store_with_node()
    other = _node()
    other["metadata"]["name"] = "gpu-2"
    store.upsert_node(other)
    assert store.changed.is_set()


@pytest.mark.parametrize("change", [_label, _cordon, _taint, _gpus, _not_ready])
def test_what_wakes_a_cycle_is_what_changes_the_nodes_admission_sees(
    change: Callable[[dict[str, Any]], None],
) -> None:
    """Worked out from the reader itself: a heartbeat leaves its nodes and down labels as they
    were, each change above moves them."""
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", "gpu-1")
    topologies = {
        "gpu-1": {
            "metadata": {"name": "gpu-1", "resourceVersion": "1"},
            "spec": spec.to_k8s(),
            "status": status.to_k8s(),
        }
    }

    def seen(node: dict[str, Any]) -> tuple[object, ...]:
        """With its NodeGpuTopology and without one (a count-only node)."""
        reader = NodeReader()
        return tuple(
            (reader.nodes([node], topos, {}), reader.down_labels([node], topos))
            for topos in (topologies, {})
        )

    assert seen(_updated(_heartbeat)) == seen(_node())
    assert seen(_updated(change)) != seen(_node())
