"""gpusched's Grafana dashboards, defined once as data and written as JSON into the chart.

Four dashboards: the cluster's GPUs (allocation, health, NVLink fragmentation, placement quality),
tenants (guarantee, use, borrowing, fair share, demand, waits, GPU-hours, preemptions),
scheduling (extender latency and throughput, refusals, the operator's cycle) and GPU health
(per-GPU state, XIDs, probe freshness, telemetry). Every query goes through the `$datasource`
variable and counts only through `rate`/`increase`; the lint test and the end-to-end test with a
real Prometheus read the same definitions (``core`` panels must show data in the e2e scenario).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
PanelKind = Literal["stat", "timeseries", "table", "bargauge"]
GRID_WIDTH: Final = 24


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """One panel; ``core`` panels must return data in the e2e scenario."""

    title: str
    description: str
    kind: PanelKind
    unit: str
    queries: tuple[Query, ...]
    width: int = 12
    height: int = 8
    core: bool = False
    stacked: bool = False


@dataclass(frozen=True)
class Row:
    """A titled row of panels, laid out left to right."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable over one label of one metric (multi-select, with All)."""

    name: str
    label: str
    metric: str

    @property
    def query(self) -> str:
        """The variable's ``label_values`` query."""
        return f"label_values({self.metric}, {self.name})"


@dataclass(frozen=True)
class Dashboard:
    """One dashboard."""

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = field(default_factory=tuple)

    @property
    def filename(self) -> str:
        """File name under the chart's dashboards/."""
        return f"{self.uid}.json"

    def panels(self) -> list[Panel]:
        """Every panel, in layout order."""
        return [panel for row in self.rows for panel in row.panels]


def _extender_gpus(state: str) -> str:
    """One state's GPUs per node of the selected models, once per node whatever the number of
    extender replicas."""
    return (
        f'max by (node, gpu_model) (gpusched_node_gpus{{state="{state}", gpu_model=~"$gpu_model"}})'
    )


_ALL_GPUS = 'max by (node, gpu_model, state) (gpusched_node_gpus{gpu_model=~"$gpu_model"})'
_LARGEST = "max by (node) (gpusched_node_largest_free_nvlink_set_gpus)"
_ALL_FREE = 'max by (node) (gpusched_node_gpus{state="free"})'

