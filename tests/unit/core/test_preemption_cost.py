"""Preemption by cost: what a victim costs, which set is cheapest, when priority preemption is
worth it, and protection after a restart."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpusched.core.admission import CycleConfig, Snapshot, Tenant, run_cycle
from gpusched.core.admission.explain import explain
from gpusched.core.admission.model import PreemptReason
from gpusched.core.admission.pool import Pool, Request
from gpusched.core.admission.preemption import (
    REPREEMPT_PROTECTION_SECONDS,
    Candidate,
    VictimSearch,
    cheapest_first,
    find_victims,
    may_be_victim,
)
from gpusched.core.placement import Placement, place
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node

NOW = 100_000.0


def snap(tenants: list[Tenant], jobs: list[Any], nodes: list[Any]) -> Snapshot:
    return Snapshot(now=NOW, tenants=tuple(tenants), jobs=tuple(jobs), nodes=tuple(nodes))


def _one_gpu_jobs_on_n0(tenant: str, rows: Sequence[tuple[int, int]]) -> list[Any]:
    """One-GPU jobs of ``tenant`` running on n0, one per (seconds run, seconds to their
    expected end)."""
    return [
        job(
            f"{tenant}/r{i}",
            tenant,
            1,
            running_on=[("n0", (i,))],
            started=NOW - ran,
            expected_end=NOW + left,
        )
        for i, (ran, left) in enumerate(rows)
    ]


def _wait_and_cheapest_eviction(
    rows: Sequence[tuple[int, int]], gpus: int
) -> tuple[int, float, int] | None:
    """Truth for a job of ``gpus`` GPUs on n0 beside the one-GPU jobs ``rows``: None when the
    free GPUs hold it; else the GPUs it lacks (``short``), its wait (when the ``short``-th
    soonest of them ends) and the price of the cheapest eviction (the ``short`` that ran
    least, each losing its run time plus the restart penalty), as (wait, price, short)."""
    short = gpus - (8 - len(rows))
    if short <= 0:
        return None
    wait = sorted(left for _, left in rows)[short - 1]
    penalty = CycleConfig().restart_penalty_seconds
    return wait, sum(sorted(ran + penalty for ran, _ in rows)[:short]), short


# --- priority preemption weighs its cost against the wait it saves ---------------------------


def test_priority_preemption_waits_when_the_victim_ends_sooner_than_its_work_is_worth() -> None:
    """A low-priority job 10 h into its run, expected to end in 10 minutes: evicting it would
    throw away 80 GPU-hours to save the high-priority job, just submitted, 80 GPU-minutes of
    waiting."""
    tenants = [Tenant("a", guaranteed=8)]
    low = job(
        "a/low",
        "a",
        8,
        running_on=[("n0", tuple(range(8)))],
        started=NOW - 36_000,
        expected_end=NOW + 600,
    )
    high = job("a/high", "a", 8, priority=10, submitted=NOW)
    result = run_cycle(snap(tenants, [low, high], [node("n0")]))
    assert result.admission_of("a/high") is None
    # explain says why, in figures: 8 GPUs x the 10 minutes it expects to wait.
    said = " ".join(explain(snap(tenants, [low, high], [node("n0")]), "a/high").preemption)
    assert "may evict its own tenant's lower-priority jobs only if" in said
    assert "at most 1.3 GPU-hours now" in said
    # The same victim expected to run for another week is worth evicting.
    for_long = replace(low, expected_end=NOW + 7 * 86_400)
    admission = run_cycle(snap(tenants, [for_long, high], [node("n0")])).admission_of("a/high")
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["a/low"]


@st.composite
def own_victims(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int]:
    """Lower-priority one-GPU jobs filling a node (seconds run, seconds to their expected
    end), the GPUs the higher-priority job asks, and how long it has waited."""
    count = draw(st.integers(1, 8))
    running = draw(
        st.lists(
            st.tuples(st.integers(0, 20_000), st.integers(60, 20_000)),
            min_size=count,
            max_size=count,
        )
    )
    gpus = draw(st.integers(1, 8))
    waited = draw(st.integers(0, 30_000))
    return running, gpus, waited


@settings(max_examples=examples(80), deadline=None)
@given(own_victims())
@example(([(0, 300)] * 8, 1, 0))  # the cost equals the wait: evicted
@example(([(36_000, 600)] * 8, 8, 30_000))  # long waited, the expected wait alone counts
def test_priority_preemption_is_made_exactly_when_the_cheapest_set_costs_no_more_than_the_wait(
    case: tuple[list[tuple[int, int]], int, int],
) -> None:
    """Truth worked out here: the high-priority job needs ``short`` of the node's GPUs; waiting,
    it starts when the ``short``-th soonest of the low-priority jobs ends; the cheapest
    eviction takes the ``short`` that ran least, each losing its run time plus the restart
    penalty. It evicts exactly when that costs no more than its GPUs times that wait, however
    long it has waited already."""
    running, gpus, waited = case
    tenants = [Tenant("a", guaranteed=8)]
    jobs = [
        *_one_gpu_jobs_on_n0("a", running),
        job("a/high", "a", gpus, priority=10, submitted=NOW - waited),
    ]
    admission = run_cycle(snap(tenants, jobs, [node("n0")])).admission_of("a/high")
    truth = _wait_and_cheapest_eviction(running, gpus)
    if truth is None:
        assert admission is not None
        assert not admission.victims
        return
    wait, cost, short = truth
    assert (admission is not None) == (cost <= gpus * wait), (cost, gpus * wait)
    if admission is not None:
        assert len(admission.victims) == short
        assert (
            sorted(v.gpu_seconds_lost for v in admission.victims)
            == sorted(float(ran) for ran, _ in running)[:short]
        )


def test_priority_preemption_with_no_known_end_evicts_as_before() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    low = job("a/low", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 36_000)
    high = job("a/high", "a", 8, priority=10, submitted=1)
    admission = run_cycle(snap(tenants, [low, high], [node("n0")])).admission_of("a/high")
    assert admission is not None


def test_reclaim_is_not_weighed_against_the_owners_wait() -> None:
    """The borrower ends in 10 minutes and lost 10 h of work; the guarantee still comes back."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    borrowed = job(
        "borrower/b",
        "borrower",
        8,
        running_on=[("n0", tuple(range(8)))],
        started=NOW - 36_000,
        expected_end=NOW + 600,
    )
    owner = job("owner/o", "owner", 8, submitted=1)
    admission = run_cycle(snap(tenants, [borrowed, owner], [node("n0")])).admission_of("owner/o")
    assert admission is not None
    assert admission.victims[0].reason is PreemptReason.RECLAIM_GUARANTEE


