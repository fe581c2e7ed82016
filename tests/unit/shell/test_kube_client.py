"""Every API call made through gpusched's client has a deadline unless it sets its own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from gpusched import kube
from gpusched.dev.localcluster import pki
from gpusched.kubeasync import AsyncApi


def test_calls_without_their_own_timeout_get_the_default_deadline(
    tmp_path: Any, monkeypatch: Any
) -> None:
    ca = pki.CertificateAuthority.create(tmp_path)
    pair = ca.issue("user", "user")
    path = pki.write_kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:1", ca.cert_path, "u", credentials=pair
    )
    api = kube.api_client(path, timeout=(1.0, 2.0))
    seen: list[Any] = []

    def fake_request(self: Any, method: str, url: str, **kwargs: Any) -> None:
        seen.append(kwargs.get("_request_timeout"))
        raise RuntimeError("stop")

    monkeypatch.setattr(type(api.rest_client), "request", fake_request)
    for timeout in (None, 5):
        with contextlib.suppress(RuntimeError):
            api.call_api("GET", "https://127.0.0.1:1/api", _request_timeout=timeout)
    assert seen == [(1.0, 2.0), 5]


def test_async_calls_without_their_own_timeout_end_at_the_clients_deadline() -> None:
    """A server that never answers (a half-open connection after a failover) holds a call for
    ``timeout_seconds``, not for ever; a call's own timeout still wins."""

    async def scenario() -> list[float]:
        async def stall(request: web.Request) -> web.Response:
            await asyncio.sleep(3600)
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", stall)
        async with TestServer(app) as server:
            configuration = client.Configuration()
            configuration.host = str(server.make_url("")).rstrip("/")
            api = AsyncApi(configuration, timeout_seconds=0.5)
            took = []
            try:
                for method, timeout in (("POST", None), ("GET", None), ("GET", 1.5)):
                    started = time.monotonic()
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(
                            api.request(method, "/api/v1/namespaces/ns/pods", {}, timeout=timeout),
                            10,
                        )
                    took.append(time.monotonic() - started)
            finally:
                await api.close()
            return took

    post, get, own = asyncio.run(scenario())
    assert post < 3
    assert get < 3
    assert 1.4 < own < 6
