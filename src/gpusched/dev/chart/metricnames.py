"""Every metric name defined in :mod:`gpusched.metrics`, as Prometheus exposes it (counters with
``_total``), for checks of dashboards, alerts and docs."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from gpusched import metrics


@dataclass(frozen=True)
class MetricName:
    """One metric family: its exposed name, type and label names."""

    name: str
    kind: str
    labels: tuple[str, ...]


def _registries() -> list[CollectorRegistry]:
    out = []
    for _, cls in inspect.getmembers(metrics, inspect.isclass):
        if cls.__module__ == metrics.__name__ and cls.__name__.endswith("Metrics"):
            factory: Any = cls
            component = factory(metrics.new_registry())
            out.append(component.registry)
    return out


def families() -> dict[str, MetricName]:
    """Exposed name -> family, for every component's metrics."""
    found: dict[str, MetricName] = {}
    for registry in _registries():
        for collector in list(registry._collector_to_names):
            describe = getattr(collector, "describe", None)
            if describe is None:
                continue
            for family in describe():
                name = family.name + ("_total" if family.type == "counter" else "")
                labels = tuple(getattr(collector, "_labelnames", ()))
                found[name] = MetricName(name, family.type, labels)
    return found


def metric_names() -> set[str]:
    """Every exposed metric family name."""
    return set(families())
