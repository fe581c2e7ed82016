"""What the single-replica victim search skips must not change what it finds, and what it
checks must see the cluster as it is.

* When no victim set can pass the quota rule and the lenders' check together, the search returns
  None without looking at a node (``_never_passes``). Truth is the same search with the shortcut
  switched off, over generated candidates with a quota rule and a lenders' check of the shape the
  cycle gives them (the quota needs enough of the preemptor's own victims, and stricter with a
  reclaim among them; a lender loses at most what it borrows).
* When no set of priority victims the preemptor's wait is worth frees enough of its own GPUs
  for the quota rule, the search returns None without a pass over the nodes
  (``_unaffordable``), for a single replica and for a gang. Truth is the same search with both
  shortcuts switched off, over the same candidates.
* A job that places on free GPUs but is over its tenant's limit needs only its own victims
  (``_quota_only``); the checks of those sets (the wait without preemption among them) run
  without the job's GPUs held for a placement not made yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.admission.model import Job, PreemptReason
from gpusched.core.admission.pool import GangFailure, Pool, Request
from gpusched.core.admission.preemption import Candidate, VictimSearch, find_victims
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node

NOW = 100_000.0


@st.composite
def searches(
    draw: Any,
) -> tuple[list[Any], list[Candidate], int, tuple[int, int], dict[str, int], int]:
    """Nodes full of one- and two-GPU jobs, some of the preemptor's tenant (priority victims),
    some borrowed from lenders (reclaim victims)."""
    nodes = [node(f"n{i}") for i in range(draw(st.integers(1, 3)))]
    own_share = draw(st.sampled_from([0, 1, 2, 3]))
    """Out of 3: how many of the candidates are the tenant's own (3: no reclaim at all)."""
    candidates: list[Candidate] = []
    for n in nodes:
        gpu = 0
        while gpu < 8:
            size = min(draw(st.sampled_from([1, 2])), 8 - gpu)
            gpus = tuple(range(gpu, gpu + size))
            gpu += size
            if draw(st.integers(0, 4)) == 0:
                continue  # GPUs held by a job that may not be evicted
            own = draw(st.integers(0, 2)) < own_share
            tenant = "t" if own else draw(st.sampled_from(["l1", "l2"]))
            victim = job(
                f"{tenant}/{n.name}-{gpus[0]}",
                tenant,
                size,
                running_on=[(n.name, gpus)],
                started=NOW - draw(st.integers(1, 10)) * 600,
                submitted=float(draw(st.integers(0, 9))),
            )
            reason = PreemptReason.HIGHER_PRIORITY if own else PreemptReason.RECLAIM_GUARANTEE
            lost = (NOW - (victim.started_at or 0.0)) * size
            candidates.append(Candidate(victim, reason, not own, lost, 300.0 * size))
    k = draw(st.integers(1, 8))
    need = (draw(st.integers(0, 6)), draw(st.integers(0, 4)))
    """GPUs of own victims the preemptor's tenant must shed to stay within its limit, and more
    to fit its guarantee (what a reclaim asks)."""
    spare = {"l1": draw(st.integers(0, 4)), "l2": draw(st.integers(0, 4))}
    """GPUs each lender borrows (what reclaim may take from it)."""
    worth = draw(st.integers(0, 16)) * 2_500
    """Price of priority victims the wait without them is worth (0: none): from none to a
    few of them, so which affordable victims free the most GPUs matters."""
    return nodes, candidates, k, need, spare, worth


