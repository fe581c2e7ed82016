"""kopf's events into the store: order, identity and what a new list no longer holds."""

from __future__ import annotations

from typing import Any

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
