"""Background wait on NVML events (XIDs, double-bit ECC), as the NVIDIA device plugin does it.

One thread blocks in ``nvmlEventSetWait`` with a short timeout and hands every event to a
callback, which wakes the probe so the health change is published within seconds instead of at
the next poll. A wait that fails for another reason than the timeout (the GPU fell off the bus,
the driver went away) is reported as an ``error`` event, which also wakes the probe: the next
cycle's per-GPU reads find out which GPU is affected, rather than every GPU being condemned.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gpusched.device_probe.nvml_backend import EVENT_DOUBLE_BIT_ECC, EVENT_MASK, EVENT_XID

log = logging.getLogger(__name__)

_TIMEOUT: Final = 10
_NOT_SUPPORTED: Final = 3
#: Pause after a failed wait, so a persistent failure does not spin.
ERROR_BACKOFF_SECONDS: Final = 1.0


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One event for the probe: an XID, a double-bit ECC error, or a failed wait."""

    kind: Literal["xid", "ecc", "error"]
    uuid: str | None = None
    xid: int | None = None
    detail: str = ""
    index: int | None = None
    """Index of the GPU whose handle the event carries, among those the watcher registered
    (the GPU is known even when its UUID cannot be read, as after a GSP timeout)."""


def handle_key(handle: Any) -> Hashable:
    """A device handle as a dictionary key. pynvml's handles are ctypes pointers and the one an
    event carries is a new object for the same device, so they are compared by address; other
    handles (the fake NVML's) compare by value."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except ctypes.ArgumentError:
        key: Hashable = handle
        return key


class EventWatcher:
    """Registers the GPUs for events and runs the wait loop on a daemon thread."""

    def __init__(
        self,
        nvml: Any,
        on_event: Callable[[GpuEvent], None],
        *,
        timeout_ms: int = 1000,
    ) -> None:
        self.nvml = nvml
        self.on_event = on_event
        self.timeout_ms = timeout_ms
        self.unmonitored: list[int] = []
        self._indices: dict[Hashable, int] = {}
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handles: Sequence[tuple[int, Any]]) -> None:
        """Register ``(index, handle)`` pairs and start waiting; GPUs that cannot be
        registered are listed in :attr:`unmonitored` (their health is still polled)."""
        nvml = self.nvml
        self._event_set = nvml.nvmlEventSetCreate()
        for index, handle in handles:
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                mask = EVENT_MASK & supported
                if not mask:
                    self.unmonitored.append(index)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
                self._indices[handle_key(handle)] = index
            except nvml.NVMLError as err:
                self.unmonitored.append(index)
                level = (
                    logging.INFO
                    if getattr(err, "value", None) == _NOT_SUPPORTED
                    else logging.WARNING
                )
                log.log(
                    level, "GPU %d: no event monitoring (%s); health is polled only", index, err
                )
        self._thread = threading.Thread(target=self._loop, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_ms / 1000.0 + ERROR_BACKOFF_SECONDS + 5)
        if self._event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._event_set)
            except self.nvml.NVMLError as err:
                log.debug("nvmlEventSetFree: %s", err)
            self._event_set = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._wait_once()
            except Exception as err:  # keep listening whatever one event did
                log.exception("event loop")
                self.on_event(GpuEvent("error", detail=f"event loop: {err}"))
                self._stop.wait(ERROR_BACKOFF_SECONDS)

    def _wait_once(self) -> None:
        """Wait for one event (or the timeout) and hand it on."""
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(self._event_set, self.timeout_ms)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == _TIMEOUT or self._stop.is_set():
                return
            self.on_event(GpuEvent("error", detail=f"nvmlEventSetWait: {err}"))
            self._stop.wait(ERROR_BACKOFF_SECONDS)
            return
        try:
            uuid: str | None = nvml.nvmlDeviceGetUUID(data.device)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
        except nvml.NVMLError:
            uuid = None  # the GPU stopped answering: its handle still says which it is
        index = self._indices.get(handle_key(data.device))
        event_type = int(data.eventType)
        if event_type & EVENT_XID:
            self.on_event(GpuEvent("xid", uuid=uuid, xid=int(data.eventData), index=index))
        elif event_type & EVENT_DOUBLE_BIT_ECC:
            self.on_event(GpuEvent("ecc", uuid=uuid, detail="double-bit ECC error", index=index))
