"""What the probe wants the cluster to show, and whether the cluster already shows it.

Pure functions between the NVML reading and the API calls: they fill in a GPU that cannot be
read from what was known of it, build the status object, and compare desired labels, spec,
status and taints with the server's copy. Writing only on change, and not flapping across
restarts, both come down to these comparisons being exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from gpusched.api import keys
from gpusched.api.base import ApiModel
from gpusched.api.meta import Condition, ConditionStatus
from gpusched.api.nodegputopology import GpuInfo, NodeGpuTopologySpec, NodeGpuTopologyStatus
from gpusched.core import Gpu, Link, NicLink, NodeTopology
from gpusched.core.health import GpuHealthRecord

T = TypeVar("T")

CONDITION_NVML_READY: Final = "NvmlReady"
#: Status fields that change on every reading and alone never justify a write.
VOLATILE_GPU_FIELDS: Final = ("temperatureC", "powerW")
#: GPU fields read from the driver or sysfs that the spec can do without (unset, or the
#: placeholder :meth:`NodeTopology.to_api` writes for a missing UUID or model).
_OPTIONAL_GPU_FIELDS: Final = (
    "uuid",
    "model",
    "memory_mib",
    "pci_bus_id",
    "numa_node",
    "cpu_affinity",
    "compute_capability",
)
_OPTIONAL_SPEC_FIELDS: Final = ("clique", "driver_version", "cuda_driver_version")


def merge_unreadable(
    current: NodeTopology, unreadable: Iterable[int], previous: NodeTopology | None
) -> NodeTopology:
    """Fill GPUs that could not be read (lost, unidentifiable) from the last good reading.

    A lost GPU still exists and its wiring has not changed; dropping its identity and links would
    change the topology hash and labels at the worst moment. Its fields and links are taken from
    ``previous`` when the GPU there is plausibly the same one (same index, and same UUID when
    both are known).
    """
    missing = set(unreadable)
    if previous is None or not missing:
        return current
    old_gpus = {g.index: g for g in previous.gpus}
    gpus: list[Gpu] = []
    kept: set[int] = set()
    for gpu in current.gpus:
        old = old_gpus.get(gpu.index)
        if gpu.index in missing and old is not None and (not gpu.uuid or gpu.uuid == old.uuid):
            gpus.append(
                replace(
                    old,
                    health=gpu.health,
                    health_reason=gpu.health_reason,
                    health_message=gpu.health_message,
                )
            )
            kept.add(gpu.index)
        else:
            gpus.append(gpu)
    links: dict[tuple[int, int], Link] = {(lk.a, lk.b): lk for lk in current.links}
    present = {g.index for g in gpus}
    for lk in previous.links:
        if (lk.a in kept or lk.b in kept) and (lk.a, lk.b) not in links and {lk.a, lk.b} <= present:
            links[(lk.a, lk.b)] = lk
    nic_links: dict[tuple[int, int], NicLink] = {(nl.nic, nl.gpu): nl for nl in current.nic_links}
    nic_indices = {n.index for n in current.nics}
    for nl in previous.nic_links:
        if nl.gpu in kept and nl.nic in nic_indices and (nl.nic, nl.gpu) not in nic_links:
            nic_links[(nl.nic, nl.gpu)] = nl
    nvswitch = current.nvswitch or (previous.nvswitch and any(g.nvswitch_links for g in gpus))
    return replace(
        current,
        gpus=tuple(gpus),
        links=tuple(links[k] for k in sorted(links)),
        nic_links=tuple(nic_links[k] for k in sorted(nic_links)),
        nvswitch=nvswitch,
        clique=current.clique or (previous.clique if kept else None),
        topology_hash=None,
    )


def publishable(topology: NodeTopology) -> tuple[NodeTopology, list[str]]:
    """The topology with every value the NodeGpuTopology schema would refuse left out, and what
    was left out (``GPU 2 model``).

    One odd answer from a driver or sysfs (a name longer than any the schema admits) must cost
    that one field, not the node's whole publication: without the object the scheduler cannot
    place on the node at all. The topology hash stays that of the wiring as read, so the spec
    and the labels agree.
    """
    dropped: list[str] = []
    gpus: list[Gpu] = []
    for gpu in topology.gpus:
        refused = _refused(GpuInfo(index=0, uuid="-", model="-"), gpu, _OPTIONAL_GPU_FIELDS)
        dropped += [f"GPU {gpu.index} {name}" for name in sorted(refused)]
        gpus.append(
            replace(
                gpu,
                uuid=_unless(refused, "uuid", gpu.uuid),
                model=_unless(refused, "model", gpu.model),
                memory_mib=_unless(refused, "memory_mib", gpu.memory_mib),
                pci_bus_id=_unless(refused, "pci_bus_id", gpu.pci_bus_id),
                numa_node=_unless(refused, "numa_node", gpu.numa_node),
                cpu_affinity=_unless(refused, "cpu_affinity", gpu.cpu_affinity),
                compute_capability=_unless(refused, "compute_capability", gpu.compute_capability),
            )
        )
    spec = NodeGpuTopologySpec(node_name=topology.node_name)
    refused = _refused(spec, topology, _OPTIONAL_SPEC_FIELDS)
    dropped += sorted(refused)
    fitted = replace(
        topology,
        gpus=tuple(gpus),
        clique=_unless(refused, "clique", topology.clique),
        driver_version=_unless(refused, "driver_version", topology.driver_version),
        cuda_driver_version=_unless(refused, "cuda_driver_version", topology.cuda_driver_version),
        topology_hash=topology.topology_hash or topology.wiring_hash,
    )
    return fitted, dropped


def _refused(model: ApiModel, source: object, names: Iterable[str]) -> set[str]:
    """Which of ``source``'s fields ``model`` refuses, tried one at a time by assignment."""
    refused: set[str] = set()
    for name in names:
        value = getattr(source, name)
        if value is None:
            continue
        try:
            setattr(model, name, value)
        except ValidationError:
            refused.add(name)
    return refused