# --- a reclaim weighed against the owner's wait, within its patience -------------------------

PATIENCE = 3_600.0


def _patient(tenants: list[Tenant], jobs: list[Any], nodes: list[Any]) -> Snapshot:
    return replace(
        snap(tenants, jobs, nodes), config=CycleConfig(reclaim_patience_seconds=PATIENCE)
    )


def _borrowed_node(started: float, expected_end: float | None) -> list[Any]:
    return [
        job(
            "borrower/b",
            "borrower",
            8,
            running_on=[("n0", tuple(range(8)))],
            started=started,
            expected_end=expected_end,
        )
    ]


OWNER_AND_BORROWER = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]


def test_a_reclaim_waits_while_the_borrower_ends_sooner_than_its_work_is_worth() -> None:
    """The borrower is 10 h into its run and ends in 10 minutes: evicting it would throw away
    80 GPU-hours to save the owner 80 GPU-minutes. Within its patience the owner waits, and
    its message says why and until when."""
    jobs = [*_borrowed_node(NOW - 36_000, NOW + 600), job("owner/o", "owner", 8, submitted=NOW)]
    result = run_cycle(_patient(OWNER_AND_BORROWER, jobs, [node("n0")]))
    assert result.admission_of("owner/o") is None
    (waiting,) = [w for w in result.waiting if w.job == "owner/o"]
    assert "would throw away more work than its expected wait costs" in waiting.message
    assert "once it has waited 1h 00m" in waiting.message
    assert result.wake_at == NOW + PATIENCE  # decided again when its patience runs out
    said = " ".join(explain(_patient(OWNER_AND_BORROWER, jobs, [node("n0")]), "owner/o").preemption)
    # 8 GPUs x the 600 s until the borrower ends, against its 80 GPU-hours.
    assert "for another 3600s (reclaim patience)" in said
    assert "0.2 h expected, so at most 1.3 GPU-hours now" in said
    # Without patience the guarantee comes back at once, as before.
    assert run_cycle(snap(OWNER_AND_BORROWER, jobs, [node("n0")])).admission_of("owner/o")


