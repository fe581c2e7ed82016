"""Crash points for restart tests: ``GPUSCHED_FAILPOINTS=name[,name...]`` makes the operator exit
abruptly (as if killed) the first time it reaches a named point, so tests can stop it exactly
between two writes of an admission or a preemption and check that a restart finishes the work
without duplicates or losses; a hang point instead blocks there for good (the liveness test).
Unset, the points cost one set lookup."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Final

ENV: Final = "GPUSCHED_FAILPOINTS"

#: Every point the operator defines (documented in docs/development.md).
POINTS: Final = frozenset(
    {
        "admission-after-status",
        "admission-after-first-pod",
        "preemption-after-victims-marked",
        "preemption-after-evict",
        "cycle-hangs",
    }
)

_enabled = frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())
unknown = _enabled - POINTS
if unknown:
    raise SystemExit(f"{ENV}: unknown failpoints {sorted(unknown)}; known: {sorted(POINTS)}")


def reach(point: str) -> None:
    """Exit at once (code 137, no cleanup) if ``point`` is enabled."""
    if point in _enabled:
        logging.getLogger(__name__).error("failpoint %s reached: exiting", point)
        sys.stderr.flush()
        os._exit(137)


async def hang(point: str) -> None:
    """Never return if ``point`` is enabled (a cycle stuck on a call that never ends)."""
    if point in _enabled:
        logging.getLogger(__name__).error("failpoint %s reached: hanging", point)
        await asyncio.Event().wait()
