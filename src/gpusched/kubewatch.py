"""List-then-watch of one resource, delivering plain dicts to a consumer: gpusched's reflector,
shared by the extender and the operator.

It lists once (paged), then watches from the list's resourceVersion with bookmarks, resumes from
the last version it saw when a watch ends, and lists again only when the server answers
``410 Gone`` (the version left the API server's history) or the connection fails. It runs as a
task on the owner's event loop and calls the consumer there, so a cache fed by it needs no locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from gpusched.kubeasync import ApiError, AsyncApi

log = logging.getLogger(__name__)


class Consumer(Protocol):
    """Receives the initial list and every later change (on the event loop)."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...
    def upsert(self, item: dict[str, Any]) -> None: ...
    def delete(self, item: dict[str, Any]) -> None: ...


class ExpiredError(Exception):
    """The watch's resourceVersion is too old: list again."""


@dataclass
class Reflector:
    """Keeps ``consumer`` in step with the collection at ``path`` until cancelled."""

    name: str
    api: AsyncApi
    path: str
    consumer: Consumer
    params: Mapping[str, str] = field(default_factory=dict)
    """``labelSelector`` / ``fieldSelector``."""
    metadata_only: bool = False
    """Objects' ``metadata`` alone (names, labels, versions): far smaller than nodes or pods."""
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    on_error: Callable[[str, BaseException], None] | None = None
    on_event: Callable[[], None] | None = None
    """Called after the consumer took a list or an event (e.g. to wake a loop)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the first list is in the consumer."""
    lists: int = 0
    """LIST calls made (the first and every re-list)."""

    async def run(self) -> None:
        """List, then watch; on a failure back off and list again."""
        backoff = self.backoff_seconds
        while True:
            try:
                version = await self._list()
                backoff = self.backoff_seconds
                while True:
                    version = await self._watch(version)
            except ExpiredError:
                log.info("watch of %s expired; listing again", self.name)
                continue
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                if self.on_error is not None:
                    self.on_error(self.name, err)
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.name, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_seconds)

    def start(self) -> asyncio.Task[None]:
        """Run as a task of the running loop."""
        return asyncio.create_task(self.run(), name=f"watch-{self.name}")

    async def _list(self) -> str:
        items, version = await self.api.list(
            self.path, self.params, metadata_only=self.metadata_only
        )
        self.lists += 1
        self.consumer.replace(items)
        self.synced.set()
        self._notify()
        return version

    async def _watch(self, version: str) -> str:
        """One watch request; returns the version to resume from."""
        try:
            async for event in self.api.watch(
                self.path, version, self.params, metadata_only=self.metadata_only
            ):
                version = self._take(event, version)
        except ApiError as err:
            if err.status == 410:
                raise ExpiredError(err.message) from err
            raise
        return version

    def _take(self, event: dict[str, Any], version: str) -> str:
        """Hand one event to the consumer; the version it moves the watch to."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ExpiredError(obj.get("message"))
            raise ValueError(f"watch error: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion") or version
        if kind in ("ADDED", "MODIFIED"):
            self.consumer.upsert(obj)
        elif kind == "DELETED":
            self.consumer.delete(obj)
        else:
            return version  # BOOKMARK: only the version moves
        self._notify()
        return version

    def _notify(self) -> None:
        if self.on_event is not None:
            self.on_event()