def test_a_reclaim_past_its_patience_is_made_whatever_it_costs() -> None:
    jobs = [
        *_borrowed_node(NOW - 36_000, NOW + 600),
        job("owner/o", "owner", 8, submitted=NOW - PATIENCE),
    ]
    admission = run_cycle(_patient(OWNER_AND_BORROWER, jobs, [node("n0")])).admission_of("owner/o")
    assert admission is not None
    assert [v.reason for v in admission.victims] == [PreemptReason.RECLAIM_GUARANTEE]


def test_a_reclaim_whose_borrower_ends_after_the_patience_or_never_is_made_at_once() -> None:
    """Ending in 2 h, the borrower still costs more (80 GPU-hours) than the owner's 16
    GPU-hours of waiting; but the GPUs would not free within the owner's hour of patience,
    and evicting it then would throw away an hour more."""
    for end in (NOW + 7_200, NOW + 7 * 86_400, None):
        jobs = [*_borrowed_node(NOW - 36_000, end), job("owner/o", "owner", 8, submitted=NOW)]
        result = run_cycle(_patient(OWNER_AND_BORROWER, jobs, [node("n0")]))
        assert result.admission_of("owner/o") is not None, end


def test_every_job_turned_down_for_the_same_reclaim_is_told_why() -> None:
    """o1 and o3 ask the same and are turned down for the reclaim's cost; o2 between them
    starts on n1's four free GPUs, so o3 is decided again rather than parked as o1's twin,
    and its search ends at the cycle's record of o1's: its message must still say why."""
    tenants = [Tenant("owner", guaranteed=24), Tenant("borrower", guaranteed=0)]
    jobs = [
        *_borrowed_node(NOW - 36_000, NOW + 600),
        job("owner/o1", "owner", 8, submitted=NOW - 3),
        job("owner/o2", "owner", 4, submitted=NOW - 2),
        job("owner/o3", "owner", 8, submitted=NOW - 1),
    ]
    result = run_cycle(_patient(tenants, jobs, [node("n0"), node("n1", busy=range(4))]))
    assert result.admission_of("owner/o2") is not None
    messages = {w.job: w.message for w in result.waiting}
    for key in ("owner/o1", "owner/o3"):
        assert "would throw away more work than its expected wait costs" in messages[key], key


@st.composite
def weighed_reclaims(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, float]:
    """One-GPU borrowers on one node (seconds run, seconds left each), the owner's GPUs and
    how long ago it was submitted."""
    borrowers = draw(
        st.lists(
            st.tuples(
                st.integers(0, 20).map(lambda m: m * 600), st.integers(1, 40).map(lambda m: m * 300)
            ),
            min_size=1,
            max_size=8,
        )
    )
    gpus = draw(st.integers(1, 8))
    waited = draw(st.sampled_from([0.0, PATIENCE / 2, PATIENCE - 1, PATIENCE]))
    return borrowers, gpus, waited


@settings(max_examples=examples(60), deadline=None)
@given(weighed_reclaims())
@example(([(0, 300)] * 8, 1, 0.0))  # the cost equals the wait: reclaimed
@example(([(12_000, 3_600)] * 8, 1, 0.0))  # the wait equals the patience left: reclaimed
def test_a_reclaim_is_made_exactly_when_the_cheapest_set_costs_no_more_than_the_wait(
    case: tuple[list[tuple[int, int]], int, float],
) -> None:
    """Truth worked out here: the owner needs ``short`` of the borrowers' GPUs; waiting, it
    starts when the ``short``-th soonest of them ends; the cheapest eviction takes the
    ``short`` borrowers that ran least, each losing its run time plus the restart penalty.
    Within its patience the owner reclaims only if that costs no more than its GPUs times the
    wait, or if the wait outlasts the patience left; past it, always."""
    borrowers, gpus, waited = case
    jobs = [
        *_one_gpu_jobs_on_n0("borrower", borrowers),
        job("owner/o", "owner", gpus, submitted=NOW - waited),
    ]
    admission = run_cycle(_patient(OWNER_AND_BORROWER, jobs, [node("n0")])).admission_of("owner/o")
    truth = _wait_and_cheapest_eviction(borrowers, gpus)
    if truth is None:
        assert admission is not None
        assert not admission.victims
        return
    wait, cost, short = truth
    expected = waited >= PATIENCE or cost <= gpus * wait or wait >= PATIENCE - waited
    assert (admission is not None) == expected, (cost, gpus * wait)
    if admission is not None:
        assert len(admission.victims) == short


