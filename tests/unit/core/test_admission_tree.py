"""The tenant tree in the admission cycle: teams borrow their siblings' idle guarantee before
other organisations do, take it back from a sibling, every level's limit, budget and per-user
cap holds over its subtree, and an organisation at its guarantee lends nothing.

The property test's truth is computed here from the snapshots (who holds what, by walking the
tenants' parents), and what a lender can use of its guarantee by a brute-force subset sum,
never from the cycle's own ledgers."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.admission import (
    Cycle,
    JobState,
    PreemptReason,
    Snapshot,
    Tenant,
    WaitReason,
)
from gpusched.core.admission.tree import TenantTree
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node, replay, snap

NOW = 10_000.0


def org(name: str, guaranteed: int = 0, **kw: Any) -> Tenant:
    return Tenant(name, guaranteed=guaranteed, **kw)


def team(name: str, parent: str, guaranteed: int = 0, **kw: Any) -> Tenant:
    return Tenant(name, guaranteed=guaranteed, parent=parent, **kw)


def test_a_team_borrows_its_siblings_idle_guarantee_before_another_organisation() -> None:
    # 12 GPUs. a1 fills its own guarantee (8) and asks 4 more, inside its org's (16); b asks
    # one GPU beyond any guarantee. a1's 4 go first (flat, b's smaller borrowing would).
    tenants = [org("a", 16), team("a1", "a", 8), team("a2", "a", 8), org("b")]
    jobs = [
        job("a1/j", "a1", 8, submitted=2.0),
        job("b/j", "b", 1, submitted=1.0),
        job("a1/k", "a1", 4, submitted=3.0),
    ]
    nodes = [node("n0"), node("n1", busy=range(4))]
    result = Cycle(snap(tenants, jobs, nodes, NOW)).run()
    assert sorted(a.job for a in result.admissions) == ["a1/j", "a1/k"]
    flat = [replace(t, parent=None) for t in tenants]
    result = Cycle(snap(flat, jobs, nodes, NOW)).run()
    assert sorted(a.job for a in result.admissions) == ["a1/j", "b/j"]


def test_a_team_below_its_guarantee_takes_it_back_from_a_sibling_under_the_orgs_limit() -> None:
    # Org a: guarantee and limit 8. a2 holds all 8 (4 of them a1's idle guarantee); a1 asks
    # its 4: one of a2's jobs goes, and the org stays at its limit.
    tenants = [org("a", 8, borrowing_limit=8), team("a1", "a", 4), team("a2", "a", 4)]
    jobs = [
        job("a2/x", "a2", 4, running_on=[("n0", (0, 1, 2, 3))]),
        job("a2/y", "a2", 4, running_on=[("n0", (4, 5, 6, 7))], started=5.0),
        job("a1/j", "a1", 4, submitted=1.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0")], NOW)).run()
    (admission,) = result.admissions
    assert admission.job == "a1/j"
    assert [(v.victim, v.reason) for v in admission.victims] == [
        ("a2/y", PreemptReason.RECLAIM_GUARANTEE)
    ]


def test_an_organisation_at_its_guarantee_lends_nothing_to_another() -> None:
    # Org a (guarantee 8) holds 8: a1 borrows a2's idle guarantee, inside a. Org b claims its
    # guarantee, but a borrows nothing beyond its own: no job of a is taken (flat, a1 would
    # lose one: it holds 4 beyond its own guarantee).
    tenants = [org("a", 8), team("a1", "a", 4), team("a2", "a", 4), org("b", 8), team("b1", "b", 8)]
    jobs = [
        job("a1/x", "a1", 4, running_on=[("n0", (0, 1, 2, 3))]),
        job("a1/y", "a1", 4, running_on=[("n0", (4, 5, 6, 7))], started=5.0),
        job("b1/j", "b1", 4, submitted=1.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0")], NOW)).run()
    assert result.admissions == ()
    assert result.wait_reasons["b1/j"] is WaitReason.WAITING_FOR_CAPACITY
    flat = [replace(t, parent=None) for t in tenants]
    result = Cycle(snap(flat, jobs, [node("n0")], NOW)).run()
    assert [a.job for a in result.admissions] == ["b1/j"]


def test_an_organisation_borrowing_beyond_its_guarantee_gives_it_back() -> None:
    # Org a (guarantee 4) holds 8 through a1; org b claims its 4: a1 loses one job.
    tenants = [org("a", 4), team("a1", "a", 4), org("b", 4)]
    jobs = [
        job("a1/x", "a1", 4, running_on=[("n0", (0, 1, 2, 3))]),
        job("a1/y", "a1", 4, running_on=[("n0", (4, 5, 6, 7))], started=5.0),
        job("b/j", "b", 4, submitted=1.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0")], NOW)).run()
    (admission,) = result.admissions
    assert [v.victim for v in admission.victims] == ["a1/y"]


def test_several_victims_from_one_organisation_leave_it_its_guarantee() -> None:
    # Org a (guarantee 8) holds 12 in 2-GPU jobs of two teams without guarantees of their own.
    # b's 8-GPU job fits only on n0 (n1 has 4 GPUs of another workload): that would take all
    # four of a's jobs there, a down to 4. Each team alone may lose them; the org may not.
    tenants = [org("a", 8), team("a1", "a"), team("a2", "a"), org("b", 8)]
    jobs = [
        job("a1/x", "a1", 2, running_on=[("n0", (0, 1))]),
        job("a1/y", "a1", 2, running_on=[("n0", (2, 3))]),
        job("a2/x", "a2", 2, running_on=[("n0", (4, 5))]),
        job("a2/y", "a2", 2, running_on=[("n0", (6, 7))]),
        job("a1/z", "a1", 2, running_on=[("n1", (0, 1))]),
        job("a2/z", "a2", 2, running_on=[("n1", (2, 3))]),
        job("b/j", "b", 8, submitted=1.0),
    ]
    nodes = [node("n0"), node("n1", busy=(4, 5, 6, 7))]
    result = Cycle(snap(tenants, jobs, nodes, NOW)).run()
    assert result.admissions == ()


def test_a_claim_on_a_parents_guarantee_takes_nothing_while_the_parent_holds_more() -> None:
    # a0's high-priority job is first in org a's queue, so it claims a's guarantee; but a holds
    # 16 against 8 (a1's jobs): it may not take x's GPUs for it, it must wait.
    tenants = [org("a", 8), team("a0", "a"), team("a1", "a"), org("x")]
    jobs = [
        job("a1/p", "a1", 8, running_on=[("n0", tuple(range(8)))], submitted=5.0),
        job("a1/q", "a1", 8, running_on=[("n1", tuple(range(8)))], submitted=6.0),
        job("x/r", "x", 8, running_on=[("n2", tuple(range(8)))]),
        job("a0/j", "a0", 1, priority=1, submitted=1.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0"), node("n1"), node("n2")], NOW)).run()
    assert result.admissions == ()


def test_a_parents_borrowing_limit_holds_all_its_teams() -> None:
    tenants = [org("a", borrowing_limit=8), team("a1", "a"), team("a2", "a")]
    jobs = [job("a1/j", "a1", 6, submitted=1.0), job("a2/j", "a2", 4, submitted=2.0)]
    result = Cycle(snap(tenants, jobs, [node("n0"), node("n1")], NOW)).run()
    # a2 borrows less (4 against 6), so it goes first; a1's 6 would take a past 8.
    assert [a.job for a in result.admissions] == ["a2/j"]
    waiting = result.waiting_of("a1/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.QUOTA_EXCEEDED
    assert "tenant a (above a1) holds 4 of its borrowing limit 8" in waiting.message


def test_a_parents_budget_and_per_user_cap_hold_across_its_teams() -> None:
    tenants = [org("a", user_max_gpus=4), team("a1", "a"), team("a2", "a")]
    jobs = [
        job("a1/j", "a1", 4, submitter="alice", running_on=[("n0", (0, 1, 2, 3))]),
        job("a2/j", "a2", 2, submitter="alice", submitted=1.0),
        job("a2/k", "a2", 2, submitter="bob", submitted=2.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0")], NOW)).run()
    assert [a.job for a in result.admissions] == ["a2/k"]
    waiting = result.waiting_of("a2/j")
    assert waiting is not None
    assert "4 GPUs tenant a allows one user" in waiting.message
    spent = [org("a", budget_exhausted_until=NOW + 3600), team("a1", "a")]
    result = Cycle(snap(spent, [job("a1/q", "a1", 1)], [node("n0")], NOW)).run()
    assert result.wait_reasons["a1/q"] is WaitReason.BUDGET_EXHAUSTED


def test_an_expected_start_waits_for_a_parents_budget_period_and_its_per_user_cap() -> None:
    """Worked out by hand: the parent's budget turns in a day; alice's 8 GPUs in team a1 end
    in an hour and the parent caps one user at 8 across its teams, so her next job in team a2
    starts then, though n1 has GPUs free now (bob's job takes one of them)."""
    turn = NOW + 86_400.0
    spent = [org("a", budget_exhausted_until=turn), team("a1", "a")]
    cycle = Cycle(snap(spent, [job("a1/q", "a1", 1)], [node("n0")], NOW))
    assert cycle.run().wait_reasons["a1/q"] is WaitReason.BUDGET_EXHAUSTED
    assert cycle.forecast()["a1/q"] == turn
    end = NOW + 3600.0
    capped = [org("a", user_max_gpus=8), team("a1", "a"), team("a2", "a")]
    jobs = [
        job(
            "a1/run",
            "a1",
            8,
            submitter="alice",
            running_on=[("n0", tuple(range(8)))],
            expected_end=end,
        ),
        job("a2/next", "a2", 1, submitter="alice", submitted=1.0),
        job("a2/bobs", "a2", 1, submitter="bob", submitted=2.0),
    ]
    cycle = Cycle(snap(capped, jobs, [node("n0"), node("n1")], NOW))
    result = cycle.run()
    assert result.wait_reasons["a2/next"] is WaitReason.USER_CAP_EXCEEDED
    assert [a.job for a in result.admissions] == ["a2/bobs"]
    starts = cycle.forecast()
    assert starts["a2/next"] == end


def test_a_job_in_a_parents_own_namespace_waits_for_a_team() -> None:
    tenants = [org("a"), team("a1", "a")]
    result = Cycle(snap(tenants, [job("a/j", "a", 1)], [node("n0")], NOW)).run()
    waiting = result.waiting_of("a/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.NO_TENANT
    assert "has child TenantQuotas" in waiting.message


def test_a_parents_usage_sums_its_teams() -> None:
    tenants = [org("a", 4), team("a1", "a", 2), team("a2", "a", 2)]
    jobs = [
        job("a1/j", "a1", 4, submitter="alice", running_on=[("n0", (0, 1, 2, 3))]),
        job("a2/j", "a2", 2, submitter="alice", running_on=[("n0", (4, 5))]),
    ]
    usage = {u.name: u for u in Cycle(snap(tenants, jobs, [node("n0")], NOW)).run().tenants}
    assert (usage["a"].used, usage["a"].borrowed, usage["a"].admitted) == (6, 2, 2)
    assert usage["a"].users == {"alice": (6, 2)}
    assert usage["a"].fair_share == usage["a1"].fair_share + usage["a2"].fair_share
    assert (usage["a1"].used, usage["a1"].borrowed) == (4, 2)


def test_a_missing_parent_or_a_cycle_of_parents_makes_roots() -> None:
    tree = TenantTree.of(
        [team("x", "y"), team("y", "x"), team("z", "x"), team("w", "nowhere"), org("r")]
    )
    assert set(tree.broken) == {"x", "y", "w"}
    assert "cycle" in tree.broken["x"]
    assert "does not exist" in tree.broken["w"]
    assert tree.levels("z") == ("z", "x")
    assert tree.levels("x") == ("x",)


# --- properties ------------------------------------------------------------------------------


@st.composite
def trees(draw: Any) -> tuple[list[Tenant], list[Any]]:
    """One or two organisations of one to three teams (children's guarantees within the
    parent's), maybe a flat tenant beside them; jobs of the teams and the flat tenant."""
    tenants: list[Tenant] = []
    leaves: list[str] = []
    for o in range(draw(st.integers(1, 2))):
        name = f"o{o}"
        guarantee = draw(st.sampled_from([0, 4, 8, 16]))
        limit = draw(st.sampled_from([None, guarantee, guarantee + 8]))
        tenants.append(Tenant(name, guaranteed=guarantee, borrowing_limit=limit))
        left = guarantee
        for t in range(draw(st.integers(1, 3))):
            share = draw(st.integers(0, left))
            left -= share
            leaf = f"{name}t{t}"
            tenants.append(
                Tenant(
                    leaf,
                    guaranteed=share,
                    parent=name,
                    weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                )
            )
            leaves.append(leaf)
    if draw(st.booleans()):
        tenants.append(Tenant("flat", guaranteed=draw(st.sampled_from([0, 4, 8]))))
        leaves.append("flat")
    jobs = [
        job(
            f"{leaf}/j{i}",
            leaf,
            draw(st.sampled_from([1, 2, 4, 8])),
            priority=draw(st.integers(0, 1)),
            submitted=float(i),
        )
        for i in range(draw(st.integers(2, 20)))
        for leaf in [draw(st.sampled_from(leaves))]
    ]
    return tenants, jobs


def _held(snapshot: Snapshot, parents: dict[str, str | None]) -> Counter[str]:
    """GPUs held at every level, walking each admitted job's tenant up its parents."""
    held: Counter[str] = Counter()
    for j in snapshot.jobs:
        if j.state is not JobState.ADMITTED:
            continue
        at = j.tenant
        while at is not None:
            held[at] += j.total_gpus
            at = parents[at]
    return held


def _sizes(snapshot: Snapshot, level: str, parents: dict[str, str | None]) -> list[int]:
    out = []
    for j in snapshot.jobs:
        at = j.tenant
        while j.state is JobState.ADMITTED and at is not None:
            if at == level:
                out.append(j.total_gpus)
                break
            at = parents[at]
    return out


def _usable(limit: int, sizes: list[int]) -> int:
    """Largest sum of some of ``sizes`` at most ``limit`` (a set of reachable sums)."""
    reach = {0}
    for size in sizes:
        reach |= {r + size for r in reach if r + size <= limit}
    return max(reach)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(trees())
def test_no_level_exceeds_its_limit_and_no_level_lends_below_its_guarantee(
    drawn: tuple[list[Tenant], list[Any]],
) -> None:
    tenants, jobs = drawn
    parents = {t.name: t.parent for t in tenants}
    by_name = {t.name: t for t in tenants}
    snapshot = snap(tenants, jobs, [node("n0"), node("n1", "dgx1"), node("n2")], NOW)
    for _ in range(4):
        result = Cycle(snapshot).run()
        before = _held(snapshot, parents)
        after_snapshot = replay(snapshot, result, dt=100.0)
        after = _held(after_snapshot, parents)
        for name, tenant in by_name.items():
            if tenant.borrowing_limit is not None:
                assert after[name] <= tenant.borrowing_limit, name
        # Reclaim takes from a level only what it holds beyond what its guarantee can cover
        # of its jobs, at every level of the lender below where it meets the claimant (checked
        # on levels that admitted nothing in the cycle, whose holdings before it are the truth).
        taken: Counter[str] = Counter()
        for admission in result.admissions:
            claimant = {admission.tenant, *_ancestors(admission.tenant, parents)}
            for victim in admission.victims:
                if victim.reason is not PreemptReason.RECLAIM_GUARANTEE:
                    continue
                at = victim.victim_tenant
                while at is not None and at not in claimant:
                    taken[at] += victim.gpus
                    at = parents[at]
        grew = {
            level
            for admission in result.admissions
            for level in (admission.tenant, *_ancestors(admission.tenant, parents))
        }
        for level, gpus in taken.items():
            if level in grew:
                continue  # it admitted jobs itself in this cycle: judged by what it held then
            guarantee = by_name[level].guaranteed
            usable = _usable(guarantee, _sizes(snapshot, level, parents))
            assert before[level] - gpus >= usable, (level, before[level], gpus, usable)
        snapshot = after_snapshot


def _ancestors(name: str, parents: dict[str, str | None]) -> list[str]:
    out = []
    at = parents[name]
    while at is not None:
        out.append(at)
        at = parents[at]
    return out


def test_expected_starts_respect_a_parents_limit() -> None:
    # Org z (sorted after its team a1, so its plan list is made last) limits its teams to 8:
    # a1's second 8-GPU job starts when the first is expected to end.
    tenants = [org("z", borrowing_limit=8), team("a1", "z")]
    jobs = [
        job("a1/x", "a1", 8, running_on=[("n0", tuple(range(8)))], expected_end=NOW + 600),
        job("a1/y", "a1", 8, submitted=1.0),
    ]
    cycle = Cycle(snap(tenants, jobs, [node("n0"), node("n1")], NOW))
    cycle.run()
    assert cycle.forecast()["a1/y"] == NOW + 600


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(trees())
def test_a_team_below_its_guarantee_gets_it_while_its_parent_holds_its_own(
    drawn: tuple[list[Tenant], list[Any]],
) -> None:
    """No team holding nothing stays so, with a queued job that fits its guarantee, while its
    parent holds at least the parent's guarantee (a sibling then borrows the team's share) for
    two cycles in a row: jobs admitted in a cycle are not victims in it, so a borrower may take
    idle GPUs before the team's turn, and reclaim takes them back in the next cycle."""
    tenants, jobs = drawn
    parents = {t.name: t.parent for t in tenants}
    by_name = {t.name: t for t in tenants}
    snapshot = snap(tenants, jobs, [node("n0"), node("n1"), node("n2")], NOW)
    short: set[str] = set()
    for _ in range(5):
        snapshot = replay(snapshot, Cycle(snapshot).run(), dt=100.0)
        held = _held(snapshot, parents)
        now_short = set()
        for name, tenant in by_name.items():
            parent = tenant.parent
            # Under a parent with a borrowing limit, a job that needs GPUs freed on one node
            # and a sibling's GPUs given back under the limit elsewhere is not found by the
            # victim search (one node's victims, or the limit's alone): not checked here.
            if (
                parent is None
                or by_name[parent].borrowing_limit is not None
                or held[parent] < by_name[parent].guaranteed
            ):
                continue
            if held[name]:
                # A team already holding some of its guarantee claims the rest in its queue
                # order (fixed by its demand, so that claims never flip and preemption never
                # loops): a running job that came later in that order can keep a small queued
                # one out. Checked from nothing held, where the first job that fits claims.
                continue
            room = tenant.guaranteed - held[name]
            if any(
                j.tenant == name and j.state is JobState.QUEUED and j.total_gpus <= room
                for j in snapshot.jobs
            ):
                now_short.add(name)
        assert not short & now_short, (short & now_short, dict(held))
        short = now_short


def test_fair_shares_are_water_filled_level_by_level() -> None:
    from gpusched.core.admission.quota import fair_shares

    tenants = [
        org("a", 8),
        team("a1", "a", 4),
        team("a2", "a", 4),
        org("b"),
        team("b1", "b"),
    ]
    # a's subtree wants 10, b's 10 on 16 GPUs: a gets its 8 and half of what is left until it
    # wants no more (2), b the rest (6); inside a, a1 takes all of a's 10 (a2 wants none).
    shares = fair_shares(16, tenants, {"a1": 10, "b1": 10})
    assert shares == {"a": 10.0, "b": 6.0, "a1": 10.0, "a2": 0.0, "b1": 6.0}


def test_a_spent_teams_queued_job_leaves_its_organisations_guarantee_to_a_sibling() -> None:
    """quotas.md, "Budgets and cost": a spent tenant's queued jobs claim no guarantee. Team a1
    of o has spent its budget; its 8-GPU job came first in o's queue, but it cannot start for
    a day, so a2's job claims o's guarantee of 8 and takes it back from borrower c."""
    tenants = [
        org("o", 8),
        team("a1", "o", budget_exhausted_until=NOW + 86400),
        team("a2", "o"),
        Tenant("c"),
    ]
    jobs = [
        job("c/borrow", "c", 8, running_on=[("n0", tuple(range(8)))]),
        job("a1/first", "a1", 8, submitted=1.0),
        job("a2/second", "a2", 8, submitted=2.0),
    ]
    result = Cycle(snap(tenants, jobs, [node("n0")], NOW)).run()
    assert [(a.job, [v.victim for v in a.victims]) for a in result.admissions] == [
        ("a2/second", ["c/borrow"])
    ]
