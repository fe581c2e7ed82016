"""Choose the GPU set for a request on one node, and say why.

This is the entry point the extender (filter, prioritize, bind), the operator's admission check and
the simulator share::

    node = prepare(NodeTopology.from_api(spec, status))
    result = place(node, 4, Policy(TopologyScope.NVLINK, TopologyMode.REQUIRED), busy={0, 3})
    if result.ok: result.gpus, result.score, result.topology_class, result.reasons
    else:         result.reason (machine code), result.reasons (sentences)

An impossible request is an answer (:class:`Refusal`), never an exception. Results are memoised
per (wiring, health, free GPUs, k, policy): nodes of one hardware type in the same state share
the work, which is what keeps scoring thousands of nodes per pod cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal

from gpusched.api.gpujob import TopologyMode, TopologyPolicy, TopologyScope
from gpusched.core.bandwidth import from_units
from gpusched.core.objective import (
    SOLO_BOTTLENECK,
    Objective,
    SearchContext,
    evaluate,
    float_score,
    fragmentation_share,
    make_context,
    set_class,
)
from gpusched.core.prepared import EXACT_MAX_GPUS, PreparedNode, PreparedWiring
from gpusched.core.search import Found, search
from gpusched.core.topology import indices_to_text

#: Scopes in class-rank order (0 = nvlink ... 3 = node).
SCOPES: Final[tuple[TopologyScope, ...]] = (
    TopologyScope.NVLINK,
    TopologyScope.PCIE_SWITCH,
    TopologyScope.NUMA,
    TopologyScope.NODE,
)
#: NIC proximity points from which a GPU counts as NIC-local (PXB or PIX).
NIC_LOCAL_POINTS: Final = 3

_RANK: Final[dict[TopologyScope, int]] = {scope: rank for rank, scope in enumerate(SCOPES)}

_CLASS_TEXT: Final[dict[TopologyScope, str]] = {
    TopologyScope.NVLINK: "every pair on NVLink",
    TopologyScope.PCIE_SWITCH: "every pair under one PCIe switch tree or on NVLink",
    TopologyScope.NUMA: "no pair crosses the CPU interconnect (one NUMA node)",
    TopologyScope.NODE: "pairs cross the CPU interconnect (SYS)",
}


def scope_rank(scope: TopologyScope) -> int:
    """Class rank of a scope: 0 for nvlink (tightest) to 3 for node."""
    return _RANK[scope]


class RefusalReason(StrEnum):
    """Why a node cannot host a request; CamelCase so it can go into conditions and events."""

    INVALID_REQUEST = "InvalidRequest"
    """The request itself is malformed (fewer than one GPU)."""
    REQUEST_EXCEEDS_NODE = "RequestExceedsNode"
    """More GPUs than the node has at all."""
    NOT_ENOUGH_HEALTHY_GPUS = "NotEnoughHealthyGpus"
    """More GPUs than the node has placeable (Healthy or Degraded, not MIG)."""
    NOT_ENOUGH_FREE_GPUS = "NotEnoughFreeGpus"
    """Enough placeable GPUs, but too many are in use."""
    SCOPE_UNSATISFIABLE = "ScopeUnsatisfiable"
    """Enough free GPUs, but no set of them meets the required topology scope."""


@dataclass(frozen=True, slots=True)
class Policy:
    """How tightly the set must be wired, and what it will be used for."""

    scope: TopologyScope = TopologyScope.NODE
    mode: TopologyMode = TopologyMode.PREFERRED
    multi_node: bool = False
    """The job spans nodes: NIC proximity of the GPUs then counts (GPUDirect RDMA). Single-node
    jobs ignore it, so they do not take the NIC-local GPUs multi-node jobs need."""
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # Policies key the result memo on every call; hash them once.
        object.__setattr__(self, "_hash", hash((self.scope, self.mode, self.multi_node)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def required(self) -> bool:
        """Whether the scope is a hard constraint."""
        return self.mode is TopologyMode.REQUIRED

    @classmethod
    def from_api(cls, topology: TopologyPolicy, *, replicas: int = 1) -> Policy:
        """The policy of a GpuJob's replica (multi-node when the gang has several replicas)."""
        return cls(scope=topology.scope, mode=topology.mode, multi_node=replicas > 1)

    def describe(self) -> str:
        """``nvlink (required)`` for messages."""
        return f"{self.scope.value} ({self.mode.value})"