CLUSTER: Final = Dashboard(
    uid="gpusched-cluster",
    title="gpusched / Cluster GPUs",
    description="Allocated, free and unavailable GPUs by model and node, NVLink fragmentation "
    "and the topology class placements achieve.",
    variables=(Variable("gpu_model", "GPU model", "gpusched_node_gpus"),),
    rows=(
        Row(
            "Now",
            (
                Panel(
                    "GPUs",
                    "Every GPU the device probes publish, in any state.",
                    "stat",
                    "short",
                    (Query(f"sum({_ALL_GPUS})"),),
                    width=4,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Allocated",
                    "GPUs held by bound pods or by binds in flight.",
                    "stat",
                    "short",
                    (Query(f"sum({_extender_gpus('allocated')})"),),
                    width=4,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Free",
                    "Healthy GPUs no pod holds.",
                    "stat",
                    "short",
                    (Query(f"sum({_extender_gpus('free')})"),),
                    width=4,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Unavailable",
                    "GPUs that take no new work: unhealthy, unschedulable or in MIG mode.",
                    "stat",
                    "short",
                    (Query(f"sum({_extender_gpus('unavailable')})"),),
                    width=4,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Allocated share",
                    "Allocated GPUs over all GPUs.",
                    "stat",
                    "percentunit",
                    (
                        Query(
                            f"sum({_extender_gpus('allocated')}) / clamp_min(sum({_ALL_GPUS}), 1)"
                        ),
                    ),
                    width=4,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Nodes with 8 free NVLinked GPUs",
                    "Nodes where an 8-GPU job with scope nvlink could start now.",
                    "stat",
                    "short",
                    (Query(f"count({_LARGEST} >= 8) or vector(0)"),),
                    width=4,
                    height=4,
                    core=True,
                ),
            ),
        ),
        Row(
            "Allocation over time",
            (
                Panel(
                    "GPUs by state",
                    "Allocated, free and unavailable GPUs of the selected models.",
                    "timeseries",
                    "short",
                    (Query(f"sum by (state) ({_ALL_GPUS})", "{{state}}"),),
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Free GPUs by model",
                    "Healthy GPUs no pod holds, per GPU model.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            'max by (gpu_model) (gpusched_free_gpus{gpu_model=~"$gpu_model"})',
                            "{{gpu_model}}",
                        ),
                    ),
                    core=True,
                ),
            ),
        ),
        Row(
            "Placement quality",
            (
                Panel(
                    "NVLink fragmentation",
                    "Share of free GPUs outside each node's largest free NVLink set: free GPUs "
                    "that a job needing NVLink between all its GPUs cannot use together. 0 "
                    "when every node's free GPUs are NVLinked pairwise.",
                    "timeseries",
                    "percentunit",
                    (
                        Query(
                            f"1 - sum({_LARGEST}) / clamp_min(sum({_ALL_FREE}), 1)",
                            "fragmentation",
                        ),
                    ),
                    width=6,
                    core=True,
                ),
                Panel(
                    "Pods placed per minute by topology class",
                    "Binds by the class the chosen GPU set achieved: nvlink (every pair on "
                    "NVLink), pcie-switch, numa, node.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (topology_class) "
                            "(rate(gpusched_placements_total[$__rate_interval])) * 60",
                            "{{topology_class}}",
                        ),
                    ),
                    width=6,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Largest gang each level can take",
                    "After the operator's last cycle: the most free GPUs on one node and in "
                    "one domain of each network level (NVLink clique, rack, block; whole "
                    "domains only where the NetworkTopology asks). A level whose line falls "
                    "below the gangs that need it is fragmented.",
                    "timeseries",
                    "short",
                    (Query("max by (level) (gpusched_largest_free_domain_gpus)", "{{level}}"),),
                    width=6,
                    core=True,
                ),
                Panel(
                    "Placements on NVLink",
                    "Share of the pods bound in the time range whose GPUs all talk over NVLink.",
                    "stat",
                    "percentunit",
                    (
                        Query(
                            'sum(increase(gpusched_placements_total{topology_class="nvlink"}'
                            "[$__range])) / clamp_min(sum(increase(gpusched_placements_total"
                            "[$__range])), 1)"
                        ),
                    ),
                    width=6,
                    core=True,
                ),
            ),
        ),
        Row(
            "Nodes",
            (
                Panel(
                    "GPUs per node",
                    "Each node's allocated, free and unavailable GPUs and its largest free "
                    "NVLink set (the biggest NVLink job it can take now).",
                    "table",
                    "short",
                    (
                        Query(_extender_gpus("allocated"), "allocated"),
                        Query(_extender_gpus("free"), "free"),
                        Query(_extender_gpus("unavailable"), "unavailable"),
                        Query(_LARGEST, "largest free NVLink set"),
                    ),
                    width=24,
                    height=10,
                    core=True,
                ),
            ),
        ),
    ),
)

_TENANT = 'tenant=~"$tenant"'

