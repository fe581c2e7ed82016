"""The chart's values model and the files generated from it."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from gpusched.dev.chart import files
from gpusched.dev.chart.values import Values


def test_generated_chart_files_are_current() -> None:
    assert files.stale() == [], "run `gpusched chart generate`"


def test_values_yaml_holds_the_models_defaults() -> None:
    parsed = yaml.safe_load(files.values_yaml())
    assert Values.model_validate(parsed) == Values()


def _keys(model: type[BaseModel], depth: int = 0) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for name, field in model.model_fields.items():
        out.append((depth, name))
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_keys(annotation, depth + 1))
    return out


def test_every_key_of_values_yaml_follows_its_description() -> None:
    lines = files.values_yaml().splitlines()
    for depth, name in _keys(Values):
        pad = "  " * depth
        numbers = [i for i, line in enumerate(lines) if line.startswith(f"{pad}{name}:")]
        assert numbers, f"{name} missing from values.yaml"
        assert any(lines[i - 1].startswith(f"{pad}# ") for i in numbers), name


def _objects(node: object) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            found.append(node)
        for value in node.values():
            found.extend(_objects(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_objects(item))
    return found


def test_schema_is_self_contained_draft_2020_12_and_closed() -> None:
    schema = json.loads(files.values_schema())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    text = json.dumps(schema)
    assert '"$ref": "#/' in text
    refs = [part.split('"', 1)[0] for part in text.split('"$ref": "')[1:]]
    assert all(ref.startswith("#/$defs/") for ref in refs), refs
    objects = _objects(schema)
    assert len(objects) > 20
    for obj in objects:
        assert obj.get("additionalProperties") is False, obj
        for name, prop in obj["properties"].items():  # type: ignore[union-attr]
            assert prop.get("description"), f"{name} has no description"


def test_the_model_refuses_an_unknown_key_by_name() -> None:
    with pytest.raises(ValidationError, match="replica"):
        Values.model_validate({"operator": {"replica": 3}})


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"deviceProbe": {"interval": "0s"}}, "interval"),
        ({"deviceProbe": {"interval": "0ms"}}, "interval"),
        ({"deviceProbe": {"interval": "0h0m0.0s"}}, "interval"),
        ({"deviceProbe": {"resync": "0s"}}, "resync"),
        ({"deviceProbe": {"resync": "00m"}}, "resync"),
        ({"scheduler": {"extender": {"httpTimeout": "0s"}}}, "httpTimeout"),
        ({"scheduler": {"extender": {"httpTimeout": "500ms"}}}, "httpTimeout"),
        ({"scheduler": {"extender": {"httpTimeout": "0m0s"}}}, "httpTimeout"),
    ],
)
def test_a_period_of_zero_and_a_timeout_under_a_second_are_refused(
    values: dict[str, object], named: str
) -> None:
    """The probe's flags refuse a zero interval or resync (its pods would crash-loop), and
    kube-scheduler reads a zero timeout as its own default; helm reads the same patterns from
    values.schema.json (tests/integration/test_chart.py)."""
    with pytest.raises(ValidationError, match=named):
        Values.model_validate(values)


@pytest.mark.parametrize(
    "values",
    [
        {"deviceProbe": {"interval": "0.5s", "resync": "1h0m"}},
        {"deviceProbe": {"interval": "250ms", "resync": "10m", "telemetryRefresh": "0s"}},
        {"scheduler": {"extender": {"httpTimeout": "1s"}}},
        {"scheduler": {"extender": {"httpTimeout": "1m30s"}}},
    ],
)
def test_durations_longer_than_zero_are_accepted(values: dict[str, object]) -> None:
    Values.model_validate(values)


@pytest.mark.parametrize("cidr", ["10.0.0.10", "nonsense/8", "10.0.0.0/8; rm", ""])
def test_the_explain_network_policy_takes_only_address_blocks(cidr: str) -> None:
    with pytest.raises(ValidationError, match="allowCidrs"):
        Values.model_validate(
            {"operator": {"explain": {"networkPolicy": {"enabled": True, "allowCidrs": [cidr]}}}}
        )


def test_the_explain_network_policy_takes_ipv4_and_ipv6_blocks() -> None:
    policy = {"enabled": True, "allowCidrs": ["10.0.0.10/32", "fd00::/64", "::1/128"]}
    Values.model_validate({"operator": {"explain": {"networkPolicy": policy}}})
