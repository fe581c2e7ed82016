"""Per-tenant gauges are replaced without a gap: tenants that stay keep their series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from gpusched.operator.loop import set_tenant_series


def _series(gauge: Gauge) -> dict[str, float]:
    return {s.labels["tenant"]: s.value for family in gauge.collect() for s in family.samples}


def test_tenant_series_follow_the_latest_values_and_drop_departed_tenants() -> None:
    gauge = Gauge("pending", "pending", ["tenant"], registry=CollectorRegistry())
    set_tenant_series(gauge, {"a": 4, "b": 8})
    assert _series(gauge) == {"a": 4, "b": 8}
    set_tenant_series(gauge, {"b": 0, "c": 2})
    assert _series(gauge) == {"b": 0, "c": 2}
