"""A minimal asyncio client for the few API calls on the extender's hot path.

Every GPU pod costs the extender one Binding call. Made through the generated (synchronous)
client, each call spends milliseconds of CPU in model serialisation and a worker thread, CPU the
API server it shares a node with would rather have. This client sends the raw JSON over a pooled
keep-alive aiohttp session, with the same credentials as the ``kubernetes`` configuration it is
built from (client certificate or bearer token, refreshed the way the configuration says).
"""

from __future__ import annotations

import json
import ssl
from typing import Any, cast

import aiohttp
from kubernetes import client


class ApiError(Exception):
    """A non-2xx answer: ``status`` and the API server's ``reason`` / message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


class AsyncApi:
    """JSON requests to the API server described by a ``kubernetes`` configuration."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        connections: int = 64,
        timeout_seconds: float = 20.0,
    ) -> None:
        """``timeout_seconds`` bounds each call; keep it below kube-scheduler's extender
        ``httpTimeout`` so a bind never outlives the call kube-scheduler made."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, connect=5)
        self._configuration = configuration
        self._host = configuration.host.rstrip("/")
        self._ssl = self._ssl_context(configuration)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def _ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
        if not configuration.host.startswith("https://"):
            return False
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        return context

    def _headers(self) -> dict[str, str]:
        configuration = self._configuration
        if configuration.refresh_api_key_hook is not None:
            configuration.refresh_api_key_hook(configuration)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        # Whatever the configuration would send: its auth settings name the header and value
        # (a bearer token from a kubeconfig or the pod's service account; none with certs).
        settings = cast(dict[str, dict[str, str]], configuration.auth_settings())
        for setting in settings.values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Send one request; the decoded JSON answer, or :class:`ApiError`."""
        session = await self._client()
        data = None if body is None else json.dumps(body)
        async with session.request(
            method, self._host + path, data=data, headers=self._headers()
        ) as response:
            text = await response.text()
            payload: dict[str, Any] = json.loads(text) if text else {}
            if response.status >= 300:
                raise ApiError(
                    response.status,
                    str(payload.get("reason") or response.reason),
                    str(payload.get("message") or text[:200]),
                )
            return payload

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()
