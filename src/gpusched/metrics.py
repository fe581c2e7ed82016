"""Every Prometheus metric gpusched exports, defined once.

Names follow Prometheus conventions (``gpusched_`` prefix, base units, ``_total`` for counters);
docs/metrics.md lists them for dashboard authors. Each component registers only its own section
on its own registry (``probe_registry()`` etc.), so a process exports just what it owns and tests
can create fresh registries.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpusched.api.gpujob import TopologyScope

NAMESPACE = "gpusched"


def new_registry() -> CollectorRegistry:
    """A registry without the default process collectors, for tests and embedded use."""
    return CollectorRegistry(auto_describe=True)


def set_labelled_series(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Set one series per label set (in the gauge's label order) and drop the others. New
    values go in before vanished label sets go out, so a scrape on another thread in between
    sees every series that was there before and is there after (clearing first would hand it
    an empty gauge: panels blink and alerts' `for` timers restart)."""
    current = {
        tuple(sample.labels.values()) for family in gauge.collect() for sample in family.samples
    }
    for key, value in values.items():
        gauge.labels(*key).set(value)
    for key in current - set(values):
        gauge.remove(*key)


# --- scheduler (extender) -----------------------------------------------------------------


#: Extender call buckets: sub-millisecond filters up to kube-scheduler's httpTimeout (the chart's
#: 30 s). histogram_quantile never answers above the top finite bucket, so a p99 alert's
#: threshold must stay below it (the chart's schema says so) or the alert could never fire.
EXTENDER_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class SchedulerMetrics:
    """Metrics of the scheduler extender."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        self.request_seconds = Histogram(
            "extender_request_duration_seconds",
            "Time to answer one extender call, by verb (filter, prioritize, bind).",
            ["verb"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=EXTENDER_LATENCY_BUCKETS,
        )
        self.placements = Counter(
            "placements",
            "Pods bound, by the achieved topology class of their GPU set.",
            ["topology_class"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        # Every class exported from the start at 0, so the first bind of a class shows in
        # rate() and increase() (a series that appears at 1 looks like no change).
        for scope in TopologyScope:
            self.placements.labels(scope.value)
        self.bind_errors = Counter(
            "bind_errors",
            "Bind calls that failed, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.refused_nodes = Counter(
            "filter_refused_nodes",
            "Nodes refused by filter, by machine reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.free_gpus = Gauge(
            "free_gpus",
            "Healthy GPUs not held by any pod, by GPU model.",
            ["gpu_model"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.node_inventory = NodeInventoryCollector()
        self.registry.register(self.node_inventory)


class NodeGpuCounts(Protocol):
    """One node's line of the per-node GPU gauges (the extender's ``NodeInventory``)."""

    @property
    def node(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def allocated(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def unavailable(self) -> int: ...
    @property
    def largest_free_nvlink_set(self) -> int: ...


NODE_GPUS_DOC = (
    "GPUs of each node by state: allocated (held by pods or binds in flight), free "
    "(placeable, not held), unavailable (unhealthy, unschedulable or MIG)."
)
LARGEST_FREE_NVLINK_SET_DOC = (
    "The most free GPUs of the node with NVLink between every pair: the largest nvlink-scoped "
    "set a job could get there now (fragmentation shows as free GPUs well above it)."
)


class NodeInventoryCollector(Collector):
    """``gpusched_node_gpus`` and ``gpusched_node_largest_free_nvlink_set_gpus``, read at scrape
    time from the last published rows.

    On a 5,000-node cluster these are 20,000 series. Kept as labelled Gauge children, clearing
    and setting them every housekeeping tick held the extender's event loop for 150-450 ms, and
    every filter call arriving meanwhile waited. Here publishing is one reference swap of an
    immutable tuple (a scrape sees one tick's rows whole, never half of two), and the series
    are built only when Prometheus asks, in the scrape's thread.
    """

    def __init__(self) -> None:
        self.rows: tuple[NodeGpuCounts, ...] = ()

    def publish(self, rows: Iterable[NodeGpuCounts]) -> None:
        """Replace the rows (nodes gone from the cache disappear from the next scrape)."""
        self.rows = tuple(rows)

    def describe(self) -> list[Metric]:
        return list(self._families(()))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.rows)

    @staticmethod
    def _families(rows: tuple[NodeGpuCounts, ...]) -> tuple[Metric, Metric]:
        gpus = GaugeMetricFamily(
            f"{NAMESPACE}_node_gpus", NODE_GPUS_DOC, labels=("node", "gpu_model", "state")
        )
        largest = GaugeMetricFamily(
            f"{NAMESPACE}_node_largest_free_nvlink_set_gpus",
            LARGEST_FREE_NVLINK_SET_DOC,
            labels=("node",),
        )
        for row in rows:
            gpus.add_metric((row.node, row.model, "allocated"), row.allocated)
            gpus.add_metric((row.node, row.model, "free"), row.free)
            gpus.add_metric((row.node, row.model, "unavailable"), row.unavailable)
            largest.add_metric((row.node,), row.largest_free_nvlink_set)
        return gpus, largest


# --- device probe -------------------------------------------------------------------------


class ProbeMetrics:
    """Metrics of the device probe (one process per node, so no node label)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        self.gpu_health = Gauge(
            "probe_gpu_health",
            "1 for each GPU's current health state (Healthy, Degraded, Unschedulable, "
            "Unhealthy), 0 for the others.",
            ["gpu", "state"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpu_temperature = Gauge(
            "probe_gpu_temperature_celsius",
            "GPU temperature at the last health reading (no series when it had none).",
            ["gpu"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpu_power = Gauge(
            "probe_gpu_power_watts",
            "GPU power draw at the last health reading (no series when it had none).",
            ["gpu"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.xid_events = Counter(
            "probe_xid_events",
            "XID events received, by GPU, XID code and action (unhealthy or ignored).",
            ["gpu", "xid", "action"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.cycle_seconds = Histogram(
            "probe_cycle_duration_seconds",
            "Time of one probe cycle: NVML reads, health judgement and any API writes.",
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.cycles = Counter(
            "probe_cycles",
            "Probe cycles by result (ok, nvml-unavailable, api-error, node-missing).",
            ["result"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.api_writes = Counter(
            "probe_api_writes",
            "API write calls, by object (labels, topology, status, taint).",
            ["object"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.api_errors = Counter(
            "probe_api_errors",
            "API write calls that failed, by object.",
            ["object"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.nvml_ready = Gauge(
            "probe_nvml_ready",
            "1 when NVML is initialised, 0 when it cannot be used on the node.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.last_success = Gauge(
            "probe_last_success_timestamp_seconds",
            "Unix time of the last cycle whose reading is published (results ok or "
            "nvml-unavailable); time() minus it is how stale the node's published health is.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.nvml_errors = Counter(
            "probe_nvml_errors",
            "Unexpected NVML errors (not 'not supported'), each degrading one field or GPU.",
            namespace=NAMESPACE,
            registry=self.registry,
        )


# --- node agent (device plugin) ------------------------------------------------------------


class NodeAgentMetrics:
    """Metrics of the node agent, gpusched's device plugin (one process per node, no node
    label)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        self.calls = Counter(
            "node_agent_calls",
            "GetPreferredAllocation (preferred) and Allocate (allocate) answers, by outcome "
            "(accepted, refused) and refusal reason.",
            ["call", "outcome", "reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.call_seconds = Histogram(
            "node_agent_call_duration_seconds",
            "Time to answer one GetPreferredAllocation or Allocate call.",
            ["call"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.registered = Gauge(
            "node_agent_registered",
            "1 while the plugin is registered with the kubelet.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.registrations = Counter(
            "node_agent_registrations",
            "Registrations with the kubelet (each kubelet or plugin restart adds one).",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.conflict = Gauge(
            "node_agent_conflicting_plugin",
            "1 while another device plugin for the same GPUs is live on the node (gpusched's "
            "plugin then stays unregistered).",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.devices = Gauge(
            "node_agent_devices",
            "Devices advertised to the kubelet, by health (Healthy, Unhealthy).",
            ["health"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.drift_pods = Gauge(
            "node_agent_drift_pods",
            "Pods whose GPUs per the kubelet's PodResources differ from gpusched's assignment, "
            "by kind (OutsideAssignment, Incomplete, TakesReserved); 0 is the healthy value.",
            ["kind"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.drift_checks = Counter(
            "node_agent_drift_checks",
            "Drift checks against the kubelet's PodResources, by outcome (ok, drift, error).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=self.registry,
        )


# --- operator (admission) -------------------------------------------------------------------

#: Queue-wait buckets: seconds to hours, as GPU queues go.
QUEUE_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)


class OperatorMetrics:
    """Metrics of the GpuJob operator. Gauges describe the last admission cycle; counters count
    this process's decisions; GPU-seconds come from TenantQuota status, so they survive
    restarts."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        self.jobs = Gauge(
            "jobs",
            "GpuJobs by tenant and phase (Queued, Admitted, Running, Preempted, ...).",
            ["tenant", "phase"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "queue_wait_seconds",
            "Time from submission (or requeue) to admission, by tenant and priority.",
            ["tenant", "priority"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=QUEUE_WAIT_BUCKETS,
        )
        self.admissions = Counter(
            "admissions",
            "Jobs admitted, by tenant and reason (WithinGuarantee, Borrowing).",
            ["tenant", "reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "preemptions",
            "Jobs preempted, by the victim's tenant and reason (HigherPriority, ReclaimGuarantee).",
            ["tenant", "reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.preempted_gpu_seconds = Counter(
            "preempted_gpu_seconds",
            "Work thrown away by preemption: each victim's GPUs x time since its start or last "
            "checkpoint, by the victim's tenant and reason (divide by the rate of "
            "gpusched_tenant_gpu_seconds for the share of GPU time run).",
            ["tenant", "reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.below_guarantee = Gauge(
            "tenant_below_guarantee",
            "1 while the tenant holds fewer GPUs than its guarantee and wants more (queued jobs) "
            "while another tenant borrows beyond its own guarantee, else 0 (the stretches "
            "reclaim should keep short).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.requeues = Counter(
            "requeues",
            "Admitted gangs released and queued again, by tenant and reason (PodsReadyTimeout, "
            "PodsLost).",
            ["tenant", "reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpus_used = Gauge(
            "tenant_used_gpus",
            "GPUs held by the tenant's admitted and running jobs.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpus_guaranteed = Gauge(
            "tenant_guaranteed_gpus",
            "The tenant's guaranteed GPUs (TenantQuota spec).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpus_borrowed = Gauge(
            "tenant_borrowed_gpus",
            "Part of the tenant's used GPUs above its guarantee.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.fair_share = Gauge(
            "tenant_fair_share_gpus",
            "GPUs the tenant is entitled to now: guarantee plus weighted share of idle GPUs.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpus_pending = Gauge(
            "tenant_pending_gpus",
            "GPUs requested by the tenant's queued jobs (demand not yet admitted).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.oldest_wait = Gauge(
            "queue_oldest_wait_seconds",
            "How long the tenant's longest-waiting queued job has waited since submission or "
            "requeue (0: nothing queued).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.largest_free_domain = Gauge(
            "largest_free_domain_gpus",
            "After the last cycle's admissions, the most free GPUs on one node (level node) "
            "and in one domain of each network level of the NetworkTopology (whole domains "
            "only where the level asks): the largest gang each level can still take.",
            ["level"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.reservations = Gauge(
            "reservations",
            "Waiting jobs holding a reservation (GPUs kept for them until they come free), by "
            "tenant.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.reserved_idle_gpus = Gauge(
            "reserved_idle_gpus",
            "GPUs free now but kept idle for a tenant's reserved jobs (the price of "
            "reservations; jobs that end in time may still use them), by tenant.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.lending_hold_gpus = Gauge(
            "lending_hold_gpus",
            "Idle GPUs of a tenant's unused guarantee kept from borrowers because it asked for "
            "GPUs within --lending-hold-seconds (the price of the hold), by tenant.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.expected_start_error = Histogram(
            "expected_start_error_seconds",
            "How far a job's start was from the first expected start it was given, by "
            "direction (late: started after it).",
            ["direction"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=QUEUE_WAIT_BUCKETS,
        )
        self.runtime_history_kinds = Gauge(
            "runtime_history_kinds",
            "Kinds of job (tenant, namespace, family, size and coarser) with recorded run "
            "times for prediction.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.gpu_seconds = Gauge(
            "tenant_gpu_seconds",
            "GPU-seconds consumed by the tenant's running jobs since its TenantQuota was "
            "created (monotonic; use rate() for GPUs in use over time).",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.tenant_cost = Gauge(
            "tenant_cost",
            "What the tenant's GPU time cost (pricing currency; without prices, GPU-hours) over "
            "a window: the current budget period (period), the last 7 or 30 days.",
            ["tenant", "window"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.tenant_gpu_hours = Gauge(
            "tenant_gpu_hours",
            "GPU-hours the tenant's jobs ran over a window (period, 7d, 30d).",
            ["tenant", "window"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.tenant_budget_cap = Gauge(
            "tenant_budget_cap",
            "The tenant's budget caps for the period (soft: alert; hard: new jobs wait), in the "
            "pricing currency; only caps that are set.",
            ["tenant", "cap"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.tenant_recent_borrowed = Gauge(
            "tenant_recent_borrowed_gpus",
            "GPUs the tenant borrowed on average lately (decayed with --usage-half-life; 0 "
            "without): what fair share with memory ranks borrowers by, besides what they "
            "borrow now.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.user_gpus = Gauge(
            "user_gpus",
            "GPUs held now by one submitter's admitted jobs, by tenant and user (the empty "
            "user: jobs with no recorded submitter).",
            ["tenant", "user"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.user_cost = Gauge(
            "user_cost",
            "What one submitter's jobs cost in the current budget period, by tenant and user.",
            ["tenant", "user"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.cycle_seconds = Histogram(
            "admission_cycle_duration_seconds",
            "Time of one admission cycle: snapshot, decisions and API writes.",
            ["stage"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.explain_seconds = Histogram(
            "operator_explain_duration_seconds",
            "Time the leading operator took to answer one `gpusched explain` request, by "
            "answer: explain (from the last cycle) or sooner (the counterfactual, decided anew).",
            ["answer"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.api_errors = Counter(
            "operator_api_errors",
            "API calls of the operator that failed, by operation.",
            ["operation"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.reports_deferred = Counter(
            "operator_reports_deferred",
            "Waiting jobs' status reports held for a later cycle because as many as the "
            "operator sends at once were in flight (admissions and preemptions go first).",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.api_requests = Counter(
            "operator_api_requests",
            "API requests of the operator, by verb (LIST, WATCH, GET, POST, PATCH, DELETE), "
            "resource and answer class (2xx, 4xx, 5xx; none when no answer came).",
            ["verb", "resource", "code"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.webhook_reviews = Counter(
            "operator_webhook_reviews",
            "Objects the operator's validating webhook checked, by resource and verdict "
            "(allowed, refused).",
            ["resource", "verdict"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.leading = Gauge(
            "operator_leading",
            "1 on the operator replica that holds the Lease and runs admission cycles, 0 on "
            "the others (which publish no job or tenant gauges).",
            namespace=NAMESPACE,
            registry=self.registry,
        )

    def stand_by(self) -> None:
        """This replica does not lead (any more): its job and tenant gauges would describe a
        cycle that is no longer current, and summed with the leader's they would count every
        job twice, so they go until it leads again."""
        self.leading.set(0)
        for gauge in (
            self.jobs,
            self.gpus_pending,
            self.oldest_wait,
            *self._tenant_gauges(),
            self.reservations,
            self.reserved_idle_gpus,
            self.lending_hold_gpus,
            self.largest_free_domain,
        ):
            gauge.clear()

    def _tenant_gauges(self) -> tuple[Gauge, ...]:
        """The gauges of a tenant's usage and spending, labelled by tenant (and more)."""
        return (
            self.gpus_used,
            self.gpus_guaranteed,
            self.gpus_borrowed,
            self.fair_share,
            self.gpu_seconds,
            self.tenant_cost,
            self.tenant_gpu_hours,
            self.tenant_budget_cap,
            self.tenant_recent_borrowed,
            self.user_gpus,
            self.user_cost,
            self.below_guarantee,
        )

    def forget_tenants(self, kept: Collection[str]) -> None:
        """Drop the tenant gauges' series of tenants not ``kept`` (their TenantQuota was
        deleted): a deleted tenant over its budget, or borrowing, would otherwise go on firing
        alerts until the operator restarts."""
        for gauge in self._tenant_gauges():
            # A sample's labels come in the gauge's label order (what ``remove`` takes).
            gone = {
                tuple(sample.labels.values())
                for family in gauge.collect()
                for sample in family.samples
                if sample.labels["tenant"] not in kept
            }
            for labels in gone:
                gauge.remove(*labels)

    def count_request(self, verb: str, path: str, code: int) -> None:
        """Count one request of the operator's API client."""
        resource = resource_of(path)
        if verb == "GET" and resource.count("/") == 0 and path.rstrip("/").endswith(resource):
            verb = "LIST"
        answer = f"{code // 100}xx" if code else "none"
        self.api_requests.labels(verb, resource, answer).inc()


def resource_of(path: str) -> str:
    """``pods``, ``gpujobs/status``, ... of an API path (namespace and name left out)."""
    parts = [p for p in path.split("?", maxsplit=1)[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return ""
    return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
