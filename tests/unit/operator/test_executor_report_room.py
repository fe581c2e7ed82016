"""Waiting jobs' reports make room for decisions under load, and only then: while admissions,
preemptions or records are in flight few reports go out beside them; while none is, as many as
the request slots, so a burst of new jobs gets its first statuses within minutes."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpusched.core.lifecycle import Group, Stage, Urgency
from gpusched.core.lifecycle.actions import Step
from gpusched.metrics import OperatorMetrics
from gpusched.operator.executor import REPORTS_IN_FLIGHT, REPORTS_IN_FLIGHT_IDLE, Executor
from gpusched.operator.store import Store


def _group(job: str, urgency: Urgency) -> Group:
    """A group with nothing to write: in flight from submit until its task first runs."""
    return Group(frozenset({job}), (Step(Stage.SETTLE, ()),), urgency)


def test_reports_get_every_request_slot_only_while_no_decision_is_in_flight() -> None:
    async def scenario() -> list[int]:
        executor = Executor(cast(Any, None), Store(), OperatorMetrics())
        rooms = [executor.reports_room()]
        executor.submit([_group(f"r{i}", Urgency.REPORT) for i in range(3)])
        rooms.append(executor.reports_room())
        executor.submit([_group("admitted", Urgency.DECIDE)])
        rooms.append(executor.reports_room())
        await executor.drain()
        rooms.append(executor.reports_room())
        executor.submit([_group("running", Urgency.SETTLE)])
        rooms.append(executor.reports_room())
        await executor.drain()
        return rooms

    assert asyncio.run(scenario()) == [
        REPORTS_IN_FLIGHT_IDLE,
        REPORTS_IN_FLIGHT_IDLE - 3,
        REPORTS_IN_FLIGHT - 3,
        REPORTS_IN_FLIGHT_IDLE,
        REPORTS_IN_FLIGHT,
    ]
