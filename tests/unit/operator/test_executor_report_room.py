"""Waiting jobs' reports make room for decisions, and only while there are decisions: while
admissions, preemptions or records are in flight, or jobs were admitted lately, few reports go
out beside them; once it is quiet, as many as the request slots, so a burst of new jobs that
cannot start gets its first statuses within minutes."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpusched.core.lifecycle import Group, Stage, Urgency
from gpusched.core.lifecycle.actions import Step
from gpusched.metrics import OperatorMetrics
from gpusched.operator.executor import REPORTS_IN_FLIGHT, REPORTS_IN_FLIGHT_IDLE, Executor
from gpusched.operator.store import Store

QUIET = 10.0


def _group(job: str, urgency: Urgency) -> Group:
    """A group with nothing to write: in flight from submit until its task first runs."""
    return Group(frozenset({job}), (Step(Stage.SETTLE, ()),), urgency)


def test_reports_get_every_request_slot_only_once_no_decision_went_out_lately() -> None:
    now = [0.0]

    async def scenario() -> list[int]:
        executor = Executor(
            cast(Any, None), Store(), OperatorMetrics(), quiet_seconds=QUIET, ticks=lambda: now[0]
        )
        rooms = [executor.reports_room()]  # nothing ever admitted: quiet
        executor.submit([_group(f"r{i}", Urgency.REPORT) for i in range(3)])
        rooms.append(executor.reports_room())
        executor.submit([_group("admitted", Urgency.DECIDE)])
        rooms.append(executor.reports_room())  # an admission in flight
        await executor.drain()
        rooms.append(executor.reports_room())  # admitted lately
        now[0] = QUIET
        rooms.append(executor.reports_room())  # quiet again
        executor.submit([_group("running", Urgency.SETTLE)])
        rooms.append(executor.reports_room())  # a record in flight
        await executor.drain()
        rooms.append(executor.reports_room())  # records do not hold reports back afterwards
        return rooms

    assert asyncio.run(scenario()) == [
        REPORTS_IN_FLIGHT_IDLE,
        REPORTS_IN_FLIGHT_IDLE - 3,
        REPORTS_IN_FLIGHT - 3,
        REPORTS_IN_FLIGHT,
        REPORTS_IN_FLIGHT_IDLE,
        REPORTS_IN_FLIGHT,
        REPORTS_IN_FLIGHT_IDLE,
    ]
