"""The replay's forecast expects the jobs submitted within the window again over the window
ahead, as the operator's does: a higher-priority job of the tenant submitted an hour ago is
expected to come again and go ahead of a waiting job."""

from __future__ import annotations

from gpusched.core.admission import Tenant
from gpusched.simulator.engine import replay
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
HOUR = 3600.0


def _told(window: float) -> float | None:
    """Whole-node jobs of one hour: ``first`` (priority 1) runs 0-1 h and teaches the run-time
    history; ``r`` runs 1-2 h; ``w`` waits from 1 h 10 min and is told then (the forecast
    comes with the first event five minutes after the last). Within a window of 1.5 h,
    ``first`` is expected again at 1 h 55 min."""
    nodes = cluster((H100, "h1"))
    tenants = (Tenant("t", guaranteed=8),)
    jobs = workload(
        trace_job("first", 0, 8, HOUR, "t", priority=1),
        trace_job("r", HOUR, 8, HOUR, "t"),
        trace_job("w", HOUR + 600, 8, HOUR, "t"),
        tenants=tenants,
    )
    policy = GpuschedPolicy(nodes.nodes, tenants, arrivals_window=window)
    result = replay(jobs, nodes, policy, speed=speed)
    (w,) = [j for j in result.jobs if j.id == "w"]
    assert w.estimated_at == HOUR + 600
    return w.estimate


def test_with_nothing_expected_the_waiting_job_is_told_it_starts_when_the_node_frees() -> None:
    assert _told(0.0) == 2 * HOUR


def test_the_higher_priority_job_expected_again_goes_ahead_of_it() -> None:
    assert _told(1.5 * HOUR) == 3 * HOUR
