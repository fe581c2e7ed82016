"""List-then-watch of one resource, delivering plain dicts to a consumer, re-listing on expiry.

The ``kubernetes`` client has a watch iterator but no informer, and its model objects cost far
more to build than the JSON dicts our caches use; so this small reflector lists and watches raw
JSON (``_preload_content=False``), resumes from the last resourceVersion, uses bookmarks, and
re-lists when the server answers 410 Gone. It runs in a thread; the consumer decides how events
reach its owner (the extender hands them to its event loop).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError, ProtocolError

log = logging.getLogger(__name__)

#: Seconds a watch request stays open before it is renewed (the server may end it sooner).
WATCH_TIMEOUT_SECONDS = 300
#: Client-side deadlines: connecting, and a whole list.
CONNECT_TIMEOUT_SECONDS = 10
LIST_TIMEOUT_SECONDS = 120


#: A ``list_*`` method of the generated client, e.g. ``CoreV1Api.list_pod_for_all_namespaces``.
ListFunction = Callable[..., Any]


class Consumer(Protocol):
    """Receives the initial list and every later change."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...
    def upsert(self, item: dict[str, Any]) -> None: ...
    def delete(self, item: dict[str, Any]) -> None: ...


@dataclass
class Reflector:
    """Keeps ``consumer`` in step with one resource until ``stop`` is set."""

    name: str
    list_function: ListFunction
    consumer: Consumer
    stop: threading.Event
    field_selector: str | None = None
    label_selector: str | None = None
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    on_error: Callable[[str, BaseException], None] | None = None

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"_preload_content": False}
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        return kwargs

    def run(self) -> None:
        """List, then watch; on any failure back off and list again."""
        backoff = self.backoff_seconds
        while not self.stop.is_set():
            try:
                version: str | None = self._list()
                backoff = self.backoff_seconds
                while version is not None and not self.stop.is_set():
                    version = self._watch(version)  # None: expired, list again
            except (ApiException, HTTPError, ProtocolError, OSError, ValueError) as err:
                if self.on_error is not None:
                    self.on_error(self.name, err)
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.name, err, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_seconds)

    def start(self) -> threading.Thread:
        """Run in a daemon thread."""
        thread = threading.Thread(target=self.run, name=f"watch-{self.name}", daemon=True)
        thread.start()
        return thread

    def _list(self) -> str:
        response = self.list_function(_request_timeout=LIST_TIMEOUT_SECONDS, **self._kwargs())
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        self.consumer.replace(body.get("items") or [])
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        """One watch request; returns the version to resume from, None to re-list."""
        response = self.list_function(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            # A read deadline beyond the server's own: a connection that dies silently (an API
            # server or load balancer failing over) must end in a re-list, not a hung thread.
            _request_timeout=(CONNECT_TIMEOUT_SECONDS, WATCH_TIMEOUT_SECONDS + 30),
            **self._kwargs(),
        )
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]  # untyped upstream
                if self.stop.is_set():
                    return version
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ValueError(f"watch error: {obj.get('message')}")
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind in ("ADDED", "MODIFIED"):
                    self.consumer.upsert(obj)
                elif kind == "DELETED":
                    self.consumer.delete(obj)
        finally:
            response.close()
            response.release_conn()
        return version
