"""The chart's alerts with the pinned promtool: the PrometheusRule the chart renders passes
`promtool check rules`, and `promtool test rules` proves each alert fires when it should and
stays quiet when it should not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpusched.dev.chart import render
from gpusched.dev.localcluster.binaries import ensure_toolchain

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


def rendered_rules() -> dict[str, Any]:
    """The rule groups of the chart's PrometheusRule, as a Prometheus rules file."""
    (rule,) = [
        o
        for o in render.render({"metrics": {"prometheusRule": {"enabled": True}}})
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