def _unless(refused: set[str], name: str, value: T) -> T | None:
    """``value``, or None when the schema refused field ``name``."""
    return None if name in refused else value


def with_health(topology: NodeTopology, records: Mapping[int, GpuHealthRecord]) -> NodeTopology:
    """The topology with each GPU's judged health (GPUs without a record keep theirs)."""
    gpus = tuple(
        replace(
            g,
            health=records[g.index].state,
            health_reason=records[g.index].reason,
            health_message=records[g.index].message,
            uuid=g.uuid or records[g.index].uuid,
        )
        if g.index in records
        else g
        for g in topology.gpus
    )
    return replace(topology, gpus=gpus)


def nvml_condition(
    ready: bool, message: str, now: datetime, previous: Sequence[Condition] = ()
) -> Condition:
    """The ``NvmlReady`` condition; its transition time moves only when its status does."""
    status = ConditionStatus.TRUE if ready else ConditionStatus.FALSE
    reason = "Initialized" if ready else "InitFailed"
    old = next((c for c in previous if c.type == CONDITION_NVML_READY), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    return Condition(
        type=CONDITION_NVML_READY,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
    )


def build_status(
    records: Sequence[GpuHealthRecord],
    condition: Condition,
    now: datetime,
    probe_version: str,
) -> NodeGpuTopologyStatus:
    """The status subresource the probe publishes."""
    ordered = sorted(records, key=lambda r: r.index)
    return NodeGpuTopologyStatus(
        gpus=[r.to_api() for r in ordered],
        healthy_gpus=sum(1 for r in ordered if r.placeable),
        observed_at=now,
        probe_version=probe_version,
        conditions=[condition],
    )


def significant_status(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A status body without what changes on every reading (observation time, temperature,
    power): two statuses equal here need no write."""
    if not status:
        return {}
    body = {k: v for k, v in status.items() if k != "observedAt"}
    body["gpus"] = [
        {k: v for k, v in gpu.items() if k not in VOLATILE_GPU_FIELDS}
        for gpu in status.get("gpus", [])
    ]
    return body


def telemetry(status: Mapping[str, Any] | None) -> list[tuple[Any, Any]]:
    """(temperature, power) per GPU of a status body, for the slow telemetry refresh."""
    if not status:
        return []
    return [(g.get("temperatureC"), g.get("powerW")) for g in status.get("gpus", [])]


@dataclass(frozen=True, slots=True)
class LabelOwnership:
    """Who holds which label keys on the Node, read from its managedFields."""

    ours: frozenset[str]
    """Keys the probe's field manager applied."""
    foreign: frozenset[str]
    """Keys some other field manager set."""


def label_ownership(managed_fields: Iterable[Mapping[str, Any]], manager: str) -> LabelOwnership:
    """Split label keys by field manager (main resource only, not status)."""
    ours: set[str] = set()
    foreign: set[str] = set()
    for entry in managed_fields:
        if entry.get("subresource"):
            continue
        labels = (entry.get("fieldsV1") or {}).get("f:metadata", {}).get("f:labels", {})
        found = {k[2:] for k in labels if k.startswith("f:")}
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            ours |= found
        else:
            foreign |= found
    return LabelOwnership(frozenset(ours), frozenset(foreign))


def labels_in_place(
    desired: Mapping[str, str], current: Mapping[str, str], owned: Iterable[str]
) -> bool:
    """Whether the Node already shows ``desired`` and carries no key the probe applied earlier
    but no longer wants (an apply without that key is needed to remove it)."""
    if any(current.get(k) != v for k, v in desired.items()):
        return False
    return all(k in desired or k not in current for k in owned)


def taints_with(
    taints: Sequence[Mapping[str, Any]], wanted: bool, effect: str = "NoSchedule"
) -> list[dict[str, Any]] | None:
    """The Node's taint list with the probe's no-healthy-GPU taint added or removed; None when
    the list is already right (no write)."""
    ours = [t for t in taints if t.get("key") == keys.TAINT_NO_HEALTHY_GPU]
    others = [dict(t) for t in taints if t.get("key") != keys.TAINT_NO_HEALTHY_GPU]
    if wanted:
        if len(ours) == 1 and ours[0].get("effect") == effect:
            return None
        return [*others, {"key": keys.TAINT_NO_HEALTHY_GPU, "value": "true", "effect": effect}]
    if not ours:
        return None
    return others
