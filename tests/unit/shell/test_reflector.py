"""The reflector against an HTTP server speaking the API server's list and watch protocol: a
watch that ends at once is not reopened in a loop, a server asking to wait is waited for, a
failed watch resumes from the last event it delivered, and only an expired version lists
again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from gpusched.kubeasync import AsyncApi
from gpusched.kubewatch import Reflector

PATH = "/api/v1/pods"


class _Items:
    """The consumer: what the reflector delivered."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.items = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}

    def upsert(self, item: dict[str, Any]) -> None:
        self.items[item["metadata"]["name"]] = item["metadata"]["resourceVersion"]

    def delete(self, item: dict[str, Any]) -> None:
        self.items.pop(item["metadata"]["name"], None)


def _pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


Watch = Callable[[web.Request, int], Any]


def _run(
    watch: Watch,
    seconds: float,
    consumer: _Items | None = None,
    backoff: float = 0.5,
    on_list: Callable[[], None] | None = None,
) -> tuple[Reflector, list[str], _Items]:
    """Run a reflector for ``seconds`` against a server whose LIST answers one pod at version
    100 and whose n-th WATCH request is answered by ``watch(request, n)``; the reflector (still
    running at the end), the ``resourceVersion`` of every WATCH request and the consumer."""
    versions: list[str] = []
    consumer = consumer or _Items()

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response(
                {"metadata": {"resourceVersion": "100"}, "items": [_pod("a", "100")]}
            )
        versions.append(request.query["resourceVersion"])
        answer: web.StreamResponse = await watch(request, len(versions))
        return answer

    async def scenario() -> Reflector:
        app = web.Application()
        app.router.add_get(PATH, pods)
        async with TestServer(app) as server:
            configuration = client.Configuration()
            configuration.host = str(server.make_url("")).rstrip("/")
            api = AsyncApi(configuration)
            reflector = Reflector(
                "pods", api, PATH, consumer, backoff_seconds=backoff, on_list=on_list
            )
            task = reflector.start()
            await asyncio.sleep(seconds)
            assert not task.done()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
            return reflector

    return asyncio.run(scenario()), versions, consumer


async def _stream(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for event in events:
        await response.write(json.dumps(event).encode() + b"\n")
    return response


async def _hold(request: web.Request) -> web.StreamResponse:
    """A quiet watch that stays open."""
    response = web.StreamResponse()
    await response.prepare(request)
    await asyncio.sleep(3600)
    return response


def test_a_watch_the_server_ends_at_once_is_reopened_after_a_backoff_not_in_a_loop() -> None:
    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        return await _stream(request, [])

    reflector, versions, _ = _run(watch, 2.0)
    # 0.5 s, then 1 s, then 2 s between attempts: 3 watches in 2 s (thousands without it).
    assert 2 <= len(versions) <= 4
    assert reflector.lists == 1


def test_a_server_asking_to_wait_is_waited_for_and_nothing_is_listed_again() -> None:
    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            return web.json_response(
                {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "wait"},
                status=429,
                headers={"Retry-After": "2"},
            )
        return await _hold(request)

    early, versions, _ = _run(watch, 1.5)
    assert len(versions) == 1  # still waiting the 2 s asked (the backoff alone is 0.5 s)
    later, versions, _ = _run(watch, 3.5)
    assert len(versions) == 2
    assert early.lists == later.lists == 1


def test_a_watch_that_fails_resumes_from_the_last_event_it_delivered() -> None:
    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            response = await _stream(
                request,
                [
                    {"type": "ADDED", "object": _pod("b", "120")},
                    {"type": "MODIFIED", "object": _pod("a", "130")},
                ],
            )
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-stream
            return response
        return await _hold(request)

    reflector, versions, consumer = _run(watch, 1.5)
    assert versions == ["100", "130"]
    assert reflector.lists == 1
    assert consumer.items == {"a": "130", "b": "120"}


def test_only_an_expired_version_lists_again() -> None:
    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}
            return await _stream(request, [gone])
        return await _hold(request)

    sent: list[int] = []
    reflector, versions, _ = _run(watch, 2.0, on_list=lambda: sent.append(len(sent)))
    assert versions == ["100", "100"]
    assert reflector.lists == 2
    assert len(sent) == 2  # the owner hears of each LIST as it is sent


class _Fragile(_Items):
    """A consumer that fails on the first event it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def upsert(self, item: dict[str, Any]) -> None:
        if not self.failed:
            self.failed = True
            raise KeyError("a consumer's own fault")
        super().upsert(item)


def test_a_consumer_that_fails_gets_a_fresh_list_and_the_watch_goes_on() -> None:
    fragile = _Fragile()

    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            return await _stream(request, [{"type": "ADDED", "object": _pod("b", "120")}])
        return await _hold(request)

    reflector, versions, _ = _run(watch, 1.0, fragile, backoff=0.2)
    assert reflector.lists == 2
    assert versions == ["100", "100"]
    assert fragile.items == {"a": "100"}


def test_a_version_that_expires_right_after_each_list_is_listed_again_after_a_backoff() -> None:
    async def watch(request: web.Request, n: int) -> web.StreamResponse:
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}
        return await _stream(request, [gone])

    reflector, _, _ = _run(watch, 2.0)
    # Lists at 0, 0.5, 1.5 s: 3 in 2 s (without the backoff, hundreds).
    assert 2 <= reflector.lists <= 4
