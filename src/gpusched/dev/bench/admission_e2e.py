"""``gpusched bench admission-e2e``: GpuJobs per second from apply to Running on the local control
plane, beside plain pods on the same cluster, with the API requests each costs.

One fresh cluster (kube-apiserver, etcd, controllers, kwok) with simulated 8-GPU H100 nodes and
their NodeGpuTopology, the gpusched extender with its kube-scheduler, the operator under its
ServiceAccount. In one run:

1. ``jobs`` one-GPU GpuJobs are created at once (``workers`` parallel clients); the figure is the
   time from the first create to the last job Running;
2. the same number of plain one-GPU pods go straight to the gpusched scheduler (no operator): the
   rate the rest of the stack sustains on this machine;
3. with ``--steady-jobs N``, N GpuJobs that can never be admitted (their tenant's borrowing limit
   is 0) are queued, and once they all wait, the operator is watched through several cycles:
   its LIST calls then (the target is none), and its cycle time.

API requests are counted from the API server's own ``apiserver_request_total`` (every client) and
from the operator's ``gpusched_operator_api_requests_total`` (its share). Figures to record,
never assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from prometheus_client.parser import text_string_to_metric_families

from gpusched.api import keys
from gpusched.dev.bench.admission import percentile_ms
from gpusched.dev.localcluster import LocalCluster, ensure_toolchain, identities
from gpusched.dev.localcluster.binaries import default_progress, repo_root
from gpusched.dev.localcluster.components import (
    gpusched_command,
    start_scheduler,
)
from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready
from gpusched.dev.localcluster.processes import free_port
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.dev.localcluster.webhook import webhook_configuration, write_certificates
from gpusched.kube import body
from gpusched.kubeasync import AsyncApi
from gpusched.kubewatch import Reflector

H100 = "NVIDIA-H100-80GB-HBM3"
#: (verb, resource, subresource) -> requests
Requests = Counter[tuple[str, str, str]]
#: (verb, resource, subresource) -> seconds
Seconds = dict[tuple[str, str, str], float]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def apiserver_requests(api: Any) -> Requests:
    """``apiserver_request_total`` by (verb, resource, subresource), every client together
    (dry runs counted apart as resource ``pods (dry run)``)."""
    return apiserver_figures(api)[0]


def apiserver_figures(api: Any) -> tuple[Requests, Seconds]:
    """Requests (``apiserver_request_total``) and the API server's seconds spent answering them
    (``apiserver_request_duration_seconds``, watches left out: they last), both by (verb,
    resource, subresource)."""
    response = api.call_api(
        "GET", api.configuration.host + "/metrics", header_params={"Accept": "text/plain"}
    )
    response.read()
    requests: Requests = Counter()
    seconds: Seconds = {}
    for family in text_string_to_metric_families(response.data.decode()):
        if family.name not in ("apiserver_request", "apiserver_request_duration_seconds"):
            continue
        for sample in family.samples:
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("dry_run"):
                resource += " (dry run)"
            key = (labels.get("verb", ""), resource, labels.get("subresource", ""))
            if family.name == "apiserver_request" and sample.name.endswith("_total"):
                requests[key] += int(sample.value)
            elif sample.name.endswith("_sum") and key[0] not in ("WATCH", "CONNECT"):
                seconds[key] = seconds.get(key, 0.0) + sample.value
    return requests, seconds


def operator_metrics(port: int) -> dict[str, Any]:
    """The operator's own request counts, cycle count and cycle time (from its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    requests: Requests = Counter()
    cycles = 0.0
    cycle_sum = 0.0
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "gpusched_operator_api_requests_total":
                requests[(labels["verb"], labels["resource"], "")] += int(sample.value)
            elif labels.get("stage") == "cycle":
                if sample.name.endswith("_count"):
                    cycles = sample.value
                elif sample.name.endswith("_sum"):
                    cycle_sum = sample.value
                elif sample.name.endswith("_bucket"):
                    buckets.append((float(labels["le"]), sample.value))
    return {"requests": requests, "cycles": cycles, "cycle_sum": cycle_sum, "buckets": buckets}


def _diff(after: Requests, before: Requests) -> Requests:
    return Counter({k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)})


