"""Per-user caps, budgets and fair share with memory in the admission cycle.

Truth for the cap property is counted here from the replayed snapshot (GPUs and jobs of each
submitter that hold GPUs), never from the cycle's own per-user counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.admission import Cycle, JobState, Snapshot, Tenant, WaitReason
from tests.unit.core.admission_testdata import job, node, replay, snap
from tests.unit.core.test_admission_properties import tenant_sets

NOW = 10_000.0


def test_a_user_at_the_gpu_cap_waits_while_a_teammate_starts() -> None:
    team = Tenant("team", guaranteed=16, user_max_gpus=8)
    jobs = [
        job("team/a1", "team", 8, submitter="alice", running_on=[("n0", tuple(range(8)))]),
        job("team/a2", "team", 4, submitter="alice", submitted=1.0),
        job("team/b1", "team", 4, submitter="bob", submitted=2.0),
    ]
    result = Cycle(snap([team], jobs, [node("n0"), node("n1")], NOW)).run()
    assert [a.job for a in result.admissions] == ["team/b1"]
    waiting = result.waiting_of("team/a2")
    assert waiting is not None
    assert waiting.reason is WaitReason.USER_CAP_EXCEEDED
    assert "user alice holds 8 of the 8 GPUs tenant team allows one user" in waiting.message


def test_the_cap_holds_across_admissions_of_one_cycle() -> None:
    team = Tenant("team", guaranteed=16, user_max_gpus=6)
    jobs = [job(f"team/a{i}", "team", 2, submitter="alice", submitted=float(i)) for i in range(5)]
    result = Cycle(snap([team], jobs, [node("n0"), node("n1")], NOW)).run()
    assert len(result.admissions) == 3
    assert {w.reason for w in result.waiting} == {WaitReason.USER_CAP_EXCEEDED}


def test_a_job_cap_counts_jobs_holding_gpus() -> None:
    team = Tenant("team", guaranteed=16, user_max_jobs=1)
    jobs = [
        job("team/a1", "team", 1, submitter="alice", running_on=[("n0", (0,))]),
        job("team/a2", "team", 1, submitter="alice", submitted=1.0),
    ]
    result = Cycle(snap([team], jobs, [node("n0")], NOW)).run()
    waiting = result.waiting_of("team/a2")
    assert waiting is not None
    assert waiting.reason is WaitReason.USER_CAP_EXCEEDED
    assert "1 of the 1 jobs holding GPUs" in waiting.message


def test_jobs_without_a_recorded_submitter_share_one_cap() -> None:
    team = Tenant("team", guaranteed=16, user_max_gpus=4)
    jobs = [job(f"team/x{i}", "team", 4, submitted=float(i)) for i in range(2)]
    result = Cycle(snap([team], jobs, [node("n0")], NOW)).run()
    assert [a.job for a in result.admissions] == ["team/x0"]
    waiting = result.waiting_of("team/x1")
    assert waiting is not None
    assert "jobs with no recorded submitter" in waiting.message


def test_a_capped_job_never_preempts_and_never_claims_the_guarantee() -> None:
    # team is below its guarantee; its only queued job is over alice's cap, so the borrower
    # keeps its GPUs.
    team = Tenant("team", guaranteed=8, user_max_gpus=4)
    other = Tenant("other")
    jobs = [
        job("team/a1", "team", 4, submitter="alice", running_on=[("n0", (0, 1, 2, 3))]),
        job("team/a2", "team", 4, submitter="alice", submitted=1.0),
        job("other/o1", "other", 4, running_on=[("n0", (4, 5, 6, 7))]),
    ]
    result = Cycle(snap([team, other], jobs, [node("n0")], NOW)).run()
    assert result.preemptions == ()
    assert result.wait_reasons["team/a2"] is WaitReason.USER_CAP_EXCEEDED


def test_the_expected_start_of_a_capped_job_waits_for_the_users_own_job_to_end() -> None:
    team = Tenant("team", guaranteed=16, user_max_gpus=8)
    running = job(
        "team/a1",
        "team",
        8,
        submitter="alice",
        running_on=[("n0", tuple(range(8)))],
        expected_end=NOW + 3600,
    )
    queued = job("team/a2", "team", 4, submitter="alice", submitted=1.0)
    cycle = Cycle(snap([team], [running, queued], [node("n0"), node("n1")], NOW))
    cycle.run()
    assert cycle.forecast()["team/a2"] == NOW + 3600


def test_a_spent_budget_stops_new_jobs_until_the_period_turns_and_keeps_running_ones() -> None:
    spent = Tenant("spent", guaranteed=8, budget_exhausted_until=NOW + 86_400)
    other = Tenant("other")
    jobs = [
        job("spent/r", "spent", 4, running_on=[("n0", (0, 1, 2, 3))]),
        job("spent/q", "spent", 4, submitted=1.0),
        job("other/q", "other", 4, submitted=2.0),
    ]
    cycle = Cycle(snap([spent, other], jobs, [node("n0"), node("n1")], NOW))
    result = cycle.run()
    assert [a.job for a in result.admissions] == ["other/q"]
    waiting = result.waiting_of("spent/q")
    assert waiting is not None
    assert waiting.reason is WaitReason.BUDGET_EXHAUSTED
    assert "next period begins, in 1d 0h" in waiting.message
    assert result.preemptions == ()
    expected = cycle.forecast()["spent/q"]
    assert expected is not None
    assert expected >= NOW + 86_400
    # Past the period's end the cap no longer applies.
    later = Cycle(snap([spent, other], jobs[:2], [node("n0")], NOW + 86_401)).run()
    assert [a.job for a in later.admissions] == ["spent/q"]


def test_a_tenant_that_borrowed_lately_lends_way_to_one_that_did_not() -> None:
    # Both borrow nothing now and ask the same; without memory the FIFO tie-break gives the
    # single free GPU to the first job (busy's); with memory, to fresh's.
    nodes = [node("n0", busy=range(7))]
    jobs = [job("busy/j", "busy", 1, submitted=1.0), job("fresh/j", "fresh", 1, submitted=2.0)]
    memoryless = [Tenant("busy"), Tenant("fresh")]
    first = Cycle(snap(memoryless, jobs, nodes, NOW)).run()
    assert [a.job for a in first.admissions] == ["busy/j"]
    remembered = [Tenant("busy", recent_borrowed=6.0), Tenant("fresh")]
    second = Cycle(snap(remembered, jobs, nodes, NOW)).run()
    assert [a.job for a in second.admissions] == ["fresh/j"]


@st.composite
def capped_workloads(draw: Any) -> tuple[Snapshot, list[Tenant]]:
    tenants = [
        replace(
            t,
            user_max_gpus=draw(st.sampled_from([None, 1, 4, 8])),
            user_max_jobs=draw(st.sampled_from([None, 1, 3])),
        )
        for t in draw(tenant_sets())
    ]
    nodes = [node(f"n{i}", draw(st.sampled_from(["nvswitch", "dgx1"]))) for i in range(3)]
    jobs = [
        job(
            f"{t}/j{i}",
            t,
            draw(st.sampled_from([1, 2, 4, 8])),
            priority=draw(st.integers(0, 2)),
            submitted=float(i),
            submitter=draw(st.sampled_from(["alice", "bob", ""])),
        )
        for i in range(draw(st.integers(2, 24)))
        for t in [draw(st.sampled_from(tenants)).name]
    ]
    return snap(tenants, jobs, nodes, NOW), tenants


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_workloads())
def test_no_submitter_ever_holds_more_than_its_tenant_allows_one_user(
    drawn: tuple[Snapshot, list[Tenant]],
) -> None:
    snapshot, tenants = drawn
    caps = {t.name: t for t in tenants}
    for _ in range(4):
        snapshot = replay(snapshot, Cycle(snapshot).run(), dt=100.0)
        gpus: Counter[tuple[str | None, str]] = Counter()
        jobs: Counter[tuple[str | None, str]] = Counter()
        for j in snapshot.jobs:
            if j.state is JobState.ADMITTED:
                gpus[(j.tenant, j.submitter)] += j.total_gpus
                jobs[(j.tenant, j.submitter)] += 1
        for (tenant, _), held in gpus.items():
            cap = caps[str(tenant)].user_max_gpus
            assert cap is None or held <= cap
        for (tenant, _), count in jobs.items():
            cap = caps[str(tenant)].user_max_jobs
            assert cap is None or count <= cap


def test_a_tenant_is_ranked_by_its_first_job_no_cap_holds_back() -> None:
    # team's head (alice, over her cap) would borrow; bob's job behind it fits team's
    # guarantee. Ranked by the capped head, team would come after the borrower, which would
    # take the free GPU that bob's job is guaranteed.
    team = Tenant("team", guaranteed=8, user_max_gpus=4)
    jobs = [
        job("team/a1", "team", 4, submitter="alice", running_on=[("n0", (0, 1, 2, 3))]),
        job("team/a2", "team", 8, submitter="alice", submitted=1.0),
        job("team/b1", "team", 1, submitter="bob", submitted=3.0),
        job("other/o1", "other", 1, submitted=2.0),
    ]
    nodes = [node("n0", busy=(4, 5, 6))]
    result = Cycle(snap([team, Tenant("other")], jobs, nodes, NOW)).run()
    assert [a.job for a in result.admissions] == ["team/b1"]
    assert result.preemptions == ()


# --- a job larger than a limit never starts under it, and is told so ---------------------


def _waiting(tenants: list[Tenant], jobs: list[Any], key: str) -> tuple[WaitReason, str]:
    result = Cycle(snap(tenants, jobs, [node("n0"), node("n1")], NOW)).run()
    waiting = result.waiting_of(key)
    assert waiting is not None
    return waiting.reason, waiting.message


def test_a_job_larger_than_its_tenants_borrowing_limit_is_told_it_can_never_start() -> None:
    # 16 GPUs idle; the tenant may hold 6 at most (4 guaranteed): 8 never fit, whatever ends.
    tenants = [Tenant("a", guaranteed=4, borrowing_limit=6)]
    reason, message = _waiting(tenants, [job("a/big", "a", 8)], "a/big")
    assert reason is WaitReason.QUOTA_EXCEEDED
    assert message.startswith("needs 8 GPUs, more than the 6 tenant a may ever hold")
    assert "4 guaranteed" in message
    assert "can never start under that limit" in message
    # A job that fits the limit, held back only by what the tenant holds now, is not told so.
    held = job("a/r", "a", 4, running_on=[("n0", (0, 1, 2, 3))])
    reason, message = _waiting(tenants, [held, job("a/w", "a", 4, submitted=1)], "a/w")
    assert reason is WaitReason.QUOTA_EXCEEDED
    assert "never" not in message
    assert "tenant a holds 4 of its borrowing limit 6" in message


def test_a_job_larger_than_a_parents_borrowing_limit_is_told_so_naming_the_parent() -> None:
    tenants = [
        Tenant("org", guaranteed=4, borrowing_limit=6),
        Tenant("a", guaranteed=2, parent="org"),
    ]
    reason, message = _waiting(tenants, [job("a/big", "a", 8)], "a/big")
    assert reason is WaitReason.QUOTA_EXCEEDED
    assert message.startswith("needs 8 GPUs, more than the 6 tenant org (above a) may ever hold")
    assert "can never start under that limit" in message
    assert message.endswith("have the limit (its spec.borrowingLimit) raised")


def test_a_job_larger_than_the_per_user_gpu_cap_is_told_it_can_never_start() -> None:
    tenants = [Tenant("team", guaranteed=16, user_max_gpus=4)]
    reason, message = _waiting(tenants, [job("team/big", "team", 8, submitter="u")], "team/big")
    assert reason is WaitReason.USER_CAP_EXCEEDED
    assert message.startswith("needs 8 GPUs, more than the 4 GPUs tenant team allows one user")
    assert "can never start under that cap" in message
    assert message.endswith("have the cap (its spec.perUser.maxGpus) raised")