TENANTS: Final = Dashboard(
    uid="gpusched-tenants",
    title="gpusched / Tenants",
    description="Each tenant's guarantee against what it uses, borrows and is entitled to, its "
    "queued demand and waits, GPU-hours and preemptions.",
    variables=(Variable("tenant", "Tenant", "gpusched_tenant_guaranteed_gpus"),),
    rows=(
        Row(
            "Quota",
            (
                Panel(
                    "Used, guarantee and fair share",
                    "GPUs the tenant's admitted and running jobs hold, its guarantee, and its "
                    "fair share now (guarantee plus weighted share of idle GPUs).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_used_gpus{{{_TENANT}}})",
                            "{{tenant}} used",
                        ),
                        Query(
                            f"max by (tenant) (gpusched_tenant_guaranteed_gpus{{{_TENANT}}})",
                            "{{tenant}} guarantee",
                        ),
                        Query(
                            f"max by (tenant) (gpusched_tenant_fair_share_gpus{{{_TENANT}}})",
                            "{{tenant}} fair share",
                        ),
                    ),
                    core=True,
                ),
                Panel(
                    "Used / guarantee",
                    "Above 100%: the tenant borrows idle GPUs of others; below with queued "
                    "jobs: it waits for its guarantee.",
                    "bargauge",
                    "percentunit",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_used_gpus{{{_TENANT}}}) / "
                            f"clamp_min(max by (tenant) "
                            f"(gpusched_tenant_guaranteed_gpus{{{_TENANT}}}), 1)",
                            "{{tenant}}",
                        ),
                    ),
                    core=True,
                ),
                Panel(
                    "Borrowed GPUs",
                    "GPUs used above the guarantee; reclaimable by tenants below theirs.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_borrowed_gpus{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Queued demand",
                    "GPUs the tenant's queued GpuJobs ask for.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_pending_gpus{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                    core=True,
                    stacked=True,
                ),
            ),
        ),
        Row(
            "Jobs and waits",
            (
                Panel(
                    "GpuJobs by phase",
                    "GpuJobs of the selected tenants by phase.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"sum by (phase) (max by (tenant, phase) (gpusched_jobs{{{_TENANT}}}))",
                            "{{phase}}",
                        ),
                    ),
                    width=8,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Oldest queued job",
                    "How long each tenant's longest-waiting queued job has waited.",
                    "timeseries",
                    "s",
                    (
                        Query(
                            f"max by (tenant) (gpusched_queue_oldest_wait_seconds{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Queue wait p90",
                    "90th percentile of the time from submission (or requeue) to admission, "
                    "of jobs admitted recently.",
                    "timeseries",
                    "s",
                    (
                        Query(
                            "histogram_quantile(0.9, sum by (tenant, le) "
                            f"(rate(gpusched_queue_wait_seconds_bucket{{{_TENANT}}}"
                            "[$__rate_interval])))",
                            "{{tenant}}",
                        ),
                    ),
                    width=8,
                ),
            ),
        ),
        Row(
            "Spending and budgets",
            (
                Panel(
                    "Spent this budget period",
                    "What each tenant's GPU time cost since its budget period began (at the "
                    "operator's prices per GPU model; without prices, GPU-hours), with its "
                    "budget's soft cap (alert) and hard cap (new jobs wait, BudgetExhausted).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f'max by (tenant) (gpusched_tenant_cost{{{_TENANT}, window="period"}})',
                            "{{tenant}} spent",
                        ),
                        Query(
                            "max by (tenant) "
                            f'(gpusched_tenant_budget_cap{{{_TENANT}, cap="soft"}})',
                            "{{tenant}} soft cap",
                        ),
                        Query(
                            "max by (tenant) "
                            f'(gpusched_tenant_budget_cap{{{_TENANT}, cap="hard"}})',
                            "{{tenant}} hard cap",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Cost, last 30 days",
                    "What each tenant's GPU time cost over the last 30 UTC days, today included.",
                    "bargauge",
                    "short",
                    (
                        Query(
                            f'max by (tenant) (gpusched_tenant_cost{{{_TENANT}, window="30d"}})',
                            "{{tenant}}",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Users who spent most this period",
                    "The ten submitters whose jobs cost most in the current budget period "
                    "(user empty: jobs with no recorded submitter).",
                    "bargauge",
                    "short",
                    (
                        Query(
                            f"topk(10, max by (tenant, user) (gpusched_user_cost{{{_TENANT}}}))",
                            "{{tenant}} {{user}}",
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "GPUs per user now",
                    "GPUs held by each submitter's admitted jobs: what the tenant's per-user "
                    "cap (spec.perUser.maxGpus) counts.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant, user) (gpusched_user_gpus{{{_TENANT}}})",
                            "{{tenant}} {{user}}",
                        ),
                    ),
                    stacked=True,
                ),
                Panel(
                    "Recent borrowing (fair share memory)",
                    "GPUs each tenant borrowed on average lately, decayed with the operator's "
                    "usage half-life; with it set, borrowers are ranked by what they borrow now "
                    "plus this. Zero when fair share has no memory.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_recent_borrowed_gpus{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                ),
            ),
        ),
        Row(
            "Reservations and expected starts",
            (
                Panel(
                    "Reservations held",
                    "Waiting jobs holding GPUs reserved for them (the head of each tenant's "
                    "blocked jobs, usually a large gang).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_reservations{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                    width=8,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "GPUs idle because reserved or kept for a lender",
                    "Free GPUs kept for reservations (the price of starting large gangs on "
                    "time; jobs expected to end before a reservation starts may still use them) "
                    "and kept from borrowers for tenants that just asked for GPUs inside their "
                    "guarantee (the price of not evicting jobs that just started).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_reserved_idle_gpus{{{_TENANT}}})",
                            "{{tenant}} reserved",
                        ),
                        Query(
                            f"max by (tenant) (gpusched_lending_hold_gpus{{{_TENANT}}})",
                            "{{tenant}} kept for it",
                        ),
                    ),
                    width=8,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Expected-start error p50 / p90",
                    "How far jobs admitted recently started from the first expected start they "
                    "were given, late and early.",
                    "timeseries",
                    "s",
                    (
                        Query(
                            "histogram_quantile(0.5, sum by (direction, le) "
                            "(rate(gpusched_expected_start_error_seconds_bucket"
                            "[$__rate_interval])))",
                            "p50 {{direction}}",
                        ),
                        Query(
                            "histogram_quantile(0.9, sum by (direction, le) "
                            "(rate(gpusched_expected_start_error_seconds_bucket"
                            "[$__rate_interval])))",
                            "p90 {{direction}}",
                        ),
                    ),
                    width=8,
                ),
            ),
        ),
        Row(
            "Consumption, admission and preemption",
            (
                Panel(
                    "GPU-hours in the time range",
                    "GPU-hours consumed by each tenant's running jobs (metered by the operator, "
                    "kept in TenantQuota status).",
                    "bargauge",
                    "short",
                    (
                        Query(
                            "max by (tenant) (increase(gpusched_tenant_gpu_seconds"
                            f"{{{_TENANT}}}[$__range])) / 3600",
                            "{{tenant}}",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Admissions per hour",
                    "Jobs admitted, within the guarantee or borrowing idle GPUs.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (tenant, reason) (rate(gpusched_admissions_total"
                            f"{{{_TENANT}}}[$__rate_interval])) * 3600",
                            "{{tenant}} {{reason}}",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Preemptions and requeues per hour",
                    "Jobs preempted (by the victim's tenant and reason) and gangs requeued "
                    "because their pods did not all run in time.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (tenant, reason) (rate(gpusched_preemptions_total"
                            f"{{{_TENANT}}}[$__rate_interval])) * 3600",
                            "{{tenant}} preempted: {{reason}}",
                        ),
                        Query(
                            "sum by (tenant, reason) (rate(gpusched_requeues_total"
                            f"{{{_TENANT}}}[$__rate_interval])) * 3600",
                            "{{tenant}} requeued: {{reason}}",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "Work thrown away by preemption",
                    "GPU time preemption threw away (each victim's GPUs x time since its start "
                    "or last checkpoint), as a share of the GPU time tenants ran, by the "
                    "victim's tenant.",
                    "timeseries",
                    "percentunit",
                    (
                        Query(
                            "sum by (tenant) (rate(gpusched_preempted_gpu_seconds_total"
                            f"{{{_TENANT}}}[$__rate_interval])) / scalar(clamp_min(sum("
                            "rate(gpusched_tenant_gpu_seconds[$__rate_interval])), 1e-9))",
                            "{{tenant}}",
                        ),
                    ),
                    width=12,
                    core=True,
                ),
                Panel(
                    "Below guarantee while others borrow",
                    "1 while the tenant holds fewer GPUs than its guarantee, wants more, and "
                    "another tenant borrows: stretches reclaim should keep short.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            f"max by (tenant) (gpusched_tenant_below_guarantee{{{_TENANT}}})",
                            "{{tenant}}",
                        ),
                    ),
                    width=12,
                    core=True,
                ),
            ),
        ),
    ),
)

