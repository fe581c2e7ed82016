"""Which jobs a preemption takes: cases translated from a peer scheduler's preemption tables
(a tenant below its guarantee, borrowers, its own lower-priority jobs) where an earlier admission
core chose wrongly. Each test names the wrong choice it rules out."""

from __future__ import annotations

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core.admission import (
    AdmitReason,
    Job,
    PreemptReason,
    Tenant,
    run_cycle,
)
from tests.unit.core.admission_testdata import job, node, replay, snap

NOW = 50_000.0


def nvlink(key: str, tenant: str, gpus: int, *args: int, **kwargs: object) -> Job:
    """A queued job that requires an NVLinked GPU set per replica."""
    return job(
        key, tenant, gpus, *args, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED, **kwargs
    )


def test_a_tenant_below_its_guarantee_reclaims_rather_than_evicting_its_own_job() -> None:
    """The owner (guarantee 8) runs a 4-GPU low-priority job; a borrower holds the other 4.
    The owner's 4-GPU high-priority job is inside the guarantee: it takes the borrower's GPUs.
    Evicting the owner's own job instead leaves it at 4 of 8 for good (the evicted job cannot
    come back while the borrower keeps borrowing)."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    jobs = [
        job("owner/low", "owner", 4, running_on=[("n0", (0, 1, 2, 3))], started=NOW - 600),
        job("borrower/b", "borrower", 4, running_on=[("n0", (4, 5, 6, 7))], started=NOW - 600),
        job("owner/high", "owner", 4, priority=10, submitted=NOW - 10),
    ]
    first = run_cycle(snap(tenants, jobs, [node("n0")], NOW))
    admission = first.admission_of("owner/high")
    assert admission is not None
    assert admission.reason is AdmitReason.WITHIN_GUARANTEE
    assert [(v.victim, v.reason) for v in admission.victims] == [
        ("borrower/b", PreemptReason.RECLAIM_GUARANTEE)
    ]
    # And the owner stays at its guarantee: nothing of its own is queued again.
    after = replay(snap(tenants, jobs, [node("n0")], NOW), first, dt=60)
    usage = {u.name: u.used for u in run_cycle(after).tenants}
    assert usage["owner"] == 8


def test_two_one_gpu_borrowers_go_rather_than_one_six_gpu_borrower() -> None:
    """The owner needs 2 GPUs of a full node where a borrower runs one 6-GPU job and two 1-GPU
    jobs, all started together: the two small ones lose a third of the work."""
    tenants = [Tenant("owner", guaranteed=2), Tenant("borrower", guaranteed=0)]
    jobs = [
        job(
            "borrower/big", "borrower", 6, running_on=[("n0", tuple(range(6)))], started=NOW - 3600
        ),
        job("borrower/s6", "borrower", 1, running_on=[("n0", (6,))], started=NOW - 3600),
        job("borrower/s7", "borrower", 1, running_on=[("n0", (7,))], started=NOW - 3600),
        job("owner/pair", "owner", 2, submitted=NOW - 10),
    ]
    admission = run_cycle(snap(tenants, jobs, [node("n0")], NOW)).admission_of("owner/pair")
    assert admission is not None
    assert sorted(v.victim for v in admission.victims) == ["borrower/s6", "borrower/s7"]


def test_a_job_inside_the_guarantee_behind_an_unplaceable_head_gets_the_idle_gpu() -> None:
    """The owner's head job asks 8 NVLinked GPUs of a model no node has; its next job (1 GPU)
    is inside the guarantee. The one idle GPU goes to it, not to a borrower, and nothing
    another tenant runs inside its own guarantee is evicted."""
    tenants = [
        Tenant("owner", guaranteed=4),
        Tenant("steady", guaranteed=4),
        Tenant("borrower", guaranteed=0, weight=10.0),
    ]
    jobs = [
        *(
            job(f"steady/s{g}", "steady", 1, running_on=[("n0", (g,))], started=NOW - 600)
            for g in range(4)
        ),
        *(
            job(f"borrower/r{g}", "borrower", 1, running_on=[("n0", (g,))], started=NOW - 600)
            for g in range(4, 7)
        ),
        nvlink("owner/head", "owner", 8, submitted=NOW - 100, gpu_model="B200"),
        job("owner/small", "owner", 1, submitted=NOW - 90),
        job("borrower/more", "borrower", 1, submitted=NOW - 95),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0")], NOW))
    assert result.admission_of("owner/small") is not None
    assert result.admission_of("borrower/more") is None
    assert not any(p.victim.startswith("steady/") for p in result.preemptions)


def test_a_foreign_victim_is_not_kept_beside_the_own_victim_the_quota_needs() -> None:
    """The owner (guarantee and limit 8) runs a 4-GPU low-priority job on n0 beside a
    borrower's 4-GPU job; n1 has 4 free GPUs next to a job nobody may evict. The owner's
    2 x 4-GPU gang must evict its own low-priority job to stay within its limit, and that job's
    GPUs complete the gang: evicting the borrower too (or instead) is for nothing."""
    tenants = [
        Tenant("owner", guaranteed=8, borrowing_limit=8),
        Tenant("borrower", guaranteed=0),
    ]
    jobs = [
        job("owner/low", "owner", 4, running_on=[("n0", (0, 1, 2, 3))], started=NOW - 600),
        job("borrower/b", "borrower", 4, running_on=[("n0", (4, 5, 6, 7))], started=NOW - 600),
        job(
            "borrower/pinned",
            "borrower",
            4,
            running_on=[("n1", (0, 1, 2, 3))],
            started=NOW - 600,
            preemptible=False,
        ),
        job("owner/gang", "owner", 4, 2, priority=5, submitted=NOW - 10),
    ]
    admission = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")], NOW)).admission_of(
        "owner/gang"
    )
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["owner/low"]


def test_a_lender_one_gpu_above_its_guarantee_loses_at_most_one_gpu() -> None:
    """t0 (guarantee 16) holds 17 GPUs; the 8-GPU job it submitted last does not fit after the
    others in queue order, but the tenant borrows 1 GPU, not 8. t1's 2-GPU NVLink job would
    need two of t0's one-GPU jobs: it waits rather than take t0 below its guarantee."""
    tenants = [Tenant("t0", guaranteed=16), Tenant("t1", guaranteed=4)]
    jobs = [
        job("t0/four", "t0", 4, priority=1, running_on=[("n0", (0, 1, 2, 3))], started=NOW - 600),
        *(
            job(f"t0/one{g}", "t0", 1, submitted=float(g), running_on=[("n0", (g,))])
            for g in range(4, 8)
        ),
        job("t0/side", "t0", 1, submitted=10.0, running_on=[("n2", ())]),
        job("t0/eight", "t0", 8, submitted=20.0, running_on=[("n1", ())]),
        nvlink("t1/pair", "t1", 2, submitted=NOW - 10),
    ]
    nodes = [node("n0"), node("n1", "count"), node("n2", "count")]
    result = run_cycle(snap(tenants, jobs, nodes, NOW))
    assert result.admission_of("t1/pair") is None
    assert not result.preemptions


