"""What the node agent knows of the cluster: the pods bound to its node and its GPUs as the
device probe published them, each kept current by a list-then-watch in a thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpusched.api.nodegputopology import NodeGpuTopology
from gpusched.core.nodeagent import GpuEntry, PodGpus, node_gpus, pod_gpus

log = logging.getLogger(__name__)


def pod_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an API object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


class PodCache:
    """The pods bound to one node (a watch with ``spec.nodeName=<node>``), parsed once."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._pods: dict[str, PodGpus] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def replace(self, items: list[dict[str, Any]]) -> None:
        parsed = {pod_key(item): pod_gpus(item, self.resource) for item in items}
        with self._lock:
            self._pods = parsed
        self.synced.set()

    def upsert(self, item: dict[str, Any]) -> None:
        parsed = pod_gpus(item, self.resource)
        with self._lock:
            self._pods[parsed.key] = parsed

    def delete(self, item: dict[str, Any]) -> None:
        key = pod_key(item)
        uid = (item.get("metadata") or {}).get("uid")
        with self._lock:
            known = self._pods.get(key)
            if known is not None and (not uid or known.uid == uid):
                del self._pods[key]

    def snapshot(self) -> dict[str, PodGpus]:
        """The pods as of now, by ``namespace/name``."""
        with self._lock:
            return dict(self._pods)


class DeviceSource:
    """The node's GPUs from its NodeGpuTopology; wakes ListAndWatch streams on every change."""

    def __init__(self, node: str, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.gpus: tuple[GpuEntry, ...] = ()
        self.version = 0
        self.synced = threading.Event()
        self._loop = loop
        self._changed = asyncio.Event()

    # --- watch consumer (runs in the watch thread) ---------------------------------------

    def replace(self, items: list[dict[str, Any]]) -> None:
        ours = [i for i in items if (i.get("metadata") or {}).get("name") == self.node]
        self._offer(self._parse(ours[0]) if ours else ())
        self.synced.set()

    def upsert(self, item: dict[str, Any]) -> None:
        if (item.get("metadata") or {}).get("name") == self.node:
            self._offer(self._parse(item))

    def delete(self, item: dict[str, Any]) -> None:
        if (item.get("metadata") or {}).get("name") == self.node:
            self._offer(())

    def _parse(self, obj: dict[str, Any]) -> tuple[GpuEntry, ...] | None:
        try:
            published = NodeGpuTopology.model_validate(obj)
        except ValidationError as err:
            log.warning("ignoring an unreadable NodeGpuTopology %s: %s", self.node, err)
            return None
        return tuple(node_gpus(published.spec, published.status))

    def _offer(self, gpus: tuple[GpuEntry, ...] | None) -> None:
        if gpus is not None and gpus != self.gpus:
            self._loop.call_soon_threadsafe(self._publish, gpus)

    # --- event loop side -----------------------------------------------------------------

    def _publish(self, gpus: tuple[GpuEntry, ...]) -> None:
        if gpus == self.gpus:
            return
        self.gpus = gpus
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, seen: int) -> None:
        """Return once the device list differs from version ``seen``."""
        while self.version == seen:
            await self._changed.wait()
