"""GPU index lists read and write the same way everywhere."""

from __future__ import annotations

import pytest

from gpusched.api.annotations import format_indices, parse_indices


def test_indices_round_trip_sorted() -> None:
    assert format_indices([5, 0, 2]) == "0,2,5"
    assert parse_indices(format_indices([5, 0, 2])) == (0, 2, 5)


@pytest.mark.parametrize("value", [None, "", "1,x", "1,,2", "-1", "1.5", "\u00b2", "1,\u0663"])
def test_absent_or_malformed_values_are_no_assignment(value: str | None) -> None:
    assert parse_indices(value) is None
