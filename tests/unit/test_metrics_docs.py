"""docs/metrics.md and gpusched.metrics (the one source of metric names) list the same metrics."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpusched.dev.chart.metricnames import _registries, metric_names

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _documented() -> set[str]:
    names: set[str] = set()
    for line in DOCS.read_text().splitlines():
        if line.startswith("| `gpusched_"):
            names |= set(re.findall(r"`(gpusched_[a-z0-9_]+)`", line.split("|")[1]))
    return names


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    defined = metric_names()
    documented = _documented()
    assert defined - documented == set(), "defined but not in docs/metrics.md"
    assert documented - defined == set(), "in docs/metrics.md but not in gpusched.metrics"


def test_metric_names_in_help_texts_are_metrics_gpusched_exports() -> None:
    defined = metric_names()
    named: set[str] = set()
    for registry in _registries():
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for name in re.findall(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b", family.documentation):
                named.add(name)
    assert named <= defined, named - defined
