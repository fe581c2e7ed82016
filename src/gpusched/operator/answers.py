"""``gpusched explain``'s answers over HTTP, from the leading operator's last cycle.

Deciding again for one question costs a whole cycle over the cluster (a second at 10,000 queued
jobs) and playing the queue forward seconds more; the leader has both at hand: the cycle it
last ran, still in the state it left, and the expected starts of its last forecast. So it
answers in milliseconds and says when that cycle decided. The next cycle decides on a second
kept pool, so an answer never waits for a cycle (:meth:`AdmissionLoop.last_decision`).

- ``GET /explain/{namespace}/{name}``: the explanation and the job's status as written. A
  waiting job the last forecast gave no start for its current wait (queued since, or beyond
  the jobs it covers) has none here, and ``unforecast`` says why.
- ``GET /explain/{namespace}/{name}/sooner``: the one change that would start the job markedly
  sooner, and for such a job its start played forward for it alone (``playedBecause``); each
  variant and the play are a cycle and a forecast of their own (seconds at scale) over the
  last cycle's snapshot, which they only read, one at a time, holding no pool.

A replica that does not lead (or has not decided yet) answers 503 with the Lease holder; the
CLI asks again (the Service picks a replica per request) and otherwise decides itself. The
server carries no credentials: whoever may reach it (the chart's Service, through the API
server's proxy and the ``explain`` Role) may read every job's explanation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from gpusched.core.admission import Job
from gpusched.core.admission.explain import Explanation, sooner
from gpusched.metrics import OperatorMetrics
from gpusched.operator.decide import Decision
from gpusched.operator.explainer import JobNotFoundError, answer, play_unforecast, unforecast
from gpusched.operator.leader import LeaderElector
from gpusched.operator.loop import AdmissionLoop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Read:
    """What one request read from the last cycle (the job as the cycle saw it, if queued)."""

    decision: Decision
    explanation: Explanation
    status: dict[str, Any]
    job: Job | None
    unforecast: str | None = None
    """Why the last forecast gave the job no start for its current wait, if it did not."""


class AnswerServer:
    """The HTTP endpoint; :meth:`start` and :meth:`stop` on the operator's event loop."""

    def __init__(
        self,
        loop: AdmissionLoop,
        metrics: OperatorMetrics,
        port: int,
        *,
        leader: LeaderElector | None = None,
        host: str = "0.0.0.0",
    ) -> None:
        self.loop = loop
        self.metrics = metrics
        self.port = port
        self.host = host
        self.leader = leader
        self.sooner_slot = asyncio.Semaphore(1)
        """Counterfactuals and starts played for one job are whole cycles: one at a time
        beside the admission loop."""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/explain/{namespace}/{name}", self._explain)
        app.router.add_get("/explain/{namespace}/{name}/sooner", self._sooner)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("explain answers on :%d/explain/NAMESPACE/NAME", self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _unavailable(self) -> web.Response:
        if not self.loop.leading():
            holder = self.leader.holder if self.leader is not None else None
            return _json(
                503,
                {
                    "reason": "NotLeading",
                    "message": "this operator replica does not lead: ask the leader"
                    + (f" ({holder})" if holder else ""),
                    "leader": holder,
                },
            )
        return _json(
            503,
            {"reason": "NoCycleYet", "message": "the operator has not finished a cycle yet"},
        )

    async def _from_last_cycle(
        self, request: web.Request, *, play: bool = False
    ) -> web.Response | _Read:
        """The job's explanation from the last cycle (or the answer that there is none);
        ``play``: a waiting job the last forecast gave no start for its current wait gets
        one played forward for it alone (seconds at scale), else only the reason why not."""
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        async with self.loop.last_decision() as decision:
            if decision is None:
                return self._unavailable()
            try:
                explanation, status = await asyncio.to_thread(answer, decision, key)
            except JobNotFoundError:
                return _not_found(key, decision)
            why = unforecast(decision, key, explanation)
            read = _Read(decision, explanation, status, decision.cycle.jobs.get(key), why)
        if why is not None and play:
            # Over the snapshot alone, which no later cycle changes: the pool is not held.
            async with self.sooner_slot:
                await asyncio.to_thread(play_unforecast, decision, key, explanation, why)
        elif why is not None:
            explanation.unforecast = why
        return read

    async def _explain(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        read = await self._from_last_cycle(request)
        if isinstance(read, web.Response):
            return read
        seconds = time.perf_counter() - started
        self.metrics.explain_seconds.labels("explain").observe(seconds)
        return _json(
            200,
            {
                "explanation": read.explanation.to_dict(),
                "status": read.status,
                "decidedAt": read.decision.world.now.isoformat(),
                "answeredBy": self._identity(),
                "seconds": round(seconds, 4),
            },
        )

    async def _sooner(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        read = await self._from_last_cycle(request, play=True)
        if isinstance(read, web.Response):
            return read
        text = None
        if read.job is not None:
            async with self.sooner_slot:
                text = await asyncio.to_thread(
                    sooner, read.decision.snapshot, read.job, read.explanation
                )
        seconds = time.perf_counter() - started
        self.metrics.explain_seconds.labels("sooner").observe(seconds)
        return _json(
            200,
            {
                "counterfactual": text,
                "expectedStart": read.explanation.expected_start,
                "forecastAt": read.explanation.forecast_at,
                "playedBecause": read.explanation.played_because,
                "decidedAt": read.decision.world.now.isoformat(),
                "seconds": round(seconds, 4),
            },
        )

    def _identity(self) -> str | None:
        return self.leader.identity if self.leader is not None else None


def _not_found(key: str, decision: Decision) -> web.Response:
    return _json(
        404,
        {
            "reason": "JobNotFound",
            "message": f"GpuJob {key} not found in the operator's cycle of "
            f"{decision.world.now.isoformat()} (a job created since is decided within a second)",
        },
    )


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status, dumps=partial(json.dumps, default=str))