def _checks(need: tuple[int, int], spare: dict[str, int], worth: int) -> tuple[Any, Any, Any]:
    limit, guarantee = need

    def quota_ok(own: Sequence[Job], cross: bool, victims: Sequence[Candidate]) -> bool:
        shed = sum(j.total_gpus for j in own)
        # With a reclaim among the victims the job must also fit its guarantee.
        return shed >= limit and (not cross or shed >= guarantee)

    def lenders_ok(victims: Sequence[Candidate]) -> bool:
        taken: Counter[str] = Counter()
        for c in victims:
            if c.reason is PreemptReason.RECLAIM_GUARANTEE and c.job.tenant is not None:
                taken[c.job.tenant] += c.job.total_gpus
        return all(taken[t] <= spare[t] for t in taken)

    def worth_it(victims: Sequence[Candidate]) -> bool:
        priced = [c.price for c in victims if c.reason is PreemptReason.HIGHER_PRIORITY]
        return not priced or sum(priced) <= worth

    return quota_ok, lenders_ok, worth_it


def _find(
    pool: Pool, preemptor: Job, candidates: list[Candidate], checks: tuple[Any, Any, Any]
) -> VictimSearch | GangFailure | None:
    quota_ok, lenders_ok, worth_it = checks
    return find_victims(
        pool,
        preemptor,
        Request.of(preemptor),
        candidates,
        quota_ok,
        lenders_ok=lenders_ok,
        worth_it=worth_it,
        may_place_now=False,
        quota_by_count=True,
    )


def _search(case: Any, replicas: int = 1) -> Any:
    nodes, candidates, k, need, spare, worth = case
    pool = Pool(nodes, [(c.job.key, a) for c in candidates for a in c.job.placement])
    preemptor = job("t/p", "t", k, replicas, priority=5)
    found = _find(pool, preemptor, candidates, _checks(need, spare, worth))
    if isinstance(found, VictimSearch):
        return sorted(c.job.key for c in found.victims), found.plans
    return found


