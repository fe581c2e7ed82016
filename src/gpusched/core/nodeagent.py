"""The node agent's decisions: which pod the kubelet is admitting, which GPUs it must get, whether
what the kubelet hands a container is what the extender chose, and where a node has drifted.

Device-plugin calls carry no pod identity. Two independent facts supply it:

* **Which pod.** The kubelet admits one pod at a time and allocates its containers one by one;
  while it does, its PodResources ``List`` already shows that pod (the pod manager knows it and it
  is active) with the containers not yet allocated holding no device. So the pod being admitted is
  the one the kubelet lists with a GPU container that holds nothing yet.
* **Which GPUs.** The extender wrote the pod's set in ``gpusched.io/gpus`` in the same API call
  that bound it, and live pods' sets never overlap. So a device set also names its pod.

``GetPreferredAllocation`` answers the admitted pod's set; ``Allocate`` accepts a device set only
when both facts agree. Everything here is a pure function over a :class:`NodeState` snapshot built
by the shell (``gpusched.node_agent``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from gpusched.api import keys
from gpusched.api.annotations import whole_number
from gpusched.api.nodegputopology import GpuHealthState, NodeGpuTopologySpec, NodeGpuTopologyStatus
from gpusched.core.podgpus import unplaced_order

#: Pod phases after which a pod holds nothing.
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


class RefusalReason(StrEnum):
    """Machine reasons of a refused ``GetPreferredAllocation`` / ``Allocate``."""

    NO_POD_RESOURCES = "PodResourcesUnavailable"
    """The kubelet's PodResources API could not be read: the pod cannot be identified."""
    POD_GONE = "PodGone"
    """The pod being admitted no longer exists in the API (deleted after it was bound)."""
    NO_ADMITTING_POD = "NoAdmittingPod"
    """The kubelet lists no pod waiting for GPUs."""
    AMBIGUOUS = "Ambiguous"
    """Several pods wait for GPUs and the devices tie to none of them."""
    MISMATCH = "Mismatch"
    """The devices are not (a part of) the admitted pod's ``gpusched.io/gpus``."""
    NOT_AVAILABLE = "AssignedGpusNotAvailable"
    """The kubelet cannot offer the GPUs the pod was bound to (held by another pod, unhealthy),
    or the probe has since judged one Unschedulable (it takes no new work)."""
    RESERVED = "ReservedByGpusched"
    """A pod gpusched did not place asks for GPUs the extender reserved for another pod."""
    NO_NEW_WORK = "GpuTakesNoNewWork"
    """A pod gpusched did not place would get a GPU the probe judged Unschedulable (e.g. a row
    remap pending): running pods keep such a GPU, new pods get none."""
    MALFORMED = "MalformedAssignment"
    """The pod's ``gpusched.io/gpus`` cannot be read, or names another number of GPUs than the
    pod requests (not a set the extender wrote)."""
    CONFLICT = "AssignmentConflict"
    """Another live pod on the node was bound to some of the same GPUs first: two pods never
    share a GPU, and the older binding holds."""


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    """One container's request for the plugin's resource."""

    name: str
    gpus: int
    init: bool = False
    """A classic (non-restartable) init container: the kubelet's PodResources does not list it."""


@dataclass(frozen=True, slots=True)
class PodGpus:
    """What the node agent needs of a pod bound to its node."""

    namespace: str
    name: str
    uid: str = ""
    containers: tuple[ContainerGpus, ...] = ()
    assigned: tuple[str, ...] | None = None
    """``gpusched.io/gpus`` in annotation order; None when the pod carries none."""
    assignment_error: str | None = None
    """Why ``gpusched.io/gpus`` is unusable, when it is present but malformed."""
    live: bool = True
    """Not in a terminal phase."""
    deleting: bool = False
    """Has a deletionTimestamp: it keeps what it holds until it ends, but is admitted no more."""
    started: bool = False
    """The kubelet has recorded the pod's start (``status.startTime``): it was admitted, so its
    classic init containers, which PodResources does not list, got their GPUs."""
    created: str = ""
    """creationTimestamp (RFC 3339 sorts as text): the kubelet admits older pods first."""
    allocated: tuple[str, ...] | None = None
    """``gpusched.io/allocated-gpus`` as last written by the node agent."""
    allocated_by: str | None = None
    """The field manager that last wrote ``gpusched.io/allocated-gpus`` (managed fields), when
    known: anyone but the node agent did not read it from the kubelet."""
    ignored: str | None = None
    """Why a ``gpusched.io/gpus`` on the pod is not believed (it is not for the gpusched
    scheduler, so the extender did not write it): the pod is treated as not placed by
    gpusched."""

    @property
    def key(self) -> str:
        """``namespace/name``, the only identity the kubelet's PodResources gives."""
        return f"{self.namespace}/{self.name}"

    @property
    def requests_gpus(self) -> bool:
        """Whether any container asks for the resource."""
        return any(c.gpus > 0 for c in self.containers)

    @property
    def gpusched_placed(self) -> bool:
        """Whether the extender chose this pod's GPUs (it carries an assignment)."""
        return self.assigned is not None or self.assignment_error is not None


