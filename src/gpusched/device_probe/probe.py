"""The probe loop: read NVML, judge health, publish what changed.

Each cycle reads the GPUs' health (and their inventory when something suggests it changed: the
first cycle, a periodic resync, a lost GPU, a different GPU count), turns readings into health
records with :func:`gpusched.core.health.classify`, derives labels and the NodeGpuTopology, and
writes only what differs from what the cluster already shows. XID events wake the loop at once.

Writes are avoided by remembering what was last applied and, on the first cycle and every
resync, by reading the server's copy: a restarted probe continues from the published status (the
same ``since`` times, a fatal XID of the current boot) and therefore republishes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError

from gpusched import __version__
from gpusched.api import keys
from gpusched.api.meta import Condition
from gpusched.api.nodegputopology import GpuHealthState, NodeGpuTopology, NodeGpuTopologyStatus
from gpusched.core import NodeTopology
from gpusched.core.health import (
    GpuHealthRecord,
    GpuObservation,
    HealthPolicy,
    classify,
    restore,
)
from gpusched.core.labels import GFD_KEYS, gfd_managed_keys, node_labels
from gpusched.device_probe.events import EventWatcher, GpuEvent
from gpusched.device_probe.nvml_backend import (
    NodeReading,
    NvmlBackend,
    NvmlUnavailableError,
)
from gpusched.device_probe.publisher import NodeMissingError, NodeView, Publisher
from gpusched.device_probe.state import (
    build_status,
    label_ownership,
    labels_in_place,
    merge_unreadable,
    nvml_condition,
    publishable,
    significant_status,
    taints_with,
    telemetry,
    with_health,
)
from gpusched.kubeasync import ApiError
from gpusched.metrics import ProbeMetrics, set_labelled_series

log = logging.getLogger(__name__)

CycleOutcome = Literal["ok", "nvml-unavailable", "api-error", "node-missing", "error"]
_API_ERRORS = (ApiError, aiohttp.ClientError, OSError, TimeoutError)


def boot_time(proc_stat: Path = Path("/proc/stat")) -> datetime | None:
    """When the kernel booted (``btime`` in /proc/stat; containers share the host's kernel)."""
    try:
        for line in proc_stat.read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), tz=UTC)
    except (OSError, ValueError):
        return None
    return None


def utcnow() -> datetime:
    """Current time, timezone-aware, whole seconds (what the API stores)."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class ProbeConfig:
    """How one probe behaves; every field is a ``gpusched probe`` flag."""

    node_name: str
    interval: float = 10.0
    """Seconds between health readings (events wake the probe sooner)."""
    resync: float = 300.0
    """Seconds between full re-reads of inventory and of the server's copy."""
    telemetry_refresh: float = 600.0
    """Least seconds between status writes made only because temperature or power moved."""
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    taint_unhealthy: bool = False
    """Taint the node ``gpusched.io/no-healthy-gpu:NoSchedule`` when it has GPUs but none is
    Healthy or Degraded."""
    gfd_labels: Literal["auto", "never"] = "auto"
    """``auto``: write ``nvidia.com/`` labels only where GFD does not; ``never``: never."""
    event_timeout_ms: int = 1000


@dataclass
class CycleResult:
    """What one cycle saw and did."""

    outcome: CycleOutcome
    writes: int
    topology: NodeTopology
    labels: dict[str, str]
    status: NodeGpuTopologyStatus
    seconds: float = 0.0


@dataclass
class _Applied:
    """What the probe last wrote (or found already in place)."""

    labels: dict[str, str] | None = None
    spec: dict[str, Any] | None = None
    owner_uid: str | None = None
    status: dict[str, Any] | None = None
    telemetry: list[tuple[Any, Any]] = field(default_factory=list)
    telemetry_at: float = float("-inf")
    taint: bool | None = None


