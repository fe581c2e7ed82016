"""NodeGpuTopology: one node's GPUs, how they are wired, and whether each is healthy.

Written by the device probe (one object per node, named after it and owned by it), read by the
extender and the operator. Wiring goes in ``spec`` because it changes only with hardware; health
goes in ``status`` because it changes at runtime and is written far more often.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Final, Literal

from pydantic import ConfigDict, Field, model_validator

from gpusched.api import keys
from gpusched.api.base import ApiModel, LenientApiModel
from gpusched.api.meta import Condition, ObjectMeta

MAX_GPUS_PER_NODE: Final = 72
MAX_NICS_PER_NODE: Final = 64
#: Longest CPU list a GPU's affinity may take. Round-robin CPU numbering on multi-socket hosts
#: gives lists without ranges (``0,2,4,...``); even all 1024 CPUs of NVML's affinity mask listed
#: one by one take about 4000 characters.
MAX_CPULIST_LENGTH: Final = 4096


class LinkType(StrEnum):
    """Connection between two devices, best first, as ``nvidia-smi topo -m`` names it."""

    NV = "NV"
    """A bonded set of NVLinks (direct, bridge or NVSwitch); ``nvlinks`` counts them."""
    PIX = "PIX"
    """At most a single PCIe bridge (same PCIe switch)."""
    PXB = "PXB"
    """Multiple PCIe bridges, without the host bridge."""
    PHB = "PHB"
    """Through a PCIe host bridge (the CPU)."""
    NODE = "NODE"
    """Between PCIe host bridges within one NUMA node."""
    SYS = "SYS"
    """Across the SMP interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)."""


class GpuInfo(ApiModel):
    """Inventory of one GPU."""

    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    """NVML / ``nvidia-smi`` index."""
    uuid: str = Field(min_length=1, max_length=128)
    """GPU UUID, ``GPU-...``."""
    model: str = Field(min_length=1, max_length=128)
    """Product name as NVML reports it, e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_mib: int | None = Field(None, ge=0)
    """Total framebuffer memory in MiB."""
    pci_bus_id: str | None = Field(None, max_length=32)
    """PCI address in sysfs form, ``0000:18:00.0``."""
    numa_node: int | None = Field(None, ge=0)
    """NUMA node the GPU is attached to; unset when the platform does not say."""
    cpu_affinity: str | None = Field(None, max_length=MAX_CPULIST_LENGTH)
    """CPUs local to the GPU, as a cpulist (``0-47,96-143``)."""
    compute_capability: str | None = Field(None, max_length=8)
    """CUDA compute capability, ``major.minor``."""
    mig_enabled: bool = False
    """Whether MIG mode is on (MIG GPUs are not placed as whole GPUs)."""
    nvlink_count: int = Field(0, ge=0, le=36)
    """Active NVLinks of this GPU; fewer than its peers' means lost links."""
    nvswitch_links: int = Field(0, ge=0, le=36)
    """Active NVLinks that end at an NVSwitch (0 on boards without one)."""


