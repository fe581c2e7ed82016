"""``gpusched bench kueue-scenario``: Kueue's own scheduler scalability benchmark, played by Kueue
and by gpusched one after the other on the same local control plane and kwok nodes, with the
same figures side by side.

Kueue's benchmark (``test/performance/scheduler`` in ``sigs.k8s.io/kueue``, pinned in
``e2e/tools/kueue``) is a generator configuration (cohorts, ClusterQueues, workload classes with
run times, priorities and requests, created at fixed intervals), a runner that creates those
objects, marks each admitted Workload finished once its run time has passed since admission and
records what it sees, and ``minimalkueue`` (Kueue's core controllers and scheduler only). Its
range spec holds the published averages of the baseline scenario (5 cohorts x 6 queues x 500
workloads): 351 s wall, 55.9 % minimum queue usage, mean time to admission 16.5 s / 76.8 s /
215.5 s for the large / medium / small classes.

One invocation:

1. builds Kueue's two binaries if needed (cached; never part of the default toolchain), starts a
   fresh local cluster and creates kwok 8-GPU H100 nodes (with their NodeGpuTopology) whose GPUs
   add up to the scenario's nominal quotas;
2. **Kueue**: installs Kueue's CRDs, starts ``minimalkueue`` and Kueue's runner against the
   cluster exactly as Kueue's ``run-performance-scheduler-in-cluster`` target does (runner QPS
   1000, burst 2000), waits for its ``summary.yaml``, then removes every Kueue object and CRD;
3. **gpusched**: starts the extender with its kube-scheduler, then the operator (under its
   ServiceAccount) and at the same moment plays the same scenario (:mod:`kueue_plan`): a parent
   TenantQuota per cohort, a TenantQuota and namespace per ClusterQueue, a GpuJob per Workload
   created in Kueue's pattern (per queue and workload set: wait the interval, create, repeat);
   kwok ends each pod after the class's run time;
4. reports both with :mod:`kueue_stats`, the same arithmetic as Kueue's recorder and checker.

What differs between the two runs is part of the output (:data:`DIFFERENCES`). Figures to
record in docs/benchmarks.md, never assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import click
import yaml

from gpusched.api import keys
from gpusched.dev.bench.admission_e2e import H100, OPERATOR, cpu_seconds, operator_metrics
from gpusched.dev.bench.kueue_plan import (
    CLASS_LABEL,
    Scenario,
    cohort_quota,
    job_manifest,
    nodes_needed,
    parse_generator_config,
    priority_classes,
    queue_quota,
    scale,
)
from gpusched.dev.bench.kueue_stats import (
    ClassAdmission,
    ClassUsage,
    JobTimes,
    QueueEvent,
    class_admission,
    class_usage,
    kueue_summary_admission,
    kueue_summary_usage,
    parse_go_duration,
    parse_time,
    ratio,
)
from gpusched.dev.localcluster import LocalCluster, ensure_toolchain, identities
from gpusched.dev.localcluster.binaries import (
    KUEUE,
    default_progress,
    ensure_tool,
    module_source,
    repo_root,
)
from gpusched.dev.localcluster.components import gpusched_command, start_scheduler
from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.kube import body
from gpusched.kubeasync import ApiError, AsyncApi, BlockingApi
from gpusched.kubewatch import Reflector

GPUS_PER_NODE = 8
#: Kueue's generator configurations, in its module's source tree.
CONFIGS = "test/performance/scheduler/configs"
#: Scenario name -> (Kueue's configuration directory, cohorts, queues per cohort set); None
#: keeps Kueue's count. Kueue's large-scale scenario has 10 cohorts x 100 queues (1,000
#: ClusterQueues, 50,000 workloads, about 20 minutes on Kueue's CI); ``large-scale`` here keeps
#: its cohorts and per-queue load with 10 queues per cohort (100 queues, 5,000 workloads).
SCENARIOS: dict[str, tuple[str, int | None, int | None]] = {
    "baseline": ("baseline", None, None),
    "large-scale": ("large-scale", None, 10),
}
#: Kueue's published averages (range spec comments of v0.19.2), for the output.
PUBLISHED = {
    "baseline": {
        "wall_seconds": 351.1,
        "min_usage_percent": {"cq": 55.9},
        "mean_time_to_admission_seconds": {"large": 16.5, "medium": 76.8, "small": 215.5},
    },
}
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
#: Kueue's generator labels what its cleanup deletes.
KUEUE_CLEANUP_LABEL = "kueue.x-k8s.io/performance-scheduler-cleanup"
#: Kueue's kinds its benchmark creates (plural, namespaced).
KUEUE_KINDS = (
    ("workloads", True),
    ("localqueues", True),
    ("clusterqueues", False),
    ("resourceflavors", False),
    ("cohorts", False),
)
DIFFERENCES = (
    "Kueue admits Workloads without pods: its runner marks a Workload finished once its run "
    "time has passed since admission, and no pod is created, scheduled or run. gpusched admits "
    "a GpuJob only with a placement on GPUs of real (kwok) nodes, creates its pods, the "
    "extender binds them through kube-scheduler, kwok runs them for the class's run time, and "
    "the operator sees them end.",
    "Kueue's requests are CPUs of one ResourceFlavor, counted only; here they are GPUs of 8-GPU "
    "H100 nodes. A request larger than a node is a gang (20 GPUs: 5 pods x 4 GPUs), placed all "
    "or nothing; a 5-GPU job must fit one node, so nodes fragment where Kueue's pool cannot.",
    "Kueue's cohort is a parent TenantQuota (guarantee and borrowing limit = the cohort's "
    "nominal quotas together); a ClusterQueue is a child TenantQuota (guarantee = nominal "
    "quota, borrowing limit = nominal + Kueue's borrowing limit, the same preemption "
    "policies); a workload's priority is a PriorityClass of the same value.",
    "Time to admission: Kueue's runner measures from the first event it sees of a Workload to "
    "the event showing it admitted. gpusched's is from the moment the create returned to the "
    "operator's admission (the Admitted condition's time; the status write may follow up to "
    "the operator's --record-delay later, with the pods running).",
    "Wall time: from the start of the scheduler process (minimalkueue / the operator, started "
    "as the generation starts) to the end of the run (Kueue: its runner's summary written; "
    "gpusched: every queue empty and every job ended). gpusched's extender and kube-scheduler "
    "are started before, as part of the cluster.",
    "Queue usage: Kueue integrates its ClusterQueues' status usage between status events; "
    "gpusched the same over its TenantQuotas' status.usedGpus, which the operator writes at "
    "most once a second per tenant: what the operator accounts as held (jobs admitted in its "
    "view, whose end it may not have recorded yet), not the pods' own run time.",
    "Clients: Kueue's generator is Go (QPS 1000, burst 2000), minimalkueue QPS 50 burst 100; "
    "gpusched's generator is this Python process (asyncio). Neither run has webhooks. The "
    "cluster is the same: kube-apiserver (max-requests-inflight 1600, Kueue's envtest uses "
    "5000), etcd, kube-controller-manager, kube-scheduler, kwok and the nodes, on this machine.",
)

Progress = Callable[[str], None]


def load_scenario(
    name: str, config: Path | None, cohorts: int | None, queues: int | None, source: Path
) -> tuple[dict[str, Any], Scenario]:
    """The generator configuration to play (Kueue's own, scaled as asked) and its reading."""
    if config is None:
        directory, default_cohorts, default_queues = SCENARIOS[name]
        config = source / CONFIGS / directory / "generator.yaml"
        cohorts = cohorts if cohorts is not None else default_cohorts
        queues = queues if queues is not None else default_queues
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    if cohorts is not None or queues is not None:
        raw = scale(raw, cohorts=cohorts, queues=queues)
    return raw, parse_generator_config(raw)


def run_scenario(
    name: str,
    *,
    config: Path | None = None,
    cohorts: int | None = None,
    queues: int | None = None,
    run: tuple[str, ...] = ("kueue", "gpusched"),
    record_delay: float | None = None,
    operator_args: tuple[str, ...] = (),
    timeout: float = 3600.0,
    progress: Progress = default_progress,
) -> dict[str, Any]:
    """See the module docstring."""
    toolchain = ensure_toolchain(progress)
    kueue_bin = ensure_tool(KUEUE, progress) if "kueue" in run else None
    source = module_source(KUEUE, progress)
    raw, scenario = load_scenario(name, config, cohorts, queues, source)
    nodes = nodes_needed(scenario, GPUS_PER_NODE)
    result: dict[str, Any] = {
        "scenario": name if config is None else str(config),
        "date": date.today().isoformat(),
        "kueue_version": KUEUE.version(repo_root() / "e2e" / "tools"),
        "cohorts": len(scenario.cohorts),
        "queues": len(scenario.queues),
        "workloads": scenario.workloads,
        "nominal_gpus": scenario.nominal,
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "published_kueue": PUBLISHED.get(name)
        if config is None and not (cohorts or queues)
        else None,
        "differences": list(DIFFERENCES),
        "operator_args": list(operator_args),
    }
    progress(
        f"[bench] scenario {result['scenario']}: {len(scenario.cohorts)} cohorts, "
        f"{len(scenario.queues)} queues, {scenario.workloads} workloads, "
        f"{scenario.nominal} GPUs on {nodes} nodes"
    )
    with tempfile.TemporaryDirectory(prefix="gpusched-kueue-") as tmp:
        workdir = Path(tmp)
        config_file = workdir / "generator.yaml"
        config_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        cluster = LocalCluster(workdir / "cluster", toolchain)
        cluster.up()
        try:
            cluster.install_crds(repo_root() / "crds")
            _create_nodes(cluster, nodes, progress)
            if kueue_bin is not None:
                result["kueue"] = run_kueue(
                    cluster,
                    kueue_bin,
                    source=source,
                    config_file=config_file,
                    out=workdir / "kueue",
                    timeout=timeout,
                    progress=progress,
                )
            if "gpusched" in run:
                result["gpusched"] = run_gpusched(
                    cluster,
                    scenario,
                    record_delay=record_delay,
                    operator_args=operator_args,
                    timeout=timeout,
                    progress=progress,
                )
        finally:
            cluster.down()
    if "kueue" in result and "gpusched" in result:
        result["ratios"] = ratios(result["gpusched"], result["kueue"])
    return result


def _create_nodes(cluster: LocalCluster, count: int, progress: Progress) -> None:
    api = cluster.api_client()
    names = [f"node-{i:04d}" for i in range(count)]
    progress(f"[bench] creating {count} simulated 8-GPU H100 nodes with their NodeGpuTopology")

    def create(name: str) -> None:
        topology, health = fixture_objects("hgx-h100-sxm-8gpu-8nic", name)
        add_gpu_nodes(
            api,
            [name],
            GPUS_PER_NODE,
            labels={keys.GFD_PRODUCT: H100},
            topology=topology,
            status=health,
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, names))
    wait_nodes_ready(api, names, timeout=300)