def _full_search(case: Any, replicas: int = 1) -> Any:
    """The search with no shortcut: every pass runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpusched.core.admission.preemption._never_passes", lambda *_args: False)
        patch.setattr("gpusched.core.admission.preemption._unaffordable", lambda *_args: False)
        return _search(case, replicas)


@settings(max_examples=examples(300), deadline=None)
@given(searches())
def test_skipping_a_search_no_set_can_pass_finds_what_the_search_finds(case: Any) -> None:
    assert _search(case) == _full_search(case)


@settings(max_examples=examples(300), deadline=None)
@given(searches(), st.integers(2, 3))
def test_skipping_a_gang_search_no_affordable_set_can_pass_finds_what_the_search_finds(
    case: Any, replicas: int
) -> None:
    assert _search(case, replicas) == _full_search(case, replicas)


@pytest.mark.parametrize("shed", [4, 6])
def test_a_gang_whose_own_victims_cost_more_than_its_wait_is_not_searched(shed: int) -> None:
    # The tenant must shed 4 or 6 GPUs of its own to fit its guarantee with a reclaim, and
    # free 8 without one; the wait is worth one of its 2-GPU jobs (two of them, 4 GPUs, are
    # what the cheapest per GPU reach when counted up to the first it cannot afford). Nothing
    # passes, and the passes over nodes never run.
    case = _gang_over_budget(shed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "gpusched.core.admission.preemption._GangSearch.by_node",
            lambda _self: pytest.fail("searched node by node"),
        )
        assert _search(case, 2) is None
    assert _full_search(case, 2) is None


@pytest.mark.parametrize(
    ("held", "price", "need", "expected"),
    [
        # Cheapest per GPU: a (1 GPU, 2,000), then b (2 GPUs, 9,000), then c (1 GPU, 5,000).
        # a and b together cost too much, yet a and c (7,000) free the 2 GPUs: a bound that
        # stopped before the first victim it cannot afford would skip the search.
        (
            {"a": (0,), "b": (1, 2), "c": (3,)},
            {"a": 2_000.0, "b": 9_000.0, "c": 5_000.0},
            2,
            ["t/a", "t/c"],
        ),
        # Cheapest by price: p, then q (2 GPUs, 11,000: too much); r alone (4 GPUs, 9,000)
        # frees what the job needs. Per GPU, r comes first.
        (
            {"p": (0,), "q": (1,), "r": (2, 3, 4, 5)},
            {"p": 5_000.0, "q": 6_000.0, "r": 9_000.0},
            4,
            ["t/r"],
        ),
    ],
)
def test_affordable_victims_are_searched_whatever_order_they_come_in(
    held: dict[str, tuple[int, ...]], price: dict[str, float], need: int, expected: list[str]
) -> None:
    # The wait is worth 10,000 GPU-s; the tenant must shed ``need`` GPUs and the job needs as
    # many; the rest of the node is held by another tenant's job that is no candidate.
    n0 = node("n0")
    candidates = [
        Candidate(
            job(f"t/{name}", "t", len(gpus), running_on=[("n0", gpus)], started=NOW - 600),
            PreemptReason.HIGHER_PRIORITY,
            False,
            price[name],
            0.0,
        )
        for name, gpus in held.items()
    ]
    rest = tuple(g for g in range(8) if all(g not in gpus for gpus in held.values()))
    others = job("x/rest", "x", len(rest), running_on=[("n0", rest)], started=NOW - 600)
    holdings = [(c.job.key, a) for c in candidates for a in c.job.placement]
    holdings += [(others.key, a) for a in others.placement]
    preemptor = job("t/p", "t", need, priority=5)
    checks = _checks((need, 0), {"l1": 0, "l2": 0}, 10_000)
    found = _find(Pool([n0], holdings), preemptor, candidates, checks)
    assert isinstance(found, VictimSearch)
    assert sorted(c.job.key for c in found.victims) == expected


def _gang_over_budget(shed: int) -> Any:
    nodes = [node("n0"), node("n1")]
    candidates = []
    for n in nodes:
        for gpu in range(0, 8, 2):
            own = gpu < 4
            tenant = "t" if own else "l1"
            victim = job(
                f"{tenant}/{n.name}-{gpu}",
                tenant,
                2,
                running_on=[(n.name, (gpu, gpu + 1))],
                started=NOW - 6_000,
            )
            reason = PreemptReason.HIGHER_PRIORITY if own else PreemptReason.RECLAIM_GUARANTEE
            candidates.append(Candidate(victim, reason, not own, 12_000.0, 600.0))
    # need (0 for the limit, ``shed`` to fit the guarantee), lenders keep nothing back, the
    # wait is worth 20,000 GPU-s: one own victim (12,600) is affordable, two are not.
    return nodes, candidates, 4, (0, shed), {"l1": 8, "l2": 0}, 20_000


def test_checks_of_victims_for_a_limit_alone_see_no_gpus_held_for_the_job() -> None:
    # n0 has two free GPUs: the job places on them, but its tenant must shed a GPU of its own
    # (on n1) to stay within its limit. While the checks run, the job must hold nothing.
    own = job("t/old", "t", 1, running_on=[("n1", (0,))], started=NOW - 3_600)
    candidates = [Candidate(own, PreemptReason.HIGHER_PRIORITY, False, 3_600.0, 300.0)]
    nodes = [node("n0", busy=range(6)), node("n1")]
    pool = Pool(nodes, [("t/old", a) for a in own.placement])
    preemptor = job("t/new", "t", 2, priority=5)
    seen: list[dict[str, int]] = []

    def worth_it(victims: Sequence[Candidate]) -> bool:
        seen.append(pool.holdings(preemptor.key))
        return True

    found = find_victims(
        pool,
        preemptor,
        Request.of(preemptor),
        candidates,
        lambda own_jobs, _cross, _victims: len(own_jobs) >= 1,
        worth_it=worth_it,
        may_place_now=True,
    )
    assert isinstance(found, VictimSearch)
    assert [c.job.key for c in found.victims] == ["t/old"]
    assert seen
    assert all(held == {} for held in seen)
    # On success the job holds its GPUs, as after any search.
    assert pool.holdings(preemptor.key) == {"n0": 0b11000000}
