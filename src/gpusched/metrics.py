"""Every Prometheus metric gpusched exports, defined once.

Names follow Prometheus conventions (``gpusched_`` prefix, base units, ``_total`` for counters);
docs/metrics.md lists them for dashboard authors. Each component registers only its own section
on its own registry (``probe_registry()`` etc.), so a process exports just what it owns and tests
can create fresh registries.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

NAMESPACE = "gpusched"


def new_registry() -> CollectorRegistry:
    """A registry without the default process collectors, for tests and embedded use."""
    return CollectorRegistry(auto_describe=True)
