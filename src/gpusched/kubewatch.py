"""List-then-watch of one resource, delivering plain dicts to a consumer: gpusched's reflector,
shared by the extender and the operator.

It lists once (paged), then watches from the list's resourceVersion with bookmarks, resumes from
the last version it saw when a watch ends or fails (after a backoff), and lists again only when
the server answers ``410 Gone`` (the version left the API server's history). It runs as a
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


class EmptyWatchError(Exception):
    """A watch ended at once without a single event: retried after a backoff."""


#: A watch that ends sooner than this with no event is retried after a backoff, not at once
#: (client-go's reflector treats such a watch as failed the same way).
SHORT_WATCH_SECONDS = 1.0


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
    on_list: Callable[[], None] | None = None
    """Called as each LIST is sent (what it returns is at least as new as that moment)."""
    on_event: Callable[[], None] | None = None
    """Called after the consumer took a list or an event (e.g. to wake a loop)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the first list is in the consumer."""
    lists: int = 0
    """LIST calls made (the first and every re-list)."""
    version: str | None = None
    """The resourceVersion the next watch resumes from (None: list first)."""

    async def run(self) -> None:
        """List, then watch; a failed watch is resumed from the last version seen, after a
        backoff that grows until a watch delivers something again (at least what the server's
        ``Retry-After`` asks); only an expired version lists again."""
        backoff = self.backoff_seconds
        loop = asyncio.get_running_loop()
        listed_at = float("-inf")
        while True:
            try:
                if self.version is None:
                    self.version = await self._list()
                    listed_at = loop.time()
                while True:
                    started = loop.time()
                    events = await self._watch()
                    if events:
                        backoff = self.backoff_seconds
                    elif loop.time() - started < SHORT_WATCH_SECONDS:
                        # Ended at once with nothing (an API server shutting down, a proxy
                        # closing streams): reopened at once it would be reopened in a loop.
                        raise EmptyWatchError(f"watch ended after {loop.time() - started:.1f}s")
            except ExpiredError:
                log.info("watch of %s expired; listing again", self.name)
                self.version = None
                if loop.time() - listed_at < SHORT_WATCH_SECONDS:
                    # Expired right after a list: listing again at once could go on for ever.
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff_seconds)
                continue
            except asyncio.CancelledError:
                raise
            except (
                ApiError,
                EmptyWatchError,
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                ValueError,
            ) as err:
                if self.on_error is not None:
                    self.on_error(self.name, err)
                asked = err.retry_after if isinstance(err, ApiError) else None
                wait = max(backoff, asked or 0.0)
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.name, err, wait)
                await asyncio.sleep(wait)
                backoff = min(backoff * 2, self.max_backoff_seconds)
            except Exception as err:
                # The consumer failed on an object: what it holds may be half-updated, so it
                # takes a fresh list; the watch never ends while its owner thinks it runs.
                if self.on_error is not None:
                    self.on_error(self.name, err)
                log.exception("watch of %s: consumer failed; listing again", self.name)
                self.version = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_seconds)

    def start(self) -> asyncio.Task[None]:
        """Run as a task of the running loop."""
        return asyncio.create_task(self.run(), name=f"watch-{self.name}")

    async def _list(self) -> str:
        if self.on_list is not None:
            self.on_list()
        items, version = await self.api.list(
            self.path, self.params, metadata_only=self.metadata_only
        )
        self.lists += 1
        self.consumer.replace(items)
        self.synced.set()
        self._notify()
        return version

    async def _watch(self) -> int:
        """One watch request from :attr:`version`, which follows every event it delivers;
        how many it delivered (bookmarks included)."""
        assert self.version is not None
        events = 0
        try:
            async for event in self.api.watch(
                self.path, self.version, self.params, metadata_only=self.metadata_only
            ):
                self.version = self._take(event, self.version)
                events += 1
        except ApiError as err:
            if err.status == 410:
                raise ExpiredError(err.message) from err
            raise
        return events

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
