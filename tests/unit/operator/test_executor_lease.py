"""Only a leader writes: writes of a step still waiting for a request slot when the Lease
lapses are never sent (another replica may be deciding by then)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from gpusched.core.lifecycle import Group, Stage, Urgency
from gpusched.core.lifecycle.actions import DeletePod, Step
from gpusched.kubeasync import AsyncApi
from gpusched.metrics import OperatorMetrics
from gpusched.operator.api import OperatorApi
from gpusched.operator.executor import Executor
from gpusched.operator.store import Store


def test_writes_waiting_for_a_slot_when_the_lease_lapses_are_not_sent() -> None:
    leading = [True]
    sent: list[bool] = []

    async def delete(request: web.Request) -> web.Response:
        sent.append(leading[0])
        await asyncio.sleep(0.1)  # a loaded API server
        return web.json_response({"kind": "Pod", "metadata": {"name": request.match_info["n"]}})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{n}", delete)
        async with TestServer(app) as server:
            configuration = client.Configuration()
            configuration.host = str(server.make_url("")).rstrip("/")
            api = AsyncApi(configuration)
            executor = Executor(
                OperatorApi(api), Store(), OperatorMetrics(), leading=lambda: leading[0], requests=4
            )
            victims = tuple(DeletePod("team", f"victim-{i}", f"uid-{i}") for i in range(20))
            step = Step(Stage.EVICT, victims)
            executor.submit([Group(frozenset({"team/big"}), (step,), Urgency.DECIDE)])
            for _ in range(500):  # until the first four went out (the next wait for them)
                if len(sent) >= 4:
                    break
                await asyncio.sleep(0.01)
            leading[0] = False
            await executor.drain()
            await api.close()

    asyncio.run(scenario())
    assert 4 <= len(sent) <= 8  # those in flight when it lapsed, never the 12 waiting
    assert all(sent[:4])
