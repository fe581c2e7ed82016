"""The single admission loop: wait for a reason to look, run one cycle, repeat.

kopf handlers only call :meth:`AdmissionLoop.wake`; the cycle itself reads everything afresh from
the API server, so events never need to be processed in order and a missed one costs at most one
resync interval. Bursts of events (500 jobs applied at once) coalesce into one cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpusched.operator.controller import Controller
from gpusched.operator.leader import LeaderElector

log = logging.getLogger(__name__)


class AdmissionLoop:
    """Runs :meth:`Controller.cycle` when woken, and at least every ``resync`` seconds."""

    def __init__(
        self,
        controller: Controller,
        *,
        resync: float = 5.0,
        debounce: float = 0.05,
        leader: LeaderElector | None = None,
    ) -> None:
        self.controller = controller
        self.resync = resync
        self.debounce = debounce
        self.leader = leader
        self.cycles = 0
        self._wake: asyncio.Event | None = None

    def wake(self) -> None:
        """Ask for a cycle soon (safe to call from kopf handlers, any number of times)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set."""
        self._wake = asyncio.Event()
        while not stop.is_set():
            self._wake.clear()
            leading = True
            if self.leader is not None:
                leading = await asyncio.to_thread(self.leader.ensure)
            if leading:
                started = time.perf_counter()
                try:
                    report = await asyncio.to_thread(self.controller.cycle)
                except Exception:
                    log.exception("admission cycle failed; retrying")
                    await _sleep_or_stop(stop, 1.0)
                    continue
                self.cycles += 1
                if report.admitted or report.preempted:
                    log.info(
                        "cycle %d: admitted %d, preempted %s, %d waiting (%.0f ms: %s)",
                        self.cycles,
                        len(report.admitted),
                        report.preempted,
                        report.waiting,
                        (time.perf_counter() - started) * 1000,
                        ", ".join(f"{k} {v * 1000:.0f}" for k, v in report.seconds.items()),
                    )
            interval = self.resync
            if self.leader is not None and not leading:
                interval = min(self.resync, self.leader.duration / 3)
            elif self.leader is not None:
                interval = min(interval, self.leader.duration / 3)
            waiter = asyncio.ensure_future(self._wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait(
                    {waiter, stopper}, timeout=interval, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for task in (waiter, stopper):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await _sleep_or_stop(stop, self.debounce)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
