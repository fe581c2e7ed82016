"""kopf's watch events into the store, with the two things kopf does not do for a cache.

kopf runs one watch per kind and hands every event to the ``@kopf.on.event`` handlers that
:mod:`gpusched.operator.main` registers; a :class:`KindFeed` turns them into the store's
``upsert_*`` / ``delete_*`` calls. kopf tells a handler neither when a kind has been listed nor
which objects a new list no longer holds (after ``410 Gone`` it lists again and delivers the
listed objects as events of type ``None``, but nothing for the objects deleted meanwhile; measured
in ``docs/architecture.md``). So a feed:

- **anchors** the kind before kopf's watches start: one paged LIST (through
  :class:`~gpusched.kubeasync.AsyncApi`) replaces the kind in the store and marks it synced, so
  the admission cycle knows when the store holds the whole kind;
- **reconciles** after kopf lists: events of type ``None`` after the anchor mean kopf listed
  again (its first list at start-up, or a relist after the watch expired). A short while after
  the last of them the feed LISTs the kind once and deletes from the store whatever that list
  lacks, unless the store saw it at a version newer than the list (created meanwhile).

At steady state neither happens: no LIST is made, however long the operator runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusched.api.annotations import whole_number
from gpusched.kubeasync import ApiError, AsyncApi

log = logging.getLogger(__name__)

Raw = Mapping[str, Any]

#: Seconds after kopf's last listed object before the feed LISTs to find deletions.
RECONCILE_AFTER = 2.0
#: Seconds between attempts of an anchor LIST that failed.
ANCHOR_RETRY = 2.0
#: The longest wait before a reconcile LIST that failed is tried again.
MAX_RECONCILE_BACKOFF = 60.0


def _version(meta: Mapping[str, Any]) -> int:
    value = str(meta.get("resourceVersion") or "")
    return whole_number(value) or 0


def _key(meta: Mapping[str, Any]) -> str:
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


@dataclass
class KindFeed:
    """One kind, fed by kopf's watch, kept whole by anchor and reconcile LISTs."""

    name: str
    """The store's name of the kind (``KINDS``)."""
    path: str
    """The collection's API path, for the anchor and reconcile LISTs."""
    replace: Callable[[list[dict[str, Any]]], None]
    upsert: Callable[[Raw], None]
    delete: Callable[[Raw], None]
    on_error: Callable[[str, BaseException], None] | None = None
    optional: bool = False
    """The kind's CRD may not be installed (a chart upgrade adds no CRD): a 404 on the anchor
    LIST means no objects, and kopf's CRD scanning starts the watch once it is installed."""
    reconcile_after: float = RECONCILE_AFTER
    seen: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    """Key -> the newest version this feed handed the store, and the object's identity
    (name, namespace, UID) to delete it by."""
    synced: bool = False
    api: AsyncApi | None = field(default=None, repr=False)
    _pending: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    _running: asyncio.Task[int] | None = field(default=None, init=False, repr=False)
    _failures: int = field(default=0, init=False, repr=False)
    """Reconcile LISTs failed in a row (each waits twice as long as the one before)."""

    # --- kopf's events -------------------------------------------------------------------

    def take(self, event: Mapping[str, Any]) -> None:
        """One event of kopf's watch (``type`` ADDED / MODIFIED / DELETED, or None: listed)."""
        kind, raw = event.get("type"), event.get("object") or {}
        meta = raw.get("metadata") or {}
        if kind == "DELETED":
            self.seen.pop(_key(meta), None)
            self.delete(raw)
            return
        if kind is None and self.synced:
            self._schedule_reconcile()
        self._upsert(raw)

    def _upsert(self, raw: Raw) -> None:
        meta = raw.get("metadata") or {}
        key, version = _key(meta), _version(meta)
        known = self.seen.get(key)
        if known is not None and known[0] >= version and known[1].get("uid") == meta.get("uid"):
            return  # kopf's list of what the anchor read already, or an older event
        self.seen[key] = (version, _identity(meta))
        self.upsert(raw)

    # --- anchor and reconcile ------------------------------------------------------------

    async def anchor(self, api: AsyncApi) -> None:
        """LIST the kind into the store (retrying until the API server answers)."""
        self.api = api
        items: list[dict[str, Any]]
        while True:
            try:
                items, _ = await api.list(self.path)
                break
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if self.optional and not_installed(err):
                    items = []
                    break
                self._failed(err)
                log.warning("listing %s failed (%s); retrying", self.name, err)
                await asyncio.sleep(ANCHOR_RETRY)
        self.seen = {
            _key(item["metadata"]): (_version(item["metadata"]), _identity(item["metadata"]))
            for item in items
        }
        self.replace(items)
        self.synced = True

    def start_reconcile(self) -> None:
        """Reconcile once, soon: kopf's first list may have missed a deletion made after the
        anchor, and a kind kopf lists empty sends no event that would start a reconcile."""
        self._schedule_reconcile()

    def _schedule_reconcile(self, delay: float | None = None) -> None:
        if self._pending is not None:
            self._pending.cancel()
        loop = asyncio.get_running_loop()
        later = self.reconcile_after if delay is None else delay
        self._pending = loop.call_later(later, self._launch)

    def _launch(self) -> None:
        self._pending = None
        if self._running is not None and not self._running.done():
            self._schedule_reconcile()  # one at a time: try again after this one
            return
        if self.api is not None:
            self._running = asyncio.create_task(
                self.reconcile(self.api), name=f"reconcile-{self.name}"
            )

    async def reconcile(self, api: AsyncApi) -> int:
        """LIST the kind; delete from the store what the list lacks and the store saw at a
        version no newer than the list's; the number deleted."""
        try:
            items, list_version = await api.list(self.path)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if not (self.optional and not_installed(err)):
                self._failed(err)
                self._failures += 1
                delay = min(self.reconcile_after * 2**self._failures, MAX_RECONCILE_BACKOFF)
                log.warning(
                    "listing %s to reconcile failed (%s); retrying in %.0f s", self.name, err, delay
                )
                self._schedule_reconcile(delay)
                return 0
            items, list_version = [], ""
        self._failures = 0
        gone = vanished(self.seen, {_key(item["metadata"]) for item in items}, list_version)
        for key in gone:
            _, identity = self.seen.pop(key)
            self.delete({"metadata": identity})
        for item in items:
            # Only newer copies of what the store holds: a key it lacks was deleted while the
            # list was in flight (kopf delivers a new object itself), one with another UID was
            # deleted and created again since.
            meta = item["metadata"]
            known = self.seen.get(_key(meta))
            if known is not None and known[1].get("uid") == meta.get("uid"):
                self._upsert(item)
        if gone:
            log.info("%s: %d deleted while the watch was down, removed", self.name, len(gone))
        return len(gone)

    def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        if self._running is not None:
            self._running.cancel()

    def _failed(self, err: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(self.name, err)


def not_installed(err: BaseException) -> bool:
    """Whether ``err`` says the kind is not served (its CRD is not installed)."""
    return isinstance(err, ApiError) and err.status == 404


def vanished(
    seen: Mapping[str, tuple[int, Any]], listed: Collection[str], list_version: str
) -> list[str]:
    """Keys the store holds that a LIST at ``list_version`` lacks because they were deleted:
    not those the store saw at a newer version (created after the list was taken). A list
    without a version (a kind not installed) lacks everything it does not hold."""
    newest = whole_number(list_version)
    return [
        key
        for key, (version, _) in seen.items()
        if key not in listed and (newest is None or version <= newest)
    ]


def _identity(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
