"""gpusched's one way to talk to the API server: raw JSON over a pooled aiohttp session.

The operator and the extender are event loops that keep watch caches and make many small writes
(a Binding per pod, a status patch per job, a pod per replica). This client sends and reads plain
JSON dicts: no model classes to build, no worker threads, one connection pool shared by the
watches and the writes, deadlines on every call. Credentials come from a ``kubernetes``
configuration (:func:`gpusched.kube.load_configuration`: kubeconfig or the pod's service account;
client certificates or bearer tokens, refreshed the way the configuration says).

Reads: :meth:`AsyncApi.list` (paged) and :meth:`AsyncApi.watch` (a stream of events), which
:mod:`gpusched.kubewatch` turns into a list-then-watch cache. Writes: :meth:`AsyncApi.request`.
Synchronous code (the device probe) uses the same client through :class:`BlockingApi`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, cast
from urllib.parse import unquote, urlencode

import aiohttp
from kubernetes import client

#: Content type of JSON merge patches (RFC 7386), the only patch gpusched sends.
MERGE_PATCH: Final = "application/merge-patch+json"
#: Accept headers asking the API server for objects' metadata alone (as client-go's metadata
#: informers do): a list, and the objects of watch events.
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
#: Bodies above this size are decoded in a worker thread so the event loop keeps serving.
LARGE_BODY_BYTES: Final = 1 << 20
#: Seconds a watch request stays open before it is renewed (the server may end it sooner).
WATCH_SECONDS: Final = 300
#: Seconds between re-reads of the credentials (service-account tokens rotate hourly).
CREDENTIALS_REFRESH_SECONDS: Final = 60.0

#: Called after every request with (method, path, HTTP status; 0 when no answer came).
RequestHook = Callable[[str, str, int], None]


class ApiError(Exception):
    """A non-2xx answer: ``status``, the API server's ``reason`` and its message, and how long
    it asked the client to wait before trying again (``Retry-After``, with a 429 of API
    Priority and Fairness or a 503), if it did."""

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


async def _decode(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    if len(raw) > LARGE_BODY_BYTES:
        return cast(dict[str, Any], await asyncio.to_thread(json.loads, raw))
    return cast(dict[str, Any], json.loads(raw))


def _check_path(path: str) -> None:
    """Refuse an API path a name from outside could have bent: a ``.`` or ``..`` segment (also
    percent-encoded), an empty segment, a fragment or whitespace. Object names never contain
    them, so no legitimate request is refused."""
    route = path.split("?", 1)[0]
    segments = route.split("/")
    if (
        not route.startswith("/")
        or any(unquote(seg) in (".", "..") for seg in segments)
        or "" in segments[1:]
        or any(c in route for c in "#\\ \t\r\n")
    ):
        raise ValueError(f"refusing to send a request to the API path {path!r}")


class AsyncApi:
    """JSON requests, lists and watches against the API server of a ``kubernetes``
    configuration. Use from one event loop."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        connections: int = 64,
        timeout_seconds: float = 20.0,
        on_request: RequestHook | None = None,
    ) -> None:
        """``timeout_seconds`` bounds each call that does not set its own (the extender keeps it
        below kube-scheduler's extender ``httpTimeout`` so a bind never outlives the call
        kube-scheduler made); ``connections`` bounds the pool, watches included."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, connect=5)
        self._configuration = configuration
        self._host = configuration.host.rstrip("/")
        self._ssl = self._ssl_context(configuration)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._auth: dict[str, str] | None = None
        self._auth_at = 0.0
        self.on_request = on_request

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

    def _headers(
        self, content_type: str = "application/json", accept: str = "application/json"
    ) -> dict[str, str]:
        now = time.monotonic()
        if self._auth is None or now - self._auth_at > CREDENTIALS_REFRESH_SECONDS:
            configuration = self._configuration
            if configuration.refresh_api_key_hook is not None:
                # Re-reads the token (a rotated service-account token, an exec plugin); it
                # reloads the whole kubeconfig, far too slow to run for every request.
                configuration.refresh_api_key_hook(configuration)
            # Whatever the configuration would send: its auth settings name the header and
            # value (a bearer token from a kubeconfig or the pod's service account; none with
            # client certificates).
            settings = cast(dict[str, dict[str, str]], configuration.auth_settings())
            self._auth = {
                setting["key"]: setting["value"]
                for setting in settings.values()
                if setting.get("in") == "header" and setting.get("value")
            }
            self._auth_at = now
        return {"Content-Type": content_type, "Accept": accept, **self._auth}

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _url(self, path: str, params: Mapping[str, Any] | None) -> str:
        _check_path(path)
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        return self._host + path + ("?" + urlencode(query) if query else "")

    def _count(self, method: str, path: str, status: int) -> None:
        if self.on_request is not None:
            self.on_request(method, path, status)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one request; the decoded JSON answer, or :class:`ApiError`."""
        session = await self._client()
        data = None if body is None else json.dumps(body)
        status = 0
        try:
            async with session.request(
                method,
                self._url(path, params),
                data=data,
                headers=self._headers(content_type, accept),
                # An explicit None would mean no deadline at all to aiohttp, not the session's.
                timeout=self._timeout if timeout is None else aiohttp.ClientTimeout(total=timeout),
            ) as response:
                status = response.status
                raw = await response.read()
                if status >= 300:
                    raise _error(status, response.reason or "", raw, response.headers)
                return await _decode(raw)
        finally:
            self._count(method, path, status)

    async def list(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        page_size: int = 2000,
        metadata_only: bool = False,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection (paged), and the list's resourceVersion to watch from.
        ``metadata_only``: each item's ``metadata`` alone (the API server's
        PartialObjectMetadata), for a reader that needs names and labels, not specs."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.request(
                "GET",
                path,
                params={**(params or {}), "limit": page_size, "continue": token},
                accept=METADATA_LIST if metadata_only else "application/json",
                timeout=120,
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        *,
        seconds: int = WATCH_SECONDS,
        metadata_only: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request from ``resource_version`` (with bookmarks), until the
        server ends it; an ERROR event is yielded like any other. ``metadata_only``: as in
        :meth:`list`."""
        session = await self._client()
        query = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": seconds,
        }
        # A read deadline beyond the server's own: a connection that dies silently (an API
        # server or load balancer failing over) must end in a new watch, not a hung task.
        timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_read=seconds + 30)
        status = 0
        try:
            async with session.get(
                self._url(path, query),
                headers=self._headers(accept=METADATA if metadata_only else "application/json"),
                timeout=timeout,
            ) as response:
                status = response.status
                if status >= 300:
                    raise _error(
                        status, response.reason or "", await response.read(), response.headers
                    )
                buffer = b""
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
                if buffer.strip():
                    yield json.loads(buffer)
        finally:
            self._count("WATCH", path, status)

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (the API server sends whole seconds), None without one."""
    value = headers.get("Retry-After", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 3600 else None


def _error(
    status: int, reason: str, raw: bytes, headers: Mapping[str, str] | None = None
) -> ApiError:
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    text = raw[:200].decode(errors="replace")
    return ApiError(
        status,
        str(payload.get("reason") or reason),
        str(payload.get("message") or text),
        _retry_after(headers or {}),
    )


class BlockingApi:
    """The same client for synchronous callers (the device probe's loop): requests run on an
    event loop of their own, on a daemon thread, and the caller waits for the answer."""

    def __init__(self, configuration: client.Configuration, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._api = AsyncApi(configuration, **options)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kubeasync", daemon=True
        )
        self._thread.start()

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> dict[str, Any]:
        """:meth:`AsyncApi.request`, waited for; raises what it raises."""
        call = self._api.request(method, path, body, **options)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def close(self) -> None:
        """Close the connections and stop the loop."""
        asyncio.run_coroutine_threadsafe(self._api.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
