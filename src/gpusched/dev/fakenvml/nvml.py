# ruff: noqa: N802, N815 - the fake keeps pynvml's function and field names
"""A stand-in for the ``pynvml`` module, answering from a node topology instead of a driver.

:class:`FakeNvml` implements the ``nvml*`` functions the probe calls with pynvml's signatures and
return shapes (real ``nvmlPciInfo_t`` / ``c_nvmlMemory_t`` structs, ctypes affinity arrays,
fabric-info structs filled through ``byref``) and fails the way NVML does, raising the real
``pynvml.NVMLError_*`` classes. Constants, error classes and struct types are pynvml's own. A
function it does not implement raises ``NVMLError_FunctionNotFound``, like an old driver lacking
the symbol, so the probe's fallbacks are exercised rather than hidden.

How it models hardware:

* NVSwitch boards: each switch-attached GPU has as many active links as its switch link count,
  every one reporting remote device type SWITCH and a switch's bus id, never the peer's.
* Bridged / meshed boards: each NV pair takes that many links on both GPUs, remote type GPU and
  the peer's bus id.
* PCIe: ``nvmlDeviceGetTopologyCommonAncestor`` answers the topology's stated level, or the
  planned tree's (:mod:`gpusched.dev.fakenvml.pcie_plan`), which also backs the fake sysfs.
* Health: idle defaults (no errors, no throttling, 34 C, 70 W, slowdown at 90 C), changed by
  :class:`~gpusched.dev.fakenvml.faults.Fault` objects via :meth:`FakeNvml.inject` or a fault
  file; XID and double-bit ECC faults are delivered through ``nvmlEventSetWait``.
* Data the topology does not state (memory of an unnamed model, driver version of a bare matrix)
  answers ``NotSupported``, which the probe must tolerate anyway.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import threading
import time
import uuid as uuidlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pynvml

from gpusched.api.nodegputopology import LinkType
from gpusched.core import Gpu, NodeTopology, generation_for
from gpusched.dev.fakenvml.faults import THROTTLE_BITS, Fault, FaultError, FaultFeed
from gpusched.dev.fakenvml.pcie_plan import FakeTopologyError, PciePlan, plan_pcie
from gpusched.device_probe.pcie import LEVEL_TO_NVML, mask_from_cpulist, nvml_bus_id

IDLE_TEMPERATURE_C: Final = 34
IDLE_POWER_W: Final = 70.0
SLOWDOWN_TEMPERATURE_C: Final = 90
#: Compute capabilities whose data-centre parts have MIG (A100/A30, H100/H200, B200).
_MIG_SMS: Final = frozenset({80, 90, 100})
_CONSUMER: Final = re.compile(r"GeForce|RTX|TITAN|Quadro", re.IGNORECASE)
_SUPPORTED_EVENTS: Final = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)


def fake_gpu_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking UUID for GPU ``index`` of simulated node ``node`` (the same
    scheme the local cluster's simulated nodes use, so both agree on a node's GPUs)."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def product_name(model: str | None) -> str:
    """What NVML would call a GPU of this model (``H100`` -> ``NVIDIA H100``); an unknown model
    reads ``NVIDIA Graphics Device``, as NVML names GPUs its driver does not recognise."""
    if not model:
        return "NVIDIA Graphics Device"
    if re.match(r"(NVIDIA|Tesla|Quadro)\b", model):
        return model
    return f"NVIDIA {model}"


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """Device handle of the fake (pynvml's are opaque pointers)."""

    index: int


@dataclass(slots=True)
class FakeEvent:
    """What ``nvmlEventSetWait`` returns; same fields as ``c_nvmlEventData_t``."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeEventSet:
    """A ``c_nvmlEventSet_t``: registrations and pending events."""

    registered: dict[int, int] = field(default_factory=dict)
    pending: deque[FakeEvent] = field(default_factory=deque)
    freed: bool = False


@dataclass
class GpuState:
    """Mutable health of one fake GPU."""

    lost: bool = False
    ecc_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    throttle: int = 0
    temperature_c: int = IDLE_TEMPERATURE_C
    power_w: float = IDLE_POWER_W


class FakeNvml:
    """The ``pynvml`` functions the probe uses, answered from ``topology``."""

    def __init__(
        self,
        topology: NodeTopology,
        plan: PciePlan | None = None,
        *,
        faults: FaultFeed | None = None,
        init_error: str | None = None,
        poll_interval: float = 0.05,
    ) -> None:
        self.topology = topology
        self.plan = plan if plan is not None else plan_pcie(topology)
        self.links = self._layout_links()
        self.state = {g.index: GpuState() for g in topology.gpus}
        self.calls: Counter[str] = Counter()
        self.faults = faults
        self.init_error = init_error
        self._refcount = 0
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._event_sets: list[FakeEventSet] = []
        self._failing: dict[str, tuple[int, int]] = {}
        """NVML function -> (calls still to fail, error code): :meth:`fail_next`."""
        self._poll_interval = poll_interval
        self._last_poll = 0.0

    # --- pynvml's non-function attributes ----------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and callable(getattr(pynvml, name, None)):

            def missing(*_args: Any, **_kwargs: Any) -> Any:
                raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        return getattr(pynvml, name)

    # --- fault injection ---------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Apply one fault now (see :mod:`gpusched.dev.fakenvml.faults`)."""
        with self._lock:
            if fault.nvml_init is not None:
                self.init_error = fault.error if fault.nvml_init == "fail" else None
                if self.init_error is not None:
                    self._error_code(self.init_error)  # validate the name now
                return
            assert fault.gpu is not None
            if fault.gpu not in self.state:
                raise FaultError(f"fault for GPU {fault.gpu}: the fake node has no such GPU")
            state = self.state[fault.gpu]
            if fault.xid is not None:
                self._emit(fault.gpu, pynvml.nvmlEventTypeXidCriticalError, fault.xid)
            if fault.ecc is not None:
                state.ecc_uncorrected += 1
                self._emit(fault.gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0)
            if fault.remapped_rows is not None:
                state.remap_pending = fault.remapped_rows == "pending"
                state.remap_failure = fault.remapped_rows == "failure"
            if fault.throttle is not None:
                state.throttle = THROTTLE_BITS[fault.throttle]
            if fault.lost is not None:
                state.lost = fault.lost
            if fault.temperature_c is not None:
                state.temperature_c = fault.temperature_c
            if fault.power_w is not None:
                state.power_w = fault.power_w
            self._changed.notify_all()

    @staticmethod
    def _error_code(name: str) -> int:
        cls = getattr(pynvml, f"NVMLError_{name}", None)
        codes = [code for code, c in pynvml.NVMLError._valClassMapping.items() if c is cls]
        if cls is None or not codes:
            raise FaultError(f"unknown NVML error {name!r} (a pynvml NVMLError_<name> suffix)")
        return int(codes[0])

    def _emit(self, index: int, event_type: int, data: int) -> None:
        for event_set in self._event_sets:
            if not event_set.freed and event_set.registered.get(index, 0) & event_type:
                event_set.pending.append(FakeEvent(FakeHandle(index), event_type, data))

    def _poll_faults(self, force: bool = False) -> None:
        if self.faults is None:
            return
        now = time.monotonic()
        if not force and now - self._last_poll < self._poll_interval:
            return
        self._last_poll = now
        for fault in self.faults.poll():
            self.inject(fault)

    # --- helpers -----------------------------------------------------------------------------

    def fail_next(self, name: str, times: int = 1, code: int = pynvml.NVML_ERROR_UNKNOWN) -> None:
        """Make the next ``times`` calls of the NVML function ``name`` fail with ``code`` (a
        driver's one-off error: out of resources, a timeout, an unknown error)."""
        self._failing[name] = (self._failing.get(name, (0, code))[0] + times, code)

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        self._poll_faults()
        if self._refcount == 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        left, code = self._failing.get(name, (0, 0))
        if left > 0:
            self._failing[name] = (left - 1, code)
            raise _error(code)

    def _gpu(self, name: str, handle: Any) -> Gpu:
        self._enter(name)
        if not isinstance(handle, FakeHandle) or handle.index not in self.state:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.state[handle.index].lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.topology.gpu(handle.index)

    def _sm(self, gpu: Gpu) -> int | None:
        if gpu.compute_capability:
            major, _, minor = gpu.compute_capability.partition(".")
            if major.isdigit() and minor.isdigit():
                return int(major) * 10 + int(minor)
        generation = generation_for(gpu.model, None)
        return generation.sm if generation.known else None

    def _consumer(self, gpu: Gpu) -> bool:
        return bool(gpu.model and _CONSUMER.search(gpu.model))

    def _layout_links(self) -> dict[int, list[tuple[int, str]]]:
        """Per GPU, its active links as (remote device type, remote bus id)."""
        topology, plan = self.topology, self.plan
        switched = {
            g.index: g.nvswitch_links
            or max(
                (
                    lk.nvlinks
                    for lk in topology.links
                    if g.index in (lk.a, lk.b) and lk.type is LinkType.NV
                ),
                default=0,
            )
            for g in topology.gpus
            if plan.nvswitch_bus_ids and (g.nvswitch_links or topology.nvswitch)
        }
        switched = {index: count for index, count in switched.items() if count > 0}
        links: dict[int, list[tuple[int, str]]] = {g.index: [] for g in topology.gpus}
        for index, count in switched.items():
            switches = plan.nvswitch_bus_ids
            links[index] += [
                (pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, switches[i % len(switches)])
                for i in range(count)
            ]
        for lk in topology.links:
            if lk.type is not LinkType.NV or (lk.a in switched and lk.b in switched):
                continue
            links[lk.a] += [
                (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, plan.gpu(lk.b).bus_id)
            ] * lk.nvlinks
            links[lk.b] += [
                (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, plan.gpu(lk.a).bus_id)
            ] * lk.nvlinks
        for index, active in links.items():
            if len(active) > pynvml.NVML_NVLINK_MAX_LINKS:
                raise FakeTopologyError(
                    f"GPU {index} would need {len(active)} NVLinks, more than NVML's "
                    f"{pynvml.NVML_NVLINK_MAX_LINKS}; mark the board as NVSwitch (nvswitch: true)"
                )
        return links

    # --- initialisation ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls["nvmlInit"] += 1
            self._poll_faults(force=True)
            if self.init_error is not None:
                raise _error(self._error_code(self.init_error))
            self._refcount += 1

    def nvmlInitWithFlags(self, _flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.calls["nvmlShutdown"] += 1
            if self._refcount == 0:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._refcount -= 1

    # --- system ------------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetDriverVersion")
            if not self.topology.driver_version:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self.topology.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._lock:
            self._enter("nvmlSystemGetCudaDriverVersion")
            match = re.fullmatch(r"(\d+)\.(\d+)", self.topology.cuda_driver_version or "")
            if match is None:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return int(match.group(1)) * 1000 + int(match.group(2)) * 10

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self.topology.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByIndex")
            if index not in self.state:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if self.state[index].lost:
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
            return FakeHandle(index)

    # --- identity ----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetUUID", handle)
            return gpu.uuid or fake_gpu_uuid(self.topology.node_name, gpu.index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        with self._lock:
            return product_name(self._gpu("nvmlDeviceGetName", handle).model)

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
            mib = gpu.memory_mib
            if mib is None and gpu.model:
                match = re.search(r"(\d+)\s*GB", gpu.model, re.IGNORECASE)
                mib = int(match.group(1)) * 1024 if match else None
            if mib is None:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            memory = pynvml.c_nvmlMemory_t()
            memory.total = mib * 1024 * 1024
            memory.free = memory.total
            memory.used = 0
            return memory

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
            return self._pci_info(self.plan.gpu(gpu.index).bus_id)

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    @staticmethod
    def _pci_info(bus_id: str) -> Any:
        info = pynvml.nvmlPciInfo_t()
        nvml_id = nvml_bus_id(bus_id).encode()
        info.busId = nvml_id
        info.busIdLegacy = nvml_id
        domain, bus, rest = bus_id.split(":")
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        with self._lock:
            sm = self._sm(self._gpu("nvmlDeviceGetCudaComputeCapability", handle))
            if sm is None:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return sm // 10, sm % 10

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMigMode", handle)
            if gpu.mig_enabled:
                return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
            if self._sm(gpu) in _MIG_SMS and not self._consumer(gpu):
                return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # --- affinity ----------------------------------------------------------------------------

    def nvmlDeviceGetCpuAffinity(self, handle: FakeHandle, cpu_set_size: int) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetCpuAffinity", handle)
            if not gpu.cpu_affinity:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            words = mask_from_cpulist(gpu.cpu_affinity, cpu_set_size)
            return (ctypes.c_ulonglong * cpu_set_size)(*words)

    def nvmlDeviceGetMemoryAffinity(
        self, handle: FakeHandle, node_set_size: int, _scope: int
    ) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
            if gpu.numa_node is None:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            words = mask_from_cpulist(str(gpu.numa_node), node_set_size)
            return (ctypes.c_ulonglong * node_set_size)(*words)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:
        with self._lock:
            self._gpu("nvmlDeviceGetNumaNodeId", handle)
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # x86: GPUs are not NUMA nodes

    # --- wiring ------------------------------------------------------------------------------

    def _link(self, name: str, handle: FakeHandle, link: int) -> tuple[int, str]:
        gpu = self._gpu(name, handle)
        active = self.links[gpu.index]
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not active:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU without NVLink
        if link >= len(active):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # beyond the GPU's links
        return active[link]

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        with self._lock:
            self._link("nvmlDeviceGetNvLinkState", handle, link)
            return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeHandle, link: int) -> int:
        with self._lock:
            return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> Any:
        with self._lock:
            return self._pci_info(self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)[1])

    nvmlDeviceGetNvLinkRemotePciInfo_v2 = nvmlDeviceGetNvLinkRemotePciInfo

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeHandle, second: FakeHandle) -> int:
        with self._lock:
            a = self._gpu("nvmlDeviceGetTopologyCommonAncestor", first)
            b = self._gpu("nvmlDeviceGetTopologyCommonAncestor", second)
            if a.index == b.index:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return LEVEL_TO_NVML[self.plan.gpu_level(a.index, b.index)]

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, info_ref: Any) -> int:
        with self._lock:
            self._gpu("nvmlDeviceGetGpuFabricInfoV", handle)
            clique = self.topology.clique
            match = re.fullmatch(r"([0-9a-fA-F-]{36})\.(\d+)", clique or "")
            if match is None:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            info = info_ref._obj  # the struct passed with ctypes.byref
            raw = uuidlib.UUID(match.group(1)).bytes
            for i, byte in enumerate(raw):
                info.clusterUuid[i] = byte
            info.cliqueId = int(match.group(2))
            info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            info.status = pynvml.NVML_SUCCESS
            return int(pynvml.NVML_SUCCESS)

    # --- health ------------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, error_type: int, counter_type: int
    ) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
            if self._consumer(gpu):
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # GeForce boards have no ECC
            if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
                return self.state[gpu.index].ecc_uncorrected
            return 0

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
            sm = self._sm(gpu)
            if sm is None or sm < 80 or self._consumer(gpu):
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # row remapping is Ampere+ HBM
            state = self.state[gpu.index]
            unc = state.ecc_uncorrected
            return (0, unc, int(state.remap_pending), int(state.remap_failure))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
            return self.state[gpu.index].throttle

    def nvmlDeviceGetTemperatureV(
        self, handle: FakeHandle, sensor: int, version: Any = None
    ) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetTemperatureV", handle)
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self.state[gpu.index].temperature_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeHandle, threshold: int) -> int:
        with self._lock:
            self._gpu("nvmlDeviceGetTemperatureThreshold", handle)
            if threshold != pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return SLOWDOWN_TEMPERATURE_C

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetPowerUsage", handle)
            return round(self.state[gpu.index].power_w * 1000)

    # --- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        with self._lock:
            self._enter("nvmlEventSetCreate")
            event_set = FakeEventSet()
            self._event_sets.append(event_set)
            return event_set

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        with self._lock:
            self._enter("nvmlEventSetFree")
            event_set.freed = True
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)
            self._changed.notify_all()

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        with self._lock:
            self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
            return int(_SUPPORTED_EVENTS)

    def nvmlDeviceRegisterEvents(
        self, handle: FakeHandle, event_types: int, event_set: FakeEventSet
    ) -> None:
        with self._lock:
            gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
            if event_types & ~_SUPPORTED_EVENTS:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            event_set.registered[gpu.index] = event_set.registered.get(gpu.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEvent:
        deadline = time.monotonic() + timeoutms / 1000.0
        with self._lock:
            self._enter("nvmlEventSetWait")
            while True:
                self._poll_faults()
                if event_set.freed:
                    raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
                if event_set.pending:
                    return event_set.pending.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error(pynvml.NVML_ERROR_TIMEOUT)
                self._changed.wait(min(remaining, self._poll_interval))

    nvmlEventSetWait_v2 = nvmlEventSetWait

    # --- introspection for tests and benchmarks -----------------------------------------------

    def call_count(self, predicate: Callable[[str], bool] | None = None) -> int:
        """How many NVML calls were made (optionally only those whose name matches)."""
        return sum(n for name, n in self.calls.items() if predicate is None or predicate(name))