# --- Kueue -------------------------------------------------------------------------------


def run_kueue(
    cluster: LocalCluster,
    binaries: Path,
    *,
    source: Path,
    config_file: Path,
    out: Path,
    timeout: float,
    progress: Progress,
) -> dict[str, Any]:
    """Kueue's benchmark as its ``run-performance-scheduler-in-cluster`` target runs it, with
    minimalkueue started beside it as its envtest mode does; then every Kueue object removed."""
    crds = source / "config" / "components" / "crd" / "bases"
    progress("[kueue] installing Kueue's CRDs")
    cluster.install_crds(crds)
    out.mkdir(parents=True)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        # Kueue's test utilities look for the Kueue checkout at start-up (PROJECT_DIR, as its
        # Makefile sets it, else a Makefile above the working directory) and exit without one;
        # the runner uses nothing from it in this mode.
        "PROJECT_DIR": str(out / "project"),
    }
    api = BlockingApi(cluster.api_client().configuration)
    cpu_before = cpu_seconds(cluster)
    progress("[kueue] starting minimalkueue and Kueue's runner (its generator, finisher, recorder)")
    started = time.time()
    minimal = cluster.spawn(
        "minimalkueue", [str(binaries / "minimalkueue"), f"--kubeconfig={cluster.kubeconfig}"], env
    )
    runner = cluster.spawn(
        "kueue-runner",
        [
            str(binaries / "performance-scheduler-runner"),
            f"--o={out}",
            f"--generatorConfig={config_file}",
            "--qps=1000",
            "--burst=2000",
            f"--timeout={int(timeout)}s",
        ],
        env,
    )
    summary_file = out / "summary.yaml"
    generated: float | None = None
    last_report = time.monotonic()
    try:
        while not summary_file.exists():
            if not is_running(runner) and not summary_file.exists():
                raise RuntimeError(
                    f"Kueue's runner ended without a summary; its log: {runner.log}\n"
                    + _tail(Path(runner.log))
                )
            if not is_running(minimal):
                raise RuntimeError(
                    f"minimalkueue ended; its log: {minimal.log}\n" + _tail(Path(minimal.log))
                )
            if time.monotonic() - last_report >= 15:
                last_report = time.monotonic()
                progress(f"[kueue] {time.time() - started:.0f} s: {_kueue_queues(api)}")
            time.sleep(1)
        ended = summary_file.stat().st_mtime
        cpu_after = cpu_seconds(cluster)
        progress(f"[kueue] done in {ended - started:.1f} s; waiting for its runner's cleanup")
        deadline = time.monotonic() + 600
        while is_running(runner) and time.monotonic() < deadline:
            time.sleep(1)
        summary = yaml.safe_load(summary_file.read_text(encoding="utf-8"))
        generated = _generator_seconds(Path(runner.log))
    finally:
        _teardown_kueue(cluster, api, crds=crds, minimal=minimal, runner=runner, progress=progress)
        api.close()
    admission = kueue_summary_admission(summary)
    usage = kueue_summary_usage(summary)
    return {
        "wall_seconds": round(ended - started, 1),
        **figures(admission, usage),
        "dropped_workload_events": summary.get("droppedWorkloadEvents", 0),
        # Kueue's generator, from its runner's log: how long creating every object took.
        "generation_seconds": None if generated is None else round(generated, 1),
        # Up to the summary: minimalkueue and the runner were still running then.
        "cpu_seconds": _cpu_diff(cpu_after, cpu_before),
        "summary": summary,
    }