class GpuLink(ApiModel):
    """How two GPUs reach each other (one entry per unordered pair, ``a < b``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.a < self.b", "message": "a must be less than b", "fieldPath": ".a"}
            ]
        }
    )

    a: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    """Lower GPU index."""
    b: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    """Higher GPU index."""
    type: LinkType
    """Best path between them."""
    nvlinks: int = Field(0, ge=0, le=36)
    """Bonded NVLinks when ``type`` is ``NV``; 0 otherwise."""
    pcie: LinkType | None = None
    """The PCIe path as well, when known (it exists even for NVLinked pairs)."""

    @model_validator(mode="after")
    def _ordered(self) -> GpuLink:
        if self.a >= self.b:
            raise ValueError("spec.links[].a must be less than b (one entry per unordered pair)")
        return self


class NicInfo(ApiModel):
    """A network adapter (RDMA NIC) on the node."""

    index: int = Field(ge=0, lt=MAX_NICS_PER_NODE)
    """Order in ``nvidia-smi topo -m`` (``NIC<index>``)."""
    name: str = Field(min_length=1, max_length=64)
    """Device name, e.g. ``mlx5_0``."""
    numa_node: int | None = Field(None, ge=0)
    """NUMA node of the NIC, when known."""


class NicLink(ApiModel):
    """PCIe distance between a NIC and a GPU."""

    nic: int = Field(ge=0, lt=MAX_NICS_PER_NODE)
    """NIC index."""
    gpu: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    """GPU index."""
    type: LinkType
    """PCIe path between them (never ``NV``)."""


class NodeGpuTopologySpec(ApiModel):
    """Wiring of the node's GPUs and NICs, as read through NVML and sysfs."""

    node_name: str = Field(min_length=1, max_length=253)
    """The Node this object describes (also its name)."""
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    """Every GPU on the node, by index."""
    links: list[GpuLink] = Field(default_factory=list, max_length=2600)
    """Every GPU pair's connection."""
    nics: list[NicInfo] = Field(default_factory=list, max_length=MAX_NICS_PER_NODE)
    """RDMA NICs."""
    nic_links: list[NicLink] = Field(default_factory=list, max_length=4700)
    """PCIe distance of every NIC to every GPU."""
    nvswitch: bool = False
    """Whether the GPUs' NVLinks end at NVSwitches (all-to-all NVLink)."""
    clique: str | None = Field(None, max_length=128)
    """Multi-node NVLink fabric clique, ``<clusterUUID>.<cliqueId>`` (GB200 NVL72)."""
    driver_version: str | None = Field(None, max_length=64)
    """NVIDIA driver version."""
    cuda_driver_version: str | None = Field(None, max_length=16)
    """Highest CUDA version the driver supports, ``major.minor``."""
    source: str = Field("nvml", max_length=MAX_CPULIST_LENGTH)
    """Where the data came from: ``nvml``, or ``fake:<file>`` for simulated nodes."""
    topology_hash: str | None = Field(None, max_length=64)
    """Digest of the wiring; equal hashes mean identical wiring."""


class GpuHealthState(StrEnum):
    """Health of one GPU as the scheduler treats it."""

    HEALTHY = "Healthy"
    """Usable."""
    DEGRADED = "Degraded"
    """Usable but slowed (e.g. sustained hardware slowdown); placement penalises it."""
    UNSCHEDULABLE = "Unschedulable"
    """Working jobs may continue, new ones are not placed (e.g. row remap pending a reset)."""
    UNHEALTHY = "Unhealthy"
    """Not usable (fatal XID, uncorrectable ECC, lost, remap failure)."""


class GpuHealth(ApiModel):
    """Current health of one GPU and why."""

    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    """GPU index."""
    uuid: str | None = Field(None, max_length=128)
    """GPU UUID."""
    state: GpuHealthState = GpuHealthState.HEALTHY
    """Healthy, Degraded, Unschedulable or Unhealthy."""
    reason: str = Field("Healthy", max_length=128)
    """Machine reason, e.g. ``Xid79``, ``EccUncorrectable``, ``RowRemapPending``, ``GpuLost``."""
    message: str = Field("", max_length=1024)
    """Sentence for humans."""
    since: datetime | None = None
    """When the GPU entered this state."""
    fatal_xid: int | None = Field(None, ge=0)
    """The fatal XID that keeps the GPU unhealthy until the node reboots, also while a more
    fundamental reason (``GpuLost``, ``ResetRequired``, ``NvmlUnavailable``) is named; a
    restarted probe continues from it."""
    temperature_c: int | None = None
    """Last GPU temperature in degrees Celsius."""
    power_w: float | None = None
    """Last power draw in watts."""


class NodeGpuTopologyStatus(ApiModel):
    """Runtime health of the node's GPUs."""

    gpus: list[GpuHealth] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    """Health per GPU."""
    healthy_gpus: int = Field(0, ge=0)
    """GPUs in state Healthy or Degraded (placeable)."""
    observed_at: datetime | None = None
    """When the probe last confirmed this status."""
    probe_version: str | None = Field(None, max_length=64)
    """Version of the probe that wrote it."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """NvmlReady (False when NVML could not be initialised) and similar."""


class NodeGpuTopology(LenientApiModel):
    """GPU topology and health of one node (cluster-scoped, named after the node)."""

    api_version: Literal["gpusched.io/v1alpha1"] = keys.API_VERSION
    kind: Literal["NodeGpuTopology"] = "NodeGpuTopology"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NodeGpuTopologySpec
    status: NodeGpuTopologyStatus = Field(default_factory=NodeGpuTopologyStatus)