def _table(requests: Requests, per: int) -> dict[str, float]:
    """Requests per job (or pod) by "VERB resource/subresource", largest first."""
    rows = {}
    for (verb, resource, sub), n in requests.most_common():
        name = f"{verb} {resource}" + (f"/{sub}" if sub else "")
        rows[name] = round(n / max(1, per), 2)
    return rows


def _ms_table(after: Seconds, before: Seconds, per: int) -> dict[str, float]:
    """The API server's milliseconds answering requests, per job (or pod), by kind; largest
    first, the top ten."""
    rows = {}
    for (verb, resource, sub), total in after.items():
        spent = total - before.get((verb, resource, sub), 0.0)
        if spent > 0:
            rows[f"{verb} {resource}" + (f"/{sub}" if sub else "")] = 1000 * spent / max(1, per)
    top = sorted(rows.items(), key=lambda kv: -kv[1])[:10]
    return {name: round(ms, 2) for name, ms in top}


def job_manifest(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {"name": name},
        "spec": {
            "gpusPerReplica": gpus,
            # The pods' grace period is the job's (a template may not set its own).
            "checkpointGracePeriodSeconds": 0,
            "template": {
                "metadata": {"annotations": {keys.SIM_RUNTIME: "1h"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }


def _quota(name: str, namespace: str, guaranteed: int, limit: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"namespaces": [namespace], "guaranteedGpus": guaranteed}
    if limit is not None:
        spec["borrowingLimit"] = limit
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "TenantQuota",
        "metadata": {"name": name},
        "spec": spec,
    }


def _wait(check: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return False


def _create_all(create: Callable[[int], None], count: int, workers: int) -> float:
    started = time.time()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(count)))
    return time.time() - started


def _cycle_p99_bound(buckets: list[tuple[float, float]], count: float) -> float | None:
    """Upper bound of the 99th percentile from histogram buckets."""
    for bound, n in sorted(buckets):
        if count and n >= 0.99 * count:
            return bound
    return None


def run_e2e(
    jobs: int,
    nodes: int,
    gpus_per_job: int,
    workers: int,
    steady_jobs: int = 0,
    *,
    record_delay: float | None = None,
    arrivals_on_top: float | None = None,
    webhook: bool = True,
    node_heartbeats: float = 0.0,
) -> dict[str, Any]:
    """See the module docstring."""
    from kubernetes import client

    progress = default_progress
    namespace = "bench"
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", ensure_toolchain())
        cluster.up()
        try:
            cluster.install_crds(repo_root() / "crds")
            api = cluster.api_client()
            names = [f"node-{i:04d}" for i in range(nodes)]
            progress(f"[bench] creating {nodes} simulated H100 nodes with their NodeGpuTopology")
            for name in names:
                topology, health = fixture_objects("hgx-h100-sxm-8gpu-8nic", name)
                add_gpu_nodes(
                    api,
                    [name],
                    8,
                    labels={keys.GFD_PRODUCT: H100},
                    topology=topology,
                    status=health,
                )
            wait_nodes_ready(api, names, timeout=180)
            core = client.CoreV1Api(api)
            custom = client.CustomObjectsApi(api)
            core.create_namespace(body({"metadata": {"name": namespace}}))
            custom.create_cluster_custom_object(
                keys.GROUP, keys.VERSION, "tenantquotas", _quota("bench", namespace, nodes * 8)
            )
            progress("[bench] starting the extender, its kube-scheduler and the operator")
            start_scheduler(cluster)
            kubeconfig = identities.kubeconfig(cluster, identities.OPERATOR)
            port = free_port()
            webhook_args: list[str] = []
            if webhook:
                # As the chart runs it: every GpuJob create is reviewed by the operator.
                webhook_port = free_port()
                ca_pem = write_certificates(Path(tmp) / "webhook")
                webhook_args = [
                    f"--webhook-port={webhook_port}",
                    f"--webhook-cert-dir={Path(tmp) / 'webhook'}",
                ]
                client.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(
                    body(webhook_configuration("gpusched-operator", webhook_port, ca_pem))
                )

            explain_port = free_port()

            def start_operator(name: str) -> None:
                cluster.spawn(
                    name,
                    [
                        *gpusched_command(),
                        "operator",
                        f"--kubeconfig={kubeconfig}",
                        f"--metrics-port={port}",
                        f"--health-port={free_port()}",
                        f"--explain-port={explain_port}",
                        "--resync=5",
                        *([f"--record-delay={record_delay}"] if record_delay is not None else []),
                        *(
                            [f"--arrivals-on-top={arrivals_on_top}"]
                            if arrivals_on_top is not None
                            else []
                        ),
                        *webhook_args,
                    ],
                )

            start_operator(OPERATOR)
            # Start-up (imports, the first lists) is not part of the figures.
            _wait(lambda: _operator_cycles(port) > 0, 120)

            created: dict[str, float] = {}

            def create(i: int) -> None:
                name = f"job-{i:05d}"
                created[name] = time.time()
                custom.create_namespaced_custom_object(
                    keys.GROUP,
                    keys.VERSION,
                    namespace,
                    "gpujobs",
                    job_manifest(name, gpus_per_job),
                )

            watcher = RunningWatcher(
                api, f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{namespace}/gpujobs"
            )
            api_before, api_seconds_before = apiserver_figures(api)
            op_before = operator_metrics(port)
            cpu_before = cpu_seconds(cluster)
            progress(f"[bench] {jobs} GpuJobs: creating, then waiting for all to run")
            started = time.time()
            apply_seconds = _create_all(create, jobs, workers)
            running = watcher.wait(jobs, 600)
            progress(f"[bench] GpuJobs: {len(running)} running in {time.time() - started:.1f} s")
            finished = max(running.values()) if running else time.time()
            cpu_after = cpu_seconds(cluster)
            api_after, api_seconds_after = apiserver_figures(api)
            op_after = operator_metrics(port)
            latencies = sorted(running[n] - created[n] for n in running)
            job_rate = len(running) / max(1e-9, finished - started)
            job_requests = _diff(api_after, api_before)
            operator_requests = _diff(op_after["requests"], op_before["requests"])

            custom.delete_collection_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, "gpujobs"
            )
            _wait(lambda: not core.list_namespaced_pod(namespace, limit=1).items, 300)
            progress(f"[bench] {jobs} plain pods straight to the gpusched scheduler")
            pods_before, pods_seconds_before = apiserver_figures(api)
            pods_cpu_before = cpu_seconds(cluster)
            pod_rate = _plain_pods_per_second(api, core, count=jobs, workers=workers)
            pods_cpu = _cpu_per(cpu_seconds(cluster), pods_cpu_before, jobs)
            pods_after, pods_seconds_after = apiserver_figures(api)
            pod_requests = _diff(pods_after, pods_before)
            result: dict[str, Any] = {
                "jobs": jobs,
                "record_delay": record_delay,
                "arrivals_on_top": arrivals_on_top,
                "webhook": webhook,
                "running": len(running),
                "nodes": nodes,
                "gpus_per_job": gpus_per_job,
                "apply_seconds": round(apply_seconds, 2),
                "wall_seconds": round(finished - started, 2),
                "jobs_per_second": round(job_rate, 1),
                "apply_to_running_p50_s": round(_percentile(latencies, 0.5), 2),
                "apply_to_running_p99_s": round(_percentile(latencies, 0.99), 2),
                "plain_pods_per_second": pod_rate,
                "ratio_to_plain_pods": round(job_rate / max(1e-9, pod_rate), 2),
                "api_requests_per_job": round(sum(job_requests.values()) / max(1, jobs), 2),
                "api_requests_per_plain_pod": round(sum(pod_requests.values()) / max(1, jobs), 2),
                "operator_requests_per_job": round(
                    sum(operator_requests.values()) / max(1, jobs), 2
                ),
                "api_requests_per_job_by_kind": _table(job_requests, jobs),
                "api_requests_per_plain_pod_by_kind": _table(pod_requests, jobs),
                "operator_requests_per_job_by_kind": _table(operator_requests, jobs),
                "apiserver_ms_per_job_by_kind": _ms_table(
                    api_seconds_after, api_seconds_before, jobs
                ),
                "apiserver_ms_per_plain_pod_by_kind": _ms_table(
                    pods_seconds_after, pods_seconds_before, jobs
                ),
                "operator_cycles": op_after["cycles"] - op_before["cycles"],
                "cpu_ms_per_job": _cpu_per(cpu_after, cpu_before, jobs),
                "cpu_ms_per_plain_pod": pods_cpu,
            }
            progress(f"[bench] plain pods: {pod_rate} pods/s")
            if steady_jobs:
                result["steady"] = _steady_state(
                    api,
                    core,
                    custom,
                    port,
                    cluster,
                    count=steady_jobs,
                    workers=workers,
                    explain_port=explain_port,
                    node_names=names,
                    node_heartbeats=node_heartbeats,
                )
                result["restart"] = _restart(cluster, port, start_operator)
            return result
        finally:
            cluster.down()


#: The operator's process name in the cluster's records.
OPERATOR = "gpusched-operator"


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU time (user + system) each process of the cluster has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for record in cluster.processes():
        try:
            stat = Path(f"/proc/{record.pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[record.name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_per(after: dict[str, float], before: dict[str, float], count: int) -> dict[str, float]:
    """CPU milliseconds per job (or pod) by process, largest first."""
    rows = {name: 1000 * (after[name] - before.get(name, 0.0)) / max(1, count) for name in after}
    return {k: round(v, 1) for k, v in sorted(rows.items(), key=lambda kv: -kv[1]) if v > 0}


class RunningWatcher:
    """Records when each object of a collection is first seen Running (a watch, not polling:
    the benchmark must not load the API server it measures). GpuJobs and plain pods are timed
    alike, when a watching client sees them Running (what their user sees): a GpuJob's
    ``status.startedAt`` is its pods' start in whole seconds, before the status says so."""

    def __init__(self, api: Any, path: str) -> None:
        self.running: dict[str, float] = {}
        client = AsyncApi(api.configuration)
        reflector = Reflector(f"bench-{path}", client, path, self)
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(reflector.run())

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                self._loop.run_until_complete(self._task)
            self._loop.run_until_complete(client.close())

        threading.Thread(target=run, name="bench-watch", daemon=True).start()

    def replace(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.upsert(item)

    def upsert(self, item: dict[str, Any]) -> None:
        name = item["metadata"]["name"]
        if name not in self.running and (item.get("status") or {}).get("phase") == "Running":
            self.running[name] = time.time()

    def delete(self, item: dict[str, Any]) -> None:
        """Deletions do not matter here."""

    def wait(self, count: int, timeout: float) -> dict[str, float]:
        _wait(lambda: len(self.running) >= count, timeout, step=0.1)
        self._loop.call_soon_threadsafe(self._task.cancel)
        return dict(self.running)


def _operator_cycles(port: int) -> float:
    try:
        return float(operator_metrics(port)["cycles"])
    except OSError:
        return 0.0


def _plain_pods_per_second(api: Any, core: Any, *, count: int, workers: int) -> float:
    """The same number of plain 1-GPU pods created straight for the gpusched scheduler (no
    operator), created-to-Running per second."""
    plain = "bench-plain"
    core.create_namespace({"metadata": {"name": plain}})

    def create(i: int) -> None:
        core.create_namespaced_pod(
            plain,
            {
                "metadata": {"name": f"pod-{i:05d}", "annotations": {keys.SIM_RUNTIME: "1h"}},
                "spec": {
                    "schedulerName": keys.SCHEDULER_NAME,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                        }
                    ],
                },
            },
        )

    watcher = RunningWatcher(api, f"/api/v1/namespaces/{plain}/pods")
    started = time.time()
    _create_all(create, count, workers)
    running = watcher.wait(count, 300)
    finished = max(running.values()) if running else time.time()
    return round(len(running) / max(1e-9, finished - started), 1)


def _operator_cpu(cluster: LocalCluster) -> float:
    return cpu_seconds(cluster).get(OPERATOR, 0.0)


def _heartbeats(core: Any, names: list[str], rate: float, seconds: float) -> int:
    """Renew nodes' Ready heartbeat ``rate`` times a second, round robin, for ``seconds``
    (none: just wait); returns how many were written."""
    if rate <= 0:
        time.sleep(seconds)
        return 0
    started = time.monotonic()
    written = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate) + 1
        while written < due:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            beat = {"type": "Ready", "status": "True", "lastHeartbeatTime": now}
            core.patch_node_status(names[written % len(names)], {"status": {"conditions": [beat]}})
            written += 1
        time.sleep(max(0.0, (written / rate) - (time.monotonic() - started)))
    return written