# --- guarantees in shape: the cheapest node, freed whole -------------------------------------


def test_reclaim_frees_the_node_whose_borrowers_lose_least() -> None:
    """One-GPU borrowers fill two nodes; those on n1 started an hour ago, those on n0 a day
    ago. The owner's 8-GPU job gets n1, all of it, and nothing on n0 is touched."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    jobs = []
    for n, started in (("n0", NOW - 86_400), ("n1", NOW - 3_600)):
        for g in range(8):
            jobs.append(
                job(f"borrower/{n}-{g}", "borrower", 1, running_on=[(n, (g,))], started=started)
            )
    jobs.append(job("owner/train", "owner", 8, submitted=NOW - 10))
    admission = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")])).admission_of("owner/train")
    assert admission is not None
    assert admission.placement[0].node == "n1"
    assert sorted(v.victim for v in admission.victims) == [f"borrower/n1-{g}" for g in range(8)]


def test_reclaim_takes_the_cheapest_borrower_whatever_its_priority() -> None:
    """Two borrowers fill a node each: a low-priority one two days into its run, a
    high-priority one an hour into it. The owner takes back its guarantee from the one that
    loses an hour: a borrower's priority does not shield what it borrows."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    jobs = [
        job(
            "borrower/old",
            "borrower",
            8,
            running_on=[("n0", tuple(range(8)))],
            started=NOW - 2 * 86_400,
            priority=0,
        ),
        job(
            "borrower/new",
            "borrower",
            8,
            running_on=[("n1", tuple(range(8)))],
            started=NOW - 3_600,
            priority=10,
        ),
        job("owner/train", "owner", 8, submitted=NOW - 10),
    ]
    admission = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")])).admission_of("owner/train")
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["borrower/new"]
    assert admission.placement[0].node == "n1"


