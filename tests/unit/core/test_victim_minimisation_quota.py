"""The minimisation of a gang's victim set asks the quota of "this set without one victim"
once per victim and pass; it keeps the preemptor's own victims and the count of reclaims as the
set shrinks instead of recounting the whole set (``_Minimised``). Whatever the set and the order
victims are dropped in, each check must hand the quota rule exactly what a recount of the
smaller set gives: its own victims, whether a reclaim is left, and the victims themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.admission.model import Job, PreemptReason
from gpusched.core.admission.preemption import Candidate, _Minimised
from tests.unit.core.admission_testdata import job

PREEMPTOR = job("t/gang", "t", 8)
REASONS = [
    PreemptReason.HIGHER_PRIORITY,
    PreemptReason.RECLAIM_GUARANTEE,
    PreemptReason.BACKFILL_OVERRUN,
]


@st.composite
def victim_sets(draw: Any) -> tuple[list[Candidate], list[int]]:
    """Victims of the preemptor's tenant and of lenders, for every reason, and an order in
    which to try dropping them (indexes, repeats allowed: a pass tries each victim again)."""
    count = draw(st.integers(1, 12))
    victims = []
    for i in range(count):
        tenant = draw(st.sampled_from(["t", "l1", "l2"]))
        reason = draw(st.sampled_from(REASONS))
        victim = job(f"{tenant}/v{i}", tenant, draw(st.integers(1, 4)))
        victims.append(Candidate(victim, reason, tenant != "t", 100.0 * i))
    order = draw(st.lists(st.integers(0, count - 1), max_size=3 * count))
    return victims, order


def _recount(victims: Sequence[Candidate]) -> tuple[list[str], bool, list[str]]:
    """What the quota rule is owed for ``victims``, counted from scratch."""
    own = [c.job.key for c in victims if c.own(PREEMPTOR)]
    cross = any(c.reason is PreemptReason.RECLAIM_GUARANTEE for c in victims)
    return own, cross, [c.job.key for c in victims]


@settings(max_examples=300, deadline=None)
@given(victim_sets(), st.data())
def test_each_check_of_a_smaller_set_sees_what_a_recount_of_it_gives(
    drawn: tuple[list[Candidate], list[int]], data: st.DataObject
) -> None:
    victims, order = drawn
    seen: list[tuple[list[str], bool, list[str]]] = []

    def quota_ok(own: Sequence[Job], cross: bool, listed: Sequence[Candidate]) -> bool:
        seen.append(([j.key for j in own], cross, [c.job.key for c in listed]))
        assert [listed[i] for i in range(len(listed))] == list(listed)
        return True

    kept = _Minimised(quota_ok, PREEMPTOR, victims)
    truth = list(victims)
    for index in order:
        gone = victims[index]
        if gone not in truth:
            continue
        seen.clear()
        kept.passes_without(gone)
        smaller = [c for c in truth if c is not gone]
        assert seen == [_recount(smaller)]
        assert len(kept.chosen) == len(truth)  # asking does not drop
        if data.draw(st.booleans()):
            kept.drop(gone)
            truth = smaller
        assert [c.job.key for c in kept.chosen] == [c.job.key for c in truth]