def _operator_rss_mib(cluster: LocalCluster) -> float | None:
    for record in cluster.processes():
        if record.name == OPERATOR:
            for line in Path(f"/proc/{record.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    return None


def _restart(cluster: LocalCluster, port: int, start: Callable[[str], None]) -> dict[str, Any]:
    """The operator stopped and started again over every queued job: how long until it
    cycles, and the CPU and memory its start-up (lists and watches) costs."""
    (record,) = [r for r in cluster.processes() if r.name == OPERATOR]
    cluster.stop_process(record)
    default_progress("[bench] restart: operator started again over every queued job")
    started = time.time()
    start(OPERATOR)
    _wait(lambda: _operator_cycles(port) > 0, 600, step=0.2)
    first_cycle = time.time() - started
    cpu_at_cycle = _operator_cpu(cluster)
    time.sleep(30)  # kopf delivers its own initial list as events; then the reconcile LIST
    return {
        "seconds_to_first_cycle": round(first_cycle, 1),
        "cpu_seconds_to_first_cycle": round(cpu_at_cycle, 2),
        "cpu_seconds_after_30s_more": round(_operator_cpu(cluster), 2),
        "rss_mib": _operator_rss_mib(cluster),
    }


def _steady_state(
    api: Any,
    core: Any,
    custom: Any,
    port: int,
    cluster: LocalCluster,
    *,
    count: int,
    workers: int,
    explain_port: int,
    node_names: list[str],
    node_heartbeats: float = 0.0,
) -> dict[str, Any]:
    """``count`` jobs that wait for good; then what the operator asks of the API server, its
    CPU per queued job and memory, and how fast ``gpusched explain`` is answered: by the
    operator from its last cycle, and decided by the CLI itself over a fresh read.

    ``node_heartbeats``: Node status writes per second during the counting window, each
    renewing one node's Ready heartbeat (round robin), as kubelets do every few minutes with
    nothing new to report (kwok renews a Lease instead): what they cost the operator."""
    namespace = "bench-steady"
    core.create_namespace(body({"metadata": {"name": namespace}}))
    custom.create_cluster_custom_object(
        keys.GROUP, keys.VERSION, "tenantquotas", _quota("steady", namespace, 0, 0)
    )

    def create(i: int) -> None:
        custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, "gpujobs", job_manifest(f"wait-{i:05d}", 1)
        )

    default_progress(f"[bench] steady state: creating {count} GpuJobs that wait for good")
    cpu_before = _operator_cpu(cluster)
    created_at = time.monotonic()
    apply_seconds = _create_all(create, count, workers)
    default_progress("[bench] steady state: waiting until every one of them waits")

    def all_waiting() -> bool:
        listed: Any = custom.list_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, "gpujobs"
        )
        reasons = [(i.get("status") or {}).get("reason") for i in listed["items"]]
        return len(reasons) >= count and all(r == "QuotaExceeded" for r in reasons)

    reported = _wait(all_waiting, 3600, step=5)
    reported_seconds = time.monotonic() - created_at if reported else None
    time.sleep(10)  # writes of the last cycles land
    cpu_queued = _operator_cpu(cluster) - cpu_before
    window = 60.0
    default_progress(f"[bench] steady state: counting requests over {window:.0f} s")
    api_before = apiserver_requests(api)
    op_before = operator_metrics(port)
    cpu_window = _operator_cpu(cluster)
    beats = _heartbeats(core, node_names, node_heartbeats, window)
    op_after = operator_metrics(port)
    api_after = apiserver_requests(api)
    cpu_window = _operator_cpu(cluster) - cpu_window
    operator_requests = _diff(op_after["requests"], op_before["requests"])
    lists_by_kind = {
        key: n
        for key, n in _table(_diff(api_after, api_before), 1).items()
        if key.startswith("LIST")
    }
    api_lists = sum(lists_by_kind.values())
    cycles = op_after["cycles"] - op_before["cycles"]
    cycle_seconds = op_after["cycle_sum"] - op_before["cycle_sum"]
    explained = _explain_latency(api, namespace, count, explain_port)
    return {
        **explained,
        "queued_jobs": count,
        "apply_seconds": round(apply_seconds, 1),
        "first_create_to_all_reported_seconds": (
            None if reported_seconds is None else round(reported_seconds, 1)
        ),
        "window_seconds": window,
        "node_heartbeats": beats,
        "operator_cpu_seconds_in_window": round(cpu_window, 2),
        "cycles": cycles,
        "operator_lists": sum(n for (verb, *_), n in operator_requests.items() if verb == "LIST"),
        "operator_requests": dict(_table(operator_requests, 1)),
        "apiserver_lists_all_clients": api_lists,
        "apiserver_lists_by_resource": lists_by_kind,
        "operator_cpu_ms_per_queued_job": round(1000 * cpu_queued / max(1, count), 2),
        "operator_rss_mib": _operator_rss_mib(cluster),
        "cycle_mean_ms": round(1000 * cycle_seconds / max(1.0, cycles), 1),
        "cycle_p99_bucket_ms": (
            None
            if (bound := _cycle_p99_bound(op_after["buckets"], op_after["cycles"])) is None
            else 1000 * bound
        ),
    }