def _generator_seconds(log: Path) -> float | None:
    """The duration Kueue's runner logs when its generator is done."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r'Generator done\s+\{"duration": "([^"]+)"', text)
    return parse_go_duration(found.group(1)) if found else None


def _kueue_queues(api: BlockingApi) -> str:
    """One progress line: what Kueue's ClusterQueues report."""
    try:
        listed = api.request("GET", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/clusterqueues")
    except ApiError as err:
        return f"cluster queues not readable ({err})"
    items = listed.get("items") or []
    status = [i.get("status") or {} for i in items]
    pending = sum(int(s.get("pendingWorkloads") or 0) for s in status)
    admitted = sum(int(s.get("admittedWorkloads") or 0) for s in status)
    return f"{len(items)} cluster queues: {pending} workloads pending, {admitted} admitted"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _teardown_kueue(
    cluster: LocalCluster,
    api: BlockingApi,
    *,
    crds: Path,
    minimal: ProcessRecord,
    runner: ProcessRecord,
    progress: Progress,
) -> None:
    """Leave the cluster as before Kueue's run: its runner's cleanup (the namespaces and
    queues it labelled) finished while minimalkueue still removes its finalizers, then any
    finalizer left stripped, every Kueue object and CRD deleted."""
    if is_running(runner):
        cluster.stop_process(runner)
    progress("[kueue] teardown: waiting for the benchmark's namespaces to go")
    _wait_gone(api, f"/api/v1/namespaces?labelSelector={KUEUE_CLEANUP_LABEL}", 600, progress)
    cluster.stop_process(minimal)
    for plural, namespaced in KUEUE_KINDS:
        path = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{plural}"
        try:
            items = api.request("GET", path).get("items") or []
        except ApiError:
            continue
        for item in items:
            meta = item["metadata"]
            where = (
                f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/namespaces/{meta['namespace']}/{plural}"
                if namespaced
                else path
            )
            if meta.get("finalizers"):
                api.request(
                    "PATCH",
                    f"{where}/{meta['name']}",
                    {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json",
                )
    progress("[kueue] teardown: deleting Kueue's CRDs")
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=true", "--timeout=600s", "-f", str(crds)
    )
    _wait_gone(api, f"/api/v1/namespaces?labelSelector={KUEUE_CLEANUP_LABEL}", 600, progress)


def _wait_gone(api: BlockingApi, path: str, timeout: float, progress: Progress) -> None:
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    while time.monotonic() < deadline:
        left = len(api.request("GET", path).get("items") or [])
        if not left:
            return
        if time.monotonic() - last_report >= 15:
            last_report = time.monotonic()
            progress(f"[kueue] teardown: {left} left at {path}")
        time.sleep(2)
    progress(f"[kueue] teardown: still there after {timeout:.0f} s: {path}")


# --- gpusched ----------------------------------------------------------------------------


class QueueRecorder:
    """Records the leaf TenantQuotas' status, as Kueue's recorder records its ClusterQueues'
    (a watch: the benchmark must not load the API server it measures). Only changes of what
    Kueue's recorder looks at are kept (used GPUs, pending and admitted jobs): the operator
    also rewrites a quota's status for metering alone, which Kueue never does, and that would
    stretch a queue's span."""

    def __init__(self, queues: int) -> None:
        self.queues = queues
        self.events: list[QueueEvent] = []
        self.latest: dict[str, tuple[int, int, int]] = {}
        self.recording = True
        self.changed = asyncio.Event()
        #: When the queues last turned idle (None while they are not).
        self.idle_since: float | None = None

    def replace(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.upsert(item)

    def upsert(self, item: dict[str, Any]) -> None:
        spec, meta = item.get("spec") or {}, item["metadata"]
        if not spec.get("parent") or not self.recording:
            return
        status = item.get("status") or {}
        state = (
            int(status.get("usedGpus") or 0),
            int(status.get("pendingJobs") or 0),
            int(status.get("admittedJobs") or 0),
        )
        name = meta["name"]
        if self.latest.get(name) == state:
            return
        self.latest[name] = state
        now = time.time()
        if not self.idle():
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        self.events.append(
            QueueEvent(
                time=now,
                queue=name,
                class_name=(meta.get("labels") or {}).get(CLASS_LABEL, ""),
                nominal=float(spec.get("guaranteedGpus") or 0),
                usage=float(state[0]),
            )
        )
        self.changed.set()

    def delete(self, item: dict[str, Any]) -> None:
        """Quotas are not deleted during the run."""

    def idle(self) -> bool:
        """Every queue reported, none with pending or admitted jobs (Kueue's recorder's end)."""
        return len(self.latest) >= self.queues and all(
            pending == 0 and admitted == 0 for _used, pending, admitted in self.latest.values()
        )


class Generator:
    """Plays a scenario's objects in Kueue's generator's pattern: per queue, its quota and
    namespace, then every workload set concurrently, each waiting its interval before each
    create (so a slow create delays the rest of its set, as in Kueue's)."""

    def __init__(self, api: AsyncApi, scenario: Scenario) -> None:
        self.api = api
        self.scenario = scenario
        #: (namespace, name) -> when its create returned.
        self.created: dict[tuple[str, str], float] = {}
        self.retries = 0
        self.done = False
        self.finished_at: float | None = None

    async def _post(self, path: str, manifest: dict[str, Any]) -> None:
        """Create, retrying what an overloaded API server answers (429, 5xx, timeouts)."""
        for attempt in range(10):
            try:
                await self.api.request("POST", path, manifest)
                return
            except ApiError as err:
                if err.status == 409:
                    return
                if err.status != 429 and err.status < 500:
                    raise
            except TimeoutError:
                pass
            self.retries += 1
            await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
        raise RuntimeError(f"creating {path} failed 10 times")

    async def run(self) -> None:
        prefix = f"/apis/{keys.GROUP}/{keys.VERSION}"
        await asyncio.gather(
            *(self._post(f"{prefix}/tenantquotas", cohort_quota(c)) for c in self.scenario.cohorts)
        )
        await asyncio.gather(*(self._queue(q) for q in self.scenario.queues))
        self.done = True
        self.finished_at = time.time()

    async def _queue(self, queue: Any) -> None:
        prefix = f"/apis/{keys.GROUP}/{keys.VERSION}"
        await self._post(f"{prefix}/tenantquotas", queue_quota(queue))
        await self._post("/api/v1/namespaces", {"metadata": {"name": queue.name}})
        await asyncio.gather(*(self._set(queue.name, s) for s in queue.workload_sets))

    async def _set(self, namespace: str, workload_set: Any) -> None:
        path = f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{namespace}/gpujobs"
        delay = workload_set.interval_ms / 1000
        for name, workload in workload_set.names():
            await asyncio.sleep(delay)
            await self._post(path, job_manifest(name, workload, GPUS_PER_NODE))
            self.created[(namespace, name)] = time.time()


def run_gpusched(
    cluster: LocalCluster,
    scenario: Scenario,
    *,
    record_delay: float | None,
    timeout: float,
    progress: Progress,
    operator_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The scenario through gpusched's operator, extender and kube-scheduler."""
    from kubernetes import client

    api = cluster.api_client()
    for manifest in priority_classes(scenario):
        client.SchedulingV1Api(api).create_priority_class(body(manifest))
    progress("[gpusched] starting the extender and its kube-scheduler")
    start_scheduler(cluster)
    kubeconfig = identities.kubeconfig(cluster, identities.OPERATOR)
    cpu_before = cpu_seconds(cluster)
    own_cpu_before = time.process_time()
    progress("[gpusched] starting the operator and the generator")
    metrics_port = free_port()
    started = time.time()
    cluster.spawn(
        OPERATOR,
        [
            *gpusched_command(),
            "operator",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-port={metrics_port}",
            f"--health-port={free_port()}",
            f"--explain-port={free_port()}",
            "--resync=5",
            *([f"--record-delay={record_delay}"] if record_delay is not None else []),
            *operator_args,
        ],
    )
    outcome = asyncio.run(_play(api.configuration, scenario, started, timeout, progress))
    cpu_after = cpu_seconds(cluster)
    own_cpu = time.process_time() - own_cpu_before
    requests = operator_metrics(metrics_port)["requests"]
    generator, recorder, ended, items = outcome
    jobs = [_job_times(item, generator.created) for item in items]
    admission = class_admission(j for j in jobs if j is not None)
    usage = class_usage(recorder.events)
    finishes = [j.finished for j in jobs if j is not None and j.finished is not None]
    # The queues report idle up to a second after the last job ends (quota status is written
    # at most once a second), and a last job admitted and ended between two writes may not
    # show in them at all: the run ends at the later of the two.
    if ended is not None:
        ended = max([ended, *finishes])
    processes = _cpu_diff(cpu_after, cpu_before)
    processes["generator (this process)"] = round(own_cpu, 1)
    return {
        # None: the run did not end within --timeout (the figures below are of the jobs so far).
        "wall_seconds": None if ended is None else round(ended - started, 1),
        "completed": ended is not None,
        "seconds_observed": round(time.time() - started, 1),
        "jobs_ended": sum(1 for j in jobs if j is not None and j.finished is not None),
        "jobs_admitted": sum(1 for j in jobs if j is not None and j.admitted is not None),
        "last_job_finished_seconds": round(max(finishes) - started, 1) if finishes else None,
        **figures(admission, usage),
        "jobs_not_ended": sum(1 for j in jobs if j is None or j.finished is None),
        "create_retries": generator.retries,
        "generation_seconds": (
            None if generator.finished_at is None else round(generator.finished_at - started, 1)
        ),
        "cpu_seconds": processes,
        # What the operator asked of the API server over the run (its own counters).
        "operator_requests": {
            f"{verb} {resource}": n for (verb, resource, _), n in requests.most_common()
        },
    }


async def _play(
    configuration: Any, scenario: Scenario, started: float, timeout: float, progress: Progress
) -> tuple[Generator, QueueRecorder, float | None, list[dict[str, Any]]]:
    """Generate, record the quotas, and wait until every queue is empty and every job ended
    (or ``timeout``: then the end is None); the jobs as listed then."""
    api = AsyncApi(configuration, connections=128, timeout_seconds=60)
    recorder = QueueRecorder(len(scenario.queues))
    generator = Generator(api, scenario)
    reflector = Reflector(
        "bench-tenantquotas", api, f"/apis/{keys.GROUP}/{keys.VERSION}/tenantquotas", recorder
    )
    watch = reflector.start()
    generating = asyncio.create_task(generator.run())
    jobs_path = f"/apis/{keys.GROUP}/{keys.VERSION}/gpujobs"
    last_report = time.monotonic()
    try:
        while True:
            if generating.done():
                generating.result()  # raises what stopped the generator
            recorder.changed.clear()
            idle_since = recorder.idle_since
            if generator.done and idle_since is not None:
                items, _version = await api.list(jobs_path, page_size=1000)
                if len(items) >= scenario.workloads and all(_ended(i) for i in items):
                    recorder.recording = False
                    return generator, recorder, idle_since, items
                progress(
                    f"[gpusched] queues report idle but {sum(not _ended(i) for i in items)} "
                    "jobs have not ended; waiting"
                )
            if time.time() - started > timeout:
                progress(
                    f"[gpusched] not ended within {timeout:.0f} s: reporting what happened so far"
                )
                recorder.recording = False
                items, _version = await api.list(jobs_path, page_size=1000)
                return generator, recorder, None, items
            if time.monotonic() - last_report >= 15:
                last_report = time.monotonic()
                states = recorder.latest.values()
                progress(
                    f"[gpusched] {time.time() - started:.0f} s: {len(generator.created)} of "
                    f"{scenario.workloads} jobs created; queues report "
                    f"{sum(s[1] for s in states)} pending, {sum(s[2] for s in states)} admitted"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorder.changed.wait(), timeout=5)
    finally:
        watch.cancel()
        if not generating.done():
            generating.cancel()
        await asyncio.gather(watch, generating, return_exceptions=True)
        await api.close()


def _ended(item: dict[str, Any]) -> bool:
    return (item.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _job_times(item: dict[str, Any], created: dict[tuple[str, str], float]) -> JobTimes | None:
    """A GpuJob's figures from its status: admitted at its Admitted condition's time (the
    operator's decision; admittedAt without one), finished at finishedAt."""
    meta, status = item["metadata"], item.get("status") or {}
    made = created.get((meta["namespace"], meta["name"]))
    if made is None:
        return None
    admitted: float | None = None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Admitted" and condition.get("status") == "True":
            admitted = parse_time(condition["lastTransitionTime"])
    if admitted is None and status.get("admittedAt"):
        admitted = parse_time(status["admittedAt"])
    finished = status.get("finishedAt")
    return JobTimes(
        class_name=(meta.get("labels") or {}).get(CLASS_LABEL, ""),
        created=made,
        admitted=admitted,
        finished=parse_time(finished) if finished else None,
        evictions=int(status.get("preemptionCount") or 0),
    )


# --- figures -----------------------------------------------------------------------------


def _cpu_diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    rows = {name: after[name] - before.get(name, 0.0) for name in after}
    return {k: round(v, 1) for k, v in sorted(rows.items(), key=lambda kv: -kv[1]) if v >= 0.1}


def figures(admission: dict[str, ClassAdmission], usage: dict[str, ClassUsage]) -> dict[str, Any]:
    """The benchmark's figures per class, in the output's units (seconds, percent)."""
    return {
        "mean_time_to_admission_seconds": {
            name: None if a.mean_time_to_admission is None else round(a.mean_time_to_admission, 1)
            for name, a in sorted(admission.items())
        },
        "mean_time_to_finish_seconds": {
            name: None if a.mean_time_to_finish is None else round(a.mean_time_to_finish, 1)
            for name, a in sorted(admission.items())
        },
        "workloads_per_class": {name: a.count for name, a in sorted(admission.items())},
        "evictions_per_class": {name: a.evictions for name, a in sorted(admission.items())},
        "min_usage_percent": {
            name: None if u.percent is None else round(u.percent, 1)
            for name, u in sorted(usage.items())
        },
        "queue_class_span_seconds": {name: round(u.span, 1) for name, u in sorted(usage.items())},
    }


def ratios(gpusched: dict[str, Any], kueue: dict[str, Any]) -> dict[str, Any]:
    """gpusched's figure over Kueue's, figure by figure (wall and waits: below 1 is better for
    gpusched; usage: above 1 is)."""

    def per_class(key: str) -> dict[str, float | None]:
        ours, theirs = gpusched[key], kueue[key]
        return {
            name: None if (r := ratio(ours.get(name), theirs.get(name))) is None else round(r, 2)
            for name in sorted(set(ours) | set(theirs))
        }

    if not gpusched.get("completed", True):
        # Its waits and usage are over the jobs that got through only: no ratio means much.
        return {"wall_seconds": None, "mean_time_to_admission_seconds": {}, "min_usage_percent": {}}
    wall = ratio(gpusched["wall_seconds"], kueue["wall_seconds"])
    return {
        "wall_seconds": None if wall is None else round(wall, 2),
        "mean_time_to_admission_seconds": per_class("mean_time_to_admission_seconds"),
        "min_usage_percent": per_class("min_usage_percent"),
    }


def _print_table(result: dict[str, Any]) -> None:
    kueue, ours, ratio_ = result.get("kueue"), result.get("gpusched"), result.get("ratios") or {}
    published = result.get("published_kueue") or {}
    click.echo(
        f"Kueue {result['kueue_version']} scenario {result['scenario']}: {result['cohorts']} "
        f"cohorts, {result['queues']} queues, {result['workloads']} workloads, "
        f"{result['nominal_gpus']} GPUs on {result['nodes']} nodes ({result['date']})"
    )
    rows: list[tuple[str, Any, Any, Any, Any]] = []

    def value(run: dict[str, Any] | None, key: str, name: str | None = None) -> Any:
        if run is None:
            return "-"
        found = run.get(key)
        return found.get(name, "-") if name is not None and isinstance(found, dict) else found

    rows.append(
        (
            "wall, s",
            published.get("wall_seconds", "-"),
            value(kueue, "wall_seconds"),
            value(ours, "wall_seconds"),
            ratio_.get("wall_seconds", "-"),
        )
    )
    for key, label in (
        ("mean_time_to_admission_seconds", "time to admission, {}, s"),
        ("min_usage_percent", "usage, queue class {}, %"),
    ):
        for name in sorted(set((kueue or {}).get(key, {})) | set((ours or {}).get(key, {}))):
            rows.append(
                (
                    label.format(name),
                    published.get(key, {}).get(name, "-"),
                    value(kueue, key, name),
                    value(ours, key, name),
                    ratio_.get(key, {}).get(name, "-"),
                )
            )
    click.echo(
        f"{'figure':34} {'Kueue published':>16} {'Kueue here':>11} {'gpusched':>9} {'ratio':>6}"
    )
    for row in rows:
        click.echo(f"{row[0]:34} {row[1]!s:>16} {row[2]!s:>11} {row[3]!s:>9} {row[4]!s:>6}")
    click.echo("ratio: gpusched / Kueue here (wall and waits: lower is better; usage: higher)")
    if ours is not None and not ours.get("completed", True):
        click.echo(
            f"gpusched did not end within the timeout: {ours['jobs_ended']} of "
            f"{result['workloads']} jobs ended, {ours['jobs_admitted']} admitted in "
            f"{ours['seconds_observed']} s (its figures are over those jobs only)"
        )
    click.echo("What differs between the two runs:")
    for sentence in result["differences"]:
        click.echo(f"- {sentence}")


@click.command("kueue-scenario")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--scenario",
    type=click.Choice(sorted(SCENARIOS)),
    default="baseline",
    show_default=True,
    help="Kueue's generator configuration: baseline (5 cohorts x 6 queues x 500 workloads), or "
    "large-scale scaled down to 10 queues per cohort (Kueue: 100).",
)
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Another generator configuration in Kueue's format (instead of --scenario).",
)
@click.option("--cohorts", type=click.IntRange(min=1), default=None, help="Cohorts per set.")
@click.option("--queues", type=click.IntRange(min=1), default=None, help="Queues per cohort set.")
@click.option(
    "--run",
    "runs",
    type=click.Choice(["both", "kueue", "gpusched"]),
    default="both",
    show_default=True,
    help="Which scheduler plays the scenario.",
)
@click.option(
    "--record-delay",
    type=click.FloatRange(min=0),
    default=None,
    help="The operator's --record-delay (default: its own).",
)
@click.option(
    "--operator-arg",
    "operator_args",
    multiple=True,
    metavar="ARG",
    help="One more argument for the operator, e.g. --operator-arg=--reservations-per-tenant=1 "
    "(repeatable).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=60),
    default=3600,
    show_default=True,
    help="Longest each run may take, seconds.",
)
def kueue_scenario(
    *,
    as_json: bool,
    scenario: str,
    config: Path | None,
    cohorts: int | None,
    queues: int | None,
    runs: str,
    record_delay: float | None,
    operator_args: tuple[str, ...],
    timeout: float,
) -> None:
    """Kueue's own scheduler benchmark through Kueue (minimalkueue and its runner) and through
    gpusched, one after the other on the same local cluster: wall time, time to admission per
    class and minimum queue usage side by side, with ratios."""
    run = ("kueue", "gpusched") if runs == "both" else (runs,)
    result = run_scenario(
        scenario,
        config=config,
        cohorts=cohorts,
        queues=queues,
        run=run,
        record_delay=record_delay,
        operator_args=operator_args,
        timeout=timeout,
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        _print_table(result)
