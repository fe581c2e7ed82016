"""Lint of the dashboards the chart ships, in the spirit of Grafana's dashboard linter, with the
real Prometheus parsing every query: a `$datasource` variable used by every panel and target,
titles, descriptions and units, queries that parse, counters only through rate/increase over
`$__rate_interval` or `$__range`, every metric and matched label defined in gpusched.metrics,
every variable defined. The alerts' expressions get the same metric check."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_alerts import rendered_rules

from gpusched.dev.chart import dashboards
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.chart.metricnames import MetricName, families
from gpusched.dev.localprometheus import LocalPrometheus, metric_names, start_prometheus

UNITS = {"short", "none", "percentunit", "s", "ops", "reqps", "celsius", "watt"}
#: Labels every scraped series may carry besides its own: target labels and histogram buckets.
TARGET_LABELS = {"job", "instance", "node", "le", "__name__"}
#: Grafana's built-in variables, with the values the evaluation uses.
BUILTINS = {"$__rate_interval": "1m", "$__range": "10m", "$__interval": "15s"}
FILES = sorted((chart_dir() / "dashboards").glob("*.json"))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrometheus]:
    running = start_prometheus(tmp_path_factory.mktemp("prometheus"), [])
    yield running
    running.stop()


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def substitute(expr: str, variables: set[str]) -> str:
    """The query as Grafana sends it with every variable at "All"."""
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    for name in variables:
        expr = expr.replace(f"${name}", ".*")
    return expr


def series_names(family: MetricName) -> set[str]:
    if family.kind == "histogram":
        return {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return {family.name}


def known_series() -> dict[str, MetricName]:
    out: dict[str, MetricName] = {}
    for family in families().values():
        for name in series_names(family):
            out[name] = family
    out["up"] = MetricName("up", "gauge", ())
    return out


def selectors(
    tree: Any, parent: dict[str, Any] | None = None
) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Every vector and matrix selector with the node directly above it."""
    if isinstance(tree, dict):
        if tree.get("type") in ("vectorSelector", "matrixSelector"):
            yield tree, parent
        for value in tree.values():
            yield from selectors(
                value, tree if isinstance(tree, dict) and "type" in tree else parent
            )
    elif isinstance(tree, list):
        for item in tree:
            yield from selectors(item, parent)


def test_the_chart_ships_the_generated_dashboards() -> None:
    assert [p.name for p in FILES] == sorted(d.filename for d in dashboards.DASHBOARDS)
    for dashboard in dashboards.DASHBOARDS:
        assert load(chart_dir() / "dashboards" / dashboard.filename) == dashboards.dashboard_json(
            dashboard
        )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_dashboard_uses_a_prometheus_datasource_variable_everywhere(path: Path) -> None:
    dashboard = load(path)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_panel_has_a_title_a_description_a_unit_and_targets(path: Path) -> None:
    dashboard = load(path)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["title"].strip(), panel
        assert panel["description"].strip(), panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_query_parses_and_selects_only_defined_metrics_and_labels(
    path: Path, prometheus: LocalPrometheus
) -> None:
    dashboard = load(path)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    known = known_series()
    exprs = [(p["title"], t["expr"]) for p in panels(dashboard) for t in p["targets"]]
    exprs += [
        (f"variable {v['name']}", v["definition"])
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    for title, expr in exprs:
        for used in re.findall(r"\$(\w+)", expr):
            assert used in variables or f"${used}" in BUILTINS, (title, used)
        if expr.startswith("label_values("):
            metric = expr[len("label_values(") :].split(",")[0].strip()
            assert metric in known, (title, metric)
            continue
        tree = prometheus.parse(substitute(expr, variables))
        names = metric_names(tree)
        assert names, (title, expr)
        for selector, parent in selectors(tree):
            name = selector["name"]
            assert name in known, (title, name)
            family = known[name]
            labels = {m["name"] for m in selector.get("matchers", [])}
            assert labels <= set(family.labels) | TARGET_LABELS, (title, name, labels)
            if family.kind == "counter":
                # Counters only as rates or increases.
                assert selector["type"] == "matrixSelector", (title, name)
                assert parent is not None, (title, name)
                assert parent.get("func", {}).get("name") in ("rate", "increase"), (title, name)
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range"), (title, window)


def test_every_alert_selects_only_defined_metrics_and_labels(prometheus: LocalPrometheus) -> None:
    known = known_series()
    for group in rendered_rules()["groups"]:
        for rule in group["rules"]:
            tree = prometheus.parse(rule["expr"])
            for selector, _ in selectors(tree):
                family = known.get(selector["name"])
                assert family is not None, (rule["alert"], selector["name"])
                labels = {m["name"] for m in selector.get("matchers", [])}
                assert labels <= set(family.labels) | TARGET_LABELS, (rule["alert"], labels)


def test_core_panels_are_most_panels() -> None:
    for dashboard in dashboards.DASHBOARDS:
        core = [p for p in dashboard.panels() if p.core]
        assert len(core) >= 0.75 * len(dashboard.panels()), dashboard.uid