def test_own_victims_needed_only_beside_a_foreign_one_are_spared_with_it() -> None:
    """t0 (guarantee 8) holds 11 GPUs: seven one-GPU jobs on n0 and two 2-GPU jobs on n1; t1
    borrows n0's last GPU and three on n1. t0's 4-GPU NVLink job of higher priority takes 4 of
    its own one-GPU jobs. Reclaiming t1's GPU too would need all seven (a reclaim is only for a
    job inside the guarantee): once that GPU is spared, three of the seven are for nothing."""
    tenants = [Tenant("t0", guaranteed=8), Tenant("t1"), Tenant("t2")]
    jobs = [
        *(
            job(f"t0/e{g}", "t0", 1, submitted=float(g), running_on=[("n0", (g,))])
            for g in range(7)
        ),
        job("t0/e7", "t0", 2, submitted=7.0, running_on=[("n1", (0, 1))]),
        job("t0/e8", "t0", 2, submitted=8.0, running_on=[("n1", (4, 5))]),
        job("t1/e9", "t1", 1, submitted=9.0, running_on=[("n0", (7,))]),
        *(
            job(f"t1/e{i}", "t1", 1, submitted=float(i), running_on=[("n1", (g,))])
            for i, g in ((10, 2), (11, 3), (12, 6))
        ),
        nvlink("t0/g0", "t0", 4, priority=1, submitted=100.0),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")], 1000.0))
    admission = result.admission_of("t0/g0")
    assert admission is not None
    assert len(admission.victims) == 4
    assert all(v.reason is PreemptReason.HIGHER_PRIORITY for v in admission.victims)


def test_a_job_that_places_on_free_gpus_evicts_only_what_its_limit_needs() -> None:
    """t0 (limit 24) holds 18 GPUs; its 8-GPU job of higher priority fits a free node, and
    two of its one-GPU jobs must go for the limit. Freeing a whole node instead (three jobs on
    the half-full node) is one eviction too many."""
    tenants = [Tenant("t0", guaranteed=16, borrowing_limit=24), Tenant("t1")]
    jobs = [
        *(
            job(f"t0/a{g}", "t0", 1, submitted=float(g), running_on=[("n0", (g,))])
            for g in range(7)
        ),
        job("t1/x", "t1", 1, submitted=7.0, running_on=[("n0", (7,))]),
        *(
            job(f"t0/b{g}", "t0", 1, submitted=10.0 + g, running_on=[("n1", (g,))])
            for g in range(3)
        ),
        job("t0/full", "t0", 8, submitted=-1.0, running_on=[("n2", tuple(range(8)))]),
        nvlink("t0/big", "t0", 8, priority=1, submitted=100.0),
    ]
    nodes = [node(f"n{i}") for i in range(4)]
    admission = run_cycle(snap(tenants, jobs, nodes, 1000.0)).admission_of("t0/big")
    assert admission is not None
    assert admission.placement[0].node == "n3"
    assert sorted(v.victim for v in admission.victims) == ["t0/b1", "t0/b2"]


def test_a_gang_spares_own_victims_once_the_foreign_one_that_needed_them_goes() -> None:
    """t0 (guarantee 16) holds 23 GPUs over three full nodes beside one of t1's GPUs. Its
    2 x 1-GPU gang of higher priority: evicting its 8-GPU job frees a whole node for both
    replicas; a one-GPU job of its own beside it, needed only while t1's GPU was a victim too
    (a reclaim is only for a job inside the guarantee), is for nothing."""
    tenants = [Tenant("t0", guaranteed=16), Tenant("t1")]
    jobs = [
        job("t0/a0", "t0", 1, submitted=0.0, running_on=[("n0", (0,))]),
        job("t0/a1", "t0", 1, submitted=1.0, running_on=[("n0", (1,))]),
        job("t0/pairs", "t0", 2, 2, submitted=2.0, running_on=[("n0", (2, 3)), ("n0", (4, 5))]),
        job("t0/a6", "t0", 1, submitted=3.0, running_on=[("n0", (6,))]),
        job("t0/a7", "t0", 1, submitted=4.0, running_on=[("n0", (7,))]),
        *(job(f"t0/b{g}", "t0", 1, submitted=5.0 + g, running_on=[("n1", (g,))]) for g in range(5)),
        job("t0/b56", "t0", 2, submitted=10.0, running_on=[("n1", (5, 6))]),
        job("t0/full", "t0", 8, submitted=11.0, running_on=[("n2", tuple(range(8)))]),
        job("t1/x", "t1", 1, submitted=12.0, running_on=[("n1", (7,))]),
        nvlink("t0/gang", "t0", 1, 2, priority=1, submitted=13.0),
    ]
    nodes = [node("n0"), node("n1"), node("n2")]
    admission = run_cycle(snap(tenants, jobs, nodes, 1000.0)).admission_of("t0/gang")
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["t0/full"]