@dataclass(frozen=True, slots=True)
class KubeletPod:
    """A pod as the kubelet's PodResources ``List`` shows it: devices of the plugin's resource
    per listed container (classic init containers are not listed)."""

    namespace: str
    name: str
    devices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def held(self) -> frozenset[str]:
        """Every device of the resource its containers hold."""
        return frozenset().union(*self.devices.values()) if self.devices else frozenset()


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """One GPU of the node, as the device probe published it."""

    uuid: str
    index: int
    numa_node: int | None = None
    healthy: bool = True
    """False when the probe judged it Unhealthy (or it is MIG-split): never offered."""
    state: GpuHealthState = GpuHealthState.HEALTHY
    """The probe's judgement. An Unschedulable GPU is healthy to the kubelet (running pods keep
    it) but takes no new work: the node agent gives it to no new pod, as the extender places
    none on it."""

    @property
    def takes_new_work(self) -> bool:
        """Whether a pod being admitted may get it."""
        return self.healthy and self.state is not GpuHealthState.UNSCHEDULABLE


@dataclass(frozen=True, slots=True)
class NodeState:
    """A snapshot of one node: its GPUs, the pods bound to it, the kubelet's holdings."""

    node: str
    pods: Mapping[str, PodGpus]
    """Pods bound to the node per the API server, by ``namespace/name``."""
    kubelet: Mapping[str, KubeletPod] | None
    """The kubelet's PodResources view by ``namespace/name``; None when unreadable."""
    gpus: Sequence[GpuEntry] = ()

    def describe(self, devices: Iterable[str]) -> str:
        """``GPU 3 (GPU-ab12...), GPU 5 (...)``: indices where known, in index order."""
        index = {g.uuid: g.index for g in self.gpus}
        ordered = sorted(devices, key=lambda d: (index.get(d, 1 << 30), d))
        parts = [f"GPU {index[d]} ({d})" if d in index else d for d in ordered]
        return ", ".join(parts) if parts else "none"

    def holder(self, device: str) -> str | None:
        """The pod the kubelet says holds ``device``."""
        for pod in (self.kubelet or {}).values():
            if device in pod.held:
                return pod.key
        return None

    def owner(self, device: str, *, excluding: str = "") -> PodGpus | None:
        """The live pod whose assignment contains ``device``."""
        for pod in self.pods.values():
            if pod.key != excluding and pod.live and pod.assigned and device in pod.assigned:
                return pod
        return None

    def no_new_work(self) -> frozenset[str]:
        """GPUs the kubelet may offer that no pod being admitted may get (Unschedulable)."""
        return frozenset(g.uuid for g in self.gpus if g.healthy and not g.takes_new_work)

    def reserved(self, *, excluding: str = "") -> frozenset[str]:
        """GPUs the extender assigned to live pods on the node (all but ``excluding``)."""
        out: set[str] = set()
        for pod in self.pods.values():
            if pod.key != excluding and pod.live and pod.assigned:
                out.update(pod.assigned)
        return frozenset(out)


# --- reading pods --------------------------------------------------------------------------


def _count(value: Any) -> int | None:
    """A container's GPU quantity; None when it is not a whole number in ASCII digits."""
    return whole_number(str(value).strip())


def _container_gpus(container: Mapping[str, Any], resource: str, *, init: bool) -> ContainerGpus:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(resource)
    if value is None:
        value = (resources.get("requests") or {}).get(resource)
    gpus = _count(value) if value is not None else 0
    return ContainerGpus(str(container.get("name") or ""), gpus or 0, init=init)


