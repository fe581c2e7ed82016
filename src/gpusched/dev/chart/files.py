"""Generated files of the Helm chart: ``values.yaml`` (defaults, each key commented with its
description), ``values.schema.json`` (draft 2020-12, self-contained), the chart's copy of the
CRDs and the Grafana dashboards, all from their one source (:mod:`gpusched.dev.chart.values`,
:mod:`gpusched.api.crdgen`, :mod:`gpusched.dev.chart.dashboards`).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpusched.api import crdgen
from gpusched.dev.chart import dashboards
from gpusched.dev.chart.values import Placement, Values
from gpusched.dev.localcluster.binaries import repo_root

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
WIDTH = 98
HEADER = """\
# Default values of the gpusched chart. Generated from src/gpusched/dev/chart/values.py by
# `gpusched chart generate`; values.schema.json (same source) refuses unknown keys and wrong
# types. docs/install.md explains the choices that matter.
"""


def chart_dir() -> Path:
    """``deploy/helm/gpusched`` of this checkout."""
    return repo_root() / "deploy" / "helm" / "gpusched"


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_defaults=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _comment(text: str, pad: str) -> list[str]:
    paragraph = " ".join(text.split())
    return [f"{pad}# {line}" for line in textwrap.wrap(paragraph, WIDTH - len(pad) - 2)]


def _ordered_fields(model: BaseModel) -> list[tuple[str, FieldInfo]]:
    """A model's own fields first, then the ones it shares with others (pod placement)."""
    fields = type(model).model_fields
    shared = set(Placement.model_fields) if isinstance(model, Placement) else set()
    return sorted(fields.items(), key=lambda item: item[0] in shared)


def _emit(model: BaseModel, depth: int) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    for name, field in _ordered_fields(model):
        if depth == 0 and lines:
            lines.append("")
        lines.extend(_comment(field.description or "", pad))
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.extend(_emit(value, depth + 1))
            continue
        dumped = yaml.safe_dump(
            {name: _plain(value)}, default_flow_style=False, sort_keys=False, width=WIDTH
        )
        lines.extend(pad + line for line in dumped.splitlines())
    return lines


def values_yaml() -> str:
    """The chart's ``values.yaml``."""
    return HEADER + "\n" + "\n".join(_emit(Values(), 0)) + "\n"


def _tidy(node: Any) -> Any:
    """Drop pydantic's generated titles; descriptions on one line; maps whose keys have a
    pattern (pydantic's ``patternProperties``, which lets other keys through) refuse every key
    that does not match (``propertyNames``)."""
    if isinstance(node, dict):
        out = {
            key: " ".join(value.split()) if key == "description" else _tidy(value)
            for key, value in node.items()
            if not (key == "title" and isinstance(value, str))
        }
        patterns = out.get("patternProperties")
        if isinstance(patterns, dict) and len(patterns) == 1 and "additionalProperties" not in out:
            ((pattern, values),) = patterns.items()
            del out["patternProperties"]
            names = out.get("propertyNames")
            base = names if isinstance(names, dict) else {}
            out["propertyNames"] = {**base, "pattern": pattern}
            out["additionalProperties"] = values
        return out
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    return node


def values_schema() -> str:
    """The chart's ``values.schema.json``."""
    schema = _tidy(Values.model_json_schema())
    document = {"$schema": SCHEMA_DIALECT, "title": "gpusched chart values", **schema}
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def expected_files() -> dict[Path, str]:
    """Every generated file of the chart and its content."""
    root = chart_dir()
    files = {root / "values.yaml": values_yaml(), root / "values.schema.json": values_schema()}
    for crd in crdgen.CRDS:
        files[root / "crds" / crd.filename] = crdgen.render(crd)
    for dashboard in dashboards.DASHBOARDS:
        files[root / "dashboards" / dashboard.filename] = dashboards.render(dashboard)
    return files


def write() -> list[Path]:
    """Write every generated file; return their paths."""
    written = []
    for path, content in expected_files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def stale() -> list[Path]:
    """Generated files that differ from their source."""
    return [
        path
        for path, content in expected_files().items()
        if not path.exists() or path.read_text(encoding="utf-8") != content
    ]
