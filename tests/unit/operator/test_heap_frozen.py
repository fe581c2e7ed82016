"""The operator freezes its long-lived heap once (``gpusched.operator.heap``): what lived
before is left out of later collections, and garbage is collected first, not frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpusched.operator.heap import freeze_long_lived


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_at_the_freeze_are_frozen_and_garbage_is_collected_first() -> None:
    kept = [{"job": i} for i in range(5_000)]
    garbage = _Node()
    garbage.peer = garbage  # a reference cycle no one holds: only the collector frees it
    gone = weakref.ref(garbage)
    del garbage
    frozen = freeze_long_lived()
    assert frozen >= len(kept)
    # Frozen objects may still be freed by their reference counts (a thread of an earlier test
    # dropping some), never added to: the count can only have gone down since.
    assert len(kept) <= gc.get_freeze_count() <= frozen
    assert gone() is None  # collected before the freeze, not kept resident by it
    # The frozen objects are out of the collector's generations.
    assert not any(o is kept[0] for o in gc.get_objects())
