"""Per-tenant gauges are replaced without a gap: tenants that stay keep their series."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry, Gauge

from gpusched.core.admission import TenantUsage
from gpusched.dev.bench.admission import Workload, build_snapshot
from gpusched.dev.bench.operator_cycle import NOW, load_store
from gpusched.metrics import OperatorMetrics
from gpusched.operator.decide import OperatorConfig, decide
from gpusched.operator.loop import AdmissionLoop, below_guarantee, set_tenant_series
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store


def _series(gauge: Gauge) -> dict[str, float]:
    return {s.labels["tenant"]: s.value for family in gauge.collect() for s in family.samples}


def test_tenant_series_follow_the_latest_values_and_drop_departed_tenants() -> None:
    gauge = Gauge("pending", "pending", ["tenant"], registry=CollectorRegistry())
    set_tenant_series(gauge, {"a": 4, "b": 8})
    assert _series(gauge) == {"a": 4, "b": 8}
    set_tenant_series(gauge, {"b": 0, "c": 2})
    assert _series(gauge) == {"b": 0, "c": 2}


def _usage(
    name: str, guaranteed: int, used: int, demand: int, borrowed: int | None = None
) -> TenantUsage:
    return TenantUsage(
        name=name,
        guaranteed=guaranteed,
        borrowing_limit=None,
        weight=1.0,
        used=used,
        borrowed=max(0, used - guaranteed) if borrowed is None else borrowed,
        used_by_model={},
        fair_share=float(guaranteed),
        pending=0,
        running=0,
        demand=demand,
    )


def test_a_tenant_is_below_its_guarantee_only_while_it_wants_more_and_another_borrows() -> None:
    owner = _usage("owner", guaranteed=16, used=8, demand=24)
    borrower = _usage("borrower", guaranteed=0, used=8, demand=8)
    assert below_guarantee([owner, borrower]) == {"owner": 1.0, "borrower": 0.0}
    # Nobody borrows: GPUs are simply short.
    assert below_guarantee([owner, _usage("other", 8, 8, 8)])["owner"] == 0.0
    # It wants no more than it holds.
    assert below_guarantee([_usage("owner", 16, 8, 8), borrower])["owner"] == 0.0
    # Its own borrowing does not count (per-model guarantees: it borrows A100s while short of
    # its H100 guarantee).
    assert below_guarantee([_usage("solo", 16, 8, 24, borrowed=2)]) == {"solo": 0.0}


def test_a_deleted_tenant_leaves_no_series_behind_in_its_spending_and_usage_gauges() -> None:
    """A TenantQuota deleted over its budget cap, or while borrowing, would otherwise keep its
    alerts firing until the operator restarts."""
    m = OperatorMetrics()
    for tenant in ("kept", "gone"):
        m.gpus_borrowed.labels(tenant).set(4)
        m.tenant_cost.labels(tenant, "7d").set(100.0)
        m.tenant_budget_cap.labels(tenant, "soft").set(50.0)
        m.user_gpus.labels(tenant, "alice").set(2)
    m.forget_tenants({"kept"})
    for gauge in (m.gpus_borrowed, m.tenant_cost, m.tenant_budget_cap, m.user_gpus):
        left = {s.labels["tenant"] for family in gauge.collect() for s in family.samples}
        assert left == {"kept"}, gauge


def test_a_replica_that_stops_leading_keeps_no_gauge_of_the_last_cycle() -> None:
    """Summed with the leader's, a stand-by's series would count tenants below their
    guarantee, and free capacity, twice."""
    m = OperatorMetrics()
    m.below_guarantee.labels("a").set(1)
    m.largest_free_domain.labels("node").set(8)
    m.gpus_used.labels("a").set(4)
    m.stand_by()
    for gauge in (m.below_guarantee, m.largest_free_domain, m.gpus_used):
        assert not [s for family in gauge.collect() for s in family.samples], gauge


class _ScrapedBetweenSteps(Gauge):
    """A gauge that records what a scrape would export after every change of its label sets
    (the operator's cycle updates gauges while the metrics endpoint's thread scrapes)."""

    scrapes: list[set[tuple[str, ...]]]

    def _scrape(self) -> None:
        exported = {tuple(s.labels.values()) for f in self.collect() for s in f.samples}
        self.scrapes.append(exported)

    def clear(self) -> None:
        super().clear()
        self._scrape()

    def remove(self, *labelvalues: Any) -> None:
        super().remove(*labelvalues)
        self._scrape()

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any:
        child = super().labels(*labelvalues, **labelkwargs)
        self._scrape()
        return child


def test_a_scrape_during_a_cycle_sees_every_job_series_present_before_and_after() -> None:
    snapshot = build_snapshot(Workload(nodes=8, tenants=3, queued=24, fill=0.5), 3)
    kinds = {n.name: "count" if n.count_only else "nvswitch" for n in snapshot.nodes}
    decision = decide(load_store(snapshot, kinds).world(NOW), {}, OperatorConfig(), NodeReader())
    loop = AdmissionLoop(cast(Any, None), Store(), OperatorConfig(), OperatorMetrics())
    jobs = _ScrapedBetweenSteps(
        "gpusched_jobs", "jobs", ["tenant", "phase"], registry=CollectorRegistry()
    )
    jobs.scrapes = []
    loop.metrics.jobs = jobs
    loop._count(decision)
    before = jobs.scrapes[-1]
    assert len(before) > 1
    # Every job of the world is in one of the series.
    counted = sum(s.value for f in jobs.collect() for s in f.samples)
    assert counted == len(decision.world.jobs)
    jobs.scrapes.clear()
    loop._count(decision)  # the next cycle, the same jobs
    assert jobs.scrapes, "the cycle set the gauge"
    for exported in jobs.scrapes:
        assert before <= exported
