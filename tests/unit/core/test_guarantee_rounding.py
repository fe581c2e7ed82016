"""Guarantees honoured in whole jobs, rounded down (the default) or up
(``CycleConfig.guarantee_rounding``).

A tenant guaranteed 10 GPUs whose jobs ask 8 each can never fill its guarantee exactly: rounded
down it claims one job (8 GPUs) and the next one borrows; rounded up the next one claims the
rest of the guarantee too, may take GPUs back from borrowers for it, and a lender keeps the
fewest of its jobs that cover its guarantee. Truth here is worked out from the job sizes by
brute force, not by the core's own arithmetic.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.admission import (
    CycleConfig,
    PreemptReason,
    Snapshot,
    Tenant,
    WaitReason,
    run_cycle,
)
from gpusched.core.admission.explain import explain
from gpusched.core.admission.model import GuaranteeRounding
from gpusched.core.admission.quota import claims, covering_of_sizes, job_sizes
from tests.unit.core.admission_testdata import job, node

NOW = 10_000.0


def _covering_by_brute_force(limit: int, sizes: list[int]) -> int:
    total = sum(sizes)
    if total <= limit:
        return total
    return min(
        sum(chosen)
        for n in range(len(sizes) + 1)
        for chosen in combinations(sizes, n)
        if sum(chosen) >= limit
    )


@given(st.integers(0, 40), st.lists(st.sampled_from([1, 2, 3, 4, 5, 8]), max_size=9))
def test_the_rounded_up_guarantee_is_the_fewest_gpus_of_whole_jobs_covering_it(
    limit: int, sizes: list[int]
) -> None:
    jobs = [job(f"t/j{i}", "t", size) for i, size in enumerate(sizes)]
    assert covering_of_sizes(limit, job_sizes(jobs)) == _covering_by_brute_force(limit, sizes)


def test_claims_rounded_up_take_the_first_preemptible_job_past_the_guarantee() -> None:
    tenant = Tenant("t", 26)
    queued = [job(f"t/j{i}", "t", 8, submitted=float(i)) for i in range(5)]
    assert claims(tenant, [], queued) == {"t/j0", "t/j1", "t/j2"}
    assert claims(tenant, [], queued, round_up=True) == {"t/j0", "t/j1", "t/j2", "t/j3"}
    # A job that cannot be taken back never claims more than fits.
    firm = [*queued[:3], job("t/firm", "t", 8, submitted=3.0, preemptible=False), *queued[3:]]
    assert claims(tenant, [], firm, round_up=True) == {"t/j0", "t/j1", "t/j2", "t/j3"}
    # Exactly filled: nothing is left to round up.
    exact = [*queued[:3], job("t/two", "t", 2, submitted=2.5), *queued[3:]]
    assert claims(tenant, [], exact, round_up=True) == {"t/j0", "t/j1", "t/j2", "t/two"}
    # A job that fits is never displaced by one rounded up, even behind it in the queue.
    behind = [*queued, job("t/late", "t", 2, submitted=9.0)]
    assert claims(tenant, [], behind, round_up=True) == {"t/j0", "t/j1", "t/j2", "t/late"}
    one = [*queued, job("t/one", "t", 1, submitted=9.0)]
    assert claims(tenant, [], one, round_up=True) == {"t/j0", "t/j1", "t/j2", "t/one", "t/j3"}


def _one_short(rounding: GuaranteeRounding, *, preemptible: bool = True) -> Snapshot:
    """Tenant a (guaranteed 10) holds 8 on n0 and asks 8 more; n1 has 6 free GPUs and 2 held
    by one-GPU jobs of tenant b, which has no guarantee (all it holds is borrowed)."""
    return Snapshot(
        now=NOW,
        tenants=(Tenant("a", 10), Tenant("b", 0)),
        jobs=(
            job("a/held", "a", 8, running_on=[("n0", tuple(range(8)))]),
            job("b/x", "b", 1, running_on=[("n1", (0,))], started=NOW - 600),
            job("b/y", "b", 1, running_on=[("n1", (1,))], started=NOW - 60),
            job("a/next", "a", 8, submitted=100.0, preemptible=preemptible),
        ),
        nodes=(node("n0"), node("n1")),
        config=CycleConfig(guarantee_rounding=rounding),
    )


def test_a_job_larger_than_what_is_left_of_the_guarantee_takes_it_back_when_rounding_up() -> None:
    down = run_cycle(_one_short("down"))
    assert down.admissions == ()
    assert down.wait_reasons["a/next"] is WaitReason.WAITING_FOR_CAPACITY

    up = run_cycle(_one_short("up"))
    (admission,) = up.admissions
    assert admission.job == "a/next"
    assert [p.node for p in admission.placement] == ["n1"]
    assert sorted(v.victim for v in admission.victims) == ["b/x", "b/y"]
    assert {v.reason for v in admission.victims} == {PreemptReason.RECLAIM_GUARANTEE}


def test_a_job_that_cannot_be_taken_back_is_never_rounded_up() -> None:
    result = run_cycle(_one_short("up", preemptible=False))
    assert result.admissions == ()
    assert result.wait_reasons["a/next"] is WaitReason.GUARANTEE_EXCEEDED


def _lumpy_lender(rounding: GuaranteeRounding) -> Snapshot:
    """Tenant a (guaranteed 10) holds two 8-GPU jobs, the whole cluster; tenant c (guaranteed
    8) asks 8."""
    return Snapshot(
        now=NOW,
        tenants=(Tenant("a", 10), Tenant("c", 8)),
        jobs=(
            job("a/one", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 3600),
            job("a/two", "a", 8, running_on=[("n1", tuple(range(8)))], started=NOW - 60),
            job("c/want", "c", 8, submitted=100.0),
        ),
        nodes=(node("n0"), node("n1")),
        config=CycleConfig(guarantee_rounding=rounding),
    )


def test_a_lender_keeps_the_fewest_whole_jobs_covering_its_guarantee_when_rounding_up() -> None:
    # Rounded down, a uses 8 of its 10 in whole jobs and lends the other 8: its cheapest job
    # goes for c's guarantee.
    down = run_cycle(_lumpy_lender("down"))
    (admission,) = down.admissions
    assert [v.victim for v in admission.victims] == ["a/two"]
    # Rounded up, both jobs cover a's guarantee: c waits for one to end (the price of
    # rounding up when guarantees fill the cluster).
    up = run_cycle(_lumpy_lender("up"))
    assert up.admissions == ()
    assert up.wait_reasons["c/want"] is WaitReason.WAITING_FOR_CAPACITY


def test_explain_says_a_job_claims_the_rest_of_the_guarantee_rounded_up() -> None:
    # Tenant b holds n1 inside its own guarantee: nothing to take back, a/next waits.
    snapshot = replace(
        _one_short("up"),
        tenants=(Tenant("a", 10), Tenant("b", 8)),
        jobs=(
            job("a/held", "a", 8, running_on=[("n0", tuple(range(8)))]),
            *(job(f"b/{i}", "b", 1, running_on=[("n1", (i,))]) for i in range(8)),
            job("a/next", "a", 8, submitted=100.0),
        ),
    )
    up = explain(snapshot, "a/next")
    assert up.decision == "waiting"
    assert up.claims_guarantee
    assert any("rounded up to this job" in line for line in up.preemption)
    down = explain(replace(snapshot, config=CycleConfig()), "a/next")
    assert not down.claims_guarantee
    assert any("may not reclaim" in line for line in down.preemption)