class Probe:
    """One node's probe: NVML backend in, Kubernetes objects out."""

    def __init__(
        self,
        backend: NvmlBackend,
        config: ProbeConfig,
        publisher: Publisher | None = None,
        metrics: ProbeMetrics | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        boot: datetime | None = None,
        watch_events: bool = True,
    ) -> None:
        self.backend = backend
        self.config = config
        self.publisher = publisher
        self.metrics = metrics if metrics is not None else ProbeMetrics()
        self.clock = clock
        self.boot = boot
        self.watch_events = watch_events
        self.records: dict[int, GpuHealthRecord] = {}
        self.reading: NodeReading | None = None
        self.known: NodeTopology | None = None
        self.node_view: NodeView | None = None
        self.applied = _Applied()
        self.conditions: list[Condition] = []
        self.last: CycleResult | None = None
        self._pending: list[GpuEvent] = []
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._need_inventory = True
        self._synced = False
        self._last_resync = float("-inf")
        self._watcher: EventWatcher | None = None
        self._watched: tuple[tuple[int, str | None], ...] = ()
        self._unpublishable: list[str] = []

    # --- events ------------------------------------------------------------------------------

    def on_event(self, event: GpuEvent) -> None:
        """Called from the event thread: queue the event and wake the loop."""
        with self._pending_lock:
            self._pending.append(event)
        self._wake.set()

    @property
    def pending_events(self) -> int:
        """Events received and not yet judged."""
        with self._pending_lock:
            return len(self._pending)

    def request_inventory(self) -> None:
        """Re-read identities and wiring at the next cycle (not only health)."""
        self._need_inventory = True

    def _drain(self) -> list[GpuEvent]:
        with self._pending_lock:
            events, self._pending = self._pending, []
        return events

    def _update_watcher(self, reading: NodeReading) -> None:
        if not self.watch_events:
            return
        watched = tuple((g.index, g.uuid) for g in reading.gpus if g.readable)
        if watched == self._watched and self._watcher is not None:
            return
        self._stop_watcher()
        self._watched = watched
        if not watched:
            return
        nvml = self.backend.nvml
        watcher = EventWatcher(nvml, self.on_event, timeout_ms=self.config.event_timeout_ms)
        try:
            watcher.start([(g.index, g.handle) for g in reading.gpus if g.readable])
        except nvml.NVMLError as err:
            # No event set now (the driver short of resources, say): health is still polled,
            # and the watcher is started again at the next cycle, not at the next resync.
            log.warning("XID events not watched (%s); trying again next cycle", err)
            watcher.stop()
            self._watched = ()
            return
        self._watcher = watcher

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
            self._watched = ()

    # --- server state ------------------------------------------------------------------------

    def _sync_from_server(self) -> dict[str, Any] | Literal[False] | None:
        """Read the Node and the published object. Returns the object (None if absent), or
        False when the Node does not exist. On the first sync, seeds the health records and the
        last known wiring from what an earlier probe published, where this probe has not seen
        them itself (it may have run for a while with the API server out of reach)."""
        assert self.publisher is not None
        view = self.publisher.read_node()
        self.node_view = view
        if view is None:
            return False
        obj = self.publisher.read_topology()
        if not self._synced and obj is not None:
            try:
                published = NodeGpuTopology.model_validate(obj)
            except ValidationError as err:
                log.warning("ignoring the published NodeGpuTopology: %s", err)
            else:
                if self.known is None:
                    self.known = NodeTopology.from_api(published.spec, published.status)
                if not self.conditions:
                    self.conditions = list(published.status.conditions)
                for entry in published.status.gpus:
                    record = restore(entry, self.boot, self.config.policy)
                    if record is not None:
                        self.records[entry.index] = _seeded(self.records.get(entry.index), record)
        self._synced = True
        return obj

    # --- the cycle ---------------------------------------------------------------------------

    def cycle(self) -> CycleResult:
        """Read, judge and publish once. Never raises for NVML or API trouble."""
        started = time.perf_counter()
        now = self.clock()
        writes_before = self._writes()
        server: dict[str, Any] | Literal[False] | None = None
        resync = self.publisher is not None and (
            not self._synced or time.monotonic() - self._last_resync >= self.config.resync
        )
        outcome: CycleOutcome = "ok"
        if resync:
            try:
                server = self._sync_from_server()
                self._last_resync = time.monotonic()
            except _API_ERRORS as err:
                log.warning("reading node %s from the API server: %s", self.config.node_name, err)
                resync = False
                outcome = "api-error"
        events = self._drain()
        topology, ready, message = self._observe(now, events, inventory=resync)
        condition = nvml_condition(ready, message, now, self.conditions)
        records = [self.records[g.index] for g in topology.gpus if g.index in self.records]
        status = build_status(records, condition, now, __version__)
        view = self.node_view
        labels = self._labels(topology, view)
        if not ready:
            outcome = "nvml-unavailable"
        if server is False:
            outcome = "node-missing"
        elif self.publisher is not None and outcome != "api-error":
            try:
                self._publish(topology, status, server if resync else None, resync)
            except NodeMissingError as err:
                log.info("%s; not publishing until it exists", err)
                outcome = "node-missing"
                self._synced_force()
            except _API_ERRORS as err:
                log.warning("publishing for node %s: %s", self.config.node_name, err)
                outcome = "api-error"
                self._synced_force()
            labels = self._labels(topology, self.node_view)
        self.conditions = [condition]
        seconds = time.perf_counter() - started
        self.metrics.cycle_seconds.observe(seconds)
        self.metrics.cycles.labels(outcome).inc()
        if outcome in ("ok", "nvml-unavailable"):
            self.metrics.last_success.set_to_current_time()
        self._export(topology)
        self.last = CycleResult(
            outcome, self._writes() - writes_before, topology, labels, status, seconds
        )
        return self.last

    def _synced_force(self) -> None:
        """After a failed or refused write the server state is uncertain: re-read next cycle."""
        self._last_resync = float("-inf")

    def _writes(self) -> int:
        total = 0.0
        for metric in self.metrics.api_writes.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    total += sample.value
        return int(total)

    def _observe(
        self, now: datetime, events: list[GpuEvent], *, inventory: bool
    ) -> tuple[NodeTopology, bool, str]:
        """Read NVML and update the health records; returns the topology with health, whether
        NVML is usable, and the condition message."""
        backend = self.backend
        try:
            backend.init()
            count = backend.device_count()
            if (
                inventory
                or self._need_inventory
                or self.reading is None
                or count != len(self.reading.gpus)
                or any(e.kind == "error" for e in events)
            ):
                self.reading = backend.read_inventory(self.config.node_name, self.reading)
                self._need_inventory = False
                self._report_issues(self.reading.issues)
            self._update_watcher(self.reading)
            samples, issues = backend.read_health(self.reading.gpus)
            self._report_issues(issues)
        except NvmlUnavailableError as err:
            self.metrics.nvml_ready.set(0)
            self._stop_watcher()
            backend.shutdown()
            self.reading = None
            self._need_inventory = True
            return self._unavailable(now, str(err), events), False, str(err)
        self.metrics.nvml_ready.set(1)
        reading = self.reading
        if any(s.lost or s.reset_required for s in samples) or any(
            not g.readable or g.query_error is not None for g in reading.gpus
        ):
            # Re-read identities and links next cycle: a GPU's failed identity query may have
            # been a one-off, and until it is read again the GPU counts as unhealthy.
            self._need_inventory = True
        xids = self._xids_by_index(events, self._uuid_index(reading), [s.index for s in samples])
        errors = {g.index: g.query_error for g in reading.gpus}
        for sample in samples:
            self.records[sample.index] = classify(
                _observation(sample, xids.get(sample.index, ()), errors.get(sample.index)),
                self.records.get(sample.index),
                now,
                self.config.policy,
            )
        for stale in set(self.records) - {s.index for s in samples}:
            del self.records[stale]
        unreadable = {g.index for g in reading.gpus if not g.readable}
        topology = merge_unreadable(reading.topology, unreadable, self.known)
        topology = with_health(topology, self.records)
        for index in unreadable:  # a merged GPU carries its UUID: keep it in the record
            gpu = topology.gpu(index)
            if self.records[index].uuid is None and gpu.uuid is not None:
                self.records[index] = replace(self.records[index], uuid=gpu.uuid)
        self.known = topology
        return topology, True, "NVML initialised"

    def _unavailable(self, now: datetime, message: str, events: list[GpuEvent]) -> NodeTopology:
        """Without NVML, the GPUs known from before are reported unhealthy (none if unknown).

        XIDs received before NVML went away are still judged, by the GPUs' known UUIDs: a fatal
        one is remembered now and named once NVML answers again, not lost with this cycle."""
        known = self.known or NodeTopology(node_name=self.config.node_name, gpus=())
        xids = self._xids_by_index(events, self._uuid_index(None), [g.index for g in known.gpus])
        for gpu in known.gpus:
            self.records[gpu.index] = classify(
                GpuObservation(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    nvml_unavailable=message,
                    xids=xids.get(gpu.index, ()),
                ),
                self.records.get(gpu.index),
                now,
                self.config.policy,
            )
        topology = with_health(known, self.records)
        self.known = topology
        return topology

    def _uuid_index(self, reading: NodeReading | None) -> dict[str, int]:
        """GPU index by UUID, from this cycle's reading (when there is one) and the GPUs known
        from earlier readings."""
        known = self.known.gpus if self.known is not None else ()
        by_uuid = {g.uuid: g.index for g in known if g.uuid}
        if reading is not None:
            by_uuid.update({g.uuid: g.index for g in reading.gpus if g.uuid})
        return by_uuid

    def _xids_by_index(
        self, events: list[GpuEvent], by_uuid: dict[str, int], gpus: list[int]
    ) -> dict[int, tuple[int, ...]]:
        """The XIDs of ``events`` per GPU index. An XID whose GPU cannot be identified (neither
        its UUID nor its handle is known) is kept for every GPU of the node, as the NVIDIA
        device plugin does: a fatal fault must not be dropped for want of a name."""
        xids: dict[int, list[int]] = {}
        for event in events:
            if event.kind == "ecc":
                log.info("double-bit ECC event on GPU %s", event.uuid)
            if event.kind == "error":
                log.warning("event wait failed: %s", event.detail)
            if event.kind != "xid" or event.xid is None:
                continue
            index = by_uuid.get(event.uuid) if event.uuid else None
            if index is None:
                index = event.index
            action = "unhealthy" if self.config.policy.xid_is_fatal(event.xid) else "ignored"
            gpu_label = str(index) if index is not None else "unknown"
            self.metrics.xid_events.labels(gpu_label, str(event.xid), action).inc()
            log.log(
                logging.WARNING if action == "unhealthy" else logging.INFO,
                "XID %d on GPU %s (%s): %s",
                event.xid,
                gpu_label if index is not None else "unknown, applied to every GPU",
                event.uuid,
                action,
            )
            for target in gpus if index is None else [index]:
                xids.setdefault(target, []).append(event.xid)
        return {index: tuple(values) for index, values in xids.items()}

    def _report_issues(self, issues: list[str]) -> None:
        for issue in issues:
            self.metrics.nvml_errors.inc()
            log.warning("NVML: %s", issue)

    def _labels(self, topology: NodeTopology, view: NodeView | None) -> dict[str, str]:
        if self.config.gfd_labels == "never":
            leave_alone: frozenset[str] = GFD_KEYS
        elif view is None:
            leave_alone = frozenset()
        else:
            ownership = label_ownership(view.managed_fields, self._manager())
            leave_alone = gfd_managed_keys(view.labels, ownership.foreign)
        return node_labels(topology, mig_capable=self._mig_capable(), leave_alone=leave_alone)

    def _mig_capable(self) -> bool | None:
        return self.reading.mig_capable if self.reading is not None else None

    def _manager(self) -> str:
        return (
            self.publisher.field_manager if self.publisher is not None else keys.FIELD_MANAGER_PROBE
        )

    def _export(self, topology: NodeTopology) -> None:
        """The GPUs of this reading, and only them: a GPU index gone from the node loses its
        series, and a temperature or power this reading could not get is left out rather than
        kept from an older reading (a dashboard would show it as live)."""
        health: dict[tuple[str, ...], float] = {}
        temperature: dict[tuple[str, ...], float] = {}
        power: dict[tuple[str, ...], float] = {}
        for gpu in topology.gpus:
            gpu_label = str(gpu.index)
            for state in GpuHealthState:
                health[(gpu_label, state.value)] = 1 if gpu.health is state else 0
            record = self.records.get(gpu.index)
            if record is not None and record.temperature_c is not None:
                temperature[(gpu_label,)] = record.temperature_c
            if record is not None and record.power_w is not None:
                power[(gpu_label,)] = record.power_w
        set_labelled_series(self.metrics.gpu_health, health)
        set_labelled_series(self.metrics.gpu_temperature, temperature)
        set_labelled_series(self.metrics.gpu_power, power)

    # --- publishing --------------------------------------------------------------------------

    def _publish(
        self,
        topology: NodeTopology,
        status: NodeGpuTopologyStatus,
        server: dict[str, Any] | None,
        resync: bool,
    ) -> None:
        assert self.publisher is not None
        spec = self._spec(topology)
        status_body = status.to_k8s()
        wanted_taint = (  # judged on health only: MIG-split GPUs are busy, not broken
            self.config.taint_unhealthy and bool(topology.gpus) and status.healthy_gpus == 0
        )
        due = time.monotonic() - self.applied.telemetry_at >= self.config.telemetry_refresh
        if resync:
            self._adopt_server(server)
        view = self.node_view
        labels = self._labels(topology, view)
        need_spec = spec != self.applied.spec or (
            view is not None and view.uid != self.applied.owner_uid
        )
        need_status = significant_status(status_body) != self.applied.status or (
            due and telemetry(status_body) != self.applied.telemetry
        )
        need_labels = labels != self.applied.labels
        need_taint = self.config.taint_unhealthy and wanted_taint != self.applied.taint
        if resync and view is not None:
            ownership = label_ownership(view.managed_fields, self._manager())
            need_labels = not labels_in_place(labels, view.labels, ownership.ours)
            need_taint = taints_with(view.taints, wanted_taint) is not None
            if not need_labels:
                self.applied.labels = labels
            if not need_taint:
                self.applied.taint = wanted_taint
        if not (need_spec or need_status or need_labels or need_taint):
            return
        if not resync:  # something changed: look at the Node as it is now
            view = self.publisher.read_node()
            self.node_view = view
            if view is None:
                raise NodeMissingError(f"node {self.config.node_name} does not exist")
            labels = self._labels(topology, view)
            ownership = label_ownership(view.managed_fields, self._manager())
            need_labels = not labels_in_place(labels, view.labels, ownership.ours)
            need_spec = need_spec or view.uid != self.applied.owner_uid
        assert view is not None
        if need_spec:
            self.publisher.apply_topology(view, spec)
            self.applied.spec, self.applied.owner_uid = spec, view.uid
        if need_status:
            self.publisher.apply_status(status_body)
            self.applied.status = significant_status(status_body)
            self.applied.telemetry = telemetry(status_body)
            self.applied.telemetry_at = time.monotonic()
        if need_labels:
            self.publisher.apply_labels(view, labels)
        self.applied.labels = labels
        if need_taint and not self.publisher.update_taint(wanted_taint):
            self._synced_force()  # try again after re-reading the Node
            return
        self.applied.taint = wanted_taint

    def _spec(self, topology: NodeTopology) -> dict[str, Any]:
        """The spec body, without values the schema refuses (warned about when that changes)."""
        fitted, dropped = publishable(topology)
        if dropped != self._unpublishable:
            for what in dropped:
                log.warning("not publishing %s: the NodeGpuTopology schema refuses its value", what)
            self._unpublishable = dropped
        return fitted.to_api()[0].to_k8s()

    def _adopt_server(self, server: dict[str, Any] | None) -> None:
        """Take the server's copy as what is applied, so only real differences are written."""
        view = self.node_view
        if server is None:
            self.applied.spec = self.applied.status = self.applied.owner_uid = None
            self.applied.telemetry = []
            return
        self.applied.spec = server.get("spec")
        owners = server.get("metadata", {}).get("ownerReferences") or []
        self.applied.owner_uid = next(
            (o.get("uid") for o in owners if o.get("kind") == "Node"), None
        )
        if view is not None and self.applied.owner_uid != view.uid:
            self.applied.owner_uid = None
        published = server.get("status")
        self.applied.status = significant_status(published) if published else None
        self.applied.telemetry = telemetry(published)
        observed = (published or {}).get("observedAt")
        if observed:
            age = (
                self.clock() - datetime.fromisoformat(observed.replace("Z", "+00:00"))
            ).total_seconds()
            self.applied.telemetry_at = time.monotonic() - max(age, 0.0)

    # --- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Cycle every ``interval`` seconds (sooner on events) until :meth:`stop` is called."""
        while not self._stopping.is_set():
            # Cleared before the cycle: an event arriving during it wakes the next one at once.
            self._wake.clear()
            try:
                self.cycle()
            except Exception:  # a bug must not take the node's health reporting down
                log.exception("probe cycle failed")
                self.metrics.cycles.labels("error").inc()
            self._wake.wait(self.config.interval)
        self.close()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current cycle."""
        self._stopping.set()
        self._wake.set()

    def close(self) -> None:
        """Stop the event thread and release NVML."""
        self._stop_watcher()
        self.backend.shutdown()


def _seeded(live: GpuHealthRecord | None, restored: GpuHealthRecord) -> GpuHealthRecord:
    """A GPU's record once the published status has been read back: the restored one when the
    probe has none of its own; otherwise the live one, which is newer in every respect but one:
    a fatal XID of this boot it has not seen (reported before this probe started) is added, so
    it lasts until the reboot whatever order the probe and the API server came up in."""
    if live is None:
        return restored
    same_gpu = not (live.uuid and restored.uuid and live.uuid != restored.uuid)
    if live.fatal_xid is not None or restored.fatal_xid is None or not same_gpu:
        return live
    return replace(live, fatal_xid=restored.fatal_xid)


def _observation(
    sample: GpuObservation, xids: tuple[int, ...], error: str | None
) -> GpuObservation:
    """The backend's reading plus what the probe loop knows: XIDs since the last pass and an
    unexpected query error (moot for a lost GPU or one that needs a reset)."""
    lost = sample.lost or sample.reset_required
    return replace(sample, xids=xids, query_error=None if lost else error)