def parse_uuids(value: str | None) -> tuple[str, ...] | None:
    """The UUID list of a ``gpusched.io/gpus``-style annotation, None when absent or empty."""
    if not value:
        return None
    parts = tuple(part.strip() for part in value.split(","))
    return parts if all(parts) else None


def pod_gpus(pod: Mapping[str, Any], resource: str = keys.GPU_RESOURCE) -> PodGpus:
    """The node agent's view of an API pod (a dict as the API server sends it)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    containers = [
        _container_gpus(c, resource, init=c.get("restartPolicy") != "Always")
        for c in spec.get("initContainers") or []
    ]
    containers += [_container_gpus(c, resource, init=False) for c in spec.get("containers") or []]
    raw = annotations.get(keys.ANNOTATION_GPUS)
    ignored = None
    if raw is not None and spec.get("schedulerName") != keys.SCHEDULER_NAME:
        # Only the extender writes this key, and only on pods for the gpusched scheduler.
        ignored = (
            f"annotation {keys.ANNOTATION_GPUS} on a pod gpusched did not schedule (schedulerName "
            f"{spec.get('schedulerName') or 'default-scheduler'}) is not believed"
        )
        raw = None
    assigned = parse_uuids(raw)
    error = None
    requested = _effective_request(containers, spec.get("initContainers") or [])
    if raw is not None and assigned is None:
        error = f"annotation {keys.ANNOTATION_GPUS}={raw!r} is not a list of GPU UUIDs"
    elif assigned is not None and len(set(assigned)) != len(assigned):
        error = f"annotation {keys.ANNOTATION_GPUS}={raw!r} names a GPU twice"
        assigned = None
    elif assigned is not None and len(assigned) != requested:
        error = (
            f"annotation {keys.ANNOTATION_GPUS} names {len(assigned)} GPU(s) but the pod requests "
            f"{requested}: not a set the extender wrote"
        )
        assigned = None
    phase = (pod.get("status") or {}).get("phase")
    return PodGpus(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        containers=tuple(containers),
        assigned=assigned,
        assignment_error=error,
        live=phase not in TERMINAL_PHASES,
        deleting=bool(meta.get("deletionTimestamp")),
        started=bool((pod.get("status") or {}).get("startTime")),
        created=str(meta.get("creationTimestamp") or ""),
        allocated=parse_uuids(annotations.get(keys.ANNOTATION_ALLOCATED_GPUS)),
        allocated_by=_manager_of(meta, keys.ANNOTATION_ALLOCATED_GPUS),
        ignored=ignored,
    )


def _manager_of(meta: Mapping[str, Any], annotation: str) -> str | None:
    """The field manager whose entry in ``managedFields`` owns ``annotation``, if any."""
    for entry in meta.get("managedFields") or []:
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations")
        if isinstance(fields, Mapping) and f"f:{annotation}" in fields:
            return str(entry.get("manager") or "")
    return None


def _effective_request(containers: Sequence[ContainerGpus], init_specs: Sequence[Any]) -> int:
    """The pod's GPUs by Kubernetes' rule: regular containers plus sidecars, or the peak while
    init containers run beside the sidecars started before them (``containers`` lists the init
    containers first, in order)."""
    inits = containers[: len(init_specs)]
    sidecars = 0
    peak = 0
    for container in inits:
        if container.init:
            peak = max(peak, sidecars + container.gpus)
        else:
            sidecars += container.gpus
            peak = max(peak, sidecars)
    regular = sum(c.gpus for c in containers[len(init_specs) :])
    return max(regular + sidecars, peak)


def node_gpus(spec: NodeGpuTopologySpec, status: NodeGpuTopologyStatus | None) -> list[GpuEntry]:
    """The devices to advertise, from the probe's NodeGpuTopology: one per GPU UUID, unhealthy
    when the probe judged it Unhealthy or it is MIG-split (not allocatable as a whole GPU).
    Degraded and Unschedulable GPUs stay healthy to the kubelet, so running pods keep them; each
    entry keeps the probe's state, because an Unschedulable GPU must still go to no new pod."""
    health = {g.index: g.state for g in (status.gpus if status is not None else [])}
    return [
        GpuEntry(
            uuid=gpu.uuid,
            index=gpu.index,
            numa_node=gpu.numa_node,
            healthy=health.get(gpu.index) is not GpuHealthState.UNHEALTHY and not gpu.mig_enabled,
            state=health.get(gpu.index, GpuHealthState.HEALTHY),
        )
        for gpu in sorted(spec.gpus, key=lambda g: g.index)
    ]


