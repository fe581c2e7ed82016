"""The extender's decisions: which nodes can host a GPU pod, how good each is, which GPUs to bind.

Pure functions over a snapshot of nodes (:class:`NodeView`); the HTTP service and its watch cache
only build the snapshot and apply the result, so the simulator and the benchmarks run exactly
this code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpusched.api import keys
from gpusched.api.annotations import whole_number
from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core.placement import (
    Placement,
    Policy,
    Refusal,
    RefusalReason,
    evaluate_set,
    place,
)
from gpusched.core.podgpus import controlling_gpujob, planned_for, unplaced_order
from gpusched.core.prepared import PreparedNode
from gpusched.core.ranking import NodeRank, WiringRank, node_rank, wiring_rank

MAX_SCORE: Final = 10

#: Refusals that freeing GPUs (preemption, jobs ending) can resolve.
_RESOLVABLE: Final = frozenset({RefusalReason.NOT_ENOUGH_FREE_GPUS})


class RequestError(ValueError):
    """The pod's GPU request cannot be understood; the message names the offending field."""


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod asks of a node."""

    gpus: int
    """Whole GPUs, from the ``nvidia.com/gpu`` limits of its containers."""
    policy: Policy
    """Topology scope and mode, from the pod's annotations."""
    planned_node: str | None = None
    """Node the operator's admission cycle planned for this pod, if any."""
    planned_gpus: tuple[int, ...] | None = None
    """GPUs admission planned on that node: the gang's placement was checked with them."""
    soft_preferences: bool = False
    """The pod has preferences kube-scheduler's scores weigh (preferred affinity, a
    ScheduleAnyway spread): filter then passes every node tied for the best rank, not one."""


def _quantity(value: Any, where: str) -> int:
    count = whole_number(str(value).strip())
    if count is None:
        raise RequestError(f"{where}: {keys.GPU_RESOURCE} must be a whole number, got {value!r}")
    return count


def _container_gpus(container: Mapping[str, Any], where: str) -> int:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if keys.GPU_RESOURCE in limits:
        return _quantity(limits[keys.GPU_RESOURCE], f"{where}.resources.limits")
    if keys.GPU_RESOURCE in requests:
        return _quantity(requests[keys.GPU_RESOURCE], f"{where}.resources.requests")
    return 0


def gpu_count(pod: Mapping[str, Any]) -> int:
    """GPUs the pod holds while running, by Kubernetes' rule for a pod's effective request: the
    regular containers and the sidecars (restartable init containers) together, or, if more,
    the peak while init containers run one at a time beside the sidecars started before them."""
    spec = pod.get("spec") or {}
    running = sum(
        _container_gpus(c, f"spec.containers[{i}]")
        for i, c in enumerate(spec.get("containers") or [])
    )
    sidecars = 0
    init_peak = 0
    for i, container in enumerate(spec.get("initContainers") or []):
        gpus = _container_gpus(container, f"spec.initContainers[{i}]")
        if container.get("restartPolicy") == "Always":
            sidecars += gpus
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + gpus)
    return max(running + sidecars, init_peak)


