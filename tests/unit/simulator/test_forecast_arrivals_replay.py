"""The replay's forecast expects each tenant's steady rate of submissions within the window
again over the window ahead, as the operator's does with ``--forecast-arrivals-window``: the
tenant's hourly higher-priority whole-node jobs are expected to go on, each ahead of a waiting
job."""

from __future__ import annotations

from gpusched.core.admission import Tenant
from gpusched.simulator.engine import replay
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
HOUR = 3600.0


def _told(window: float) -> float | None:
    """Whole-node jobs of one hour: ``p0`` .. ``p11`` (priority 1) run one after the other from
    0 h to 12 h and teach the run-time history; ``r`` runs 12-13 h; ``w`` waits from 12 h 10 min
    and is told then (a forecast comes with the first event five minutes after the last)."""
    nodes = cluster((H100, "h1"))
    tenants = (Tenant("t", guaranteed=8),)
    jobs = workload(
        *(trace_job(f"p{h}", h * HOUR, 8, HOUR, "t", priority=1) for h in range(12)),
        trace_job("r", 12 * HOUR, 8, HOUR, "t"),
        trace_job("w", 12 * HOUR + 600, 8, HOUR, "t"),
        tenants=tenants,
    )
    policy = GpuschedPolicy(nodes.nodes, tenants, arrivals_window=window)
    result = replay(jobs, nodes, policy, speed=speed)
    (w,) = [j for j in result.jobs if j.id == "w"]
    assert w.estimated_at == 12 * HOUR + 600
    return w.estimate


def test_with_nothing_expected_the_waiting_job_is_told_it_starts_when_the_node_frees() -> None:
    assert _told(0.0) == 13 * HOUR


def test_the_higher_priority_jobs_expected_to_go_on_go_ahead_of_it() -> None:
    # Within 12 h, eleven of the twelve hourly slices saw one: twelve more are expected, one an
    # hour from 12 h 40 min, and each takes the node before w: w follows them at 25 h.
    assert _told(12 * HOUR) == 25 * HOUR