# --- who is being admitted -----------------------------------------------------------------


def waiting_containers(pod: PodGpus, seen: KubeletPod) -> list[ContainerGpus]:
    """The pod's GPU containers that hold no device yet.

    A listed container waits while it holds nothing. PodResources never lists a classic init
    container, but the kubelet allocates init containers before any other: one counts as
    waiting while none of the pod's listed containers holds a device and the kubelet has not
    started the pod (a pod whose only GPU user is an init container would never be seen
    admitted otherwise)."""
    unstarted = not pod.started and not seen.held
    return [
        c
        for c in pod.containers
        if c.gpus > 0 and (unstarted if c.init else not seen.devices.get(c.name))
    ]


def _surely_waiting(pod: PodGpus, seen: KubeletPod) -> bool:
    """Whether a listed container of the pod waits. A pod whose only waiting containers are
    init containers may already be admitted: its start is recorded only after admission, so
    until then it looks the same."""
    return any(not c.init for c in waiting_containers(pod, seen))


@dataclass(frozen=True, slots=True)
class Admission:
    """Who the kubelet is admitting, as far as the snapshot tells."""

    pods: tuple[PodGpus, ...]
    """Known pods with a GPU container that holds nothing yet: those that surely wait, oldest
    first, then those that may already be admitted (only init containers waiting), oldest
    first."""
    gone: tuple[str, ...]
    """Pods the kubelet lists without any device that the API no longer has."""


def admitting(state: NodeState) -> Admission:
    """The pods the kubelet is admitting right now (normally exactly one).

    The kubelet admits one pod at a time, so a pod that surely waits goes before one that only
    may (an init-only pod admitted a moment ago, its start not yet recorded): the latter would
    otherwise be taken for the pod admitted right after it."""
    pods: list[tuple[bool, PodGpus]] = []
    gone: list[str] = []
    for key, seen in sorted((state.kubelet or {}).items()):
        pod = state.pods.get(key)
        if pod is None or (pod.deleting and pod.live and waiting_containers(pod, seen)):
            if not seen.held:
                gone.append(key)
            continue
        if pod.live and waiting_containers(pod, seen):
            pods.append((not _surely_waiting(pod, seen), pod))
    pods.sort(key=lambda entry: (entry[0], entry[1].created, entry[1].key))
    return Admission(tuple(pod for _, pod in pods), tuple(gone))


# --- the two calls -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one device-plugin call."""

    pod: str | None
    """The pod the call was tied to, when known."""
    devices: tuple[str, ...] = ()
    """Preferred devices (GetPreferredAllocation); the accepted ones (Allocate)."""
    reason: RefusalReason | None = None
    message: str = ""
    placed_by_gpusched: bool = True

    @property
    def ok(self) -> bool:
        """Whether the call succeeds."""
        return self.reason is None


def _refuse(reason: RefusalReason, message: str, pod: str | None = None) -> Verdict:
    return Verdict(pod=pod, reason=reason, message=message)


def _unidentified(state: NodeState, admission: Admission) -> Verdict:
    if admission.gone:
        names = ", ".join(admission.gone)
        return _refuse(
            RefusalReason.POD_GONE,
            f"pod {names} being admitted was deleted after it was bound (it is gone from the "
            "API server or terminating); it gets no GPUs",
            admission.gone[0],
        )
    return _refuse(
        RefusalReason.NO_ADMITTING_POD,
        f"the kubelet on {state.node} lists no pod waiting for GPUs, so these devices cannot be "
        "tied to a pod",
    )


def _held_by_siblings(pod: PodGpus, state: NodeState) -> frozenset[str]:
    seen = (state.kubelet or {}).get(pod.key)
    return seen.held if seen is not None else frozenset()


def _not_available(pod: PodGpus, missing: Iterable[str], state: NodeState) -> str:
    reasons = []
    unhealthy = {g.uuid for g in state.gpus if not g.healthy}
    no_new_work = state.no_new_work()
    index = {g.uuid: g.index for g in state.gpus}
    for device in sorted(missing, key=lambda d: (index.get(d, 1 << 30), d)):
        holder = state.holder(device)
        if holder is not None:
            why = f"held by pod {holder}"
        elif device in unhealthy:
            why = "unhealthy"
        elif device in no_new_work:
            why = "Unschedulable (it takes no new work)"
        elif device not in {g.uuid for g in state.gpus}:
            why = "not a GPU of this node"
        else:
            why = "not offered by the kubelet"
        reasons.append(f"{state.describe([device])} is {why}")
    return (
        f"pod {pod.key} is bound to {state.describe(pod.assigned or ())} ({keys.ANNOTATION_GPUS}) "
        f"but {'; '.join(reasons)}"
    )


