"""The run-time history is read when a replica starts to lead, which is when the API server is
likeliest to be unreachable: a connection lost on that read is retried like a failed cycle, and
never ends the admission loop (the Lease would go on being renewed by a replica that admits
nothing)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import aiohttp
import pytest

from gpusched.kubeasync import ApiError
from gpusched.operator.loop import AdmissionLoop, CycleReport
from gpusched.operator.runtimes import RuntimeBook
from gpusched.operator.store import KINDS, Store


class _Restarting:
    """The API server's answers to the history read: the connection reset twice, then no
    ConfigMap yet."""

    def __init__(self) -> None:
        self.reads = 0

    async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.reads += 1
        if self.reads <= 2:
            raise aiohttp.ClientConnectionError("Connection reset by peer")
        raise ApiError(404, "NotFound", "configmaps not found")


def test_a_connection_lost_reading_the_history_is_retried_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store()
    store.synced.update(KINDS)
    api = _Restarting()
    book = RuntimeBook(cast(Any, api), "gpusched-system")
    loop = AdmissionLoop(cast(Any, None), store, runtimes=book, resync=0.01, debounce=0.01)
    cycles = 0

    async def cycle() -> CycleReport:
        nonlocal cycles
        cycles += 1
        return CycleReport()

    monkeypatch.setattr(loop, "cycle", cycle)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        for _ in range(400):
            await asyncio.sleep(0.01)
            if cycles >= 3 or task.done():
                break
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert api.reads == 3
    assert book.loaded
    assert cycles >= 3
