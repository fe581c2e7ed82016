"""The order in which the Kubernetes baselines take waiting jobs, against times worked out by
hand on one 8-GPU node: where priority counts and where only age does."""

from __future__ import annotations

from gpusched.core.admission import Tenant
from gpusched.simulator.engine import replay
from gpusched.simulator.model import RunResult, TraceJob
from gpusched.simulator.policies import build
from tests.unit.simulator.simdata import cluster, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"

#: R runs first; then L (older, priority 0) and H (newer, priority 1) wait for the node.
R, L, H = (
    trace_job("R", 0, 8, 10, "a"),
    trace_job("L", 1, 8, 100, "a", priority=0),
    trace_job("H", 2, 8, 100, "a", priority=1),
)


def _run(policy: str, tenants: tuple[Tenant, ...], *jobs: TraceJob) -> RunResult:
    nodes = cluster((H100, "h100"))
    return replay(workload(*jobs, tenants=tenants), nodes, build(policy, nodes.nodes, tenants, 0))


def _attempts(result: RunResult) -> dict[str, list[tuple[float, float, bool]]]:
    return {j.id: [(a.start, a.end, a.preempted) for a in j.attempts] for j in result.jobs}


def test_kube_default_creates_pods_oldest_job_first_whatever_their_priority() -> None:
    # The ResourceQuota (8 GPUs) holds L and H uncreated while R runs. The Job controller knows
    # no PriorityClass: at 10 it creates the older L, and the newer high-priority H waits.
    result = _run("kube-default", (Tenant("a", guaranteed=8),), R, L, H)
    assert _attempts(result) == {
        "R": [(0, 10, False)],
        "L": [(10, 110, False)],
        "H": [(110, 210, False)],
    }


def test_kube_default_binds_created_pods_by_priority_then_age() -> None:
    # With quota for all, L and H are both created at once and wait for the node in
    # kube-scheduler's queue, which takes the higher priority first.
    result = _run("kube-default", (Tenant("a", guaranteed=24),), R, L, H)
    assert _attempts(result) == {
        "R": [(0, 10, False)],
        "H": [(10, 110, False)],
        "L": [(110, 210, False)],
    }


def test_kueue_like_admits_by_priority_within_a_queue_before_an_older_workload() -> None:
    # BestEffortFIFO orders a ClusterQueue by priority, then creation: when R ends, the newer
    # high-priority H is admitted before the older L, and nothing is preempted. Admitting L first
    # would have it preempted by H at once (work thrown away for nothing).
    tenants = (Tenant("a", guaranteed=8), Tenant("b", guaranteed=0))
    urgent = trace_job("R", 0, 8, 10, "a", priority=1)
    result = _run("kueue-like", tenants, urgent, L, H, trace_job("X", 20, 1, 5, "b"))
    assert _attempts(result) == {
        "R": [(0, 10, False)],
        "H": [(10, 110, False)],
        "L": [(110, 210, False)],
        "X": [(210, 215, False)],
    }
    assert result.preemptions == 0


def test_kueue_like_queues_take_turns_by_heads_within_nominal_quota_then_priority() -> None:
    # Borrowing: a's L fits within a's nominal quota, b's older high-priority X would borrow:
    # L first. Priority: both heads would borrow (nominal 4 each, jobs of 8): B, of higher
    # priority, before the older A.
    tenants = (Tenant("a", guaranteed=8), Tenant("b", guaranteed=0))
    borrower = trace_job("X", 1, 8, 50, "b", priority=1)
    result = _run("kueue-like", tenants, R, borrower, trace_job("L", 2, 8, 100, "a"))
    assert _attempts(result) == {
        "R": [(0, 10, False)],
        "L": [(10, 110, False)],
        "X": [(110, 160, False)],
    }
    tenants = (Tenant("a", guaranteed=4), Tenant("b", guaranteed=4))
    older = trace_job("A", 1, 8, 100, "a", priority=0)
    result = _run("kueue-like", tenants, R, older, trace_job("B", 2, 8, 100, "b", priority=1))
    assert _attempts(result) == {
        "R": [(0, 10, False)],
        "B": [(10, 110, False)],
        "A": [(110, 210, False)],
    }