def _choose_for_pod(
    pod: PodGpus,
    state: NodeState,
    available: frozenset[str],
    must_include: Sequence[str],
    size: int,
) -> Verdict:
    if pod.assignment_error is not None:
        return _refuse(RefusalReason.MALFORMED, f"pod {pod.key}: {pod.assignment_error}", pod.key)
    if pod.assigned is None:
        return _choose_unplaced(pod, state, available, must_include, size)
    conflict = _conflict(pod, state)
    if conflict is not None:
        return conflict
    held = _held_by_siblings(pod, state)
    wanted = [g for g in pod.assigned if g not in held]
    foreign = [d for d in must_include if d not in wanted]
    if foreign:
        return _refuse(
            RefusalReason.MISMATCH,
            f"the kubelet insists on {state.describe(foreign)} for pod {pod.key}, which is bound "
            f"to {state.describe(pod.assigned)} ({keys.ANNOTATION_GPUS})",
            pod.key,
        )
    # A GPU judged Unschedulable since the bind refuses the whole pod at once, not only the
    # container that would get it.
    stopped = state.no_new_work()
    usable = [g for g in wanted if g in available and g not in stopped]
    if len(usable) < size or stopped & set(wanted):
        missing = [g for g in wanted if g not in usable]
        return _refuse(RefusalReason.NOT_AVAILABLE, _not_available(pod, missing, state), pod.key)
    chosen = list(must_include) + [g for g in usable if g not in must_include]
    return Verdict(pod=pod.key, devices=tuple(chosen[:size]))


def _conflict(pod: PodGpus, state: NodeState) -> Verdict | None:
    """A refusal when another live pod on the node was bound to some of ``pod``'s GPUs first.

    The extender never gives two live pods one GPU, so two claims on one GPU mean one of them
    was not the extender's (a pod created with ``nodeName`` and a copied annotation, say); the
    older binding is the one the extender made, and it keeps the GPU."""
    mine = set(pod.assigned or ())
    clashes = [
        f"{state.describe(sorted(mine & set(other.assigned)))} to pod {other.key}"
        for other in sorted(state.pods.values(), key=lambda o: (o.created, o.key))
        if other.key != pod.key
        and other.live
        and not other.deleting  # leaving: the kubelet's own holdings speak for it
        and other.assigned
        and (other.created, other.key) < (pod.created, pod.key)
        and mine & set(other.assigned)
    ]
    if not clashes:
        return None
    return _refuse(
        RefusalReason.CONFLICT,
        f"pod {pod.key} claims GPUs that older pods were bound to ({'; '.join(clashes)}); two "
        "pods never share a GPU, so it gets none",
        pod.key,
    )


def _choose_unplaced(
    pod: PodGpus,
    state: NodeState,
    available: frozenset[str],
    must_include: Sequence[str],
    size: int,
) -> Verdict:
    """A pod gpusched did not place gets GPUs nobody else was assigned and that take new work,
    those placement is least likely to choose first (:func:`_placement_avoids`)."""
    reserved = state.reserved(excluding=pod.key)
    stopped = state.no_new_work()
    clash = [d for d in must_include if d in reserved]
    if clash:
        return _refuse(RefusalReason.RESERVED, _reserved_message(pod, clash, state), pod.key)
    if stopped & set(must_include):
        return _no_new_work(pod, stopped & set(must_include), state)
    free = _placement_avoids(
        state, (d for d in available if d not in reserved and d not in stopped)
    )
    chosen = list(must_include) + [d for d in free if d not in must_include]
    if len(chosen) < size:
        return _too_few_unplaced(pod, state, available, size, len(chosen))
    return Verdict(pod=pod.key, devices=tuple(chosen[:size]), placed_by_gpusched=False)