_LATENCY = (
    "histogram_quantile({q}, sum by (verb, le) "
    "(rate(gpusched_extender_request_duration_seconds_bucket[$__rate_interval])))"
)

SCHEDULING: Final = Dashboard(
    uid="gpusched-scheduling",
    title="gpusched / Scheduling",
    description="The extender kube-scheduler calls for every GPU pod (latency, throughput, "
    "refusals, bind errors) and the operator's admission cycle.",
    rows=(
        Row(
            "Extender",
            (
                Panel(
                    "Extenders up",
                    "Extender processes Prometheus reaches (one per scheduler replica; the "
                    "leader's serves kube-scheduler).",
                    "stat",
                    "short",
                    (Query('sum(up{job="gpusched-extender"})'),),
                    width=6,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Pods bound per second",
                    "GPU pods the extender bound.",
                    "stat",
                    "ops",
                    (Query("sum(rate(gpusched_placements_total[$__rate_interval]))"),),
                    width=6,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Bind errors in the time range",
                    "Binds that failed, any reason.",
                    "stat",
                    "short",
                    (Query("sum(increase(gpusched_bind_errors_total[$__range])) or vector(0)"),),
                    width=6,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Operators up",
                    "Operator processes Prometheus reaches (one holds the Lease and decides).",
                    "stat",
                    "short",
                    (Query('sum(up{job="gpusched-operator"})'),),
                    width=6,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Extender latency",
                    "p50 and p99 time to answer kube-scheduler, by verb. kube-scheduler waits "
                    "for filter and bind on every GPU pod.",
                    "timeseries",
                    "s",
                    (
                        Query(_LATENCY.format(q="0.5"), "{{verb}} p50"),
                        Query(_LATENCY.format(q="0.99"), "{{verb}} p99"),
                    ),
                    core=True,
                ),
                Panel(
                    "Extender calls per second",
                    "Calls from kube-scheduler, by verb.",
                    "timeseries",
                    "reqps",
                    (
                        Query(
                            "sum by (verb) (rate(gpusched_extender_request_duration_seconds_count"
                            "[$__rate_interval]))",
                            "{{verb}}",
                        ),
                    ),
                    core=True,
                ),
            ),
        ),
        Row(
            "Why pods wait",
            (
                Panel(
                    "Nodes refused by filter",
                    "Per second, by reason: NotEnoughFreeGpus (busy), ScopeUnsatisfiable (no "
                    "free set meets a required topology), NotEnoughHealthyGpus, "
                    "RequestExceedsNode, NoTopology, InvalidRequest.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (reason) "
                            "(rate(gpusched_filter_refused_nodes_total[$__rate_interval]))",
                            "{{reason}}",
                        ),
                    ),
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Bind errors",
                    "Per second, by reason (NoLongerFits, AlreadyBound, PodGone, ApiError).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (reason) (rate(gpusched_bind_errors_total[$__rate_interval]))",
                            "{{reason}}",
                        ),
                    ),
                ),
            ),
        ),
        Row(
            "Operator",
            (
                Panel(
                    "Admission cycle p90 by stage",
                    "settle (each job's life cycle), snapshot (the core's input), decide (the "
                    "pure core), forecast (expected starts), plan (the writes), cycle (all of "
                    "it; the writes go out after).",
                    "timeseries",
                    "s",
                    (
                        Query(
                            "histogram_quantile(0.9, sum by (stage, le) "
                            "(rate(gpusched_admission_cycle_duration_seconds_bucket"
                            "[$__rate_interval])))",
                            "{{stage}}",
                        ),
                    ),
                    core=True,
                ),
                Panel(
                    "Operator API errors",
                    "Failed API writes per second, by operation (conflicts included).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (operation) "
                            "(rate(gpusched_operator_api_errors_total[$__rate_interval]))",
                            "{{operation}}",
                        ),
                    ),
                ),
            ),
        ),
    ),
)

