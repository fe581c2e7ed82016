"""The chart's alerts with the pinned promtool: the PrometheusRule the chart renders passes
`promtool check rules`, and `promtool test rules` proves each alert fires when it should and
stays quiet when it should not."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.dev.chart import render
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.localcluster.binaries import ensure_toolchain
from gpusched.metrics import SchedulerMetrics, new_registry

UNIT_TESTS = Path(__file__).parent / "promtool" / "alerts.test.yaml"
ALERTS = {
    "GpuschedExtenderDown",
    "GpuschedExtenderSlow",
    "GpuschedOperatorDown",
    "GpuschedOperatorNoLeader",
    "GpuschedProbeNotReporting",
    "GpuschedNvmlUnavailable",
    "GpuschedGpuUnhealthy",
    "GpuschedJobsPendingTooLong",
    "GpuschedTenantBelowGuaranteeWhileOthersBorrow",
    "GpuschedPreemptionChurn",
    "GpuschedTenantBudgetSoftCap",
    "GpuschedTenantBudgetExhausted",
}


def rendered_rules(thresholds: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rule groups of the chart's PrometheusRule, as a Prometheus rules file."""
    rules: dict[str, Any] = {"enabled": True}
    if thresholds:
        rules["thresholds"] = thresholds
    (rule,) = [
        o
        for o in render.render({"metrics": {"prometheusRule": rules}})
        if o["kind"] == "PrometheusRule"
    ]
    return {"groups": rule["spec"]["groups"]}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = ensure_toolchain(lambda _m: None).path("promtool")
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_chart_ships_the_alerts_that_matter() -> None:
    names = {r["alert"] for g in rendered_rules()["groups"] for r in g["rules"]}
    assert names == ALERTS


def test_the_install_docs_list_every_alert_the_chart_ships() -> None:
    docs = (chart_dir().parents[2] / "docs" / "install.md").read_text()
    listed = set(re.findall(r"^\| `(Gpusched\w+)`", docs, flags=re.MULTILINE))
    shipped = {r["alert"] for g in rendered_rules()["groups"] for r in g["rules"]}
    assert listed == shipped


def test_promtool_check_rules_accepts_the_rendered_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules()))
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_every_alert_pass(tmp_path: Path) -> None:
    groups = rendered_rules()["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule["annotations"].pop("description")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    tested = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", [])}
    assert tested == ALERTS, "every alert has a promtool test"
    test_file = tmp_path / "alerts.test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def _largest_latency_threshold() -> float:
    """Just under the largest extender latency threshold the chart's schema accepts."""
    schema = json.loads((chart_dir() / "values.schema.json").read_text())
    field = schema["$defs"]["AlertThresholds"]["properties"]["extenderLatencySeconds"]
    top = field.get("exclusiveMaximum", field.get("maximum"))
    return float(top) - 0.5


def _filter_latency_series(seconds: float) -> list[dict[str, str]]:
    """One filter call a second, each taking ``seconds``, as the extender exports them: the
    cumulative buckets of its own histogram after a minute of such calls, growing per minute."""
    metrics = SchedulerMetrics(new_registry())
    for _ in range(60):
        metrics.request_seconds.labels("filter").observe(seconds)
    series = []
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "gpusched_extender_request_duration_seconds_bucket":
                per_minute = int(sample.value)
                series.append(
                    {
                        "series": (
                            "gpusched_extender_request_duration_seconds_bucket"
                            f'{{verb="filter", le="{sample.labels["le"]}"}}'
                        ),
                        "values": f"0+{per_minute}x30",
                    }
                )
    return series


@pytest.mark.parametrize("threshold", [1.0, 5.0, 20.0, "largest"])
def test_extender_slow_fires_at_any_threshold_the_chart_accepts(
    tmp_path: Path, threshold: float | str
) -> None:
    limit = _largest_latency_threshold() if threshold == "largest" else float(threshold)
    groups = rendered_rules({"extenderLatencySeconds": limit})["groups"]
    for group in groups:
        group["rules"] = [r for r in group["rules"] if r["alert"] == "GpuschedExtenderSlow"]
        for rule in group["rules"]:
            rule.pop("annotations")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    fired = [{"exp_labels": {"severity": "warning", "verb": "filter"}}]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _filter_latency_series(seconds),
                "alert_rule_test": [
                    {
                        "eval_time": "25m",
                        "alertname": "GpuschedExtenderSlow",
                        "exp_alerts": expected,
                    }
                ],
            }
            # Calls twice as slow as the threshold fire; calls a quarter of it stay quiet.
            for seconds, expected in ((2 * limit, fired), (limit / 4, []))
        ],
    }
    test_file = tmp_path / "slow.test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