DEFAULT_POLICY: Final = Policy()


class _Reasons:
    """Reasons built on first use: prioritize scores thousands of nodes and reads none of them."""

    __slots__ = ("_build", "_value")

    def __init__(self, build: Callable[[], tuple[str, ...]]) -> None:
        self._build: Callable[[], tuple[str, ...]] | None = build
        self._value: tuple[str, ...] | None = None

    def get(self) -> tuple[str, ...]:
        if self._value is None:
            assert self._build is not None
            self._value = self._build()
            self._build = None
        return self._value


def _fixed(reasons: Iterable[str]) -> _Reasons:
    frozen = tuple(reasons)
    return _Reasons(lambda: frozen)


class Placement:
    """The chosen set and everything needed to explain and rank it.

    Read-only. ``gpus``, ``score`` and ``objective`` are computed with the placement; the
    descriptive fields are derived on first access, because prioritize builds thousands of
    placements per pod and reads only their scores.
    """

    __slots__ = ("_ctx", "_lazy", "_positions", "gpus", "objective", "policy", "score", "search")

    gpus: tuple[int, ...]
    """GPU indices, increasing."""
    score: float
    """0..100, higher is better, comparable across nodes (see :func:`float_score`)."""
    objective: Objective
    """The tuple the search maximised (for comparing sets of one request)."""
    policy: Policy
    """The policy the set was chosen under."""
    search: str
    """``exact``, ``heuristic``, or ``given`` for :func:`evaluate_set`."""
    _ctx: SearchContext
    _positions: tuple[int, ...]
    _lazy: dict[str, Any]

    def __init__(self, ctx: SearchContext, found: Found, policy: Policy, search: str) -> None:
        objective, positions = found
        set_ = object.__setattr__
        set_(self, "_ctx", ctx)
        set_(self, "_positions", positions)
        set_(self, "_lazy", {})
        set_(self, "gpus", tuple(ctx.wiring.indices[p] for p in positions))
        set_(self, "objective", objective)
        set_(self, "policy", policy)
        set_(self, "search", search)
        set_(self, "score", float_score(ctx, objective, len(positions)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Placement is read-only (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        return (self.gpus, self.objective, self.policy, self.search) == (
            other.gpus,
            other.objective,
            other.policy,
            other.search,
        )

    def __hash__(self) -> int:
        return hash((self.gpus, self.objective, self.policy, self.search))

    def __repr__(self) -> str:
        return (
            f"Placement(gpus={self.gpus}, score={self.score}, "
            f"topology_class={self.topology_class.value!r}, search={self.search!r})"
        )

    def _get(self, key: str, build: Callable[[], Any]) -> Any:
        lazy: dict[str, Any] = self._lazy
        if key not in lazy:
            lazy[key] = build()
        return lazy[key]

    @property
    def ok(self) -> Literal[True]:
        """Always True; lets callers branch on ``result.ok``."""
        return True

    @property
    def topology_class(self) -> TopologyScope:
        """Achieved class: ``nvlink``, ``pcie-switch``, ``numa`` or ``node``."""
        scope: TopologyScope = self._get(
            "class", lambda: SCOPES[set_class(self._ctx.wiring, self._positions)]
        )
        return scope

    @property
    def scope_satisfied(self) -> bool:
        """Whether the class is at least as tight as the requested scope."""
        return scope_rank(self.topology_class) <= scope_rank(self.policy.scope)

    @property
    def free_after(self) -> int:
        """Free placeable GPUs the node keeps once this set is taken."""
        return self._ctx.free.bit_count() - len(self._positions)

    @property
    def bottleneck_gbps(self) -> float | None:
        """Slowest pair's effective bandwidth; None for a single GPU."""
        if self.objective.bottleneck == SOLO_BOTTLENECK:
            return None
        return from_units(self.objective.bottleneck)

    @property
    def bottleneck_link(self) -> str | None:
        """That pair's link as ``topo -m`` prints it (``NV12``, ``PXB``)."""
        if self.objective.bottleneck == SOLO_BOTTLENECK:
            return None
        a, b = _slowest_pair(self._ctx.wiring, self._positions)
        return self._ctx.wiring.codes[a][b]

    @property
    def aggregate_gbps(self) -> float:
        """Sum of all pairs' effective bandwidth."""
        return from_units(self.objective.aggregate)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        """NUMA nodes the set spans (those known)."""
        bits = 0
        for p in self._positions:
            bits |= self._ctx.wiring.numa_bit[p]
        return tuple(n for n in range(bits.bit_length()) if bits >> n & 1)

    @property
    def degraded_gpus(self) -> tuple[int, ...]:
        """Members whose health is Degraded."""
        w = self._ctx.wiring
        return tuple(w.indices[p] for p in self._positions if self._ctx.degraded >> p & 1)

    @property
    def fragmentation(self) -> float:
        """Share (0..1) of the node's free GPU connectivity the set consumes."""
        return round(fragmentation_share(self._ctx, self.objective), 4)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Short sentences for humans, most important first."""
        reasons: tuple[str, ...] = self._get("reasons", self._explain)
        return reasons

    def _explain(self) -> tuple[str, ...]:
        ctx = self._ctx
        w = ctx.wiring
        positions = self._positions
        k = len(positions)
        policy = self.policy
        achieved = self.topology_class
        what = _CLASS_TEXT[achieved] if k > 1 else "a single GPU"
        reasons = [f"{k} GPU{'s' if k > 1 else ''} {indices_to_text(self.gpus)}: {what}"]
        if self.bottleneck_gbps is None:
            reasons.append("single GPU: no GPU-to-GPU traffic")
        else:
            a, b = _slowest_pair(w, positions)
            reasons.append(
                f"slowest pair {w.indices[a]}-{w.indices[b]} {self.bottleneck_link} at "
                f"{self.bottleneck_gbps:.1f} GB/s; {k * (k - 1) // 2} pairs total "
                f"{self.aggregate_gbps:.1f} GB/s"
            )
        if policy.scope is not TopologyScope.NODE:
            if self.scope_satisfied:
                reasons.append(f"scope {policy.describe()} met")
            else:
                reasons.append(
                    f"scope {policy.describe()}: no free set qualifies; placed at {achieved.value}"
                )
        numa = self.numa_nodes
        if numa:
            label = "NUMA node" if len(numa) == 1 else "NUMA nodes"
            reasons.append(f"{label} {indices_to_text(numa)}")
        if self.degraded_gpus:
            reasons.append(
                f"includes Degraded GPU {indices_to_text(self.degraded_gpus)} (no better set)"
            )
        if policy.multi_node:
            near = [p for p in positions if w.nic_points[p] >= NIC_LOCAL_POINTS]
            reasons.append(
                f"NIC-local (PIX/PXB) GPUs: {_text(w, near)}" if near else "no NIC-local GPU"
            )
        left = ctx.free.bit_count() - k
        reasons.append(
            f"leaves {left} free GPU{'s' if left != 1 else ''}; takes {self.fragmentation:.0%} "
            "of the free GPUs' connectivity"
        )
        return tuple(reasons)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``gpusched topo place --json`` prints)."""
        return {
            "ok": True,
            "gpus": list(self.gpus),
            "score": self.score,
            "topology_class": self.topology_class.value,
            "scope": self.policy.scope.value,
            "mode": self.policy.mode.value,
            "scope_satisfied": self.scope_satisfied,
            "bottleneck_gbps": self.bottleneck_gbps,
            "bottleneck_link": self.bottleneck_link,
            "aggregate_gbps": self.aggregate_gbps,
            "numa_nodes": list(self.numa_nodes),
            "degraded_gpus": list(self.degraded_gpus),
            "fragmentation": self.fragmentation,
            "search": self.search,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why no set was chosen."""

    reason: RefusalReason
    """Machine code."""
    k: int
    policy: Policy = field(default=DEFAULT_POLICY)
    best_class: TopologyScope | None = None
    """For ScopeUnsatisfiable: the tightest class a free set could reach."""
    _reasons: _Reasons = field(default_factory=lambda: _fixed(()), repr=False, compare=False)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Short sentences for humans, the most useful first."""
        return self._reasons.get()

    @property
    def ok(self) -> Literal[False]:
        """Always False."""
        return False

    @property
    def gpus(self) -> tuple[int, ...]:
        """Empty: nothing was placed."""
        return ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": False,
            "gpus": [],
            "score": None,
            "topology_class": None,
            "scope": self.policy.scope.value,
            "mode": self.policy.mode.value,
            "reason": self.reason.value,
            "best_class": None if self.best_class is None else self.best_class.value,
            "reasons": list(self.reasons),
        }


PlacementResult = Placement | Refusal


class _ResultCache:
    """Bounded FIFO memo of results, shared by threads (the extender serves requests in
    parallel); results are immutable, so sharing them is safe."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._entries: dict[tuple[object, ...], PlacementResult] = {}
        self._lock = threading.Lock()
        self._max = max_entries

    def get(self, key: tuple[object, ...]) -> PlacementResult | None:
        return self._entries.get(key)

    def put(self, key: tuple[object, ...], value: PlacementResult) -> None:
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


_RESULTS: Final = _ResultCache()


def clear_placement_cache() -> None:
    """Forget memoised results (benchmarks measure uncached work with it)."""
    _RESULTS.clear()


def _free_mask(node: PreparedNode, busy: Iterable[int], free_mask: int | None) -> int:
    all_mask = node.wiring.all_mask
    given = all_mask if free_mask is None else free_mask & all_mask
    if busy:
        given &= ~node.mask(busy)
    return given


def place(
    node: PreparedNode,
    k: int,
    policy: Policy = DEFAULT_POLICY,
    *,
    busy: Iterable[int] = (),
    free_mask: int | None = None,
    use_cache: bool = True,
    exact: bool | None = None,
) -> PlacementResult:
    """Best set of ``k`` GPUs on ``node`` under ``policy``, or why there is none.

    ``busy`` lists GPU indices in use; ``free_mask`` (bit per position, see
    :meth:`PreparedNode.mask`) may be given instead or as well. Unhealthy, Unschedulable and MIG
    GPUs are never chosen whatever the masks say. ``exact`` forces exact search or the heuristic
    (default: exact up to 16 GPUs). ``use_cache=False`` bypasses the memo (benchmarks).
    """
    given = _free_mask(node, busy, free_mask)
    free = given & node.placeable_mask
    if not 1 <= k <= free.bit_count():  # (k <= free implies k <= placeable <= GPUs)
        refusal = _count_refusal(node, k, policy, given)
        assert refusal is not None
        return refusal
    degraded = node.degraded_mask & free
    if not use_cache:
        return _choose(node.wiring, k, policy, free, degraded, exact=exact)
    # The answer depends on the wiring and the free, placeable GPUs only, so every node of a
    # hardware type in the same state shares it.
    key = (node.wiring.key, free, degraded, k, policy, exact)
    cached = _RESULTS.get(key)
    if cached is None:
        cached = _choose(node.wiring, k, policy, free, degraded, exact=exact)
        _RESULTS.put(key, cached)
    return cached


def _unplaceable_text(node: PreparedNode) -> str | None:
    parts = []
    for gpu in node.topology.gpus:
        if gpu.placeable:
            continue
        why = "MIG enabled" if gpu.mig_enabled else gpu.health.value
        if gpu.health_reason and gpu.health_reason != gpu.health.value and not gpu.mig_enabled:
            why += f" ({gpu.health_reason})"
        parts.append(f"GPU {gpu.index} {why}")
    return "not placeable: " + ", ".join(parts) if parts else None


def _gpus(k: int) -> str:
    return f"{k} GPU" if k == 1 else f"{k} GPUs"


def _count_refusal(node: PreparedNode, k: int, policy: Policy, given: int) -> Refusal | None:
    """Refusals that need no search: the request is malformed, too big, or too few GPUs left."""
    w = node.wiring
    if k < 1:
        return Refusal(
            RefusalReason.INVALID_REQUEST,
            k,
            policy,
            _reasons=_fixed([f"a request needs at least 1 GPU, not {k}"]),
        )
    if k > w.n:
        return Refusal(
            RefusalReason.REQUEST_EXCEEDS_NODE,
            k,
            policy,
            _reasons=_fixed([f"requests {_gpus(k)}; the node has {w.n}"]),
        )
    placeable = node.placeable_mask.bit_count()
    if k > placeable:

        def not_healthy() -> tuple[str, ...]:
            reasons = [f"requests {_gpus(k)}; only {placeable} of {w.n} are placeable"]
            unplaceable = _unplaceable_text(node)
            return (*reasons, unplaceable) if unplaceable else tuple(reasons)

        return Refusal(
            RefusalReason.NOT_ENOUGH_HEALTHY_GPUS, k, policy, _reasons=_Reasons(not_healthy)
        )
    free = given & node.placeable_mask
    if k > free.bit_count():

        def not_free() -> tuple[str, ...]:
            busy = node.indices(node.placeable_mask & ~given)
            reasons = [
                f"requests {_gpus(k)}; {free.bit_count()} of {placeable} placeable GPUs are free"
            ]
            if busy:
                reasons.append(f"in use: {indices_to_text(busy)}")
            return tuple(reasons)

        return Refusal(RefusalReason.NOT_ENOUGH_FREE_GPUS, k, policy, _reasons=_Reasons(not_free))
    return None  # pragma: no cover - place() only calls it when a count check fails


def _choose(
    w: PreparedWiring, k: int, policy: Policy, free: int, degraded: int, *, exact: bool | None
) -> PlacementResult:
    ctx = make_context(w, free, degraded, scope_rank(policy.scope), policy.multi_node)
    method = "exact" if (exact if exact is not None else w.n <= EXACT_MAX_GPUS) else "heuristic"
    found = search(ctx, k, required=policy.required, exact=exact)
    if found is None:
        return _scope_refusal(ctx, k, policy, exact)
    return _placement(ctx, found, policy, method)


def _text(w: PreparedWiring, positions: Iterable[int]) -> str:
    return indices_to_text(w.indices[p] for p in positions)


def _scope_refusal(ctx: SearchContext, k: int, policy: Policy, exact: bool | None) -> Refusal:
    w = ctx.wiring
    # The tightest class some free set reaches: the first looser scope a set meets. (The best set
    # overall can be looser still: one NVLink can be slower than a PCIe switch.)
    reachable: Found | None = None
    for rank in range(ctx.scope_rank + 1, len(SCOPES)):
        looser = ctx._replace(scope_rank=rank)
        reachable = search(looser, k, required=True, exact=exact)
        if reachable is not None:
            break
    best_class = None if reachable is None else SCOPES[set_class(w, reachable[1])]

    def explain() -> tuple[str, ...]:
        reasons = [f"no {k} free GPUs meet scope {policy.describe()}"]
        if reachable is not None and best_class is not None:
            reasons.append(
                f"best free set {_text(w, reachable[1])} reaches only {best_class.value}"
            )
        if policy.scope is TopologyScope.NVLINK:
            islands = [
                _text(w, w.positions_of(island & ctx.free))
                for island in w.islands
                if island & ctx.free
            ]
            reasons.append("free GPUs per NVLink island: " + "; ".join(islands))
        return tuple(reasons)

    return Refusal(
        RefusalReason.SCOPE_UNSATISFIABLE,
        k,
        policy,
        best_class=best_class,
        _reasons=_Reasons(explain),
    )


def _slowest_pair(w: PreparedWiring, positions: tuple[int, ...]) -> tuple[int, int]:
    """The first pair (in index order) whose bandwidth is the set's bottleneck."""
    best = (positions[0], positions[1])
    slowest = w.bw[best[0]][best[1]]
    for i, a in enumerate(positions):
        row = w.bw[a]
        for b in positions[i + 1 :]:
            if row[b] < slowest:
                slowest = row[b]
                best = (a, b)
    return best


def _placement(ctx: SearchContext, found: Found, policy: Policy, method: str) -> Placement:
    return Placement(ctx, found, policy, method)


def evaluate_set(
    node: PreparedNode,
    gpus: Iterable[int],
    policy: Policy = DEFAULT_POLICY,
    *,
    busy: Iterable[int] = (),
    free_mask: int | None = None,
) -> Placement:
    """Score a given set as :func:`place` would, to explain or compare an existing assignment
    (e.g. a baseline's choice). Raises ValueError if the set includes a GPU that is not free."""
    chosen = node.mask(gpus)
    given = _free_mask(node, busy, free_mask)
    free = given & node.placeable_mask
    if chosen & ~free:
        raise ValueError(
            f"GPUs {indices_to_text(node.indices(chosen & ~free))} are not free and placeable"
        )
    k = chosen.bit_count()
    if k == 0:
        raise ValueError("an empty set cannot be scored")
    w = node.wiring
    ctx = make_context(w, free, node.degraded_mask, scope_rank(policy.scope), policy.multi_node)
    positions = w.positions_of(chosen)
    return _placement(ctx, (evaluate(ctx, positions), positions), policy, "given")