_NODE = 'node=~"$node"'

HEALTH: Final = Dashboard(
    uid="gpusched-health",
    title="gpusched / GPU health",
    description="Each GPU's state as the device probes judge it, XID events, NVML, how fresh "
    "each node's published health is, temperature and power.",
    variables=(Variable("node", "Node", "gpusched_probe_gpu_health"),),
    rows=(
        Row(
            "Now",
            (
                Panel(
                    "Unhealthy GPUs",
                    "GPUs out of placement: Unhealthy (fatal XID, uncorrectable ECC, lost) "
                    "or Unschedulable (row remapping pending, until a GPU reset).",
                    "stat",
                    "short",
                    (
                        Query(
                            "sum(max by (node, gpu) (gpusched_probe_gpu_health"
                            f'{{state=~"Unhealthy|Unschedulable", {_NODE}}}))'
                        ),
                    ),
                    width=5,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Degraded GPUs",
                    "GPUs still placed but throttling or running hot.",
                    "stat",
                    "short",
                    (
                        Query(
                            "sum(max by (node, gpu) "
                            f'(gpusched_probe_gpu_health{{state="Degraded", {_NODE}}}))'
                        ),
                    ),
                    width=5,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Nodes without NVML",
                    "Nodes whose probe cannot use NVML (published NvmlReady=False).",
                    "stat",
                    "short",
                    (Query(f"count(gpusched_probe_nvml_ready{{{_NODE}}} == 0) or vector(0)"),),
                    width=5,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Stalest node",
                    "Age of the oldest published reading among the selected nodes.",
                    "stat",
                    "s",
                    (
                        Query(
                            "max(time() - "
                            f"gpusched_probe_last_success_timestamp_seconds{{{_NODE}}})"
                        ),
                    ),
                    width=5,
                    height=4,
                    core=True,
                ),
                Panel(
                    "Probes up",
                    "Device probes Prometheus reaches (one per GPU node).",
                    "stat",
                    "short",
                    (Query('sum(up{job="gpusched-device-probe"})'),),
                    width=4,
                    height=4,
                    core=True,
                ),
            ),
        ),
        Row(
            "GPUs",
            (
                Panel(
                    "GPUs not healthy",
                    "Every GPU whose state is not Healthy, with its node.",
                    "table",
                    "short",
                    (
                        Query(
                            "max by (node, gpu, state) "
                            f'(gpusched_probe_gpu_health{{state!="Healthy", {_NODE}}}) == 1',
                        ),
                    ),
                    width=8,
                    core=True,
                ),
                Panel(
                    "GPUs by state",
                    "GPUs of the selected nodes by health state.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (state) (max by (node, gpu, state) "
                            f"(gpusched_probe_gpu_health{{{_NODE}}}))",
                            "{{state}}",
                        ),
                    ),
                    width=8,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "XID events per hour",
                    "By node, XID and action (unhealthy: the XID took the GPU out; ignored).",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (node, xid, action) (rate(gpusched_probe_xid_events_total"
                            f"{{{_NODE}}}[$__rate_interval])) * 3600",
                            "{{node}} XID {{xid}} ({{action}})",
                        ),
                    ),
                    width=8,
                    core=True,
                ),
            ),
        ),
        Row(
            "Probes and telemetry",
            (
                Panel(
                    "Age of published health",
                    "Seconds since each node's probe last published a reading.",
                    "timeseries",
                    "s",
                    (
                        Query(
                            "time() - max by (node) "
                            f"(gpusched_probe_last_success_timestamp_seconds{{{_NODE}}})",
                            "{{node}}",
                        ),
                    ),
                    width=6,
                    core=True,
                ),
                Panel(
                    "Probe readings per minute by result",
                    "ok, nvml-unavailable, api-error, node-missing, error.",
                    "timeseries",
                    "short",
                    (
                        Query(
                            "sum by (result) (rate(gpusched_probe_cycles_total"
                            f"{{{_NODE}}}[$__rate_interval])) * 60",
                            "{{result}}",
                        ),
                    ),
                    width=6,
                    core=True,
                    stacked=True,
                ),
                Panel(
                    "Hottest GPU per node",
                    "Highest GPU temperature of each node at the last reading.",
                    "timeseries",
                    "celsius",
                    (
                        Query(
                            f"max by (node) (gpusched_probe_gpu_temperature_celsius{{{_NODE}}})",
                            "{{node}}",
                        ),
                    ),
                    width=6,
                    core=True,
                ),
                Panel(
                    "Power per node",
                    "Sum of the GPUs' power draw of each node.",
                    "timeseries",
                    "watt",
                    (
                        Query(
                            f"sum by (node) (gpusched_probe_gpu_power_watts{{{_NODE}}})",
                            "{{node}}",
                        ),
                    ),
                    width=6,
                    core=True,
                ),
            ),
        ),
    ),
)

