"""A progress line for a replay, on stderr.

Written by hand rather than with ``tqdm`` or ``rich``: neither is a dependency of gpusched
(pyproject.toml), and what is needed (one line redrawn with ``\\r``, a throttle, an ETA, and a
plain line per 10 % when stderr is a log file) is a few lines, not worth a new dependency of the
CLI.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_DAY = 86400.0


def _clock(seconds: float) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s``."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


class Progress:
    """Reports how far a replay got; the engine calls :meth:`update` (or the object itself, so
    it is a ``ProgressHook``) as events are processed.

    On a terminal: one line redrawn in place, at most ``max_rate`` times a second (and always at
    the last event). Elsewhere (CI logs): one plain line each time another 10 % of the events is
    done.
    """

    def __init__(
        self,
        policy: str,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        max_rate: float = 4.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else self.stream.isatty()
        self.interval = 1.0 / max_rate
        self.clock = clock
        self.started = clock()
        self.last_draw: float | None = None
        self.last_decile = 0
        self.width = 0
        """Length of the line last drawn (to blank what a shorter line leaves)."""
        self.closed = False

    def line(
        self,
        virtual_time: float,
        done: int,
        total: int,
        running: int | None = None,
        queued: int | None = None,
    ) -> str:
        """The text of the progress line (no newline)."""
        elapsed = self.clock() - self.started
        pct = 100.0 * done / total if total else 100.0
        parts = [f"{self.policy}: {pct:5.1f}% of {total} events", f"day {virtual_time / _DAY:.1f}"]
        if running is not None:
            parts.append(f"{running} running")
        if queued is not None:
            parts.append(f"{queued} queued")
        parts.append(f"elapsed {_clock(elapsed)}")
        if 0 < done < total:
            parts.append(f"ETA {_clock(elapsed * (total - done) / done)}")
        return ", ".join(parts)

    def update(
        self,
        virtual_time: float,
        events_done: int,
        events_total: int,
        running: int | None = None,
        queued: int | None = None,
    ) -> None:
        """Note progress; draws when due (see the class docstring)."""
        if self.closed:
            return
        last = events_total > 0 and events_done >= events_total
        if self.tty:
            now = self.clock()
            if not last and self.last_draw is not None and now - self.last_draw < self.interval:
                return
            self.last_draw = now
            text = self.line(virtual_time, events_done, events_total, running, queued)
            pad = " " * max(0, self.width - len(text))
            self.width = len(text)
            self.stream.write(f"\r{text}{pad}")
            self.stream.flush()
            return
        decile = 10 * events_done // events_total if events_total else 10
        if decile > self.last_decile:
            self.last_decile = decile
            text = self.line(virtual_time, events_done, events_total, running, queued)
            self.stream.write(text + "\n")
            self.stream.flush()

    __call__ = update

    def close(self) -> None:
        """End the line on a terminal (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.tty and self.last_draw is not None:
            self.stream.write("\n")
            self.stream.flush()
