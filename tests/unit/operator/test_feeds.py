"""kopf's events into the store: order, identity and what a new list no longer holds."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.operator.feeds import KindFeed, vanished
from gpusched.operator.store import Store
from tests.cases.manifests import tenantquota


def _quota(name: str, version: int, uid: str = "") -> dict[str, Any]:
    raw = tenantquota(name, namespaces=[name])
    raw["metadata"].update(resourceVersion=str(version), uid=uid or f"uid-{name}")
    return raw


def _feed(store: Store) -> KindFeed:
    return KindFeed(
        "tenantquotas", "/unused", store.replace_quotas, store.upsert_quota, store.delete_quota
    )


def test_an_older_event_does_not_replace_a_newer_object() -> None:
    store = Store()
    feed = _feed(store)
    feed.take({"type": "MODIFIED", "object": _quota("a", 20) | {"spec": {"namespaces": ["new"]}}})
    feed.take({"type": None, "object": _quota("a", 10)})
    assert store.quotas["a"].spec.namespaces == ["new"]


def test_an_object_recreated_under_its_name_replaces_the_old_one_whatever_its_version() -> None:
    store = Store()
    feed = _feed(store)
    feed.take({"type": "ADDED", "object": _quota("a", 20)})
    recreated = _quota("a", 5, uid="other") | {"spec": {"namespaces": ["again"]}}
    feed.take({"type": "ADDED", "object": recreated})
    assert store.quotas["a"].spec.namespaces == ["again"]


def test_a_deleted_event_removes_the_object() -> None:
    store = Store()
    feed = _feed(store)
    feed.take({"type": "ADDED", "object": _quota("a", 20)})
    feed.take({"type": "DELETED", "object": _quota("a", 21)})
    assert "a" not in store.quotas
    assert "a" not in feed.seen


def test_a_list_lacks_deleted_objects_not_those_created_after_it() -> None:
    seen = {"kept": (5, {}), "deleted": (7, {}), "created-later": (12, {})}
    assert vanished(seen, {"kept"}, "10") == ["deleted"]


def test_a_list_without_a_version_lacks_everything_it_does_not_hold() -> None:
    seen = {"a": (5, {}), "b": (70, {})}
    assert vanished(seen, {"a"}, "") == ["b"]


class _ListWhile:
    """The API server's answer to the reconcile LIST, taken as of ``version``, while kopf's
    watch delivers ``meanwhile`` before the answer arrives."""

    def __init__(
        self, feed: KindFeed, items: list[dict[str, Any]], version: str, meanwhile: list[Any]
    ) -> None:
        self.feed, self.items, self.version, self.meanwhile = feed, items, version, meanwhile

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        for event in self.meanwhile:
            self.feed.take(event)
        return self.items, self.version


def test_an_object_deleted_or_recreated_while_the_reconcile_list_is_in_flight_stays_so() -> None:
    store = Store()
    feed = _feed(store)
    for name in ("kept", "deleted", "recreated"):
        feed.take({"type": "ADDED", "object": _quota(name, 10)})
    listed = [_quota("kept", 15), _quota("deleted", 10), _quota("recreated", 10)]
    again = _quota("recreated", 30, uid="new") | {"spec": {"namespaces": ["again"]}}
    meanwhile = [
        {"type": "DELETED", "object": _quota("deleted", 25)},
        {"type": "DELETED", "object": _quota("recreated", 26)},
        {"type": "ADDED", "object": again},
    ]
    api = _ListWhile(feed, listed, "20", meanwhile)
    asyncio.run(feed.reconcile(cast(AsyncApi, api)))
    assert sorted(store.quotas) == ["kept", "recreated"]
    assert store.quotas["recreated"].metadata.uid == "new"
    assert store.quotas["recreated"].spec.namespaces == ["again"]
    assert feed.seen["kept"][0] == 15  # a newer copy of what the store holds is taken


class _Refusing:
    """An API server that refuses every LIST (429 under API Priority and Fairness)."""

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        raise ApiError(429, "TooManyRequests", "slow down")


def test_a_reconcile_list_that_keeps_failing_is_retried_ever_later() -> None:
    async def delays() -> list[float]:
        feed = _feed(Store())
        feed.reconcile_after = 1.0
        loop = asyncio.get_running_loop()
        waits = []
        for _ in range(8):
            await feed.reconcile(cast(AsyncApi, _Refusing()))
            assert feed._pending is not None
            waits.append(round(feed._pending.when() - loop.time()))
        feed.stop()
        return waits

    assert asyncio.run(delays()) == [2, 4, 8, 16, 32, 60, 60, 60]