def _placement_avoids(state: NodeState, devices: Iterable[str]) -> list[str]:
    """``devices`` in the order placement is least likely to choose them: Degraded GPUs first,
    then from the highest index down (:func:`gpusched.core.podgpus.unplaced_order`, the
    order the extender assumes for them too).

    The extender learns which GPUs a pod it did not place holds only once the node agent has
    written ``gpusched.io/allocated-gpu-indices``; until then it knows their number alone and
    places as if any GPU were free. Placement avoids Degraded GPUs and breaks ties towards the
    lowest indices (:mod:`gpusched.core.objective`), so a gpusched pod bound in that window
    lands on the GPUs at the other end rather than on the foreign pod's, where the kubelet would
    refuse it. Devices the node does not know come last."""
    entries = {g.uuid: g for g in state.gpus}
    known = [d for d in devices if d in entries]
    unknown = sorted(d for d in devices if d not in entries)
    by_index = {entries[d].index: d for d in known}
    degraded = {entries[d].index for d in known if entries[d].state is GpuHealthState.DEGRADED}
    return [by_index[i] for i in unplaced_order(by_index, degraded)] + unknown


def _too_few_unplaced(
    pod: PodGpus, state: NodeState, available: frozenset[str], size: int, usable: int
) -> Verdict:
    """Why a pod gpusched did not place cannot have ``size`` GPUs: reservations when they are
    in the way, otherwise GPUs that take no new work."""
    taken = sorted(d for d in available if d in state.reserved(excluding=pod.key))
    if not taken:
        return _no_new_work(pod, available & state.no_new_work(), state)
    return _refuse(
        RefusalReason.RESERVED,
        f"pod {pod.key} (not placed by gpusched) needs {size} GPU(s) but only {usable} free "
        "one(s) are neither reserved by gpusched nor Unschedulable; "
        + _reserved_message(pod, taken, state),
        pod.key,
    )


def _no_new_work(pod: PodGpus, devices: Iterable[str], state: NodeState) -> Verdict:
    return _refuse(
        RefusalReason.NO_NEW_WORK,
        f"pod {pod.key} (not placed by gpusched) would get {state.describe(devices)}, which the "
        "device probe judged Unschedulable: it takes no new work",
        pod.key,
    )


def _reserved_message(pod: PodGpus, devices: Iterable[str], state: NodeState) -> str:
    owners = []
    for device in devices:
        owner = state.owner(device, excluding=pod.key)
        owners.append(
            f"{state.describe([device])} is reserved for pod {owner.key if owner else '?'}"
        )
    return "; ".join(owners)


def preferred_allocation(
    state: NodeState, available: Iterable[str], must_include: Sequence[str], size: int
) -> Verdict:
    """The answer to ``GetPreferredAllocation`` for one container request.

    The pod being admitted gets its own annotated GPUs (never another's); a pod gpusched did not
    place gets free GPUs that no gpusched pod was assigned. A refusal fails the pod's admission
    with the message, which is what the kubelet would otherwise be led into by Allocate.
    """
    if state.kubelet is None:
        return _refuse(
            RefusalReason.NO_POD_RESOURCES,
            "the kubelet's PodResources API is unreadable, so the pod being admitted cannot be "
            "identified",
        )
    offered = frozenset(available) | frozenset(must_include)
    admission = admitting(state)
    candidates = [
        p
        for p in admission.pods
        if any(c.gpus == size for c in waiting_containers(p, state.kubelet[p.key]))
    ] or list(admission.pods)
    if not candidates:
        return _unidentified(state, admission)
    if len(candidates) > 1:
        fitting = [p for p in candidates if p.assigned is not None and set(p.assigned) & offered]
        candidates = fitting or candidates
    return _choose_for_pod(candidates[0], state, offered, must_include, size)