#: ``gpusched explain`` requests timed at steady state (answered by the operator), and decided
#: by the CLI itself (each a read of the whole cluster and a cycle).
EXPLAIN_ASKS = 50
EXPLAIN_LOCAL = 3


def _explain_latency(api: Any, namespace: str, count: int, explain_port: int) -> dict[str, Any]:
    """Wall time of ``gpusched explain`` for queued jobs drawn at random: the operator's
    answer over HTTP (what the CLI waits for before printing), and the CLI's own decision."""
    from gpusched.operator import asking
    from gpusched.operator.explainer import explain_in_cluster

    default_progress(f"[bench] steady state: {EXPLAIN_ASKS} explain requests to the operator")
    rng = random.Random(1)
    fetch = asking.at_url(f"http://127.0.0.1:{explain_port}")
    answered: list[float] = []
    for _ in range(EXPLAIN_ASKS):
        key = f"{namespace}/wait-{rng.randrange(count):05d}"
        started = time.perf_counter()
        asking.ask(fetch, key)
        answered.append(time.perf_counter() - started)
    default_progress(f"[bench] steady state: {EXPLAIN_LOCAL} explains decided by the CLI")
    local: list[float] = []
    for _ in range(EXPLAIN_LOCAL):
        key = f"{namespace}/wait-{rng.randrange(count):05d}"
        started = time.perf_counter()
        explain_in_cluster(api.configuration, key)
        local.append(time.perf_counter() - started)
    return {
        "explain_operator_p50_ms": percentile_ms(answered, 0.5),
        "explain_operator_p99_ms": percentile_ms(answered, 0.99),
        "explain_local_p50_ms": percentile_ms(local, 0.5),
    }


