"""Idle GPUs kept for a lender that asked for GPUs moments ago (``CycleConfig.
lending_hold_seconds``).

Tenants submit in bursts. A GPU lent the moment it comes free is reclaimed seconds later by the
lender's next job: a preemption of a job that had barely started. For the hold's window a
tenant that asked for GPUs keeps as many idle GPUs of its unused guarantee as it asked; jobs of
other tenants that would borrow wait for the rest. The expected answers below are worked out by
hand from the snapshot (free GPUs, the lender's guarantee, use and recent asks), not from the
core's arithmetic.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.core.admission import (
    Cycle,
    CycleConfig,
    Cycles,
    PreemptReason,
    Snapshot,
    Tenant,
    WaitReason,
    run_cycle,
)
from tests.unit.core.admission_testdata import job, node, replay

NOW = 100_000.0
WINDOW = CycleConfig().lending_hold_seconds


def _lender_and_borrower(
    borrower_gpus: int, *, asked_ago: float = 60.0, borrower_guarantee: int = 0
) -> Snapshot:
    """One 8-GPU node. Lender ``l`` (guaranteed 8) runs a 2-GPU job it submitted
    ``asked_ago`` seconds ago; borrower ``b`` queues one job of ``borrower_gpus``. Free: 6;
    ``l`` leaves 6 of its guarantee unused and asked 2 GPUs recently, so it keeps 2."""
    return Snapshot(
        now=NOW,
        tenants=(Tenant("l", 8), Tenant("b", borrower_guarantee)),
        jobs=(
            job(
                "l/burst",
                "l",
                2,
                submitted=NOW - asked_ago,
                started=NOW - asked_ago,
                running_on=[("n0", (0, 1))],
            ),
            job("b/next", "b", borrower_gpus, submitted=NOW - 3600),
        ),
        nodes=(node("n0"),),
    )


@pytest.mark.parametrize(("gpus", "admitted"), [(1, True), (4, True), (5, False), (6, False)])
def test_a_borrower_gets_only_the_idle_gpus_a_lender_that_just_asked_does_not_keep(
    gpus: int, admitted: bool
) -> None:
    # 6 free, 2 kept for l: a borrower may take up to 4.
    result = run_cycle(_lender_and_borrower(gpus))
    assert bool(result.admissions) is admitted
    if not admitted:
        assert result.wait_reasons["b/next"] is WaitReason.HELD_FOR_LENDERS
        (waiting,) = result.waiting
        assert "2 of them are kept" in waiting.message
        assert "(l 2)" in waiting.message
        assert result.wake_at == NOW - 60.0 + WINDOW


def test_the_hold_lapses_once_the_lender_has_been_quiet_for_the_window() -> None:
    result = run_cycle(_lender_and_borrower(6, asked_ago=WINDOW + 1))
    assert [a.job for a in result.admissions] == ["b/next"]
    assert result.wake_at is None


def test_a_job_inside_its_own_guarantee_never_waits_for_another_tenants_hold() -> None:
    result = run_cycle(_lender_and_borrower(6, borrower_guarantee=6))
    assert [a.job for a in result.admissions] == ["b/next"]


def test_no_hold_when_the_setting_is_zero() -> None:
    snapshot = _lender_and_borrower(6)
    snapshot = replace(snapshot, config=CycleConfig(lending_hold_seconds=0))
    assert [a.job for a in run_cycle(snapshot).admissions] == ["b/next"]


def test_a_lender_keeps_at_most_what_its_guarantee_leaves_unused() -> None:
    # l asked 2 GPUs recently but its guarantee is 3 and it uses 2: it keeps 1, so a
    # borrower may take 5 of the 6 free GPUs.
    snapshot = _lender_and_borrower(5)
    snapshot = replace(snapshot, tenants=(Tenant("l", 3), Tenant("b", 0)))
    assert [a.job for a in run_cycle(snapshot).admissions] == ["b/next"]
    blocked = replace(snapshot, jobs=(snapshot.jobs[0], job("b/next", "b", 6)))
    assert run_cycle(blocked).wait_reasons["b/next"] is WaitReason.HELD_FOR_LENDERS


def _burst(config: CycleConfig) -> tuple[int, list[str]]:
    """Lender ``l`` (guaranteed 8) submits one 1-GPU job, then another 30 s later; borrower
    ``b`` keeps a queue of 1-GPU jobs. Returns the preemptions and where l's second job
    started (admissions by key)."""
    tenants = (Tenant("l", 8), Tenant("b", 0))
    nodes = (node("n0"),)
    borrowers = tuple(job(f"b/q{i}", "b", 1, submitted=float(i)) for i in range(8))
    first = job("l/first", "l", 1, submitted=NOW)
    snapshot = Snapshot(
        now=NOW, tenants=tenants, jobs=(first, *borrowers), nodes=nodes, config=config
    )
    result = run_cycle(snapshot)
    snapshot = replay(snapshot, result, 30.0)
    second = job("l/second", "l", 1, submitted=NOW + 30.0)
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, second))
    result = run_cycle(snapshot)
    preempted = [p for p in result.preemptions if p.reason is PreemptReason.RECLAIM_GUARANTEE]
    return len(preempted), [a.job for a in result.admissions]


def test_a_lenders_next_job_in_a_burst_starts_on_the_kept_gpu_without_evicting_anyone() -> None:
    evictions, admitted = _burst(CycleConfig())
    assert evictions == 0
    assert "l/second" in admitted
    # Lent at once, the borrower that took the last GPU is evicted for it.
    evictions, admitted = _burst(CycleConfig(lending_hold_seconds=0))
    assert evictions == 1
    assert "l/second" in admitted


def test_a_tenant_never_waits_for_its_own_hold() -> None:
    # b (guaranteed 4) asked for 2 GPUs a minute ago and runs them; its next job asks 6, more
    # than its guarantee leaves, so it borrows: the 2 unused GPUs of its guarantee are not
    # kept from it, and nobody else asked.
    snapshot = Snapshot(
        now=NOW,
        tenants=(Tenant("b", 4), Tenant("l", 0)),
        jobs=(
            job("b/run", "b", 2, submitted=NOW - 60, started=NOW - 60, running_on=[("n0", (0, 1))]),
            job("b/next", "b", 6, submitted=NOW - 30),
        ),
        nodes=(node("n0"),),
    )
    assert [a.job for a in run_cycle(snapshot).admissions] == ["b/next"]


def test_the_idle_gpus_kept_for_a_lender_are_reported_with_its_usage() -> None:
    # l keeps 2 of the 6 idle GPUs while b's 6-GPU job waits; nobody keeps any for b.
    usage = {u.name: u for u in run_cycle(_lender_and_borrower(6)).tenants}
    assert usage["l"].lending_hold == 2
    assert usage["b"].lending_hold == 0
    # Kept GPUs are idle ones: once b's 5-GPU job starts inside b's own guarantee, 1 GPU is
    # idle and l keeps that one.
    busy = _lender_and_borrower(5, borrower_guarantee=6)
    usage = {u.name: u for u in run_cycle(busy).tenants}
    assert usage["l"].lending_hold == 1


def test_a_borrower_over_its_borrowing_limit_evicts_nothing_while_a_lender_keeps_its_gpus() -> None:
    """b's 6-GPU job would borrow: within b's borrowing limit only once b's own low-priority
    job goes. While lender l keeps 6 of the idle GPUs it asked for, the job waits as any
    borrower does; nothing is evicted for it."""
    jobs = (
        job("l/run", "l", 2, running_on=[("n1", (0, 1))], started=NOW - 100, submitted=NOW - 100),
        job("l/back", "l", 6, submitted=NOW - 100, not_before=NOW + 60),  # requeued, in backoff
        job("b/low", "b", 4, priority=0, running_on=[("n0", (0, 1, 2, 3))], started=0.0),
        job("b/hi", "b", 6, priority=5, submitted=NOW - 10),
    )
    for limit in (None, 8):
        tenants = (Tenant("l", guaranteed=8), Tenant("b", guaranteed=0, borrowing_limit=limit))
        result = run_cycle(
            Snapshot(now=NOW, tenants=tenants, jobs=jobs, nodes=(node("n0"), node("n1")))
        )
        assert result.admissions == (), limit
        assert result.wait_reasons["b/hi"] is WaitReason.HELD_FOR_LENDERS, limit


@pytest.mark.parametrize("spent", ["l", "org"])
def test_a_tenant_that_spent_its_budget_keeps_no_idle_gpus(spent: str) -> None:
    """quotas.md, "Lending after a burst": the hold keeps GPUs for the lender's next jobs. A
    lender whose budget (or whose parent's) is spent for five more days starts none of them
    before then, however often it submits: its 8 idle GPUs go to b at once."""
    until = NOW + 5 * 86400
    tenants = (
        Tenant("org", 8, budget_exhausted_until=until if spent == "org" else None),
        Tenant("l", 8, parent="org", budget_exhausted_until=until if spent == "l" else None),
        Tenant("b"),
    )
    result = run_cycle(
        Snapshot(
            now=NOW,
            tenants=tenants,
            jobs=(job("l/next", "l", 8, submitted=NOW - 10.0), job("b/x", "b", 8)),
            nodes=(node("n"),),
        )
    )
    assert [a.job for a in result.admissions] == ["b/x"]
    waiting = result.waiting_of("l/next")
    assert waiting is not None
    assert waiting.reason is WaitReason.BUDGET_EXHAUSTED


_NEVER = {
    # No node of 8 GPUs holds 16 in one replica, even idle.
    "larger than any node": (Tenant("l", 8), job("l/never", "l", 16, submitted=NOW - 10.0)),
    "a model no node has": (
        Tenant("l", 8),
        job("l/never", "l", 4, gpu_model="B200", submitted=NOW - 10.0),
    ),
    # 2 x 6 GPUs fit the two idle nodes, but l may never hold more than 10.
    "beyond the borrowing limit": (
        Tenant("l", 8, borrowing_limit=10),
        job("l/never", "l", 6, 2, submitted=NOW - 10.0),
    ),
    "beyond the per-user cap": (
        Tenant("l", 8, user_max_gpus=4),
        job("l/never", "l", 6, submitter="alice", submitted=NOW - 10.0),
    ),
}


@pytest.mark.parametrize("why", sorted(_NEVER))
def test_a_job_that_can_never_start_keeps_no_idle_gpus_from_borrowers(why: str) -> None:
    """quotas.md, "Lending after a burst": the hold keeps GPUs for the jobs a lender just
    asked for. Two idle 8-GPU nodes; lender l (guaranteed 8) asked 10 s ago with a job that
    can never start (no node holds it even idle, or it is larger than one of l's limits), so
    it would never take kept GPUs: b's 14-GPU job borrows 14 of the 16 idle GPUs at once
    rather than wait out the hold for the 4 or more kept ones."""
    lender, never = _NEVER[why]
    snapshot = Snapshot(
        now=NOW,
        tenants=(lender, Tenant("b")),
        jobs=(never, job("b/x", "b", 7, 2, submitted=NOW - 3600.0)),
        nodes=(node("n0"), node("n1")),
    )
    result = run_cycle(snapshot)
    assert [a.job for a in result.admissions] == ["b/x"], result.waiting
    assert {u.name: u.lending_hold for u in result.tenants}["l"] == 0
    # A 4-GPU ask from a job that could start (in requeue backoff for a minute) keeps 4 of
    # the 16 idle GPUs: b's job would leave 2.
    startable = replace(never, gpus_per_replica=4, replicas=1, gpu_model=None, not_before=NOW + 60)
    result = run_cycle(replace(snapshot, jobs=(startable, snapshot.jobs[1])))
    assert result.wait_reasons["b/x"] is WaitReason.HELD_FOR_LENDERS


def test_a_job_queued_at_a_parent_tenant_keeps_no_idle_gpus_from_borrowers() -> None:
    """A job whose namespace belongs to a parent tenant waits with NoTenant for ever: its
    GPUs are not kept at the parent either."""
    tenants = (Tenant("org", 8), Tenant("l", 8, parent="org"), Tenant("b"))
    snapshot = Snapshot(
        now=NOW,
        tenants=tenants,
        jobs=(job("org/x", "org", 8, submitted=NOW - 10.0), job("b/x", "b", 7, 2)),
        nodes=(node("n0"), node("n1")),
    )
    result = run_cycle(snapshot)
    assert [a.job for a in result.admissions] == ["b/x"], result.waiting
    assert result.wait_reasons["org/x"] is WaitReason.NO_TENANT


def test_an_arrival_that_can_never_start_is_decided_on_top_of_a_kept_cycle() -> None:
    """It leaves the lenders' holds as they were, so a kept cycle decides it alone (as
    :meth:`Cycle.decide_arrivals` requires) and says what a cycle from scratch says: b still
    waits for the 4 GPUs kept for l's startable job, l's 16-GPU job for a node that holds it."""
    lender, never = _NEVER["larger than any node"]
    startable = job("l/back", "l", 4, submitted=NOW - 20.0, not_before=NOW + 60)
    snapshot = Snapshot(
        now=NOW,
        tenants=(lender, Tenant("b")),
        jobs=(startable, job("b/x", "b", 7, 2, submitted=NOW - 3600.0)),
        nodes=(node("n0"), node("n1")),
    )
    cycles = Cycles()
    assert cycles.cycle(snapshot).run().wait_reasons["b/x"] is WaitReason.HELD_FOR_LENDERS
    arrived = replace(snapshot, jobs=(*snapshot.jobs, never))
    result = cycles.cycle(arrived).run()
    assert cycles.extended == 1
    assert result == Cycle(arrived).run()
    assert result.wait_reasons["b/x"] is WaitReason.HELD_FOR_LENDERS
    assert result.wait_reasons["l/never"] is WaitReason.NO_FEASIBLE_NODES


def test_a_kept_cycle_and_one_from_scratch_agree_on_a_job_arriving_at_a_parent_tenant() -> None:
    """b runs 8 GPUs on one of two nodes and its 9-GPU gang waits for capacity; then a job
    arrives at parent tenant org (guaranteed 8). The kept cycle decides it alone (NoTenant);
    a cycle from scratch must not keep the 8 idle GPUs for it and tell b it waits for org."""
    tenants = (Tenant("org", 8), Tenant("l", 8, parent="org"), Tenant("b"))
    snapshot = Snapshot(
        now=NOW,
        tenants=tenants,
        jobs=(
            job("b/run", "b", 8, running_on=[("n0", ())], preemptible=False),
            job("b/x", "b", 3, 3, submitted=NOW - 3600.0),
        ),
        nodes=(node("n0"), node("n1")),
    )
    cycles = Cycles()
    cycles.cycle(snapshot).run()
    arrived = replace(snapshot, jobs=(*snapshot.jobs, job("org/x", "org", 8, submitted=NOW)))
    result = cycles.cycle(arrived).run()
    assert result == Cycle(arrived).run()
    assert result.wait_reasons["b/x"] is WaitReason.WAITING_FOR_CAPACITY
