"""The extender's HTTP answers when things are not normal: 503 while its cache syncs, 400 for a
request it cannot read, 500 for its own failure, and it keeps serving after each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from gpusched.api import keys
from gpusched.kubeasync import AsyncApi
from gpusched.scheduler.cache import Assumption
from gpusched.scheduler.server import Extender
from tests.unit.scheduler.test_cache import topology_object

NODE = "n0"


def _extender() -> Extender:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"  # never reached: no watch is started here
    return Extender(AsyncApi(configuration))


def _ready(extender: Extender) -> None:
    extender.cache.replace_topologies([topology_object(NODE)])
    extender.cache.replace_pods([])


def _filter_args(gpus: int = 2) -> dict[str, Any]:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}],
        },
    }
    return {"Pod": pod, "NodeNames": [NODE]}


def _serve(extender: Extender, scenario: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        app = extender.app()
        app.on_startup.clear()  # no watches: the tests fill the cache themselves
        async with TestClient(TestServer(app)) as http:
            await scenario(http)

    asyncio.run(main())


async def _json(response: ClientResponse) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(await response.text())
    return payload


def test_every_verb_answers_503_until_the_cache_holds_its_first_lists() -> None:
    extender = _extender()

    async def scenario(http: TestClient[Any, Any]) -> None:
        for verb in ("filter", "prioritize"):
            response = await http.post(f"/{verb}", json=_filter_args())
            assert response.status == 503
            assert "syncing" in (await _json(response))["Error"]
        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": NODE}
        assert (await http.post("/bind", json=bind)).status == 503
        assert (await http.get("/readyz")).status == 503
        assert (await http.get("/healthz")).status == 200  # alive while syncing
        _ready(extender)
        assert (await http.get("/readyz")).status == 200
        response = await http.post("/filter", json=_filter_args())
        assert response.status == 200
        assert (await _json(response))["NodeNames"] == [NODE]

    _serve(extender, scenario)


def test_unreadable_requests_answer_400_and_the_next_one_is_served() -> None:
    extender = _extender()
    _ready(extender)

    async def scenario(http: TestClient[Any, Any]) -> None:
        not_json = await http.post("/filter", data=b"{not json", headers={"Content-Type": "x"})
        assert not_json.status == 400
        assert (await _json(not_json))["Error"].startswith("malformed request")
        no_pod = await http.post("/filter", json={"NodeNames": [NODE]})
        assert no_pod.status == 400
        assert "Pod" in (await _json(no_pod))["Error"]
        bind = await http.post("/bind", json={"PodName": "p"})
        assert bind.status == 400
        assert (await http.post("/filter", json=_filter_args())).status == 200

    _serve(extender, scenario)


def test_an_internal_failure_answers_500_with_its_message_and_the_process_keeps_serving() -> None:
    extender = _extender()
    _ready(extender)
    real_views = extender.cache.views
    calls = {"n": 0}

    def failing_views(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("cache exploded")
        return real_views(*args, **kwargs)

    extender.cache.views = failing_views  # type: ignore[method-assign]

    async def scenario(http: TestClient[Any, Any]) -> None:
        failed = await http.post("/filter", json=_filter_args())
        assert failed.status == 500
        assert (await _json(failed))["Error"] == "internal error: cache exploded"
        assert (await http.get("/healthz")).status == 200
        again = await http.post("/filter", json=_filter_args())
        assert again.status == 200
        assert (await _json(again))["NodeNames"] == [NODE]

    _serve(extender, scenario)


def test_a_pod_filtered_again_after_a_bind_without_answer_is_not_blocked_by_its_own_gpus() -> None:
    """Its earlier Binding may have been stored, so its GPUs stay held from every other pod;
    not from the pod itself, which kube-scheduler schedules again."""
    extender = _extender()

    async def scenario(http: TestClient[Any, Any]) -> None:
        _ready(extender)
        extender.cache.assume(
            Assumption(
                uid="u1", key="ns/p", node=NODE, gpus=tuple(range(8)), topology_class="nvlink"
            )
        )
        extender.cache.mark_bound("u1")
        again = await _json(await http.post("/filter", json=_filter_args(8)))
        assert again["NodeNames"] == [NODE]
        other = _filter_args(1)
        other["Pod"]["metadata"]["uid"] = "u2"
        refused = await _json(await http.post("/filter", json=other))
        assert refused["NodeNames"] in (None, [])

    _serve(extender, scenario)


def test_a_filter_of_an_invalid_request_counts_every_node_it_refuses() -> None:
    extender = _extender()
    _ready(extender)
    extender.cache.replace_topologies([topology_object(NODE), topology_object("n1")])
    args = _filter_args()
    args["NodeNames"] = [NODE, "n1"]
    args["Pod"]["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] = "-3"

    async def scenario(http: TestClient[Any, Any]) -> None:
        response = await http.post("/filter", json=args)
        refused = (await _json(response))["FailedAndUnresolvableNodes"]
        assert sorted(refused) == [NODE, "n1"]
        assert all(reason.startswith("InvalidRequest:") for reason in refused.values())

    _serve(extender, scenario)
    counted = extender.metrics.registry.get_sample_value(
        "gpusched_filter_refused_nodes_total", {"reason": "InvalidRequest"}
    )
    assert counted == 2
