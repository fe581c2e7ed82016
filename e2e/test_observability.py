"""Prometheus and Grafana on a live gpusched: a real Prometheus scrapes the device probes, the
extender and the operator (as the chart's ServiceMonitors would) while two tenants share
simulated GPU nodes, one borrows and is preempted, a gang waits and a GPU fails. Then every
dashboard query and every alert expression is evaluated through Prometheus' HTTP API, the core
panels must show data, a few series are compared with what the API server says, the chart's
`helm test` script checks the components, and the dashboards are drawn from the recorded data.

Set GPUSCHED_DASHBOARD_PICTURES to a directory (docs/dashboards) to keep the pictures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.helpers import gpu_pod
from gpusched.api import keys
from gpusched.dev.chart import dashboards, pictures, render
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.components import (
    SchedulerProcesses,
    gpusched_command,
    start_scheduler,
    wait_http_ok,
)
from gpusched.dev.localcluster.nodes import add_gpu_nodes, delete_nodes, wait_nodes_ready
from gpusched.dev.localcluster.processes import ProcessRecord, free_port
from gpusched.dev.localcluster.topologies import fixture_path
from gpusched.dev.localprobes import FakeProbe, start_fake_probe
from gpusched.dev.localprometheus import (
    EXTENDER_JOB,
    OPERATOR_JOB,
    PROBE_JOB,
    LocalPrometheus,
    Target,
    start_prometheus,
)
from tests.integration.operator_harness import Scenario, wait_for

POOL_LABEL = "gpusched.io/test-pool"
POOL = "observability"
H100 = "hgx-h100-sxm-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
NODES = {"obs-h100-a": H100, "obs-h100-b": H100, "obs-h100-c": H100, "obs-pcie": BRIDGED}
#: Thresholds low enough for alerts to reach pending/firing within the scenario.
ALERT_VALUES = {
    "metrics": {
        "prometheusRule": {
            "enabled": True,
            "thresholds": {"jobPendingSeconds": 20, "probeStaleSeconds": 600},
        }
    }
}


@dataclass
class Observed:
    """What the scenario left for the tests to look at."""

    prometheus: LocalPrometheus
    window: pictures.Window
    scenario: Scenario
    probes: dict[str, FakeProbe]
    scheduler: SchedulerProcesses
    extender_metrics: int
    operator_metrics: int
    namespaces: dict[str, str] = field(default_factory=dict)


def _start_operator(cluster: LocalCluster, metrics_port: int) -> ProcessRecord:
    record = cluster.spawn(
        "gpusched-operator-observed",
        [
            *gpusched_command(),
            "operator",
            f"--kubeconfig={identities.kubeconfig(cluster, identities.OPERATOR)}",
            f"--metrics-port={metrics_port}",
            f"--health-port={free_port()}",
            f"--explain-port={free_port()}",
            "--resync=1",
            "--pods-ready-timeout=60",
            f"--node-selector={POOL_LABEL}={POOL}",
        ],
    )
    wait_http_ok(f"http://127.0.0.1:{metrics_port}/metrics", record)
    return record


def _rules_file(directory: Path) -> Path:
    (rule,) = [o for o in render.render(ALERT_VALUES) if o["kind"] == "PrometheusRule"]
    path = directory / "gpusched-alerts.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture(scope="module")
def observed(
    local_cluster: LocalCluster, kube: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    workdir = tmp_path_factory.mktemp("observability")
    nodes = list(NODES)
    add_gpu_nodes(kube, nodes, 8, labels={POOL_LABEL: POOL})
    wait_nodes_ready(kube, nodes)
    started: list[ProcessRecord] = []
    scenario = Scenario(kube, lambda *_args, **_kwargs: [])  # nodes come from the probes
    try:
        probes = {
            node: start_fake_probe(
                local_cluster, node, fixture_path(fixture), args=("--interval=2",)
            )
            for node, fixture in NODES.items()
        }
        started += [p.record for p in probes.values()]
        extender_metrics, operator_metrics = free_port(), free_port()
        scheduler = start_scheduler(local_cluster, metrics_port=extender_metrics)
        started += [scheduler.extender, scheduler.kube_scheduler]
        started.append(_start_operator(local_cluster, operator_metrics))
        targets = [
            Target(PROBE_JOB, f"127.0.0.1:{p.metrics_port}", {"node": node})
            for node, p in probes.items()
        ]
        targets += [
            Target(EXTENDER_JOB, f"127.0.0.1:{extender_metrics}"),
            Target(OPERATOR_JOB, f"127.0.0.1:{operator_metrics}"),
        ]
        prometheus = start_prometheus(
            workdir / "prometheus",
            targets,
            rule_files=[_rules_file(workdir)],
            spawner=local_cluster.spawn,
        )
        started.append(prometheus.record)
        start = time.time()
        prometheus.wait_targets_up()
        custom = client.CustomObjectsApi(kube)

        def published() -> bool:
            items = custom.list_cluster_custom_object(
                keys.GROUP, keys.VERSION, "nodegputopologies"
            )["items"]
            return set(nodes) <= {i["metadata"]["name"] for i in items}

        wait_for(published, 60, "every probe to publish its node")
        observed = Observed(
            prometheus,
            pictures.Window(start, start, 5),
            scenario,
            probes,
            scheduler,
            extender_metrics,
            operator_metrics,
        )
        _run_scenario(observed)
        observed.window = pictures.Window(start, time.time(), 5)
        yield observed
    finally:
        _remove(scenario)
        for record in reversed(started):
            local_cluster.stop_process(record)
        delete_nodes(kube, nodes)


def _remove(scenario: Scenario) -> None:
    """Delete the scenario's GpuJobs while the operator still runs (it releases their
    finalizers), then its tenants and namespaces, and wait until they are gone: later tests list
    every GpuJob of the cluster."""
    custom = client.CustomObjectsApi(scenario.kube)

    def jobs() -> list[Any]:
        return [
            job
            for namespace in scenario.namespaces
            for job in custom.list_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, "gpujobs"
            )["items"]
        ]

    for job in jobs():
        meta = job["metadata"]
        custom.delete_namespaced_custom_object(
            keys.GROUP, keys.VERSION, meta["namespace"], "gpujobs", meta["name"]
        )
    wait_for(lambda: not jobs(), 120, "the scenario's GpuJobs to be deleted")
    scenario.cleanup()
    names = set(scenario.namespaces)
    core = client.CoreV1Api(scenario.kube)
    wait_for(
        lambda: not names & {n.metadata.name for n in core.list_namespace().items},
        180,
        "the scenario's namespaces to be deleted",
    )


def _record(o: Observed, seconds: float) -> None:
    """Let Prometheus scrape the current state for a while (a plateau in the pictures)."""
    until = time.monotonic() + seconds
    o.prometheus.wait(lambda: time.monotonic() > until, "recording", timeout=seconds + 30)


def _seen(o: Observed, expr: str, what: str) -> None:
    """Until Prometheus has scraped what ``expr`` selects."""
    o.prometheus.wait(lambda: o.prometheus.query(expr), what)


def _run_scenario(o: Observed) -> None:
    s = o.scenario
    _record(o, 10)
    # A GPU of the bridged node fails (XID 79: fallen off the bus).
    o.probes["obs-pcie"].inject(gpu=6, xid=79)
    _seen(o, 'gpusched_probe_gpu_health{gpu="6", state="Unhealthy"} == 1', "the failed GPU")
    # A plain pod asks gpusched for all 8 GPUs of that node: kube-scheduler counts 8 free, the
    # extender refuses the node (7 healthy), and the pod waits.
    strays = s.namespace("strays")
    client.CoreV1Api(s.kube).create_namespaced_pod(strays, gpu_pod("all-eight", 8, node="obs-pcie"))
    _seen(
        o,
        'sum(gpusched_filter_refused_nodes_total{reason="NotEnoughHealthyGpus"}) > 0',
        "the extender to refuse the node for the stray pod",
    )
    low, high = s.priority("batch", 100), s.priority("prod", 1000)
    research_quota, research = s.tenant("research", guaranteed=8, borrowingLimit=32, weight=1)
    training_quota, training = s.tenant("training", guaranteed=16, weight=2)
    o.namespaces = {"research": research, "training": training}
    # Each tenant's counters are scraped at 0 before anything happens to it.
    for quota in (research_quota, training_quota):
        _seen(o, f'gpusched_preemptions_total{{tenant="{quota}"}}', f"{quota}'s series")
    _record(o, 6)
    # research fills three H100 nodes, two of them on borrowed GPUs, then four bridged GPUs.
    for i in range(3):
        s.submit(
            research,
            f"sweep-{i}",
            8,
            priorityClassName=low,
            preemptible=True,
            topology={"scope": "nvlink", "mode": "preferred"},
        )
        s.wait_phase(research, f"sweep-{i}", "Running", timeout=120)
        _record(o, 8)
    s.submit(
        research, "pairs", 4, priorityClassName=low, topology={"scope": "node", "mode": "preferred"}
    )
    s.wait_phase(research, "pairs", "Running", timeout=120)
    _record(o, 15)
    # training reclaims its guarantee: a borrowed sweep is preempted and queued again.
    s.submit(
        training,
        "finetune",
        8,
        priorityClassName=high,
        topology={"scope": "nvlink", "mode": "required"},
    )
    s.wait_phase(training, "finetune", "Running", timeout=180)
    _seen(o, f'gpusched_preemptions_total{{tenant="{research_quota}"}} >= 1', "the preemption")
    _record(o, 15)
    # A gang that cannot fit now waits.
    s.submit(
        training,
        "pretrain",
        8,
        replicas=3,
        priorityClassName=high,
        topology={"scope": "nvlink", "mode": "required"},
    )
    s.wait_phase(training, "pretrain", "Queued", timeout=60)
    # The failing GPU reports again (XIDs repeat on a GPU that fell off the bus).
    o.probes["obs-pcie"].inject(gpu=6, xid=79)
    # Let Prometheus record the state for a while (the unhealthy GPU's alert needs a minute).
    _record(o, 75)


def _panel_id(dashboard: dashboards.Dashboard, panel: dashboards.Panel) -> str:
    return f"{dashboard.uid}: {panel.title}"


ALL_PANELS = [(d, p) for d in dashboards.DASHBOARDS for p in d.panels()]


@pytest.mark.parametrize(
    ("dashboard", "panel"), ALL_PANELS, ids=[_panel_id(d, p) for d, p in ALL_PANELS]
)
def test_every_panel_query_runs_and_core_panels_show_data(
    observed: Observed, dashboard: dashboards.Dashboard, panel: dashboards.Panel
) -> None:
    values = {v.name: ".*" for v in dashboard.variables}
    results = []
    for query in panel.queries:
        expr = pictures.grafana_query(query.expr, observed.window, values)
        if panel.kind in ("timeseries",):
            w = observed.window
            results += observed.prometheus.query_range(expr, w.start, w.end, w.step)
        else:
            results += observed.prometheus.query(expr, at=observed.window.end)
    if panel.core:
        assert results, f"core panel {_panel_id(dashboard, panel)} shows no data"


def test_dashboard_variables_find_their_values(observed: Observed) -> None:
    for dashboard in dashboards.DASHBOARDS:
        for variable in dashboard.variables:
            found = observed.prometheus.query(f"count by ({variable.name}) ({variable.metric})")
            assert found, (dashboard.uid, variable.name)


def test_every_alert_evaluates_and_the_failed_gpu_alerts(observed: Observed) -> None:
    groups = observed.prometheus.rules()
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} >= {"GpuschedGpuUnhealthy", "GpuschedExtenderDown"}
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        observed.prometheus.query(rule["query"])  # runs as an instant query too
    states = {r["name"]: r["state"] for r in rules}
    assert states["GpuschedGpuUnhealthy"] in ("pending", "firing")
    (alert,) = next(r for r in rules if r["name"] == "GpuschedGpuUnhealthy")["alerts"]
    assert alert["labels"]["node"] == "obs-pcie"
    assert alert["labels"]["gpu"] == "6"
    assert states["GpuschedJobsPendingTooLong"] in ("pending", "firing")
    for quiet in (
        "GpuschedExtenderDown",
        "GpuschedOperatorDown",
        "GpuschedOperatorNoLeader",
        "GpuschedProbeNotReporting",
    ):
        assert states[quiet] == "inactive", quiet


def _value(prometheus: LocalPrometheus, expr: str, at: float | None = None) -> dict[str, float]:
    return {
        ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items())): float(s["value"][1])
        for s in prometheus.query(expr, at=at)
    }


def test_allocation_series_match_the_pods_the_api_server_holds(
    observed: Observed, kube: Any
) -> None:
    def per_node_truth() -> dict[str, float]:
        held = dict.fromkeys(NODES, 0.0)
        for pod in client.CoreV1Api(kube).list_pod_for_all_namespaces().items:
            if pod.spec.node_name in held and pod.status.phase in ("Pending", "Running"):
                limits = pod.spec.containers[0].resources.limits or {}
                held[pod.spec.node_name] += float(limits.get(keys.GPU_RESOURCE, 0))
        return held

    def matches() -> bool:
        series = _value(
            observed.prometheus,
            'max by (node) (gpusched_node_gpus{state="allocated", node=~"obs-.*"})',
        )
        return {k.removeprefix("node="): v for k, v in series.items()} == per_node_truth()

    observed.prometheus.wait(matches, "allocated GPUs per node to match the bound pods", 60)


def test_tenant_series_match_the_gpujobs(observed: Observed, kube: Any) -> None:
    training = observed.namespaces["training"]
    jobs = client.CustomObjectsApi(kube).list_namespaced_custom_object(
        keys.GROUP, keys.VERSION, training, "gpujobs"
    )["items"]
    queued = sum(
        j["spec"]["replicas"] * j["spec"]["gpusPerReplica"]
        for j in jobs
        if (j.get("status") or {}).get("phase") == "Queued"
    )
    tenant = f"{observed.scenario.id}-training"
    pending = _value(observed.prometheus, f'gpusched_tenant_pending_gpus{{tenant="{tenant}"}}')
    assert list(pending.values()) == [queued] == [24]
    # The first preemption of a tenant counts in increase() (its series existed at 0).
    window = observed.window.range
    # Over the scenario's window, evaluated at its end: evaluated later (after the tests before
    # this one), the range would slide past the scenario's first placements.
    end = observed.window.end
    preempted = _value(
        observed.prometheus, f"sum(increase(gpusched_preemptions_total[{window}]))", at=end
    )
    assert next(iter(preempted.values())) >= 0.9
    placed = _value(
        observed.prometheus,
        f'sum(increase(gpusched_placements_total{{topology_class="nvlink"}}[{window}]))',
        at=end,
    )
    # The sweeps and the finetune job; on failure, what the extender counted and refused.
    counted = _value(observed.prometheus, "sum by (topology_class) (gpusched_placements_total)")
    errors = _value(observed.prometheus, "sum by (reason) (gpusched_bind_errors_total)")
    assert next(iter(placed.values())) >= 3.5, (placed, counted, errors)


def test_the_helm_test_hooks_pass_against_the_running_components(
    observed: Observed, tmp_path: Path
) -> None:
    rendered = render.render()
    script = next(
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpusched-test"
    )["data"]["check.py"]
    check = tmp_path / "check.py"
    check.write_text(script)
    local = {
        "gpusched-extender.gpusched-system.svc:8889": f"127.0.0.1:{observed.extender_metrics}",
        "gpusched-operator.gpusched-system.svc:8080": f"127.0.0.1:{observed.operator_metrics}",
        # Every address the name resolves to must answer (here: one probe).
        "gpusched-device-probe.gpusched-system.svc:9402": (
            f"127.0.0.1:{observed.probes['obs-pcie'].metrics_port}"
        ),
    }
    hooks = [
        o
        for o in rendered
        if o["kind"] == "Pod" and o["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    assert {h["metadata"]["name"] for h in hooks} == {
        "gpusched-test-components",
        "gpusched-test-device-probes",
    }
    for hook in hooks:
        container = hook["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        for service, address in local.items():
            env["GPUSCHED_CHECK"] = env["GPUSCHED_CHECK"].replace(service, address)
        assert "svc" not in env["GPUSCHED_CHECK"], env
        result = subprocess.run(
            [sys.executable, str(check)],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "FAIL" not in result.stdout
    # The script does fail when a component does not answer.
    dead = {
        **os.environ,
        "GPUSCHED_CHECK": f"operator=http://127.0.0.1:{free_port()}/metrics",
        "GPUSCHED_CHECK_TIMEOUT": "2",
    }
    failed = subprocess.run(
        [sys.executable, str(check)],
        env=dead,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 1
    assert "FAIL operator" in failed.stdout


def test_each_dashboard_is_drawn_from_the_recorded_data(observed: Observed, tmp_path: Path) -> None:
    keep = os.environ.get("GPUSCHED_DASHBOARD_PICTURES")
    directory = Path(keep) if keep else tmp_path
    for dashboard in dashboards.DASHBOARDS:
        path = pictures.draw(
            dashboard, observed.prometheus, observed.window, directory / f"{dashboard.uid}.png"
        )
        assert path.stat().st_size > 20_000, path
