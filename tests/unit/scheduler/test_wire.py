"""Extender wire types speak kube-scheduler's Go field names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpusched.api.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
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