def verify_allocation(state: NodeState, devices: Iterable[str]) -> Verdict:
    """The verdict on ``Allocate`` of ``devices`` for one container.

    Accepted when the kubelet is admitting a pod whose ``gpusched.io/gpus`` contains every device
    and whose other containers do not hold them, or when the oldest waiting pod is one gpusched
    did not place and the devices include no GPU assigned to a gpusched pod. Anything else is
    refused with a sentence naming the pods and GPUs involved.
    """
    requested = frozenset(devices)
    if state.kubelet is None:
        return _refuse(
            RefusalReason.NO_POD_RESOURCES,
            "the kubelet's PodResources API is unreadable, so the pod being admitted cannot be "
            "identified; refusing rather than risk handing out another pod's GPUs",
        )
    admission = admitting(state)
    if not admission.pods:
        return _unidentified(state, admission)
    stopped = sorted(requested & state.no_new_work())
    for pod in admission.pods:
        if pod.assigned is not None and requested <= set(pod.assigned):
            if requested & _held_by_siblings(pod, state):
                continue
            conflict = _conflict(pod, state)
            if conflict is not None:
                return conflict
            if stopped:
                return _refuse(
                    RefusalReason.NOT_AVAILABLE, _not_available(pod, stopped, state), pod.key
                )
            return Verdict(pod=pod.key, devices=tuple(sorted(requested)))
    # No waiting pod's assignment holds the set, so it can only be for the pod the kubelet
    # admits first (the oldest waiting, as in preferred_allocation), and only if gpusched did
    # not place that pod; a younger pod gpusched did not place is not who the kubelet admits.
    pod = admission.pods[0]
    if len(admission.pods) == 1 and pod.assignment_error is not None:
        return _refuse(RefusalReason.MALFORMED, f"pod {pod.key}: {pod.assignment_error}", pod.key)
    if not pod.gpusched_placed:
        clash = sorted(requested & state.reserved(excluding=pod.key))
        if not clash and stopped:
            return _no_new_work(pod, stopped, state)
        if not clash:
            return Verdict(pod=pod.key, devices=tuple(sorted(requested)), placed_by_gpusched=False)
        if len(admission.pods) == 1:
            return _refuse(
                RefusalReason.RESERVED,
                f"pod {pod.key} was not placed by gpusched and asks for GPUs reserved for "
                f"others: {_reserved_message(pod, clash, state)}",
                pod.key,
            )
    if len(admission.pods) > 1:
        names = ", ".join(p.key for p in admission.pods)
        return _refuse(
            RefusalReason.AMBIGUOUS,
            f"pods {names} all wait for GPUs and {state.describe(requested)} belongs to none of "
            "them",
        )
    owner = next((state.owner(d) for d in sorted(requested) if state.owner(d)), None)
    whose = f"; they are assigned to pod {owner.key}" if owner is not None else ""
    return _refuse(
        RefusalReason.MISMATCH,
        f"the kubelet passed {state.describe(requested)} for pod {pod.key}, which is bound to "
        f"{state.describe(pod.assigned or ())} ({keys.ANNOTATION_GPUS}){whose}",
        pod.key,
    )


# --- drift ---------------------------------------------------------------------------------


class DriftKind(StrEnum):
    """How a pod's real GPUs differ from what gpusched decided."""

    OUTSIDE_ASSIGNMENT = "OutsideAssignment"
    """A gpusched pod's containers hold GPUs that are not in its ``gpusched.io/gpus``."""
    INCOMPLETE = "Incomplete"
    """A gpusched pod, fully admitted, holds fewer GPUs than its listed containers ask for."""
    TAKES_RESERVED = "TakesReserved"
    """A pod gpusched did not place holds GPUs assigned to a gpusched pod."""


@dataclass(frozen=True, slots=True)
class Drift:
    """One pod whose real GPUs differ from gpusched's decision."""

    pod: str
    kind: DriftKind
    held: tuple[str, ...]
    assigned: tuple[str, ...]
    message: str


@dataclass(frozen=True, slots=True)
class DriftReport:
    """What the kubelet's PodResources say against the annotations."""

    drifts: tuple[Drift, ...]
    allocated: Mapping[str, tuple[str, ...]]
    """For every pod the kubelet lists with GPUs: what it really holds, in index order."""
    checked: int
    """Pods compared."""


def _expected_held(pod: PodGpus) -> int:
    """How many of its assigned GPUs an admitted pod's listed containers (regular ones and
    sidecars) hold: all of them, unless a classic init container needed more than those ask
    for. PodResources does not list init containers, and the containers after one reuse only
    as many of its GPUs as they ask for."""
    assigned = len(pod.assigned or ())
    if not any(c.init and c.gpus for c in pod.containers):
        return assigned
    return min(assigned, sum(c.gpus for c in pod.containers if not c.init))


