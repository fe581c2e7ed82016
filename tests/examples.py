"""How many examples a property test draws: its own count in ``./scripts/test``, or
``GPUSCHED_EXAMPLES`` of each in a nightly-size run (docs/development.md)."""

from __future__ import annotations

import os


def examples(default: int) -> int:
    """``default``, unless ``GPUSCHED_EXAMPLES`` asks for another count for every property."""
    value = os.environ.get("GPUSCHED_EXAMPLES", "").strip()
    if not value:
        return default
    count = int(value)
    if count < 1:
        raise ValueError(f"GPUSCHED_EXAMPLES must be a positive whole number, not {value!r}")
    return count
