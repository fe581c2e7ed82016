"""The chart's alerts with the pinned promtool: the PrometheusRule the chart renders passes
`promtool check rules`, and `promtool test rules` proves each alert fires when it should and
stays quiet when it should not."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.core.nodeagent import DriftKind
from gpusched.dev.chart import render
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.localcluster.binaries import ensure_toolchain
from gpusched.metrics import NodeAgentMetrics, SchedulerMetrics, new_registry

UNIT_TESTS = Path(__file__).parent / "promtool" / "alerts.test.yaml"
ALERTS = {
    "GpuschedExtenderDown",
    "GpuschedExtenderSlow",
    "GpuschedOperatorDown",
    "GpuschedOperatorNoLeader",
    "GpuschedProbeNotReporting",
    "GpuschedNvmlUnavailable",
    "GpuschedGpuUnhealthy",
    "GpuschedNodeAgentDown",
    "GpuschedNodeAgentNotRegistered",
    "GpuschedNodeAgentConflictingPlugin",
    "GpuschedGpuAssignmentDrift",
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


NODE_AGENT_ALERTS = (
    "GpuschedNodeAgentDown",
    "GpuschedNodeAgentNotRegistered",
    "GpuschedNodeAgentConflictingPlugin",
    "GpuschedGpuAssignmentDrift",
)
Step = Callable[[NodeAgentMetrics], None] | None


def _agent_series(node: str, minutes: list[Step], up: str = "1") -> list[dict[str, str]]:
    """A node agent's own gauges as Prometheus scrapes them once a minute: each minute's step
    (None: nothing changes) is applied to one NodeAgentMetrics, then every gauge sample is
    read, with the job and node labels the chart's ServiceMonitor adds ("_" before a series
    exists)."""
    metrics = NodeAgentMetrics(new_registry())
    values: dict[str, list[str]] = {}
    for minute, step in enumerate(minutes):
        if step is not None:
            step(metrics)
        for family in metrics.registry.collect():
            if family.type != "gauge":
                continue
            for sample in family.samples:
                labels = {"job": "gpusched-node-agent", "node": node, **sample.labels}
                name = sample.name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                values.setdefault(name, ["_"] * minute).append(f"{sample.value:g}")
    values[f'up{{job="gpusched-node-agent", node="{node}"}}'] = [up] * len(minutes)
    return [{"series": name, "values": " ".join(v)} for name, v in values.items()]


def _registered(m: NodeAgentMetrics) -> None:
    """What the agent does on a registration the kubelet accepts."""
    m.conflict.set(0)
    m.registered.set(1)


def _conflict(m: NodeAgentMetrics) -> None:
    """What the agent does while another plugin's socket is live: stays unregistered."""
    m.registered.set(0)
    m.conflict.set(1)


def _refused(m: NodeAgentMetrics) -> None:
    """No other plugin, and the kubelet does not accept the registration."""
    m.conflict.set(0)
    m.registered.set(0)


def _drift(outside: int) -> Step:
    def check(m: NodeAgentMetrics) -> None:  # what one drift check publishes
        for kind in DriftKind:
            m.drift_pods.labels(kind.value).set(
                outside if kind is DriftKind.OUTSIDE_ASSIGNMENT else 0
            )

    return check


def _kubelet_restart(m: NodeAgentMetrics) -> None:
    m.registered.set(0)


def test_node_agent_alerts_fire_on_its_own_metrics_and_stay_quiet_on_a_healthy_agent(
    tmp_path: Path,
) -> None:
    groups = rendered_rules()["groups"]
    for group in groups:
        group["rules"] = [r for r in group["rules"] if r["alert"] in NODE_AGENT_ALERTS]
        for rule in group["rules"]:
            rule.pop("annotations")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    span = 30
    # Healthy: registers after a minute, drift checks find nothing, and a kubelet restart at
    # minute 12 costs one minute unregistered.
    healthy: list[Step] = [None, _registered, _drift(0), *[None] * (span - 3)]
    healthy[12], healthy[13] = _kubelet_restart, _registered
    series = [
        *_agent_series("healthy", healthy),
        *_agent_series("beside-nvidia", [_conflict, *[None] * (span - 1)]),
        *_agent_series("refused", [_refused, *[None] * (span - 1)]),
        *_agent_series(
            "drifting", [_registered, _drift(0), None, None, _drift(2), *[None] * (span - 5)]
        ),
        *_agent_series("down", [_registered, *[None] * (span - 1)], up="0"),
    ]
    fired = {
        "GpuschedNodeAgentDown": [{"node": "down", "job": "gpusched-node-agent"}],
        "GpuschedNodeAgentNotRegistered": [{"node": "refused"}],
        "GpuschedNodeAgentConflictingPlugin": [{"node": "beside-nvidia"}],
        "GpuschedGpuAssignmentDrift": [{"node": "drifting", "kind": "OutsideAssignment"}],
    }
    cases = [
        {
            "eval_time": "25m",
            "alertname": name,
            "exp_alerts": [
                {"exp_labels": {"severity": "warning", **labels}} for labels in fired[name]
            ],
        }
        for name in NODE_AGENT_ALERTS
    ]
    # In the minute of the healthy agent's kubelet restart, only the refused one fires.
    cases.append(
        {
            "eval_time": "12m",
            "alertname": "GpuschedNodeAgentNotRegistered",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "node": "refused"}}],
        }
    )
    cases += [
        # Nothing fires before its `for` has passed.
        {"eval_time": "1m", "alertname": name, "exp_alerts": []}
        for name in NODE_AGENT_ALERTS
    ]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    test_file = tmp_path / "agent.test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