@click.command("admission-e2e")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--jobs", default=500, show_default=True, help="GpuJobs applied at once.")
@click.option("--nodes", default=64, show_default=True, help="Simulated 8-GPU H100 nodes.")
@click.option("--gpus", "gpus_per_job", default=1, show_default=True, help="GPUs per job.")
@click.option("--workers", default=16, show_default=True, help="Parallel creates.")
@click.option(
    "--steady-jobs",
    default=0,
    show_default=True,
    help="Then queue this many jobs that never fit and count the operator's LIST calls at "
    "steady state.",
)
@click.option(
    "--webhook/--no-webhook",
    default=True,
    show_default=True,
    help="Register the operator's validating webhook, as the chart does (each GpuJob create "
    "is reviewed).",
)
@click.option(
    "--record-delay",
    type=click.FloatRange(min=0),
    default=None,
    help="The operator's --record-delay (default: its own; 0 writes each admission before "
    "its pods, two status writes per job).",
)
@click.option(
    "--arrivals-on-top",
    type=click.FloatRange(min=0),
    default=None,
    help="The operator's --arrivals-on-top in seconds (default: its own; 0: every cycle "
    "decides the whole queue).",
)
@click.option(
    "--node-heartbeats",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="With --steady-jobs: Node status writes per second during the steady window, each "
    "renewing one node's Ready heartbeat (as kubelets do every few minutes).",
)
def admission_e2e(
    *,
    as_json: bool,
    node_heartbeats: float,
    jobs: int,
    nodes: int,
    gpus_per_job: int,
    workers: int,
    steady_jobs: int,
    record_delay: float | None,
    arrivals_on_top: float | None,
    webhook: bool,
) -> None:
    """GpuJobs per second from apply to Running, through the operator, the extender and a
    kube-scheduler on a fresh local control plane, beside plain pods, with API requests."""
    result = run_e2e(
        jobs,
        nodes,
        gpus_per_job,
        workers,
        steady_jobs,
        record_delay=record_delay,
        arrivals_on_top=arrivals_on_top,
        webhook=webhook,
        node_heartbeats=node_heartbeats,
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{result['running']}/{jobs} GpuJobs Running in {result['wall_seconds']} s "
        f"({result['jobs_per_second']} jobs/s; apply took {result['apply_seconds']} s); "
        f"apply->Running p50 {result['apply_to_running_p50_s']} s, "
        f"p99 {result['apply_to_running_p99_s']} s"
    )
    writes = result["operator_requests_per_job_by_kind"].get("PATCH gpujobs/status", 0.0)
    click.echo(
        f"status writes per job: {writes} (1: admission written with its pods running; near 2: "
        "pods ran after --record-delay, a slower mode; see docs/benchmarks.md)"
    )
    click.echo(
        f"same count of plain 1-GPU pods straight to the gpusched scheduler: "
        f"{result['plain_pods_per_second']} pods/s (GpuJobs at {result['ratio_to_plain_pods']}x)"
    )
    click.echo(
        f"API requests (apiserver_request_total): {result['api_requests_per_job']} per GpuJob, "
        f"{result['api_requests_per_plain_pod']} per plain pod; the operator's share "
        f"{result['operator_requests_per_job']} per job"
    )
    for name, per in result["operator_requests_per_job_by_kind"].items():
        click.echo(f"  operator {name}: {per} per job")
    steady = result.get("steady")
    if steady:
        click.echo(
            f"steady state, {steady['queued_jobs']} queued jobs: {steady['cycles']:.0f} cycles in "
            f"{steady['window_seconds']:.0f} s ({steady['node_heartbeats']} node heartbeats, "
            f"operator CPU {steady['operator_cpu_seconds_in_window']} s), "
            f"operator LIST calls {steady['operator_lists']}, "
            f"all clients' LISTs {steady['apiserver_lists_all_clients']}, cycle mean "
            f"{steady['cycle_mean_ms']} ms (p99 <= {steady['cycle_p99_bucket_ms']} ms); "
            f"operator CPU {steady['operator_cpu_ms_per_queued_job']} ms per queued job, "
            f"RSS {steady['operator_rss_mib']} MiB"
        )
        click.echo(
            f"first create to every one of them reporting its reason: "
            f"{steady['first_create_to_all_reported_seconds']} s"
        )
        click.echo(
            f"gpusched explain at {steady['queued_jobs']} queued jobs: answered by the operator "
            f"p50 {steady['explain_operator_p50_ms']} ms, p99 {steady['explain_operator_p99_ms']} "
            f"ms; decided by the CLI itself p50 {steady['explain_local_p50_ms']} ms"
        )
    restart = result.get("restart")
    if restart:
        click.echo(
            f"operator restarted over them: first cycle after "
            f"{restart['seconds_to_first_cycle']} s ({restart['cpu_seconds_to_first_cycle']} "
            f"CPU-s; {restart['cpu_seconds_after_30s_more']} CPU-s 30 s later), "
            f"RSS {restart['rss_mib']} MiB"
        )
