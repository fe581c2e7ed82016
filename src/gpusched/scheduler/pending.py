"""Pods waiting for gpusched, as the API server says: which UIDs the extender may bind.

The extender binds with its own ServiceAccount's ``pods/binding`` permission, so it must bind
only pods that asked for gpusched (``spec.schedulerName``). A bind request names a pod by
namespace, name and UID; whether that pod is gpusched's is read here, from a watch of unbound
pods with ``spec.schedulerName=gpusched``, never from what a caller sent (``schedulerName`` is
immutable, so a UID seen here stays gpusched's). A UID the watch has not delivered yet is checked
with one GET by the binder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpusched.api import keys

#: Field selector of the watch: unbound pods for gpusched.
FIELD_SELECTOR = f"spec.schedulerName={keys.SCHEDULER_NAME},spec.nodeName="


class PendingPods:
    """UIDs of unbound gpusched pods (fed by a reflector task on the event loop that reads it)."""

    def __init__(self) -> None:
        self._uids: set[str] = set()

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        uids = {str((item.get("metadata") or {}).get("uid") or "") for item in items}
        uids.discard("")
        self._uids = uids

    def upsert(self, item: Mapping[str, Any]) -> None:
        uid = (item.get("metadata") or {}).get("uid")
        if uid:
            self._uids.add(str(uid))

    def delete(self, item: Mapping[str, Any]) -> None:
        """Deleted, or bound (it left the watch's selector)."""
        uid = (item.get("metadata") or {}).get("uid")
        if uid:
            self._uids.discard(str(uid))

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)