def test_reclaim_takes_a_whole_node_of_borrowed_jobs_whatever_their_queue_order() -> None:
    """The borrower (guarantee 8) runs 16 one-GPU jobs submitted alternately on n0 and n1, so
    its last 8 in queue order are spread over both nodes. Evicting the 8 on one node leaves it
    exactly at its guarantee and frees a whole node for the owner's 8-GPU job."""
    tenants = [
        Tenant("owner", guaranteed=8),
        Tenant("borrower", guaranteed=8),
        Tenant("idle", guaranteed=8),
    ]
    jobs = [
        job(
            f"borrower/j{i:02d}",
            "borrower",
            1,
            running_on=[(f"n{i % 2}", (i // 2,))],
            started=NOW - 3_600,
            submitted=float(i),
        )
        for i in range(16)
    ]
    jobs.append(job("owner/train", "owner", 8, submitted=100.0))
    result = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")]))
    admission = result.admission_of("owner/train")
    assert admission is not None
    assert len(admission.victims) == 8
    assert len({int(v.victim[-2:]) % 2 for v in admission.victims}) == 1


def test_a_lender_at_its_guarantee_loses_nothing_to_reclaim() -> None:
    tenants = [Tenant("owner", guaranteed=8), Tenant("lender", guaranteed=8)]
    jobs = [
        job(f"lender/j{g}", "lender", 1, running_on=[("n0", (g,))], started=NOW - 3_600)
        for g in range(8)
    ]
    jobs.append(job("owner/train", "owner", 8, submitted=100.0))
    assert run_cycle(snap(tenants, jobs, [node("n0")])).admission_of("owner/train") is None


# --- no thrash --------------------------------------------------------------------------------


def test_a_job_preempted_before_is_protected_after_it_restarts() -> None:
    restarted = job(
        "a/low", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 600, preemptions=1
    )
    fresh = replace(restarted, preemptions=0)
    assert may_be_victim(fresh, NOW)
    assert not may_be_victim(restarted, NOW)
    assert may_be_victim(restarted, NOW - 600 + REPREEMPT_PROTECTION_SECONDS)
    twice = replace(restarted, preemptions=2)
    assert not may_be_victim(twice, NOW - 600 + REPREEMPT_PROTECTION_SECONDS)
    assert may_be_victim(twice, NOW - 600 + 2 * REPREEMPT_PROTECTION_SECONDS)
    # Reclaiming a guarantee is bounded by the job's protection on borrowed GPUs instead.
    assert may_be_victim(restarted, NOW, reclaim=True)


def test_a_restarted_victim_is_not_evicted_again_by_the_next_high_priority_job() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    restarted = job(
        "a/low", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 60, preemptions=1
    )
    high = job("a/high", "a", 8, priority=10, submitted=1)
    assert run_cycle(snap(tenants, [restarted, high], [node("n0")])).admission_of("a/high") is None
    fresh = replace(restarted, preemptions=0)
    assert run_cycle(snap(tenants, [fresh, high], [node("n0")])).admission_of("a/high")


# --- the chosen set is the cheapest (brute force on small cases) ------------------------------


@st.composite
def small_cases(draw: Any) -> tuple[list[Any], list[Candidate], int]:
    """One or two NVSwitch nodes, up to 6 running one-replica jobs, a request of 1-8 GPUs."""
    names = ["n0", "n1"][: draw(st.integers(1, 2))]
    nodes = [node(n) for n in names]
    candidates: list[Candidate] = []
    for n in names:
        free = list(range(8))
        for i in range(draw(st.integers(0, 3))):
            if not free:
                break
            size = draw(st.integers(1, min(4, len(free))))
            gpus, free = tuple(free[:size]), free[size:]
            victim = job(
                f"t/{n}-{i}",
                "t",
                size,
                running_on=[(n, gpus)],
                started=NOW - draw(st.integers(0, 10)) * 600,
                submitted=float(draw(st.integers(0, 5))),
                priority=draw(st.integers(0, 1)),
            )
            lost = (NOW - victim.started_at) * size
            # The preemptor's own lower-priority job, or another tenant's borrowed one.
            reclaim = draw(st.booleans())
            reason = PreemptReason.RECLAIM_GUARANTEE if reclaim else PreemptReason.HIGHER_PRIORITY
            candidates.append(Candidate(victim, reason, reclaim, lost, 300.0 * size))
    return nodes, candidates, draw(st.integers(1, 8))


def _standing(victims: Sequence[Candidate]) -> tuple[int, int]:
    """Which of a set's victims weighs most: another tenant's borrowed jobs go before the
    preemptor's own (whatever their priority), own jobs lowest priority first."""
    return max(
        (0, 0) if c.reason is PreemptReason.RECLAIM_GUARANTEE else (1, c.job.priority)
        for c in victims
    )


def _brute_force_key(nodes: list[Any], candidates: list[Candidate], k: int) -> Any:
    """The least (standing, total price, size) over every subset that frees a placement of
    ``k`` GPUs on some node, worked out from the jobs' GPU lists alone."""
    best = None
    for size in range(1, len(candidates) + 1):
        for subset in itertools.combinations(candidates, size):
            for n in nodes:
                busy = {
                    g
                    for c in candidates
                    if c not in subset
                    for a in c.job.placement
                    if a.node == n.name
                    for g in a.gpus
                }
                free = sum(1 << g for g in range(8) if g not in busy)
                request = Request.of(job("t/p", "t", k))
                if isinstance(place(n.topology, k, request.policy, free_mask=free), Placement):
                    key = (
                        _standing(subset),
                        sum(c.lost + c.penalty for c in subset),
                        size,
                    )
                    best = key if best is None else min(best, key)
    return best


@settings(max_examples=examples(300), deadline=None)
@given(small_cases())
def test_the_chosen_victims_cost_no_more_than_any_other_set(case: Any) -> None:
    nodes, candidates, k = case
    holdings = [(c.job.key, a) for c in candidates for a in c.job.placement]
    pool = Pool(nodes, holdings)
    preemptor = job("t/p", "t", k, priority=5)
    request = Request.of(preemptor)
    if not isinstance(pool.place_gang("probe", request), list):
        found = find_victims(pool, preemptor, request, candidates, lambda _o, _c, _v: True)
        expected = _brute_force_key(nodes, candidates, k)
        if expected is None:
            assert not isinstance(found, VictimSearch)
            return
        assert isinstance(found, VictimSearch)
        chosen = found.victims
        key = (
            _standing(chosen),
            sum(c.lost + c.penalty for c in chosen),
            len(chosen),
        )
        assert key == expected


def test_reclaim_never_takes_a_lender_below_its_guarantee_however_many_victims() -> None:
    """The lender (guarantee 8) runs 12 one-GPU jobs, 6 on each node: it borrows 4. Freeing a
    whole node for the owner would take 6 of them, 2 below its guarantee, so the owner waits."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("lender", guaranteed=8)]
    jobs = [
        job(f"lender/{n}-{g}", "lender", 1, running_on=[(n, (g,))], started=NOW - 3_600)
        for n in ("n0", "n1")
        for g in range(6)
    ]
    jobs.append(job("owner/train", "owner", 8, submitted=100.0))
    result = run_cycle(snap(tenants, jobs, [node("n0"), node("n1")]))
    assert result.admission_of("owner/train") is None
    # Four GPUs fit what the lender borrows: its jobs on one node go, two of them.
    small = job("owner/small", "owner", 4, submitted=100.0)
    admission = run_cycle(snap(tenants, [*jobs[:-1], small], [node("n0"), node("n1")]))
    found = admission.admission_of("owner/small")
    assert found is not None
    assert len(found.victims) == 2


@st.composite
def whole_node_gang_cases(draw: st.DrawFn) -> tuple[list[Any], list[Candidate], int]:
    """Nodes filled by another tenant's borrowed jobs of random sizes and ages, and a gang of
    whole-node replicas reclaiming its guarantee."""
    nodes = [node(f"n{i}") for i in range(draw(st.integers(2, 5)))]
    candidates: list[Candidate] = []
    for n in nodes:
        free = list(range(8))
        while free:
            size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if s <= len(free)]))
            gpus, free = tuple(free[:size]), free[size:]
            victim = job(
                f"b/{n.name}-{len(free)}",
                "b",
                size,
                running_on=[(n.name, gpus)],
                started=NOW - draw(st.integers(0, 48)) * 1_800,
            )
            lost = (NOW - victim.started_at) * size
            candidates.append(
                Candidate(victim, PreemptReason.RECLAIM_GUARANTEE, True, lost, 300.0 * size)
            )
    return nodes, candidates, draw(st.integers(2, len(nodes)))


@settings(max_examples=examples(300), deadline=None)
@given(whole_node_gang_cases())
def test_a_gang_of_whole_node_replicas_frees_the_nodes_whose_borrowers_cost_least(
    case: Any,
) -> None:
    """Each replica needs a node to itself, so the cheapest victim set is every job on the
    ``replicas`` nodes whose jobs together cost least, worked out here from the jobs alone."""
    nodes, candidates, replicas = case
    pool = Pool(nodes, [(c.job.key, a) for c in candidates for a in c.job.placement])
    preemptor = job("o/gang", "o", 8, replicas=replicas)
    found = find_victims(
        pool, preemptor, Request.of(preemptor), candidates, lambda _o, _c, _v: True
    )
    assert isinstance(found, VictimSearch)
    per_node: dict[str, float] = {}
    for c in candidates:
        for a in c.job.placement:
            per_node[a.node] = per_node.get(a.node, 0.0) + c.price
    cheapest = sum(sorted(per_node.values())[:replicas])
    assert sum(c.price for c in found.victims) == cheapest


@dataclass(frozen=True)
class _Option:
    key: Any
    name: str


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 3), st.integers(1, 2), st.booleans()),
        max_size=12,
    )
)
def test_nodes_priced_lazily_come_cheapest_first(rows: list[tuple[int, int, int, bool]]) -> None:
    """Each node's true price, a bound at or below it, and whether it frees anything: the
    lazy order is the order of the true prices (ties by name), computed here by sorting."""
    truth = {
        f"n{i:02d}": (((0, 0, 0, 0), float(price), size), slack, frees)
        for i, (price, slack, size, frees) in enumerate(rows)
    }
    bounds = sorted(
        (((0, 0, 0, 0), key[1] - slack, key[2] if slack == 0 else 0), name)
        for name, (key, slack, _) in truth.items()
    )

    def price(name: str) -> _Option | None:
        key, _, frees = truth[name]
        return _Option(key, name) if frees else None

    got = [o.name for o in cheapest_first(bounds, price)]
    expected = sorted((key, name) for name, (key, _, frees) in truth.items() if frees)
    assert got == [name for _, name in expected]
