"""Reads a node's GPUs, their wiring and their health through NVML (``pynvml``) and sysfs.

The backend is written against the ``pynvml`` function surface and receives the module as a
parameter: production passes ``pynvml`` itself, tests and the demo pass
:class:`gpusched.dev.fakenvml.FakeNvml`, which implements the same functions and raises the
same ``pynvml.NVMLError_*`` classes. All of the logic here (the NVSwitch rule, the PCIe level
mapping, per-GPU degradation) therefore runs in tests exactly as on a GPU host.

Failure is contained where it happens: a GPU that answers ``GPU is lost`` is marked lost and the
rest of the node is still read; a query a GPU does not support leaves that one field unknown; an
unexpected error in an identity query marks that GPU (not the node) as unreadable.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from gpusched.api.nodegputopology import MAX_NICS_PER_NODE, LinkType
from gpusched.core import Gpu, Link, Nic, NicLink, NodeTopology
from gpusched.core.health import GpuObservation
from gpusched.device_probe.pcie import (
    PciAddressError,
    PciPath,
    cpulist_from_mask,
    level_from_nvml,
    normalize_bus_id,
    pcie_distance,
)
from gpusched.device_probe.sysfs import Sysfs, SysfsNic

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Errors that mean "this GPU or driver does not offer this": the field stays unknown, quietly.
_UNSUPPORTED_CODES: Final = frozenset({2, 3, 4, 6, 13, 21, 26})  # invalid arg, not supported,
# no permission, not found, function not found, no data, deprecated
_GPU_IS_LOST: Final = 15
_RESET_REQUIRED: Final = 16
_FUNCTION_NOT_FOUND: Final = 13

#: CPU and NUMA bitmask sizes passed to NVML (64 bits per word: 1024 CPUs, 256 NUMA nodes).
CPU_SET_WORDS: Final = 16
NODE_SET_WORDS: Final = 4
#: Event types the probe listens for (nvmlEventType*): XIDs and double-bit ECC errors.
EVENT_XID: Final = 0x8
EVENT_DOUBLE_BIT_ECC: Final = 0x2
EVENT_MASK: Final = EVENT_XID | EVENT_DOUBLE_BIT_ECC


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this node (library missing, driver not loaded, init failed)."""


class _GpuGoneError(Exception):
    """Internal: the GPU stopped answering (lost or needs a reset); stop reading it."""


@dataclass
class GpuReading:
    """What one inventory pass learned about one GPU (None: not readable)."""

    index: int
    handle: Any = None
    uuid: str | None = None
    name: str | None = None
    memory_mib: int | None = None
    bus_id: str | None = None
    compute_capability: str | None = None
    mig_enabled: bool = False
    mig_capable: bool | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    nvlinks_active: int = 0
    switch_links: int = 0
    direct_links: dict[str, int] = field(default_factory=dict)
    """Active NVLinks per peer bus id (sysfs form), for links that end at a GPU."""
    clique: str | None = None
    lost: bool = False
    reset_required: bool = False
    query_error: str | None = None
    pci_path: PciPath | None = None
    failed: set[str] = field(default_factory=set)
    """NVML calls that failed with an unexpected error in this reading."""

    @property
    def readable(self) -> bool:
        """Whether the GPU answered well enough to be queried further."""
        return self.handle is not None and not self.lost and not self.reset_required