DASHBOARDS: Final = (CLUSTER, TENANTS, SCHEDULING, HEALTH)


# --- Grafana JSON -----------------------------------------------------------------------------


def _target(query: Query, ref: str, kind: PanelKind) -> dict[str, Any]:
    table = kind == "table"
    return {
        "refId": ref,
        "datasource": DATASOURCE,
        "expr": query.expr,
        "legendFormat": query.legend,
        "instant": table,
        "range": not table,
        "format": "table" if table else "time_series",
    }


def _options(panel: Panel) -> dict[str, Any]:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if panel.kind == "stat":
        return {"reduceOptions": reduce, "colorMode": "value", "graphMode": "area"}
    if panel.kind == "bargauge":
        return {"reduceOptions": reduce, "orientation": "horizontal", "displayMode": "gradient"}
    if panel.kind == "table":
        return {"showHeader": True}
    return {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit, "min": 0}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "fillOpacity": 20 if panel.stacked else 5,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": _options(panel),
        "targets": [
            _target(query, chr(ord("A") + i), panel.kind) for i, query in enumerate(panel.queries)
        ],
    }
    if panel.kind == "table":
        out["transformations"] = [{"id": "merge", "options": {}}]
    return out


def _variable_json(variable: Variable) -> dict[str, Any]:
    return {
        "type": "query",
        "name": variable.name,
        "label": variable.label,
        "datasource": DATASOURCE,
        "query": {"query": variable.query, "refId": "variable"},
        "definition": variable.query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard model (schema 39)."""
    panels: list[dict[str, Any]] = []
    y = 0
    panel_id = 1
    for row in dashboard.rows:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, panel_id, x, y))
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    templating = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        },
        *(_variable_json(v) for v in dashboard.variables),
    ]
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["gpusched"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["gpusched"],
                "title": "gpusched",
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
            }
        ],
        "templating": {"list": templating},
        "panels": panels,
    }


def render(dashboard: Dashboard) -> str:
    """The dashboard's JSON file content."""
    return json.dumps(dashboard_json(dashboard), indent=2) + "\n"