def check_drift(state: NodeState) -> DriftReport:
    """Compare every pod the kubelet lists with the extender's assignments."""
    if state.kubelet is None:
        return DriftReport((), {}, 0)
    order = {g.uuid: g.index for g in state.gpus}
    drifts: list[Drift] = []
    allocated: dict[str, tuple[str, ...]] = {}
    checked = 0
    for key, seen in sorted(state.kubelet.items()):
        pod = state.pods.get(key)
        if pod is None or not pod.live:
            continue
        held = seen.held
        if held:
            allocated[key] = tuple(sorted(held, key=lambda d: (order.get(d, 1 << 30), d)))
        if not held and not pod.gpusched_placed:
            continue
        checked += 1
        if pod.assigned is not None:
            assigned = set(pod.assigned)
            outside = held - assigned
            if outside:
                drifts.append(
                    Drift(
                        key,
                        DriftKind.OUTSIDE_ASSIGNMENT,
                        allocated.get(key, ()),
                        pod.assigned,
                        f"pod {key} holds {state.describe(outside)} outside its assigned "
                        f"{state.describe(pod.assigned)} ({keys.ANNOTATION_GPUS})",
                    )
                )
            elif held and len(held) < _expected_held(pod) and not waiting_containers(pod, seen):
                drifts.append(
                    Drift(
                        key,
                        DriftKind.INCOMPLETE,
                        allocated.get(key, ()),
                        pod.assigned,
                        f"pod {key} holds {state.describe(held)} but was assigned "
                        f"{state.describe(pod.assigned)} ({keys.ANNOTATION_GPUS})",
                    )
                )
            continue
        taken = held & state.reserved(excluding=key)
        if taken:
            drifts.append(
                Drift(
                    key,
                    DriftKind.TAKES_RESERVED,
                    allocated.get(key, ()),
                    (),
                    f"pod {key} (not placed by gpusched) holds GPUs gpusched reserved: "
                    + _reserved_message(pod, sorted(taken), state),
                )
            )
    return DriftReport(tuple(drifts), allocated, checked)


# --- what `gpusched explain` says about a pod ------------------------------------------------


class Enforcement(StrEnum):
    """Whether a pod's containers are known to hold exactly what gpusched decided."""

    CONFIRMED = "Confirmed"
    """The node agent saw the kubelet give the pod exactly its ``gpusched.io/gpus``."""
    DRIFT = "Drift"
    """The kubelet gave the pod other GPUs than its ``gpusched.io/gpus``."""
    UNCONFIRMED = "Unconfirmed"
    """No report from a node agent yet (not admitted yet, or no gpusched plugin on the node)."""
    NOT_PLACED = "NotPlacedByGpusched"
    """The pod carries no assignment; the node agent reports what it holds."""


@dataclass(frozen=True, slots=True)
class EnforcementCheck:
    """The verdict on one pod, with a sentence."""

    state: Enforcement
    message: str


def enforcement(pod: PodGpus) -> EnforcementCheck:
    """Compare a pod's assignment with what the node agent saw it allocated."""
    held = ",".join(pod.allocated) if pod.allocated else "nothing reported"
    if pod.assigned is None:
        return EnforcementCheck(
            Enforcement.NOT_PLACED,
            f"not placed by gpusched; the kubelet gave it {held}",
        )
    if pod.allocated is not None and pod.allocated_by not in (None, keys.FIELD_MANAGER_NODE_AGENT):
        return EnforcementCheck(
            Enforcement.UNCONFIRMED,
            f"{keys.ANNOTATION_ALLOCATED_GPUS} was written by {pod.allocated_by!r}, not by "
            "gpusched's node agent, so it says nothing about what the kubelet allocated",
        )
    if pod.allocated is None:
        return EnforcementCheck(
            Enforcement.UNCONFIRMED,
            "no node agent has reported its GPUs yet (not admitted yet, or gpusched's device "
            "plugin does not run on its node)",
        )
    outside = sorted(set(pod.allocated) - set(pod.assigned))
    complete = len(set(pod.allocated) & set(pod.assigned)) >= _expected_held(pod)
    if not outside and complete:
        return EnforcementCheck(
            Enforcement.CONFIRMED, "its containers hold exactly its assigned GPUs"
        )
    missing = [] if complete else sorted(set(pod.assigned) - set(pod.allocated))
    parts = []
    if outside:
        parts.append(f"holds {','.join(outside)} it was not assigned")
    if missing:
        parts.append(f"lacks assigned {','.join(missing)}")
    return EnforcementCheck(
        Enforcement.DRIFT,
        "the kubelet's allocation differs from gpusched's assignment: " + "; ".join(parts),
    )