@dataclass
class NodeReading:
    """One inventory pass over the node."""

    gpus: list[GpuReading]
    topology: NodeTopology
    mig_capable: bool | None
    issues: list[str] = field(default_factory=list)
    """Unexpected per-field errors (logged and counted), e.g. ``GPU 3 nvmlDeviceGetName: ...``."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Inventory, wiring and health of the node's GPUs from an NVML module and a sysfs tree."""

    def __init__(self, nvml: Any, sysfs: Sysfs, *, source: str = "nvml") -> None:
        self.nvml = nvml
        self.sysfs = sysfs
        self.source = source
        self.initialized = False

    # --- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        """Initialise NVML; raises :class:`NvmlUnavailableError` with NVML's reason."""
        if self.initialized:
            return
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as err:
            raise NvmlUnavailableError(f"nvmlInit: {err}") from err
        except OSError as err:  # the library could not be loaded at all
            raise NvmlUnavailableError(f"nvmlInit: {err}") from err
        self.initialized = True

    def shutdown(self) -> None:
        """Release NVML (errors ignored: the process is going away or re-initialising)."""
        if not self.initialized:
            return
        self.initialized = False
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as err:
            log.debug("nvmlShutdown: %s", err)

    # --- error handling ----------------------------------------------------------------------

    def _query(
        self,
        gpu: GpuReading | None,
        what: str,
        issues: list[str],
        fn: Callable[..., T],
        *args: Any,
    ) -> T | None:
        """Call one NVML function; None when the answer is not available.

        ``GPU is lost`` / ``reset required`` mark the GPU and abort its reading; "not supported"
        style errors are silent; anything else is recorded as an issue and the field left unknown.
        """
        try:
            return fn(*args)
        except self.nvml.NVMLError as err:
            code = getattr(err, "value", None)
            if gpu is not None and code == _GPU_IS_LOST:
                gpu.lost = True
                raise _GpuGoneError from err
            if gpu is not None and code == _RESET_REQUIRED:
                gpu.reset_required = True
                raise _GpuGoneError from err
            if code not in _UNSUPPORTED_CODES:
                where = f"GPU {gpu.index} " if gpu is not None else ""
                issues.append(f"{where}{what}: {err}")
                if gpu is not None:
                    gpu.failed.add(what)
            return None

    # --- inventory ---------------------------------------------------------------------------

    def device_count(self) -> int:
        """Number of GPUs NVML sees (raises :class:`NvmlUnavailableError` when it cannot say)."""
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as err:
            raise NvmlUnavailableError(f"nvmlDeviceGetCount: {err}") from err

    def read_inventory(self, node_name: str, previous: NodeReading | None = None) -> NodeReading:
        """GPUs, every pair's link, NICs and their distances, versions and fabric clique.

        A field whose query fails with an unexpected error keeps its value from ``previous``
        when that reading saw the same GPU (same UUID): one failed call must not read as a
        change of hardware, which would rewrite the spec and flip the topology hash."""
        nvml = self.nvml
        issues: list[str] = []
        count = self.device_count()
        gpus = [self._read_gpu(index, issues) for index in range(count)]
        before = {g.index: g for g in previous.gpus} if previous is not None else {}
        for gpu in gpus:
            _keep_failed_fields(gpu, before.get(gpu.index))

        links: list[Link] = []
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                link = self._pair_link(a, b, issues)
                if link is not None:
                    links.append(link)

        nics: list[Nic] = []
        nic_links: list[NicLink] = []
        for nic_index, nic in enumerate(self._rdma_nics(issues)):
            nics.append(Nic(index=nic_index, name=nic.name, numa_node=nic.path.numa_node))
            for gpu in gpus:
                if gpu.pci_path is not None:
                    nic_links.append(
                        NicLink(nic_index, gpu.index, pcie_distance(nic.path, gpu.pci_path))
                    )

        driver = self._query(
            None, "nvmlSystemGetDriverVersion", issues, nvml.nvmlSystemGetDriverVersion
        )
        cuda = self._query(
            None, "nvmlSystemGetCudaDriverVersion", issues, nvml.nvmlSystemGetCudaDriverVersion
        )
        cliques = {g.clique for g in gpus if g.readable}
        clique = cliques.pop() if len(cliques) == 1 else None  # GFD: only if every GPU agrees
        capable = [g.mig_capable for g in gpus if g.mig_capable is not None]
        topology = NodeTopology(
            node_name=node_name,
            gpus=tuple(self._gpu_model(g) for g in gpus),
            links=tuple(links),
            nics=tuple(nics),
            nic_links=tuple(nic_links),
            nvswitch=any(g.switch_links > 0 for g in gpus),
            clique=clique,
            driver_version=_text(driver) if driver is not None else None,
            cuda_driver_version=(
                f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda is not None else None
            ),
            source=self.source,
        )
        return NodeReading(
            gpus=gpus,
            topology=topology,
            mig_capable=any(capable) if capable else None,
            issues=issues,
        )

    def _rdma_nics(self, issues: list[str]) -> list[SysfsNic]:
        """The node's RDMA NICs, at most as many as the NodeGpuTopology schema holds: the rest
        are left out with an issue rather than making the node's object unpublishable."""
        found = self.sysfs.rdma_nics()
        if len(found) > MAX_NICS_PER_NODE:
            issues.append(
                f"{len(found)} RDMA devices, more than the {MAX_NICS_PER_NODE} a NodeGpuTopology "
                f"holds; left out: {', '.join(nic.name for nic in found[MAX_NICS_PER_NODE:])}"
            )
        return found[:MAX_NICS_PER_NODE]

    @staticmethod
    def _gpu_model(g: GpuReading) -> Gpu:
        return Gpu(
            index=g.index,
            model=g.name,
            uuid=g.uuid,
            memory_mib=g.memory_mib,
            pci_bus_id=g.bus_id,
            numa_node=g.numa_node,
            cpu_affinity=g.cpu_affinity,
            compute_capability=g.compute_capability,
            mig_enabled=g.mig_enabled,
            nvlink_count=min(g.nvlinks_active, 36),
            nvswitch_links=min(g.switch_links, 36),
        )

    def _read_gpu(self, index: int, issues: list[str]) -> GpuReading:
        nvml = self.nvml
        gpu = GpuReading(index=index)
        try:
            gpu.handle = self._query(
                gpu, "nvmlDeviceGetHandleByIndex", issues, nvml.nvmlDeviceGetHandleByIndex, index
            )
            if gpu.handle is None:
                gpu.query_error = "nvmlDeviceGetHandleByIndex failed"
                return gpu
            h = gpu.handle
            uuid = self._query(gpu, "nvmlDeviceGetUUID", issues, nvml.nvmlDeviceGetUUID, h)
            if uuid is None:
                gpu.query_error = "nvmlDeviceGetUUID failed: the GPU cannot be identified"
            else:
                gpu.uuid = _text(uuid)
            name = self._query(gpu, "nvmlDeviceGetName", issues, nvml.nvmlDeviceGetName, h)
            gpu.name = _text(name) if name else None
            memory = self._query(
                gpu, "nvmlDeviceGetMemoryInfo", issues, nvml.nvmlDeviceGetMemoryInfo, h
            )
            if memory is not None:
                gpu.memory_mib = int(memory.total) // (1024 * 1024)
            pci = self._query(gpu, "nvmlDeviceGetPciInfo", issues, nvml.nvmlDeviceGetPciInfo, h)
            if pci is not None:
                try:
                    gpu.bus_id = normalize_bus_id(_text(pci.busId))
                except PciAddressError as err:
                    issues.append(f"GPU {index} nvmlDeviceGetPciInfo: {err}")
            cc = self._query(
                gpu,
                "nvmlDeviceGetCudaComputeCapability",
                issues,
                nvml.nvmlDeviceGetCudaComputeCapability,
                h,
            )
            if cc is not None:
                gpu.compute_capability = f"{int(cc[0])}.{int(cc[1])}"
            mig = self._query(gpu, "nvmlDeviceGetMigMode", issues, nvml.nvmlDeviceGetMigMode, h)
            gpu.mig_capable = mig is not None
            gpu.mig_enabled = mig is not None and int(mig[0]) == nvml.NVML_DEVICE_MIG_ENABLE
            self._read_affinity(gpu, issues)
            self._read_nvlinks(gpu, issues)
            gpu.clique = self._read_clique(gpu, issues)
        except _GpuGoneError:
            pass
        return gpu

    def _read_affinity(self, gpu: GpuReading, issues: list[str]) -> None:
        """NUMA node and local CPUs: sysfs first (x86 hosts), NVML where sysfs does not say
        (platforms such as Grace, where GPUs are NUMA nodes and the PCI device reports -1)."""
        nvml = self.nvml
        if gpu.bus_id is not None:
            gpu.pci_path = self.sysfs.pci_path(gpu.bus_id)
            gpu.numa_node = gpu.pci_path.numa_node if gpu.pci_path else None
            gpu.cpu_affinity = self.sysfs.local_cpulist(gpu.bus_id)
        if gpu.numa_node is None:
            nodes = self._query(
                gpu,
                "nvmlDeviceGetMemoryAffinity",
                issues,
                nvml.nvmlDeviceGetMemoryAffinity,
                gpu.handle,
                NODE_SET_WORDS,
                nvml.NVML_AFFINITY_SCOPE_NODE,
            )
            if nodes is not None:
                listed = cpulist_from_mask(list(nodes))
                if listed and "," not in listed and "-" not in listed:
                    gpu.numa_node = int(listed)  # exactly one closest node
        if gpu.cpu_affinity is None:
            cpus = self._query(
                gpu,
                "nvmlDeviceGetCpuAffinity",
                issues,
                nvml.nvmlDeviceGetCpuAffinity,
                gpu.handle,
                CPU_SET_WORDS,
            )
            if cpus is not None:
                gpu.cpu_affinity = cpulist_from_mask(list(cpus)) or None

    def _read_nvlinks(self, gpu: GpuReading, issues: list[str]) -> None:
        """Count active links: those ending at an NVSwitch, and per peer GPU for direct links.

        On NVSwitch boards the remote PCI info of every link is the switch, never the peer, so
        peers cannot be matched by bus id; the switch links are counted instead and a pair's
        bandwidth is the smaller of the two GPUs' switch link counts (HAMi PR #2103's rule).
        """
        nvml = self.nvml
        h = gpu.handle
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            state = self._query(
                gpu, "nvmlDeviceGetNvLinkState", [], nvml.nvmlDeviceGetNvLinkState, h, link
            )
            if state is None or int(state) != nvml.NVML_FEATURE_ENABLED:
                continue
            gpu.nvlinks_active += 1
            errors: list[str] = []
            kind = self._query(
                gpu,
                "nvmlDeviceGetNvLinkRemoteDeviceType",
                errors,
                nvml.nvmlDeviceGetNvLinkRemoteDeviceType,
                h,
                link,
            )
            issues += errors
            if errors:  # what the link ends at is unknown this time: count it neither way
                continue
            if kind is not None and int(kind) == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                gpu.switch_links += 1
                continue
            remote = self._query(
                gpu,
                "nvmlDeviceGetNvLinkRemotePciInfo",
                issues,
                nvml.nvmlDeviceGetNvLinkRemotePciInfo,
                h,
                link,
            )
            if remote is None:
                continue
            try:
                peer = normalize_bus_id(_text(remote.busId))
            except PciAddressError as err:
                issues.append(f"GPU {gpu.index} link {link} remote: {err}")
                continue
            gpu.direct_links[peer] = gpu.direct_links.get(peer, 0) + 1

    def _read_clique(self, gpu: GpuReading, issues: list[str]) -> str | None:
        """``<clusterUuid>.<cliqueId>`` when the GPU is registered in a multi-node NVLink fabric
        (GB200 NVL72), with GFD's rule: call succeeded, state completed, status success, UUID
        non-zero. Prefers the versioned call, falls back to the original where it is missing."""
        nvml = self.nvml
        info: Any = nvml.c_nvmlGpuFabricInfo_v2_t()
        try:
            nvml.nvmlDeviceGetGpuFabricInfoV(gpu.handle, ctypes.byref(info))
        except nvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code != _FUNCTION_NOT_FOUND:
                return self._query(gpu, "nvmlDeviceGetGpuFabricInfoV", issues, _reraise, err)
            info = nvml.c_nvmlGpuFabricInfo_t()
            done = self._query(
                gpu,
                "nvmlDeviceGetGpuFabricInfo",
                issues,
                nvml.nvmlDeviceGetGpuFabricInfo,
                gpu.handle,
                ctypes.byref(info),
            )
            if done is None:
                return None
        if int(info.state) != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != 0:
            return None
        raw = bytes(info.clusterUuid)
        if not any(raw):
            return None
        return f"{uuidlib.UUID(bytes=raw)}.{int(info.cliqueId)}"

    def _pair_link(
        self,
        a: GpuReading,
        b: GpuReading,
        issues: list[str],
    ) -> Link | None:
        """The link between two GPUs: NVLink count if any, with the PCIe level beside it."""
        if not (a.readable and b.readable):
            return None
        nvml = self.nvml
        level: LinkType | None = None
        raw = self._query(
            None,
            "nvmlDeviceGetTopologyCommonAncestor",
            issues,
            nvml.nvmlDeviceGetTopologyCommonAncestor,
            a.handle,
            b.handle,
        )
        if raw is not None:
            level = level_from_nvml(int(raw))
        elif a.pci_path is not None and b.pci_path is not None:
            level = pcie_distance(a.pci_path, b.pci_path)  # sysfs fallback (containers, VMs)
        direct = max(a.direct_links.get(b.bus_id or "", 0), b.direct_links.get(a.bus_id or "", 0))
        nvlinks = direct
        if nvlinks == 0 and a.switch_links and b.switch_links:
            nvlinks = min(a.switch_links, b.switch_links)
        nvlinks = min(nvlinks, 36)
        if nvlinks > 0:
            return Link(a.index, b.index, LinkType.NV, nvlinks=nvlinks, pcie=level)
        if level is None:
            return None
        return Link(a.index, b.index, level)

    # --- health ------------------------------------------------------------------------------

    def read_health(self, gpus: list[GpuReading]) -> tuple[list[GpuObservation], list[str]]:
        """ECC, row remapping, clock-event reasons, temperature and power of every GPU."""
        issues: list[str] = []
        samples = []
        for gpu in gpus:
            if gpu.handle is None:
                samples.append(
                    GpuObservation(
                        gpu.index, gpu.uuid, lost=gpu.lost, reset_required=gpu.reset_required
                    )
                )
                continue
            samples.append(self._sample(gpu, issues))
        return samples, issues

    def _sample(self, gpu: GpuReading, issues: list[str]) -> GpuObservation:
        nvml = self.nvml
        probe = GpuReading(index=gpu.index, handle=gpu.handle, uuid=gpu.uuid)
        h = gpu.handle
        values: dict[str, Any] = {}
        try:
            values["ecc_uncorrected"] = self._query(
                probe,
                "nvmlDeviceGetTotalEccErrors",
                issues,
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            rows = self._query(
                probe, "nvmlDeviceGetRemappedRows", issues, nvml.nvmlDeviceGetRemappedRows, h
            )
            if rows is not None:
                values["remapped_rows_pending"] = bool(rows[2])
                values["remapped_rows_failure"] = bool(rows[3])
            values["throttle_reasons"] = self._clock_events(probe, issues)
            temperature = self._query(
                probe,
                "nvmlDeviceGetTemperatureV",
                issues,
                nvml.nvmlDeviceGetTemperatureV,
                h,
                nvml.NVML_TEMPERATURE_GPU,
            )
            if temperature is None:
                temperature = self._query(
                    probe,
                    "nvmlDeviceGetTemperature",
                    issues,
                    nvml.nvmlDeviceGetTemperature,
                    h,
                    nvml.NVML_TEMPERATURE_GPU,
                )
            values["temperature_c"] = int(temperature) if temperature is not None else None
            threshold = self._query(
                probe,
                "nvmlDeviceGetTemperatureThreshold",
                issues,
                nvml.nvmlDeviceGetTemperatureThreshold,
                h,
                nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            )
            values["slowdown_temperature_c"] = int(threshold) if threshold else None
            milliwatts = self._query(
                probe, "nvmlDeviceGetPowerUsage", issues, nvml.nvmlDeviceGetPowerUsage, h
            )
            values["power_w"] = (
                round(int(milliwatts) / 1000.0, 1) if milliwatts is not None else None
            )
        except _GpuGoneError:
            pass
        return GpuObservation(
            gpu.index,
            gpu.uuid,
            lost=probe.lost or gpu.lost,
            reset_required=probe.reset_required or gpu.reset_required,
            **{k: v for k, v in values.items() if v is not None},
        )

    def _clock_events(self, gpu: GpuReading, issues: list[str]) -> int | None:
        nvml = self.nvml
        reasons = self._query(
            gpu,
            "nvmlDeviceGetCurrentClocksEventReasons",
            issues,
            nvml.nvmlDeviceGetCurrentClocksEventReasons,
            gpu.handle,
        )
        if reasons is None:  # drivers before the rename only have the throttle-named call
            reasons = self._query(
                gpu,
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                issues,
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
                gpu.handle,
            )
        return int(reasons) if reasons is not None else None


#: Fields of :class:`GpuReading` each identity or wiring call reads (or derives from its answer).
_FIELDS_OF_CALL: Final[dict[str, tuple[str, ...]]] = {
    "nvmlDeviceGetName": ("name",),
    "nvmlDeviceGetMemoryInfo": ("memory_mib",),
    "nvmlDeviceGetPciInfo": ("bus_id", "pci_path", "numa_node", "cpu_affinity"),
    "nvmlDeviceGetCudaComputeCapability": ("compute_capability",),
    "nvmlDeviceGetMigMode": ("mig_enabled", "mig_capable"),
    "nvmlDeviceGetMemoryAffinity": ("numa_node",),
    "nvmlDeviceGetCpuAffinity": ("cpu_affinity",),
    "nvmlDeviceGetNvLinkRemoteDeviceType": ("nvlinks_active", "switch_links", "direct_links"),
    "nvmlDeviceGetNvLinkRemotePciInfo": ("nvlinks_active", "switch_links", "direct_links"),
    "nvmlDeviceGetGpuFabricInfoV": ("clique",),
    "nvmlDeviceGetGpuFabricInfo": ("clique",),
}


def _keep_failed_fields(gpu: GpuReading, before: GpuReading | None) -> None:
    """Give ``gpu`` the previous reading's value of every field whose call failed this time,
    when the previous reading is of the same GPU."""
    if before is None or gpu.uuid is None or gpu.uuid != before.uuid:
        return
    for call in gpu.failed:
        for name in _FIELDS_OF_CALL.get(call, ()):
            setattr(gpu, name, copy.copy(getattr(before, name)))


def _reraise(err: BaseException) -> Any:
    """Lets :meth:`NvmlBackend._query` classify an error already caught."""
    raise err
