"""Fair share with memory and the tenant tree in the replay: a tenant that borrowed the whole
cluster lately gets less of what frees up than one that borrowed nothing (exactly as much
without memory), and a parent tenant's figures are those of its subtree."""

from __future__ import annotations

from gpusched.core.admission import Tenant
from gpusched.simulator.engine import replay
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
HOURS = 3600.0


def _started_at(half_life: float | None, at: float) -> dict[str, int]:
    nodes = cluster((H100, "h1"))
    early = [trace_job(f"a{i}", 0, 1, 10 * HOURS, "a") for i in range(8)]
    # Both tenants queue eight one-GPU jobs while a's first eight run; a's come first.
    late = [trace_job(f"a-late{i}", 5 * HOURS, 1, 10 * HOURS, "a") for i in range(8)]
    late += [trace_job(f"b-late{i}", 6 * HOURS, 1, 10 * HOURS, "b") for i in range(8)]
    tenants = (Tenant("a"), Tenant("b"))
    jobs = workload(*early, *late, tenants=tenants)
    policy = GpuschedPolicy(nodes.nodes, tenants, usage_half_life=half_life)
    result = replay(jobs, nodes, policy, speed=speed)
    counts = {"a": 0, "b": 0}
    for job in result.jobs:
        if "late" in job.id and job.attempts and job.attempts[0].start == at:
            counts[job.id[0]] += 1
    return counts


def test_without_memory_the_freed_gpus_are_split_evenly() -> None:
    assert _started_at(None, 10 * HOURS) == {"a": 4, "b": 4}


def test_with_memory_the_tenant_that_borrowed_lately_gets_less() -> None:
    # a borrowed all 8 GPUs for 10 h = one half-life: it remembers 4 borrowed GPUs, so b's
    # first four jobs rank before a's first, then they alternate.
    assert _started_at(10 * HOURS, 10 * HOURS) == {"a": 2, "b": 6}


def test_a_parent_tenants_figures_are_its_subtrees() -> None:
    from gpusched.simulator.figures import figures

    nodes = cluster((H100, "h1"))
    tenants = (
        Tenant("org", guaranteed=8),
        Tenant("a", 4, parent="org"),
        Tenant("b", 4, parent="org"),
    )
    jobs = workload(
        trace_job("a1", 0, 4, 2 * HOURS, "a"),
        trace_job("b1", 0, 2, 1 * HOURS, "b"),
        tenants=tenants,
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants), speed=speed)
    by_name = {t.name: t for t in figures(result).tenants}
    assert by_name["a"].gpu_hours == 8.0
    assert by_name["b"].gpu_hours == 2.0
    assert by_name["org"].gpu_hours == 10.0
    assert by_name["org"].jobs == 2
