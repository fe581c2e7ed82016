"""Typed model of one node's GPUs, their wiring and their health.

The model is what every consumer of topology shares: the parser of ``nvidia-smi topo -m`` produces
it, the device probe publishes it as a NodeGpuTopology object, and the extender, the operator and
the simulator read it back with :meth:`NodeTopology.from_api`. Keeping it separate from the API
type lets the core validate once (every link names known GPUs, NV links carry a count) and compute
the wiring hash that lets thousands of identical nodes share one set of precomputed structures.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from gpusched.api import nodegputopology as api
from gpusched.api.nodegputopology import GpuHealthState, LinkType

#: Health states whose GPUs may receive new work.
PLACEABLE_STATES: Final = frozenset({GpuHealthState.HEALTHY, GpuHealthState.DEGRADED})

#: What ``to_api`` writes for a GPU whose UUID or model is not known (e.g. parsed from a matrix),
#: because the API type requires both.
UNKNOWN_MODEL: Final = "unknown"


def placeholder_uuid(index: int) -> str:
    """The UUID ``to_api`` writes for a GPU whose UUID was never read."""
    return f"unknown-gpu-{index}"


#: Most NVLinks a GPU has (Blackwell: 18; the NodeGpuTopology schema allows 36 for what comes
#: next): a pair bonded by more is a typo, not a machine.
MAX_NVLINKS_PER_PAIR: Final = 36


class TopologyError(ValueError):
    """The topology is inconsistent (duplicate GPU, link to a GPU that does not exist, ...)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU: identity, attachment and health."""

    index: int
    model: str | None = None
    uuid: str | None = None
    memory_mib: int | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    compute_capability: str | None = None
    mig_enabled: bool = False
    nvlink_count: int = 0
    nvswitch_links: int = 0
    health: GpuHealthState = GpuHealthState.HEALTHY
    health_reason: str = "Healthy"
    health_message: str = ""

    @property
    def placeable(self) -> bool:
        """Whether new work may land on this GPU (healthy or degraded, and not split by MIG)."""
        return self.health in PLACEABLE_STATES and not self.mig_enabled


@dataclass(frozen=True, slots=True)
class Link:
    """How two GPUs reach each other; ``a < b``."""

    a: int
    b: int
    type: LinkType
    nvlinks: int = 0
    pcie: LinkType | None = None

    @property
    def code(self) -> str:
        """The link as ``nvidia-smi topo -m`` prints it (``NV12``, ``PIX``, ``SYS``)."""
        return f"NV{self.nvlinks}" if self.type is LinkType.NV else self.type.value


@dataclass(frozen=True, slots=True)
class Nic:
    """An RDMA NIC."""

    index: int
    name: str
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class NicLink:
    """PCIe distance between a NIC and a GPU."""

    nic: int
    gpu: int
    type: LinkType


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class NodeTopology:
    """One node's GPUs, NICs, every GPU pair's link and every GPU's health.

    Pairs without a link entry are treated as ``SYS`` (the slowest class) by everything that
    scores sets; they are not invented here so that a round trip through the API stays exact.
    """

    node_name: str
    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...] = ()
    nics: tuple[Nic, ...] = ()
    nic_links: tuple[NicLink, ...] = ()
    nvswitch: bool = False
    clique: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    source: str = "nvml"
    topology_hash: str | None = field(default=None, compare=False)
    """The hash as published in the API object, kept for a lossless round trip; the engine uses
    :attr:`wiring_hash`, which it computes itself."""
    wiring_hash: str = field(init=False, compare=False, repr=False)
    """Digest of everything placement depends on except health: equal for identical wiring."""
    _gpu_by_index: dict[int, Gpu] = field(init=False, compare=False, repr=False)
    _link_by_pair: dict[tuple[int, int], Link] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_index: dict[int, Gpu] = {}
        for gpu in self.gpus:
            if gpu.index in by_index:
                raise TopologyError(f"GPU {gpu.index} is listed twice")
            by_index[gpu.index] = gpu
        if list(by_index) != sorted(by_index):
            raise TopologyError("GPUs must be listed by increasing index")
        uuids: dict[str, int] = {}
        for gpu in self.gpus:
            if gpu.index < 0:
                raise TopologyError(f"GPU index {gpu.index} is negative")
            if gpu.numa_node is not None and gpu.numa_node < 0:
                raise TopologyError(f"GPU {gpu.index}: NUMA node {gpu.numa_node} is negative")
            if gpu.uuid is not None:
                if gpu.uuid in uuids:
                    raise TopologyError(
                        f"GPUs {uuids[gpu.uuid]} and {gpu.index} have the same UUID {gpu.uuid}"
                    )
                uuids[gpu.uuid] = gpu.index
        by_pair: dict[tuple[int, int], Link] = {}
        for link in self.links:
            if link.a >= link.b:
                raise TopologyError(f"link {link.a}-{link.b}: a must be lower than b")
            for end in (link.a, link.b):
                if end not in by_index:
                    raise TopologyError(f"link {link.a}-{link.b} names unknown GPU {end}")
            if (link.a, link.b) in by_pair:
                raise TopologyError(f"link {link.a}-{link.b} is listed twice")
            if (link.type is LinkType.NV) != (link.nvlinks > 0):
                raise TopologyError(
                    f"link {link.a}-{link.b}: NV links need a count > 0, other links none"
                )
            if link.nvlinks > MAX_NVLINKS_PER_PAIR:
                raise TopologyError(
                    f"link {link.a}-{link.b}: {link.nvlinks} NVLinks between two GPUs; no GPU "
                    f"has more than {MAX_NVLINKS_PER_PAIR}"
                )
            if link.pcie is LinkType.NV:
                raise TopologyError(f"link {link.a}-{link.b}: pcie level cannot be NV")
            by_pair[(link.a, link.b)] = link
        nic_indices = {nic.index for nic in self.nics}
        if len(nic_indices) != len(self.nics):
            raise TopologyError("a NIC is listed twice")
        seen_nic_links: set[tuple[int, int]] = set()
        for nic_link in self.nic_links:
            if nic_link.nic not in nic_indices:
                raise TopologyError(f"NIC link names unknown NIC {nic_link.nic}")
            if nic_link.gpu not in by_index:
                raise TopologyError(f"NIC link names unknown GPU {nic_link.gpu}")
            if nic_link.type is LinkType.NV:
                raise TopologyError(f"NIC {nic_link.nic} to GPU {nic_link.gpu} cannot be NV")
            if (nic_link.nic, nic_link.gpu) in seen_nic_links:
                raise TopologyError(f"NIC {nic_link.nic} to GPU {nic_link.gpu} is listed twice")
            seen_nic_links.add((nic_link.nic, nic_link.gpu))
        object.__setattr__(self, "_gpu_by_index", by_index)
        object.__setattr__(self, "_link_by_pair", by_pair)
        object.__setattr__(self, "wiring_hash", self._compute_wiring_hash())

    # --- queries -----------------------------------------------------------------------------

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """GPU indices in increasing order."""
        return tuple(gpu.index for gpu in self.gpus)

    def gpu(self, index: int) -> Gpu:
        """The GPU with this index (KeyError if there is none)."""
        return self._gpu_by_index[index]

    def link(self, a: int, b: int) -> Link | None:
        """The link between two GPUs in either order, or None when the pair was not reported."""
        if a > b:
            a, b = b, a
        return self._link_by_pair.get((a, b))

    def nic_link(self, nic: int, gpu: int) -> LinkType | None:
        """PCIe distance between a NIC and a GPU, when known."""
        for nic_link in self.nic_links:
            if nic_link.nic == nic and nic_link.gpu == gpu:
                return nic_link.type
        return None

    @property
    def placeable_gpus(self) -> tuple[int, ...]:
        """Indices of GPUs that may receive new work."""
        return tuple(gpu.index for gpu in self.gpus if gpu.placeable)

    # --- derivation --------------------------------------------------------------------------

    def with_health(
        self,
        states: Mapping[int, GpuHealthState],
        reasons: Mapping[int, str] | None = None,
    ) -> NodeTopology:
        """A copy with some GPUs' health replaced (wiring, and so the wiring hash, unchanged)."""
        unknown = set(states) - set(self._gpu_by_index)
        if unknown:
            raise TopologyError(f"health for unknown GPUs {sorted(unknown)}")
        gpus = tuple(
            replace(
                gpu,
                health=states[gpu.index],
                health_reason=(reasons or {}).get(gpu.index, states[gpu.index].value),
                health_message="",
            )
            if gpu.index in states
            else gpu
            for gpu in self.gpus
        )
        return replace(self, gpus=gpus)

    def _compute_wiring_hash(self) -> str:
        """Hash of what placement reads, excluding identity (UUIDs, bus ids) and health."""
        payload = {
            "gpus": [[g.index, g.model, g.compute_capability, g.numa_node] for g in self.gpus],
            "links": [[lk.a, lk.b, lk.type.value, lk.nvlinks] for lk in self.links],
            "nics": [[n.index, n.numa_node] for n in self.nics],
            "nic_links": sorted([nl.nic, nl.gpu, nl.type.value] for nl in self.nic_links),
        }
        return hashlib.sha256(_canonical(payload).encode()).hexdigest()[:32]

    # --- API conversion ----------------------------------------------------------------------

    @classmethod
    def from_api(
        cls,
        spec: api.NodeGpuTopologySpec,
        status: api.NodeGpuTopologyStatus | None = None,
    ) -> NodeTopology:
        """Build the model from a NodeGpuTopology's spec and status.

        The placeholders :meth:`to_api` writes for an unknown model or UUID read back as unknown,
        so a round trip is exact in both directions.

        A GPU the status does not mention counts as Healthy: the probe writes the spec first, and
        a GPU it lists but has not judged yet is still advertised by the device plugin.
        """
        health: dict[int, api.GpuHealth] = {}
        if status is not None:
            health = {h.index: h for h in status.gpus}
        gpus = []
        for info in sorted(spec.gpus, key=lambda g: g.index):
            h = health.get(info.index)
            gpus.append(
                Gpu(
                    index=info.index,
                    model=None if info.model == UNKNOWN_MODEL else info.model,
                    uuid=None if info.uuid == placeholder_uuid(info.index) else info.uuid,
                    memory_mib=info.memory_mib,
                    pci_bus_id=info.pci_bus_id,
                    numa_node=info.numa_node,
                    cpu_affinity=info.cpu_affinity,
                    compute_capability=info.compute_capability,
                    mig_enabled=info.mig_enabled,
                    nvlink_count=info.nvlink_count,
                    nvswitch_links=info.nvswitch_links,
                    health=h.state if h is not None else GpuHealthState.HEALTHY,
                    health_reason=h.reason if h is not None else "Healthy",
                    health_message=h.message if h is not None else "",
                )
            )
        links = tuple(
            Link(a=lk.a, b=lk.b, type=lk.type, nvlinks=lk.nvlinks, pcie=lk.pcie)
            for lk in sorted(spec.links, key=lambda lk: (lk.a, lk.b))
        )
        nics = tuple(
            Nic(index=n.index, name=n.name, numa_node=n.numa_node)
            for n in sorted(spec.nics, key=lambda n: n.index)
        )
        nic_links = tuple(NicLink(nic=nl.nic, gpu=nl.gpu, type=nl.type) for nl in spec.nic_links)
        return cls(
            node_name=spec.node_name,
            gpus=tuple(gpus),
            links=links,
            nics=nics,
            nic_links=nic_links,
            nvswitch=spec.nvswitch,
            clique=spec.clique,
            driver_version=spec.driver_version,
            cuda_driver_version=spec.cuda_driver_version,
            source=spec.source,
            topology_hash=spec.topology_hash,
        )

    @classmethod
    def from_topo_matrix(cls, text: str, **options: Any) -> NodeTopology:
        """Parse ``nvidia-smi topo -m`` text; the options are those of
        :func:`gpusched.core.topo_matrix.parse_topo_matrix` (``node_name``, ``gpu_model``, ...)."""
        from gpusched.core.topo_matrix import parse_topo_matrix

        return parse_topo_matrix(text, **options)

    @classmethod
    def from_api_object(cls, obj: api.NodeGpuTopology) -> NodeTopology:
        """Build the model from a whole NodeGpuTopology object."""
        return cls.from_api(obj.spec, obj.status)

    def to_api(self) -> tuple[api.NodeGpuTopologySpec, api.NodeGpuTopologyStatus]:
        """The spec and status the device probe publishes for this node.

        Fields the API requires but the model may lack (UUID, model of a GPU read from a matrix)
        get placeholders; the published ``topologyHash`` is the wiring hash unless one was read.
        """
        spec = api.NodeGpuTopologySpec(
            node_name=self.node_name,
            gpus=[
                api.GpuInfo(
                    index=g.index,
                    uuid=g.uuid or placeholder_uuid(g.index),
                    model=g.model or UNKNOWN_MODEL,
                    memory_mib=g.memory_mib,
                    pci_bus_id=g.pci_bus_id,
                    numa_node=g.numa_node,
                    cpu_affinity=g.cpu_affinity,
                    compute_capability=g.compute_capability,
                    mig_enabled=g.mig_enabled,
                    nvlink_count=g.nvlink_count,
                    nvswitch_links=g.nvswitch_links,
                )
                for g in self.gpus
            ],
            links=[
                api.GpuLink(a=lk.a, b=lk.b, type=lk.type, nvlinks=lk.nvlinks, pcie=lk.pcie)
                for lk in self.links
            ],
            nics=[
                api.NicInfo(index=n.index, name=n.name, numa_node=n.numa_node) for n in self.nics
            ],
            nic_links=[api.NicLink(nic=nl.nic, gpu=nl.gpu, type=nl.type) for nl in self.nic_links],
            nvswitch=self.nvswitch,
            clique=self.clique,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            source=self.source,
            topology_hash=self.topology_hash or self.wiring_hash,
        )
        status = api.NodeGpuTopologyStatus(
            gpus=[
                api.GpuHealth(
                    index=g.index,
                    uuid=g.uuid,
                    state=g.health,
                    reason=g.health_reason,
                    message=g.health_message,
                )
                for g in self.gpus
            ],
            healthy_gpus=sum(1 for g in self.gpus if g.health in PLACEABLE_STATES),
        )
        return spec, status


def numa_nodes(topology: NodeTopology) -> dict[int | None, tuple[int, ...]]:
    """GPU indices per NUMA node (key None for GPUs whose NUMA node is not known)."""
    groups: dict[int | None, list[int]] = {}
    for gpu in topology.gpus:
        groups.setdefault(gpu.numa_node, []).append(gpu.index)
    return {node: tuple(indices) for node, indices in groups.items()}


def indices_to_text(indices: Iterable[int]) -> str:
    """``0,2,3`` for messages and annotations."""
    return ",".join(str(i) for i in indices)
