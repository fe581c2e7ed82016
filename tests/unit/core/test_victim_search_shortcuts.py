"""What the single-replica victim search skips must not change what it finds, and what it
checks must see the cluster as it is.

* When no victim set can pass the quota rule and the lenders' check together, the search returns
  None without looking at a node (``_never_passes``). Truth is the same search with the shortcut
  switched off, over generated candidates with a quota rule and a lenders' check of the shape the
  cycle gives them (the quota needs enough of the preemptor's own victims, and stricter with a
  reclaim among them; a lender loses at most what it borrows).
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
from gpusched.core.admission.pool import Pool, Request
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
    need = (draw(st.integers(0, 4)), draw(st.integers(0, 3)))
    """GPUs of own victims the preemptor's tenant must shed to stay within its limit, and more
    to fit its guarantee (what a reclaim asks)."""
    spare = {"l1": draw(st.integers(0, 4)), "l2": draw(st.integers(0, 4))}
    """GPUs each lender borrows (what reclaim may take from it)."""
    worth = draw(st.integers(0, 3)) * 20_000
    """Price of priority victims the wait without them is worth (0: none)."""
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


def _search(case: Any) -> Any:
    nodes, candidates, k, need, spare, worth = case
    pool = Pool(nodes, [(c.job.key, a) for c in candidates for a in c.job.placement])
    preemptor = job("t/p", "t", k, priority=5)
    quota_ok, lenders_ok, worth_it = _checks(need, spare, worth)
    found = find_victims(
        pool,
        preemptor,
        Request.of(preemptor),
        candidates,
        quota_ok,
        lenders_ok=lenders_ok,
        worth_it=worth_it,
        may_place_now=False,
    )
    if isinstance(found, VictimSearch):
        return sorted(c.job.key for c in found.victims), found.plans
    return found


@settings(max_examples=examples(300), deadline=None)
@given(searches())
def test_skipping_a_search_no_set_can_pass_finds_what_the_search_finds(case: Any) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpusched.core.admission.preemption._never_passes", lambda *_args: False)
        truth = _search(case)
    assert _search(case) == truth


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