def _enum(value: str, kind: type[TopologyScope] | type[TopologyMode], key: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise RequestError(f"annotation {key}={value!r} is not one of {allowed}") from None


def gpu_request(pod: Mapping[str, Any]) -> GpuRequest:
    """The request of a pod; raises :class:`RequestError` naming a malformed field."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    scope = _enum(
        annotations.get(keys.ANNOTATION_TOPOLOGY_SCOPE, TopologyScope.NODE.value),
        TopologyScope,
        keys.ANNOTATION_TOPOLOGY_SCOPE,
    )
    mode = _enum(
        annotations.get(keys.ANNOTATION_TOPOLOGY_MODE, TopologyMode.PREFERRED.value),
        TopologyMode,
        keys.ANNOTATION_TOPOLOGY_MODE,
    )
    gang_size = annotations.get(keys.ANNOTATION_GANG_SIZE, "1")
    gang = whole_number(gang_size)
    if gang is None:
        raise RequestError(f"annotation {keys.ANNOTATION_GANG_SIZE}={gang_size!r} is not a number")
    # Only the operator plans, and only for its GpuJobs' pods: a plan on any other pod is
    # ignored (gpusched.core.podgpus).
    planned_node, planned_gpus = planned_for(pod)
    planned = annotations.get(keys.ANNOTATION_PLANNED_GPU_INDICES)
    if planned and planned_gpus is None and controlling_gpujob(pod) is not None:
        raise RequestError(
            f"annotation {keys.ANNOTATION_PLANNED_GPU_INDICES}={planned!r} is not a list of "
            "distinct GPU indices"
        )
    return GpuRequest(
        gpus=gpu_count(pod),
        planned_gpus=planned_gpus,
        policy=Policy(scope=scope, mode=mode, multi_node=gang > 1),
        planned_node=planned_node,
        soft_preferences=has_soft_preferences(pod),
    )


_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def has_soft_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether the pod states preferences that only kube-scheduler's scores see."""
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        if (affinity.get(kind) or {}).get(_PREFERRED):
            return True
    return any(
        (constraint or {}).get("whenUnsatisfiable") == "ScheduleAnyway"
        for constraint in spec.get("topologySpreadConstraints") or []
    )


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the extender sees it at a moment."""

    name: str
    prepared: PreparedNode | None
    """Wiring and health; None when the node has no NodeGpuTopology yet."""
    busy: frozenset[int] = frozenset()
    """GPU indices held by bound or assumed pods."""
    unaccounted: int = 0
    """GPUs held by pods that carry no GPU assignment (bound by another scheduler): we cannot
    know which, so they only reduce how many of the free GPUs may be used."""
    domains: tuple[str | None, ...] = ()
    """The node's domain at each of the cluster's network levels, narrowest first (None where
    it has none); empty when the cluster lists no levels."""
    state: tuple[object, ...] | None = field(init=False, default=None, compare=False)
    """What every decision about the node depends on (wiring, health, held GPUs): nodes in
    the same state get the same verdict. None without a topology."""
    hardware: tuple[object, ...] | None = field(init=False, default=None, compare=False)
    """The part of ``state`` that does not change with occupancy (wiring and health)."""
    free: int = field(init=False, default=-1, compare=False)
    """Placeable GPUs nobody holds, less the unaccounted ones (-1 without a topology)."""
    bucket: tuple[object, ...] | None = field(init=False, default=None, compare=False)
    """``hardware`` and ``free``: nodes that could offer the same at best."""

    def __post_init__(self) -> None:
        prepared = self.prepared
        if prepared is None:
            return
        hardware = (prepared.wiring.key, prepared.placeable_mask, prepared.degraded_mask)
        free = (prepared.placeable_mask & ~prepared.mask(self.busy)).bit_count()
        object.__setattr__(self, "hardware", hardware)
        object.__setattr__(self, "state", (*hardware, self.busy, self.unaccounted))
        object.__setattr__(self, "free", free - self.unaccounted)
        object.__setattr__(self, "bucket", (hardware, free - self.unaccounted))


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a node can host the request, and with which set (shared by nodes in the same
    state, so it does not name one)."""

    placement: Placement | None
    reason: str | None = None
    """Why not, for FailedNodes: ``<Code>: <sentence>``."""
    resolvable: bool = True
    """Whether freeing GPUs could make the node fit (otherwise FailedAndUnresolvable)."""
    rank: NodeRank | None = None
    """The node's rank for the request (:func:`gpusched.core.ranking.node_rank`)."""


def _sentence(refusal: Refusal, k: int) -> str:
    """A reason that reads the same on every node it applies to: kube-scheduler folds equal
    reasons into one line of the pod's FailedScheduling event ("600 NotEnoughFreeGpus: ...");
    per-node detail is in ``gpusched explain`` and the extender's debug log."""
    gpus = "GPU" if k == 1 else "GPUs"
    match refusal.reason:
        case RefusalReason.REQUEST_EXCEEDS_NODE:
            return f"node has fewer than {k} {gpus}"
        case RefusalReason.NOT_ENOUGH_HEALTHY_GPUS:
            return f"fewer than {k} healthy {gpus}"
        case RefusalReason.NOT_ENOUGH_FREE_GPUS:
            return f"fewer than {k} free {gpus}"
        case RefusalReason.SCOPE_UNSATISFIABLE:
            return f"no {k} free {gpus} meet scope {refusal.policy.describe()}"
        case _:
            return refusal.reasons[0]


def _refused(view: NodeView, request: GpuRequest, refusal: Refusal) -> Verdict:
    resolvable = refusal.reason in _RESOLVABLE
    if refusal.reason is RefusalReason.SCOPE_UNSATISFIABLE and view.prepared is not None:
        # Would the node satisfy the scope with nothing running? Then preemption could help.
        empty = place(view.prepared, request.gpus, request.policy)
        resolvable = empty.ok
    reason = f"{refusal.reason.value}: {_sentence(refusal, request.gpus)}"
    return Verdict(None, reason, resolvable=resolvable)


def evaluate(view: NodeView, request: GpuRequest) -> Verdict:
    """Best set for ``request`` on one node, or why there is none."""
    if view.prepared is None:
        return Verdict(
            None,
            "NoTopology: node has no NodeGpuTopology (is the gpusched device probe running?)",
            resolvable=False,
        )
    planned = _planned_set(view, request)
    busy = view.busy | foreign_guess(view) if view.unaccounted else view.busy
    result = planned or place(view.prepared, request.gpus, request.policy, busy=busy)
    if isinstance(result, Refusal):
        return _refused(view, request, result)
    if view.unaccounted:
        free = bin(view.prepared.placeable_mask & ~view.prepared.mask(view.busy)).count("1")
        if free - view.unaccounted < request.gpus:
            return Verdict(
                None,
                f"{RefusalReason.NOT_ENOUGH_FREE_GPUS.value}: fewer than {request.gpus} free "
                "GPUs (some are held by pods gpusched did not place)",
            )
    return Verdict(result, rank=node_rank(result, unaccounted=view.unaccounted))


def foreign_guess(view: NodeView) -> frozenset[int]:
    """The GPUs that pods gpusched did not place are taken to hold while their assignment is
    not known yet: the ones the node agent hands such pods (Degraded first, then from the
    highest index down, :func:`gpusched.core.podgpus.unplaced_order`), so a set placed in the
    meantime avoids them."""
    prepared = view.prepared
    if prepared is None or not view.unaccounted:
        return frozenset()
    free = prepared.indices(prepared.placeable_mask & ~prepared.mask(view.busy))
    degraded = set(prepared.indices(prepared.degraded_mask))
    return frozenset(unplaced_order(free, degraded)[: view.unaccounted])


def _planned_set(view: NodeView, request: GpuRequest) -> Placement | None:
    """The set admission planned, when this is its node and the set is still free and whole;
    otherwise None, and the engine chooses afresh (the plan was only a reservation)."""
    planned = request.planned_gpus
    if view.prepared is None or view.name != request.planned_node or planned is None:
        return None
    # Distinct indices: a repeated one would make the bind write fewer GPUs than requested.
    if len(set(planned)) != len(planned) or len(planned) != request.gpus:
        return None
    if not set(planned) <= set(view.prepared.wiring.indices):
        return None
    try:
        placement = evaluate_set(view.prepared, planned, request.policy, busy=view.busy)
    except ValueError:
        return None  # some planned GPU is taken or no longer healthy
    if request.policy.required and not placement.scope_satisfied:
        return None
    return placement


def evaluate_all(views: Iterable[NodeView], request: GpuRequest) -> dict[str, Verdict]:
    """Verdicts of many nodes, deciding once per distinct node state: a large cluster has
    thousands of nodes but only dozens of (wiring, health, occupancy) combinations."""
    memo: dict[object, Verdict] = {}
    verdicts: dict[str, Verdict] = {}
    for view in views:
        state = view.state
        if state is None or view.name == request.planned_node:
            verdicts[view.name] = evaluate(view, request)
            continue
        verdict = memo.get(state)
        if verdict is None:
            verdict = memo[state] = evaluate(view, request)
        verdicts[view.name] = verdict
    return verdicts


def _ceiling(view: NodeView, request: GpuRequest) -> WiringRank | None:
    """The best wiring the node could give the request with all its GPUs free (memoised per
    wiring and health by the placement engine); None if it never could."""
    assert view.prepared is not None
    result = place(view.prepared, request.gpus, request.policy)
    return wiring_rank(result) if isinstance(result, Placement) else None


def first_ranked(views: Iterable[NodeView], request: GpuRequest) -> dict[str, Verdict]:
    """The nodes ranked first for the request (one, unless several share the best rank),
    with their verdicts; empty when no node can host it.

    Deciding every node is not needed for that. Node states are visited by what they could
    offer at best, their wiring's rank when idle (:func:`_ceiling`), then fewest free GPUs; the
    visit stops once no remaining state could outrank the best found. On a busy cluster of
    thousands of nodes that is a handful of placements instead of one per distinct state.
    """
    k = request.gpus
    # Views bucketed by hardware and free GPUs: a few dozen buckets however large the cluster;
    # states are told apart only inside the buckets visited.
    buckets: dict[object, list[NodeView]] = {}
    for view in views:
        if view.free >= k:  # (-1 without a topology)
            members = buckets.get(view.bucket)
            if members is None:
                buckets[view.bucket] = [view]
            else:
                members.append(view)
    ceilings: dict[object, WiringRank | None] = {}
    tiers: dict[WiringRank, dict[int, list[list[NodeView]]]] = {}
    for members in buckets.values():
        view = members[0]
        if view.hardware in ceilings:
            ceiling = ceilings[view.hardware]
        else:
            ceiling = ceilings[view.hardware] = _ceiling(view, request)
        if ceiling is not None:
            tiers.setdefault(ceiling, {}).setdefault(view.free, []).append(members)
    best: NodeRank | None = None
    winners: list[tuple[str, Verdict]] = []
    for ceiling in sorted(tiers, reverse=True):
        by_free = tiers[ceiling]
        for free in sorted(by_free):
            if best is not None and (ceiling, k - free) < (best.wiring, best.fuller):
                return dict(winners)
            for members in by_free[free]:
                states: dict[object, list[NodeView]] = {}
                for view in members:
                    states.setdefault(view.state, []).append(view)
                for same in states.values():
                    verdict = evaluate(same[0], request)
                    rank = verdict.rank
                    if rank is None:
                        continue
                    if best is None or rank > best:
                        best, winners = rank, []
                    if rank == best:
                        winners.extend((view.name, verdict) for view in same)
    return dict(winners)


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """Filter verdicts split the way the extender protocol reports them."""

    fits: tuple[str, ...]
    """What kube-scheduler may choose from: the planned node, else the best-ranked node (every
    node tied for the best rank when the pod has soft preferences)."""
    failed: dict[str, str]
    """Refused nodes whose refusal freeing GPUs could resolve (only when nothing fits)."""
    unresolvable: dict[str, str]
    """Refused nodes nothing but a change of the node can make fit (only when nothing fits)."""
    verdicts: dict[str, Verdict]
    """Verdicts of the nodes in ``fits``, or of every node when nothing fits."""


def filter_nodes(views: Iterable[NodeView], request: GpuRequest) -> FilterOutcome:
    """Nodes that can host the request, narrowed to the one the shared ranking puts first.

    Passing a single node makes kube-scheduler's choice the ranking's (it skips scoring when one
    node is left), so the extender's choice and the operator's plan agree. When the operator
    planned a node for the pod and it fits, only that node passes: admission reserved those
    GPUs for this gang. Per-node reasons are worked out only when no node fits: kube-scheduler
    reads them only to explain an unschedulable pod.
    """
    views = list(views)
    planned = request.planned_node
    if planned is not None:
        for view in views:
            if view.name == planned:
                verdict = evaluate(view, request)
                if verdict.placement is not None:
                    return FilterOutcome((planned,), {}, {}, {planned: verdict})
                break
    first = first_ranked(views, request)
    if first:
        names = sorted(first)
        fits = tuple(names) if request.soft_preferences else (fullest_first(names, views),)
        return FilterOutcome(fits, {}, {}, {name: first[name] for name in fits})
    verdicts = evaluate_all(views, request)
    failed = {
        n: v.reason or "" for n, v in verdicts.items() if v.placement is None and v.resolvable
    }
    unresolvable = {
        n: v.reason or "" for n, v in verdicts.items() if v.placement is None and not v.resolvable
    }
    return FilterOutcome((), failed, unresolvable, verdicts)


def fullest_first(names: Sequence[str], views: Sequence[NodeView]) -> str:
    """Of nodes ranked equal (``names``, sorted), the one whose network domains have the fewest
    free GPUs among ``views``, narrowest level first, then the lowest name: the admission
    cycle's own tie-break (:meth:`gpusched.core.admission.pool.Pool.fullness`), so GPU pods fill
    partly used cliques, racks and leaves and the roomiest stay whole for gangs. A node outside
    a level's domains goes first there."""
    # Every view has domains when the cluster lists levels, none otherwise: one tells.
    if len(names) == 1 or not views or not views[0].domains:
        return names[0]
    free: dict[tuple[int, str], int] = {}
    by_name: dict[str, NodeView] = {}
    for view in views:
        by_name[view.name] = view
        for level, value in enumerate(view.domains):
            if value is not None:
                free[(level, value)] = free.get((level, value), 0) + max(view.free, 0)

    def fullness(name: str) -> tuple[tuple[int, ...], str]:
        domains = by_name[name].domains
        return (
            tuple(
                -1 if value is None else free[(level, value)] for level, value in enumerate(domains)
            ),
            name,
        )

    return min(names, key=fullness)


def prioritize(views: Iterable[NodeView], request: GpuRequest) -> dict[str, int]:
    """Priority of every candidate node; nodes that cannot host the request score 0."""
    return priorities(evaluate_all(views, request))


def priorities(verdicts: Mapping[str, Verdict]) -> dict[str, int]:
    """Priority per node from verdicts already computed (filter's, for the same pod): the
    shared ranking folded into kube-scheduler's 1..10, the best rank getting 10 and each lower
    distinct rank one less (never below 1); nodes that cannot host the request get 0."""
    distinct = sorted({v.rank for v in verdicts.values() if v.rank is not None}, reverse=True)
    level = {rank: max(1, MAX_SCORE - i) for i, rank in enumerate(distinct)}
    return {
        name: 0 if verdict.rank is None else level[verdict.rank]
        for name, verdict in verdicts.items()
    }
