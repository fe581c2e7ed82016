"""When a tenant's planned jobs leave room under a cap (``cycle._quota_allows``): the sweep it
makes past the first time tried must give what trying each time in turn gives, rounds bounded
alike. Truth here walks the plan once per time tried, as the definition reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.admission.cycle import _FORECAST_ROUNDS, _quota_allows
from gpusched.core.admission.profile import NEVER

Interval = tuple[float, float, int]


def _by_definition(planned: list[Interval], at: float, gpus: int, cap: int) -> float | None:
    when = at
    for _ in range(_FORECAST_ROUNDS):
        held = [(end, n) for start, end, n in planned if start <= when < end]
        if sum(n for _, n in held) + gpus <= cap:
            return when
        if not held or min(end for end, _ in held) == NEVER:
            return None
        when = min(end for end, _ in held)
    return None


times = st.sampled_from([0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, NEVER])
intervals = st.tuples(times, times, st.integers(0, 8))


@settings(max_examples=3000, deadline=None)
@given(st.lists(intervals, max_size=60), times, st.integers(1, 8), st.integers(0, 24))
def test_room_under_a_cap_is_found_when_trying_each_time_in_turn_finds_it(
    planned: list[Interval], at: float, gpus: int, cap: int
) -> None:
    assert _quota_allows(planned, at, gpus, cap) == _by_definition(planned, at, gpus, cap)


def test_the_rounds_are_bounded_as_trying_each_time_in_turn_bounds_them() -> None:
    # Jobs ending one after another, each holding the cap: room comes when the last ends, at
    # the (count + 1)-th time tried from 0.
    for count in range(_FORECAST_ROUNDS - 3, _FORECAST_ROUNDS + 3):
        planned = [(0.0, float(i + 1), 8) for i in range(count)]
        found = _quota_allows(planned, 0.0, 1, 8)
        assert found == _by_definition(planned, 0.0, 1, 8)
        assert found == (float(count) if count < _FORECAST_ROUNDS else None)
