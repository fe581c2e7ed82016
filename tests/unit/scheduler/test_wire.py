"""Extender wire types speak kube-scheduler's Go field names."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpusched.api.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
    WireError,
)


def test_filter_args_read_node_names_of_a_node_cache_capable_request() -> None:
    args = ExtenderArgs.model_validate(
        {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b"]}
    )
    assert args.candidate_names() == ["a", "b"]


def test_filter_args_read_node_objects_when_sent_whole() -> None:
    args = ExtenderArgs.model_validate(
        {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}, "NodeNames": None}
    )
    assert args.candidate_names() == ["a"]


def test_filter_result_uses_go_field_names() -> None:
    wire = ExtenderFilterResult(node_names=["a"], failed_nodes={"b": "why"}).to_wire()
    assert wire == {
        "NodeNames": ["a"],
        "FailedNodes": {"b": "why"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_priority_outside_the_extender_range_is_refused() -> None:
    with pytest.raises(ValidationError):
        HostPriority(host="a", score=11)


def test_bind_args_require_every_field() -> None:
    with pytest.raises(ValidationError) as caught:
        ExtenderBindingArgs.model_validate({"PodName": "p", "PodNamespace": "ns", "Node": "n"})
    assert "PodUID" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"Pod": {"metadata": "x"}, "NodeNames": ["a"]}, "Pod.metadata"),
        ({"Pod": {}, "Nodes": {"items": [{}]}}, "Nodes.items.0.metadata"),
        (
            {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": ""}}]}},
            "Nodes.items.0.metadata.name",
        ),
        (
            {"Pod": {"metadata": {"annotations": {"gpusched.io/gang-size": 2}}}, "NodeNames": []},
            "Pod.metadata.annotations.gpusched.io/gang-size",
        ),
        (
            {"Pod": {"spec": {"containers": [{"resources": {"limits": []}}]}}, "NodeNames": []},
            "Pod.spec.containers.0.resources.limits",
        ),
        ({"Pod": {}, "NodeNames": ["a", 7]}, "NodeNames.1"),
        ({"NodeNames": ["a"]}, "Pod"),
        ([], "request body"),
    ],
)
def test_wrong_shapes_are_refused_naming_the_field(body: Any, field: str) -> None:
    with pytest.raises(WireError) as caught:
        ExtenderArgs.from_wire(body)
    assert str(caught.value).startswith(f"{field}:")


def test_a_real_pod_keeps_every_field_after_validation() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {"a": "b"}, "ownerReferences": [{"x": 1}]},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Pending"},
    }
    args = ExtenderArgs.from_wire({"Pod": pod, "NodeNames": ["a"]})
    assert args.pod == pod


def test_bind_args_of_the_wrong_type_are_refused_naming_the_field() -> None:
    with pytest.raises(WireError, match="PodUID"):
        ExtenderBindingArgs.from_wire(
            {"PodName": "p", "PodNamespace": "n", "PodUID": 1, "Node": "x"}
        )
