"""How GPU index lists are written in annotations (``gpusched.io/gpu-indices``,
``gpusched.io/planned-gpu-indices``): one spelling and one reading for every component, so a
malformed value means the same thing to the extender, the operator and job status."""

from __future__ import annotations

from collections.abc import Iterable


def format_indices(indices: Iterable[int]) -> str:
    """``0,2,5``: increasing, comma-separated."""
    return ",".join(str(i) for i in sorted(indices))


def whole_number(text: str) -> int | None:
    """The value of ``text`` when it is a whole number in ASCII digits; None otherwise.
    str.isdigit() also accepts superscripts and other scripts' digits, which int() refuses or
    reads as numbers no Kubernetes quantity or annotation of ours is written with."""
    return int(text) if text.isascii() and text.isdigit() else None


def parse_indices(value: str | None) -> tuple[int, ...] | None:
    """The indices of a value written by :func:`format_indices`, increasing; None when the value
    is absent, empty or malformed (a malformed assignment is treated as no assignment)."""
    if not value:
        return None
    numbers = [whole_number(part.strip()) for part in value.split(",")]
    if any(n is None for n in numbers):
        return None
    return tuple(sorted(n for n in numbers if n is not None))
