"""Command-line value types shared by the components' flags.

Durations are written the way Kubernetes admins write them everywhere else (``10s``, ``5m``,
``1h30m``, ``250ms``: Go's ``time.ParseDuration`` units) or as plain seconds, so the chart's
values and a hand-typed flag mean the same thing. No well-kept Python library parses Go
durations (``pytimeparse`` reads English phrases and is unmaintained; ``isodate`` reads ISO 8601
only), and the grammar is one regular expression.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

import click

_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_WHOLE: Final = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")


def parse_duration(text: str) -> float:
    """Seconds of ``text``: a Go duration (``1h30m``, ``10s``, ``250ms``) or a plain number of
    seconds. Raises ValueError naming what is wrong; negative, infinite and NaN values are
    refused."""
    value = text.strip()
    if not value:
        raise ValueError("a duration is empty")
    try:
        seconds = float(value)
    except ValueError:
        if not _WHOLE.fullmatch(value):
            raise ValueError(
                f"{text!r} is not a duration (seconds, or a Go duration such as 10s, 5m, 1h30m)"
            ) from None
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(value))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration of zero or more seconds")
    return seconds


class Duration(click.ParamType[float, Any]):
    """A click type for :func:`parse_duration` (the value is seconds, a float)."""

    name = "duration"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        try:
            seconds = parse_duration(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)
        if self.positive and seconds <= 0:
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        return seconds


#: A duration that must be longer than zero.
POSITIVE_DURATION: Final = Duration(positive=True)
#: A duration of zero or more.
DURATION: Final = Duration()
