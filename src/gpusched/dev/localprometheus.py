"""A real Prometheus (the pinned build) on loopback, scraping local gpusched processes.

The scrape configuration is the static equivalent of the chart's ServiceMonitors: one job per
component named like the Services' `gpusched.io/metrics-job` label (`gpusched-device-probe`,
`gpusched-extender`, `gpusched-operator`), and a `node` label on each probe's target as the
ServiceMonitor's relabeling adds from the pod's node. The HTTP API answers queries, range
queries and parses PromQL, which the tests and the dashboard pictures use.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpusched.dev.localcluster.binaries import ensure_toolchain
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running, spawn, stop

PROBE_JOB = "gpusched-device-probe"
EXTENDER_JOB = "gpusched-extender"
OPERATOR_JOB = "gpusched-operator"


class PrometheusError(RuntimeError):
    """Prometheus refused a query or did not start."""


@dataclass(frozen=True)
class Target:
    """One scrape target: its job, ``host:port`` and extra labels."""

    job: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def scrape_config(
    targets: Iterable[Target], *, interval: str = "2s", rule_files: Iterable[Path] = ()
) -> dict[str, Any]:
    """A Prometheus configuration scraping ``targets`` (grouped by job)."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append(
            {"targets": [target.address], "labels": dict(target.labels)}
        )
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": groups} for job, groups in sorted(jobs.items())
        ],
    }


@dataclass
class LocalPrometheus:
    """A running Prometheus and its HTTP API."""

    record: ProcessRecord
    url: str
    config_file: Path

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {dict(params or {})}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result (vector samples, or ``[scalar]``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's series."""
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"},
        )
        return list(data["result"])

    def parse(self, expr: str) -> dict[str, Any]:
        """The syntax tree Prometheus builds for ``expr`` (PrometheusError if it does not parse)."""
        return dict(self._get("/api/v1/parse_query", {"query": expr}))

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with their health."""
        return list(self._get("/api/v1/targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """Loaded rule groups with each rule's health and last error."""
        return list(self._get("/api/v1/rules")["groups"])

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        """Poll ``condition`` until truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not is_running(self.record):
                raise PrometheusError(f"prometheus exited:\n{_tail(Path(self.record.log))}")
            value = condition()
            if value:
                return value
            time.sleep(0.5)
        raise PrometheusError(f"timed out after {timeout:.0f}s waiting for {what}")

    def wait_targets_up(self, timeout: float = 120.0) -> None:
        """Until every target has been scraped successfully."""

        def up() -> bool:
            targets = self.targets()
            return bool(targets) and all(t["health"] == "up" for t in targets)

        self.wait(up, "every scrape target up", timeout)

    def stop(self) -> None:
        """Stop the process."""
        stop(self.record)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def start_prometheus(
    directory: Path,
    targets: Iterable[Target],
    *,
    interval: str = "2s",
    rule_files: Iterable[Path] = (),
    spawner: Callable[[str, list[str]], ProcessRecord] | None = None,
) -> LocalPrometheus:
    """Start Prometheus with its data in ``directory``; return once it is ready.

    ``spawner(name, argv)`` starts the process (e.g. ``LocalCluster.spawn``, so the cluster's
    ``down()`` stops it); by default it is started on its own and ``stop()`` ends it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "prometheus.yml"
    config = scrape_config(targets, interval=interval, rule_files=rule_files)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    binary = ensure_toolchain(lambda _m: None).path("prometheus")
    argv = [
        str(binary),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
    if spawner is not None:
        record = spawner(f"prometheus-{port}", argv)
    else:
        record = spawn(f"prometheus-{port}", argv, directory / "prometheus.log")
    prometheus = LocalPrometheus(record, f"http://127.0.0.1:{port}", config_file)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    prometheus.wait(ready, "prometheus to be ready", timeout=60)
    return prometheus


def metric_names(tree: Mapping[str, Any]) -> set[str]:
    """Every metric name a parsed PromQL expression selects (from ``parse``)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("vectorSelector", "matrixSelector") and node.get("name"):
                names.add(str(node["name"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(tree)
    return names
