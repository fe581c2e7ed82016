"""Free GPUs of the cluster during one cycle, and gang placement on them.

The pool keeps, per node, which GPUs each job holds, and an index that groups nodes in the same
state (wiring, health, free GPUs, taints): the placement engine's answer is the same for every
node of a group, so choosing a node for a replica costs one ``place`` call per group, not per
node. Groups are bucketed by free-GPU count, which gives best fit cheaply: the scan starts at
nodes with just enough free GPUs and stops at the first bucket that holds a node meeting the
job's topology scope.

Replicas of a gang are placed one after another, each taking its GPUs before the next is placed,
so two replicas never get the same GPU.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpusched.api.gpujob import TopologyScope
from gpusched.core.admission.domains import (
    Domain,
    fewest_domains,
    level_chain,
    level_of,
    segments_in,
)
from gpusched.core.admission.model import (
    AcrossReplicas,
    Assignment,
    Job,
    Level,
    Node,
    ReplicaPlan,
    Taint,
    Toleration,
    WaitReason,
    tolerated,
)
from gpusched.core.placement import Placement, Policy, Refusal, RefusalReason, place
from gpusched.core.ranking import NodeRank, WiringRank, node_rank, outranks, wiring_rank

GroupKey = tuple[str, int, int, bool, tuple[Taint, ...]]
FilterKey = tuple[str | None, bool, tuple[Toleration, ...], tuple[tuple[str, str], ...]]
FreeShape = tuple[str, int, int, tuple[float, ...]]
"""What the times a node can host replicas depend on: its wiring key, placeable and degraded
GPUs, and each GPU's free time (the cycle's own time written as ``-inf``)."""


@dataclass(frozen=True, slots=True)
class _Eligible:
    """Nodes one kind of request may use, with what an empty cluster would offer it."""

    names: tuple[str, ...]
    name_set: frozenset[str]
    placeable: int
    representatives: tuple[str, ...]
    """One node per distinct (wiring, placeable, degraded, count-only) state."""


@dataclass(slots=True)
class Slot:
    """One node's GPUs during the cycle."""

    node: Node
    free: int
    """Bitmask (positions) of placeable GPUs nobody holds."""
    held: dict[str, int] = field(default_factory=dict)
    """Job key -> positions it holds on this node."""
    foreign: int = 0
    """Positions held by pods outside any GpuJob."""
    group: GroupKey | None = None
    counted: int = 0
    """Free GPUs as last counted into the pool's total and its network domains' free GPUs."""

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def free_count(self) -> int:
        return self.free.bit_count()

    def group_key(self) -> GroupKey:
        topo = self.node.topology
        # What the placement engine's answer depends on (wiring, free and degraded GPUs), plus
        # what decides eligibility; every node of a group gets the same answer.
        degraded = topo.degraded_mask & self.free
        return (topo.wiring.key, self.free, degraded, self.node.count_only, self.node.taints)


@dataclass(frozen=True, slots=True)
class Request:
    """What a job asks of nodes, shared by all its replicas (the memo key of a cycle)."""

    gpus_per_replica: int
    replicas: int
    policy: Policy
    gpu_model: str | None
    across: AcrossReplicas | None
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[Toleration, ...]
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # Requests key several memos per queued job per cycle; hash them once.
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.gpus_per_replica,
                    self.replicas,
                    self.policy,
                    self.gpu_model,
                    self.across,
                    self.node_selector,
                    self.tolerations,
                )
            ),
        )

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, job: Job) -> Request:
        """The job's request (cached on the job: a frozen job always asks the same)."""
        found = job.request_memo
        if isinstance(found, Request):
            return found
        request = cls.build(job)
        # Equal requests share one object, so jobs asking the same compare by identity and
        # every memo keyed on a request finds it without comparing fields.
        request = _INTERNED.setdefault(request, request)
        if len(_INTERNED) > _MAX_INTERNED:
            _INTERNED.clear()
        object.__setattr__(job, "request_memo", request)
        return request

    @classmethod
    def build(cls, job: Job) -> Request:
        return cls(
            job.gpus_per_replica,
            job.replicas,
            job.policy,
            job.gpu_model,
            job.across,
            job.node_selector,
            job.tolerations,
        )

    def with_across(self, across: AcrossReplicas) -> Request:
        """The same request with other rules across replicas (interned like :meth:`of`)."""
        request = Request(
            self.gpus_per_replica,
            self.replicas,
            self.policy,
            self.gpu_model,
            across,
            self.node_selector,
            self.tolerations,
        )
        return _INTERNED.setdefault(request, request)

    def segment_alternatives(self) -> tuple[Request, Request] | None:
        """For a gang whose segments are only preferred: the request with its segments kept,
        then without them (tried in that order); None for any other request."""
        across = self.across
        if across is None or not across.segments_preferred:
            return None
        return (
            self.with_across(across.with_segments_required()),
            self.with_across(across.without_segments()),
        )

    @property
    def total(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def filter_key(self) -> FilterKey:
        """What decides which nodes are eligible (free GPUs aside)."""
        tight = self.policy.required and self.policy.scope is not TopologyScope.NODE
        return (self.gpu_model, tight, self.tolerations, self.node_selector)

    def describe(self) -> str:
        """``2 x 8 GPUs`` / ``4 GPUs`` plus model, for messages."""
        size = (
            f"{self.replicas} x {self.gpus_per_replica} GPUs"
            if self.replicas > 1
            else f"{self.gpus_per_replica} GPU{'s' if self.gpus_per_replica > 1 else ''}"
        )
        return size + (f" of model {self.gpu_model}" if self.gpu_model else "")


_NOTHING: Final[Mapping[str, int]] = {}

#: Distinct requests kept for interning; past it the table starts over (identity is an
#: optimisation, equality still decides).
_MAX_INTERNED: Final = 65_536
_INTERNED: dict[Request, Request] = {}


@dataclass(frozen=True, slots=True)
class GangFailure:
    """Why a gang could not be placed."""

    reason: WaitReason
    message: str


@dataclass(frozen=True, slots=True)
class _Choice:
    slot: Slot
    placement: Placement
    rank: NodeRank


class Pool:
    """Mutable free-GPU state of the cluster for one cycle."""

    def __init__(
        self,
        nodes: Iterable[Node],
        holdings: Iterable[tuple[str, Assignment]],
        levels: Sequence[Level] = (),
        down_labels: Iterable[Mapping[str, str]] = (),
    ) -> None:
        self.levels = tuple(levels)
        self._down_labels = tuple(down_labels)
        self._down: dict[str, frozenset[str]] = {}
        self._capacities: dict[Request, dict[str, tuple[int, int]]] = {}
        self._domains: dict[
            tuple[str, Request, int], tuple[int, list[Domain], dict[str, tuple[int, Domain]]]
        ] = {}
        """Per label, request and floor: the pool's change count they were worked out at,
        the domains, and each domain with its own change count (:attr:`_domain_changes`)."""
        self._free_of: dict[FilterKey, tuple[int, tuple[int, int]]] = {}
        """Per node filter: :meth:`free_gpus` and the change count it was counted at."""
        self._domain_changes: dict[str, dict[str, int]] = {}
        """Per node label asked for by :meth:`domains`: changes to the free GPUs of each of
        its domains, so a domain is worked out again only when one of its nodes changed."""
        self._changes = 0
        """Counts holds and releases: memos of free capacity are good while it stays."""
        self.free_total = 0
        """Free GPUs of the whole cluster, kept as nodes change."""
        self._domain_free: dict[tuple[str, str], int] = {}
        """Free GPUs per network domain, (level label, value) -> count, kept as nodes change."""
        self.slots: dict[str, Slot] = {}
        self._index: dict[str | None, dict[int, dict[GroupKey, list[str]]]] = {}
        self._jobs: dict[str, dict[str, int]] = {}
        self._feasible: dict[Request, GangFailure | None] = {}
        self._ceilings: dict[Request, WiringRank | None] = {}
        self._eligible: dict[FilterKey, _Eligible] = {}
        self._eligible_domains: dict[
            tuple[str, FilterKey], tuple[tuple[str, tuple[str, ...], int], ...]
        ] = {}
        self.models: list[str | None] = []
        self.free_times: dict[tuple[FreeShape, int, int, int], tuple[float, ...]] = {}
        """The profile's answers kept across cycles (:meth:`Profile._node_times`): per shape
        of a node's free times (its wiring, healthy GPUs and GPU free times, with the cycle's
        time written as ``-inf``) and request."""
        self.policy_index: dict[Policy, int] = {}
        """A small number per distinct placement policy, for the keys of :attr:`free_times`."""
        self._journal: dict[str, tuple[int, dict[str, int]]] | None = None
        """While a cycle runs on a kept pool: each changed node's free GPUs and holders before
        its first change (:meth:`begin`, :meth:`rollback`)."""
        by_node: dict[str, list[tuple[str, Assignment]]] = {}
        for held in holdings:
            by_node.setdefault(held[1].node, []).append(held)
        for node in sorted(nodes, key=lambda n: n.name):
            slot = self.slots[node.name] = _empty_slot(node)
            self._fill(slot, sorted(by_node.get(node.name, ()), key=lambda h: h[0]))
        models = {slot.node.model for slot in self.slots.values()}
        self.models = sorted(models, key=lambda m: (m is None, m or ""))
        for slot in self.slots.values():
            self._reindex(slot)

    def _fill(self, slot: Slot, holdings: Iterable[tuple[str, Assignment]]) -> None:
        """Hold a node's GPUs for its holders (in job key order): GPUs known by index first,
        then GPUs known only by count on the lowest free positions, then pods outside any
        GpuJob that are known only by count. Nodes are filled one by one in name order, so
        each job's holdings list its nodes in name order."""
        counted: list[tuple[str, Assignment]] = []
        topo = slot.node.topology
        for job, assignment in holdings:
            if assignment.gpus:
                mask = 0
                for index in assignment.gpus:
                    try:
                        mask |= 1 << topo.position(index)
                    except ValueError:
                        continue
                self._hold_mask(slot, job, mask)
            else:
                counted.append((job, assignment))
        for job, assignment in counted:
            self._hold_mask(slot, job, _lowest(slot.free, assignment.count))
        if slot.node.busy_count:
            taken = _lowest(slot.free, slot.node.busy_count)
            slot.foreign |= taken
            slot.free &= ~taken

    # --- keeping the pool from one cycle to the next ---------------------------------------

    @property
    def changes(self) -> int:
        """How many times a GPU was held or freed (or a node rebuilt) since the pool was made:
        answers worked out at one count hold while it stays."""
        return self._changes

    def memo_entries(self) -> int:
        """How many answers the pool's memos hold (a kept pool's grow with every kind of
        request it has seen)."""
        return (
            sum(len(per_node) for per_node in self._capacities.values())
            + len(self._domains)
            + len(self._feasible)
            + len(self._ceilings)
            + len(self._eligible)
            + len(self._eligible_domains)
            + len(self._free_of)
            + len(self.free_times)
        )

    def begin(self) -> None:
        """Record what a cycle changes from here on, so :meth:`rollback` can undo it: a pool
        kept across cycles returns to the cluster as it is before the next cycle's changes
        are applied, in time proportional to what the cycle changed."""
        self._journal = {}

    def rollback(self) -> None:
        """Undo every change since :meth:`begin` (nothing if it was not called)."""
        journal, self._journal = self._journal, None
        if not journal:
            return
        jobs: set[str] = set()
        for name, (free, held) in journal.items():
            slot = self.slots[name]
            for job in slot.held:
                jobs.add(job)
                self._jobs[job].pop(name, None)
            slot.free, slot.held = free, held
            for job, mask in held.items():
                jobs.add(job)
                self._jobs.setdefault(job, {})[name] = mask
            self._reindex(slot)
        self._in_node_order(jobs)

    def refill(self, holdings: Mapping[str, Sequence[tuple[str, Assignment]]]) -> None:
        """Rebuild the named nodes from their holders now (job key order), exactly as a new
        pool would fill them: the kept pool catches up with jobs that started, ended or
        moved since the last cycle."""
        jobs: set[str] = set()
        for name, held in holdings.items():
            slot = self.slots[name]
            for job in slot.held:
                jobs.add(job)
                self._jobs[job].pop(name, None)
            empty = _empty_slot(slot.node)
            slot.free, slot.foreign, slot.held = empty.free, empty.foreign, {}
            self._fill(slot, held)
            jobs.update(slot.held)
            self._reindex(slot)
        self._in_node_order(jobs)

    def _in_node_order(self, jobs: Iterable[str]) -> None:
        """List each job's holdings in node name order again (as a new pool does)."""
        for job in jobs:
            held = self._jobs.get(job)
            if not held:
                self._jobs.pop(job, None)
            elif len(held) > 1:
                self._jobs[job] = dict(sorted(held.items()))

    # --- state changes -------------------------------------------------------------------

    def _hold_mask(self, slot: Slot, job: str, mask: int) -> None:
        mask &= slot.free
        if not mask:
            return
        if self._journal is not None and slot.name not in self._journal:
            self._journal[slot.name] = (slot.free, dict(slot.held))
        slot.held[job] = slot.held.get(job, 0) | mask
        slot.free &= ~mask
        self._jobs.setdefault(job, {})[slot.name] = slot.held[job]

    def _reindex(self, slot: Slot) -> None:
        self._changes += 1
        if self._domain_changes:
            labels = slot.node.labels
            for label, changes in self._domain_changes.items():
                value = labels.get(label)
                if value is not None:
                    changes[value] = changes.get(value, 0) + 1
        count = slot.free.bit_count()
        if count != slot.counted:
            self.free_total += count - slot.counted
            if self.levels:
                labels = slot.node.labels
                for level in self.levels:
                    value = labels.get(level.node_label)
                    if value is not None:
                        domain = (level.node_label, value)
                        self._domain_free[domain] = (
                            self._domain_free.get(domain, 0) + count - slot.counted
                        )
            slot.counted = count
        model = slot.node.model
        buckets = self._index.setdefault(model, {})
        if slot.group is not None:
            old_count = slot.group[1].bit_count()
            groups = buckets.get(old_count)
            if groups is not None:
                members = groups.get(slot.group)
                if members is not None:
                    at = bisect_left(members, slot.name)
                    if at < len(members) and members[at] == slot.name:
                        del members[at]
                    if not members:
                        del groups[slot.group]
                if not groups:
                    del buckets[old_count]
        key = slot.group_key()
        slot.group = key
        if slot.free:
            # Kept sorted: a group's first eligible member is the one with the lowest name,
            # whatever order nodes joined it in (a pool's decisions do not depend on its past).
            insort(buckets.setdefault(slot.free.bit_count(), {}).setdefault(key, []), slot.name)

    def hold(self, job: str, node: str, gpus: Iterable[int]) -> None:
        """Give GPUs (indices) of ``node`` to ``job``."""
        slot = self.slots[node]
        self._hold_mask(slot, job, slot.node.topology.mask(gpus))
        self._reindex(slot)

    def release(self, job: str) -> dict[str, int]:
        """Free everything ``job`` holds; returns what it held (node -> positions)."""
        held = self._jobs.pop(job, {})
        journal = self._journal
        for name, mask in held.items():
            slot = self.slots[name]
            if journal is not None and name not in journal:
                journal[name] = (slot.free, dict(slot.held))
            slot.held.pop(job, None)
            slot.free |= mask & slot.node.topology.placeable_mask
            self._reindex(slot)
        return held

    def restore(self, job: str, held: dict[str, int]) -> None:
        """Undo :meth:`release`."""
        for name, mask in held.items():
            slot = self.slots[name]
            self._hold_mask(slot, job, mask)
            self._reindex(slot)

    def holdings(self, job: str) -> dict[str, int]:
        """Positions ``job`` holds per node."""
        return dict(self._jobs.get(job, {}))

    def holding(self, job: str) -> Mapping[str, int]:
        """:meth:`holdings` without the copy, for reading at once (it changes with the pool)."""
        return self._jobs.get(job, _NOTHING)

    # --- queries -------------------------------------------------------------------------

    def eligible(self, slot: Slot, request: Request) -> bool:
        """Whether a node may host a replica of the request at all (ignoring free GPUs)."""
        node = slot.node
        if request.gpu_model is not None and node.model != request.gpu_model:
            return False
        if (
            node.count_only
            and request.policy.required
            and (request.policy.scope is not TopologyScope.NODE)
        ):
            return False
        if node.taints and not tolerated(node.taints, request.tolerations):
            return False
        labels = node.labels
        return all(labels.get(k) == v for k, v in request.node_selector)

    def _models_for(self, request: Request) -> list[str | None]:
        if request.gpu_model is not None:
            return [request.gpu_model] if request.gpu_model in self._index else []
        return [m for m in self.models if m in self._index]

    def free_gpus(self, request: Request) -> tuple[int, int]:
        """Free GPUs on eligible nodes, and the most on one node (kept until a GPU is held
        or freed: every failed placement's message and victim search asks it)."""
        key = request.filter_key
        found = self._free_of.get(key)
        if found is not None and found[0] == self._changes:
            return found[1]
        total = 0
        largest = 0
        slots = self.slots
        for name in self.eligible_nodes(request).names:
            count = slots[name].free.bit_count()
            total += count
            largest = max(largest, count)
        self._free_of[key] = (self._changes, (total, largest))
        return total, largest

    def eligible_nodes(self, request: Request) -> _Eligible:
        """Nodes the request may use at all (cached per kind of request)."""
        key = request.filter_key
        found = self._eligible.get(key)
        if found is None:
            names = []
            placeable = 0
            reps: dict[tuple[str, int, int, bool], str] = {}
            for name, slot in self.slots.items():
                if not self.eligible(slot, request):
                    continue
                names.append(name)
                topo = slot.node.topology
                # Pods outside GpuJobs come and go: an empty cluster has them gone too.
                usable = topo.placeable_mask
                placeable += usable.bit_count()
                rep = (topo.wiring.key, usable, topo.degraded_mask, slot.node.count_only)
                reps.setdefault(rep, name)
            found = _Eligible(tuple(names), frozenset(names), placeable, tuple(reps.values()))
            self._eligible[key] = found
        return found

    def eligible_domains(
        self, label: str, request: Request
    ) -> tuple[tuple[str, tuple[str, ...], int], ...]:
        """(domain value, eligible nodes, their placeable GPUs) for a node-label domain."""
        key = (label, request.filter_key)
        found = self._eligible_domains.get(key)
        if found is None:
            by_value: dict[str, list[str]] = {}
            for name in self.eligible_nodes(request).names:
                value = self.slots[name].node.labels.get(label)
                if value is not None:
                    by_value.setdefault(value, []).append(name)
            found = tuple(
                (
                    value,
                    tuple(names),
                    sum(self.slots[n].node.topology.placeable_mask.bit_count() for n in names),
                )
                for value, names in sorted(by_value.items())
            )
            self._eligible_domains[key] = found
        return found

    def _candidates(
        self, request: Request, names: Sequence[str] | None
    ) -> Iterator[tuple[int, Slot]]:
        """(free count, representative slot) per group, fewest free GPUs first."""
        k = request.gpus_per_replica
        if names is not None:
            seen: set[GroupKey] = set()
            slots = [self.slots[n] for n in names]
            # Fewest free GPUs, then the fullest domains (none without levels); the sort is
            # stable, so ties keep the names' order.
            for slot in sorted(slots, key=lambda s: (s.free_count, self.fullness(s.name))):
                if slot.free_count < k or slot.group in seen or not self.eligible(slot, request):
                    continue
                assert slot.group is not None
                seen.add(slot.group)
                yield slot.free_count, slot
            return
        per_model = [self._index[m] for m in self._models_for(request)]
        counts = sorted({c for buckets in per_model for c in buckets if c >= k})
        for count in counts:
            for buckets in per_model:
                for members in list(buckets.get(count, {}).values()):
                    if self.levels:
                        found = self._fullest(members, request)
                        if found is not None:
                            yield count, found
                        continue
                    for name in members:
                        slot = self.slots[name]
                        if self.eligible(slot, request):
                            yield count, slot
                            break

    def fullness(self, name: str) -> tuple[int, ...]:
        """Free GPUs of the node's domains, narrowest level first (-1 where it has none):
        among nodes equal for a job, the one in the fullest domains is taken, so the roomiest
        cliques, racks and leaves stay whole for the gangs that need them."""
        labels = self.slots[name].node.labels
        free = self._domain_free
        out = []
        for level in self.levels:
            value = labels.get(level.node_label)
            out.append(-1 if value is None else free.get((level.node_label, value), 0))
        return tuple(out)

    def _fullest(self, members: Sequence[str], request: Request) -> Slot | None:
        """The eligible member of a group in the fullest domains (then the lowest name)."""
        best: tuple[tuple[int, ...], str] | None = None
        for name in members:
            key = (self.fullness(name), name)
            if (best is None or key < best) and self.eligible(self.slots[name], request):
                best = key
        return None if best is None else self.slots[best[1]]

    def ceiling(self, request: Request) -> WiringRank | None:
        """The best wiring any eligible node could give one replica on an idle cluster: once a
        candidate reaches it, nodes with more free GPUs cannot do better for the job."""
        if request in self._ceilings:
            return self._ceilings[request]
        best: WiringRank | None = None
        for name in self.eligible_nodes(request).representatives:
            topo = self.slots[name].node.topology
            result = place(
                topo, request.gpus_per_replica, request.policy, free_mask=topo.placeable_mask
            )
            if isinstance(result, Placement):
                rank = wiring_rank(result)
                best = rank if best is None else max(best, rank)
        self._ceilings[request] = best
        return best

    def choose(
        self, request: Request, names: Sequence[str] | None = None
    ) -> tuple[_Choice | None, bool]:
        """Best node and GPU set for one replica, by the ranking the extender uses too
        (:func:`gpusched.core.ranking.node_rank`: scope, class, bandwidth, then best fit among
        equally wired nodes). Also returns whether some node had enough free GPUs but no set
        meeting a required scope.

        Candidates come fewest free GPUs first, one per group of nodes in the same state; the
        scan stops after a bucket once the best choice is wired as well as any eligible node
        could offer (:meth:`ceiling`), since the rest would only pack worse."""
        policy = request.policy
        k = request.gpus_per_replica
        ceiling = self.ceiling(request)
        best: _Choice | None = None
        scope_refused = False
        current_count = -1
        for count, slot in self._candidates(request, names):
            if count != current_count:
                if best is not None and ceiling is not None and best.rank.wiring >= ceiling:
                    break
                current_count = count
            result = place(slot.node.topology, k, policy, free_mask=slot.free)
            if isinstance(result, Refusal):
                if result.reason is RefusalReason.SCOPE_UNSATISFIABLE:
                    scope_refused = True
                continue
            rank = node_rank(result)
            if best is None or self.ranks_before(rank, slot.name, best.rank, best.slot.name):
                best = _Choice(slot, result, rank)
        return best, scope_refused

    def ranks_before(self, rank: NodeRank, name: str, other: NodeRank, other_name: str) -> bool:
        """The node ranking (:func:`gpusched.core.ranking.outranks`), nodes of equal rank
        taken in the fullest network domains first (:meth:`fullness`)."""
        if rank != other or not self.levels:
            return outranks(rank, name, other, other_name)
        return (self.fullness(name), name) < (self.fullness(other_name), other_name)

    # --- gangs ---------------------------------------------------------------------------

    def _place_replicas(
        self, job: str, request: Request, replicas: int, names: Sequence[str] | None
    ) -> tuple[list[ReplicaPlan], bool]:
        plans: list[ReplicaPlan] = []
        scope_refused = False
        for _ in range(replicas):
            choice, refused = self.choose(request, names)
            scope_refused = scope_refused or refused
            if choice is None:
                break
            slot = choice.slot
            self._hold_mask(slot, job, slot.node.topology.mask(choice.placement.gpus))
            self._reindex(slot)
            plans.append(
                ReplicaPlan(
                    replica=0,
                    node=slot.name,
                    gpus=choice.placement.gpus,
                    topology_class=choice.placement.topology_class,
                    score=choice.placement.score,
                    count_only=slot.node.count_only,
                )
            )
        return plans, scope_refused

    def place_gang(self, job: str, request: Request) -> list[ReplicaPlan] | GangFailure:
        """Place every replica (holding the GPUs under ``job``), or hold nothing and say why.

        The gang goes to the narrowest level one of whose domains holds it (best fit among
        those), segments each inside one domain of their level; a preferred level no domain
        holds is spread over the fewest domains (:mod:`gpusched.core.admission.domains`)."""
        alternatives = request.segment_alternatives()
        if alternatives is not None:
            # Preferred segments: kept when some placement keeps them, else the gang unsegmented.
            segmented, whole = alternatives
            placed = self.place_gang(job, segmented)
            return placed if not isinstance(placed, GangFailure) else self.place_gang(job, whole)
        static = self.static_failure(request)
        if static is not None:
            return static
        across = request.across
        degraded: list[str] = []
        chain = level_chain(self.levels, across, request.replicas)
        for level in chain:
            plans = self._place_in_level(job, request, level, degraded)
            if plans is not None:
                return _numbered(plans)
        if across is not None and across.required:
            if degraded:
                return GangFailure(
                    WaitReason.DOMAIN_DEGRADED,
                    f"only {_listed(degraded)} would hold {request.describe()} now, with nodes "
                    "or GPUs down: the gang waits for a whole domain",
                )
            broken = [
                f"{level.title} {value}"
                for level in chain
                if level.whole_domains
                for value in sorted(self._degraded_values(level.node_label))
            ]
            return GangFailure(
                WaitReason.TOPOLOGY_UNSATISFIABLE,
                f"no {across.node_label} domain has room for all of {request.describe()}"
                f"{self._segments_text(request)} now{self._free_text(request)}"
                + (f"; not whole (nodes or GPUs down): {_listed(broken)}" if broken else ""),
            )
        if across is not None and across.segment_label is not None:
            parts = self._segment_domains(across.segment_label, request)
            plans, refused = self._place_segments(job, request, parts) or [], False
        elif across is not None:
            plans, refused = self._place_spread(job, request, across.node_label)
        else:
            plans, refused = self._place_replicas(job, request, request.replicas, None)
        if len(plans) == request.replicas:
            return _numbered(plans)
        self.release(job)
        return self._failure(request, refused)

    def capacity(self, slot: Slot, request: Request) -> int:
        """Replicas of the request the node can still take, as the engine would place them one
        after another (each taking its best set of what the previous left)."""
        per_node = self._capacities.get(request)
        if per_node is None:
            per_node = self._capacities[request] = {}
        found = per_node.get(slot.name)
        if found is not None and found[0] == slot.free:
            return found[1]
        topo = slot.node.topology
        k = request.gpus_per_replica
        free = slot.free
        count = 0
        while free.bit_count() >= k:
            result = place(topo, k, request.policy, free_mask=free)
            if not isinstance(result, Placement):
                break
            free &= ~topo.mask(result.gpus)
            count += 1
        per_node[slot.name] = (slot.free, count)
        return count

    def _domain(self, value: str, names: tuple[str, ...], request: Request, floor: int) -> Domain:
        slots = self.slots
        free = sum(slots[n].free.bit_count() for n in names)
        # Too few free GPUs for ``floor`` replicas: what it could take does not matter.
        capacity = (
            sum(self.capacity(slots[n], request) for n in names)
            if free >= floor * request.gpus_per_replica
            else 0
        )
        return Domain(value, names, free, capacity)

    def domains(self, label: str, request: Request, floor: int = 1) -> list[Domain]:
        """The label's domains among the request's eligible nodes, with their free GPUs and
        the replicas they can take (0 for those with too few free GPUs for ``floor``
        replicas), kept until a GPU is held or freed."""
        key = (label, request, floor)
        found = self._domains.get(key)
        if found is not None and found[0] == self._changes:
            return found[1]
        changes = self._domain_changes.get(label)
        if changes is None:
            # Counted from here on: no answer for this label was kept before.
            changes = self._domain_changes[label] = {}
        before = found[2] if found is not None else {}
        out: list[Domain] = []
        kept: dict[str, tuple[int, Domain]] = {}
        for value, names, _ in self.eligible_domains(label, request):
            version = changes.get(value, 0)
            old = before.get(value)
            domain = (
                old[1]
                if old is not None and old[0] == version
                else self._domain(value, names, request, floor)
            )
            kept[value] = (version, domain)
            out.append(domain)
        self._domains[key] = (self._changes, out, kept)
        return out

    def _segment_domains(self, label: str, request: Request) -> list[Domain]:
        """The domains a segment of the request may go to: at a whole-domain level (NVLink
        cliques) only those with nothing down, as for a gang scoped to the level."""
        domains = self.domains(label, request, _segment(request))
        if not level_of(self.levels, label).whole_domains:
            return domains
        return [d for d in domains if not self.degraded(label, d.value)]

    def _parts(self, label: str, outer: str, request: Request) -> dict[str, list[Domain]]:
        """The ``label`` domains inside each ``outer`` domain (by its value); a domain that
        straddles two outer domains counts as one part in each."""
        out: dict[str, list[Domain]] = {}
        slots = self.slots
        floor = _segment(request)
        for domain in self._segment_domains(label, request):
            groups: dict[str, list[str]] = {}
            for n in domain.names:
                value = slots[n].node.labels.get(outer)
                if value is not None:
                    groups.setdefault(value, []).append(n)
            for value, names in groups.items():
                part = (
                    domain
                    if len(names) == len(domain.names)
                    else self._domain(domain.value, tuple(names), request, floor)
                )
                out.setdefault(value, []).append(part)
        return out

    def largest_free(self) -> tuple[tuple[str, int], ...]:
        """The most free GPUs on one node (``node``) and in one domain of each level, narrowest
        first; a whole-domain level counts only domains with nothing down. Free GPUs of a
        reservation or a terminating victim are not free."""
        out = [("node", max((s.free.bit_count() for s in self.slots.values()), default=0))]
        for level in self.levels:
            by_value: dict[str, int] = {}
            for slot in self.slots.values():
                value = slot.node.labels.get(level.node_label)
                if value is not None:
                    by_value[value] = by_value.get(value, 0) + slot.free.bit_count()
            out.append(
                (
                    level.title,
                    max(
                        (
                            free
                            for value, free in by_value.items()
                            if not (level.whole_domains and self.degraded(level.node_label, value))
                        ),
                        default=0,
                    ),
                )
            )
        return tuple(out)

    def degraded(self, label: str, value: str) -> bool:
        """Whether a domain has a node out of service or a GPU that cannot be placed on."""
        return value in self._degraded_values(label)

    def _degraded_values(self, label: str) -> frozenset[str]:
        down = self._down.get(label)
        if down is None:
            values = {labels[label] for labels in self._down_labels if label in labels}
            for slot in self.slots.values():
                topo = slot.node.topology
                if label in slot.node.labels and topo.placeable_mask.bit_count() < topo.wiring.n:
                    values.add(slot.node.labels[label])
            down = self._down[label] = frozenset(values)
        return down

    def _holds(self, request: Request, domain: Domain, parts: Sequence[Domain] | None) -> bool:
        """Whether the domain can take the whole gang (each segment inside one of the
        segment level's ``parts`` of it)."""
        if domain.capacity < request.replicas:
            return False
        if parts is None:
            return True
        size = _segment(request)
        return bool(segments_in(parts, size, request.replicas // size))

    def _place_in_level(
        self, job: str, request: Request, level: Level, degraded: list[str]
    ) -> list[ReplicaPlan] | None:
        """Best fit among the level's domains that hold the gang: the fewest free GPUs. A
        required wider level bounds the choice: a narrower domain counts only inside one of its
        domains. Degraded domains of a whole-domain level are skipped (and named)."""
        across = request.across
        bound = across.node_label if across is not None and across.required else None
        segments = across.segment_label if across is not None else None
        parts = self._parts(segments, level.node_label, request) if segments else None
        candidates = []
        slots = self.slots
        for domain in self.domains(level.node_label, request, request.replicas):
            if bound is not None and bound != level.node_label:
                # All in one domain of the required level: nodes without its label are in none.
                outer = {slots[n].node.labels.get(bound) for n in domain.names}
                if len(outer) != 1 or None in outer:
                    continue
            inside = parts.get(domain.value, []) if parts is not None else None
            if not self._holds(request, domain, inside):
                continue
            if level.whole_domains and self.degraded(level.node_label, domain.value):
                degraded.append(f"{level.title} {domain.value}")
                continue
            candidates.append((domain, inside))
        for domain, inside in sorted(candidates, key=lambda c: (c[0].free, c[0].value)):
            if inside is not None:
                plans = self._place_segments(job, request, inside)
            else:
                plans, _ = self._place_replicas(job, request, request.replicas, domain.names)
            if plans is not None and len(plans) == request.replicas:
                return plans
            self.release(job)
        return None

    def _place_segments(
        self, job: str, request: Request, parts: Sequence[Domain]
    ) -> list[ReplicaPlan] | None:
        """Every segment inside one of ``parts`` (domains of the segment's level), as few as
        possible; consecutive replicas form a segment. None (nothing held) when they do not
        fit."""
        size = _segment(request)
        plans: list[ReplicaPlan] = []
        for domain, count in segments_in(parts, size, request.replicas // size):
            more, _ = self._place_replicas(job, request, count * size, domain.names)
            plans.extend(more)
        if len(plans) != request.replicas:
            self.release(job)
            return None
        return plans

    def _place_spread(
        self, job: str, request: Request, label: str
    ) -> tuple[list[ReplicaPlan], bool]:
        """A preferred level that no single domain satisfies: the fewest domains (those taking
        the most replicas first), then nodes without the label."""
        plans: list[ReplicaPlan] = []
        refused = False
        domains = self.domains(label, request)
        for domain, count in fewest_domains(domains, request.replicas):
            more, r = self._place_replicas(job, request, count, domain.names)
            plans.extend(more)
            refused = refused or r
        if len(plans) < request.replicas:
            labelled = {n for d in domains for n in d.names}
            rest = tuple(n for n in self.eligible_nodes(request).names if n not in labelled)
            more, r = self._place_replicas(job, request, request.replicas - len(plans), rest)
            plans.extend(more)
            refused = refused or r
        return plans, refused

    def _segments_text(self, request: Request) -> str:
        across = request.across
        if across is None or across.segment_label is None:
            return ""
        return f" in segments of {across.segment_replicas} replicas per {across.segment_label}"

    def _free_text(self, request: Request) -> str:
        total, largest = self.free_gpus(request)
        return f" ({total} eligible GPUs free, at most {largest} on one node)"

    def _failure(self, request: Request, scope_refused: bool) -> GangFailure:
        total, largest = self.free_gpus(request)
        k = request.gpus_per_replica
        free = f"{total} eligible GPUs free, at most {largest} on one node"
        if scope_refused and largest >= k and total >= request.total:
            return GangFailure(
                WaitReason.TOPOLOGY_UNSATISFIABLE,
                f"needs {request.describe()} with scope {request.policy.describe()}; {free}, "
                "but no free set meets the scope",
            )
        return GangFailure(WaitReason.WAITING_FOR_CAPACITY, f"needs {request.describe()}; {free}")

    def static_failure(self, request: Request) -> GangFailure | None:
        """Why the request could not be placed even on an empty cluster (None: it could)."""
        if request in self._feasible:
            return self._feasible[request]
        alternatives = request.segment_alternatives()
        if alternatives is not None:
            # Preferred segments never make a gang impossible: the unsegmented gang decides.
            found = self._feasible[request] = self.static_failure(alternatives[1])
            return found
        k = request.gpus_per_replica
        eligible = self.eligible_nodes(request)
        fits_one = False
        for name in eligible.representatives:
            slot = self.slots[name]
            topo = slot.node.topology
            result = place(topo, k, request.policy, free_mask=topo.placeable_mask)
            if isinstance(result, Placement) and (
                result.scope_satisfied or not request.policy.required
            ):
                fits_one = True
                break
        failure: GangFailure | None = None
        what = request.describe()
        if not eligible.names:
            failure = GangFailure(
                WaitReason.NO_FEASIBLE_NODES, f"no schedulable node matches {_filters(request)}"
            )
        elif not fits_one:
            # Said by what to change: the GPUs per replica when no node has that many at all,
            # else the scope no node's wiring can give them.
            largest = max(
                self.slots[name].node.topology.placeable_mask.bit_count()
                for name in eligible.representatives
            )
            nodes = f"{len(eligible.names)} node{'s' if len(eligible.names) != 1 else ''}"
            if request.gpu_model or request.node_selector:
                nodes += f" matching {_filters(request)}"
            failure = GangFailure(
                WaitReason.NO_FEASIBLE_NODES,
                f"needs {k} GPUs on one node per replica (spec.gpusPerReplica), more than any "
                f"of the {nodes} has ({largest} at most); ask for more replicas of fewer GPUs"
                if k > largest
                else f"no node can give {k} GPUs scope {request.policy.describe()} even when "
                f"idle ({nodes} checked); with spec.topology.mode preferred, or a looser "
                "scope, it would fit",
            )
        elif eligible.placeable < request.total:
            failure = GangFailure(
                WaitReason.NO_FEASIBLE_NODES,
                f"needs {what}; nodes matching {_filters(request)} have {eligible.placeable} "
                "GPUs in all",
            )
        elif request.across is not None and request.across.required:
            domains = self.eligible_domains(request.across.node_label, request)
            best = max((placeable for _, _, placeable in domains), default=0)
            if best < request.total:
                failure = GangFailure(
                    WaitReason.NO_FEASIBLE_NODES,
                    f"needs {what} in one {request.across.node_label} domain; the largest has "
                    f"{best} GPUs",
                )
        if failure is None and request.across is not None and request.across.segment_label:
            label = request.across.segment_label
            segment = _segment(request) * k
            domains = self.eligible_domains(label, request)
            best = max((placeable for _, _, placeable in domains), default=0)
            if best < segment:
                failure = GangFailure(
                    WaitReason.NO_FEASIBLE_NODES,
                    f"needs segments of {request.across.segment_replicas} x {k} GPUs, each in "
                    f"one {label} domain; the largest has {best} GPUs",
                )
        self._feasible[request] = failure
        return failure


def _filters(request: Request) -> str:
    parts = []
    if request.gpu_model:
        parts.append(f"model {request.gpu_model}")
    if request.node_selector:
        parts.append("nodeSelector " + ",".join(f"{k}={v}" for k, v in request.node_selector))
    return " and ".join(parts) if parts else "the job (any GPU node)"


def _segment(request: Request) -> int:
    """Replicas per segment of the request's gang (1: no segments)."""
    across = request.across
    return (across.segment_replicas or 1) if across is not None else 1


def _listed(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and 3 more``."""
    if len(names) <= 2:
        return " and ".join(names)
    return f"{', '.join(names[:2])} and {len(names) - 2} more"


def _numbered(plans: list[ReplicaPlan]) -> list[ReplicaPlan]:
    return [
        ReplicaPlan(i, p.node, p.gpus, p.topology_class, p.score, p.count_only)
        for i, p in enumerate(plans)
    ]


def _empty_slot(node: Node) -> Slot:
    """A node's slot with no GpuJob holding anything: placeable GPUs minus those pods outside
    any GpuJob hold by index."""
    topo = node.topology
    foreign = 0
    for index in sorted(node.busy):
        try:
            foreign |= 1 << topo.position(index)
        except ValueError:
            continue
    return Slot(node=node, free=topo.placeable_mask & ~foreign, foreign=foreign)


def _lowest(mask: int, count: int) -> int:
    """The ``count`` lowest set bits of ``mask``."""
    out = 0
    while mask and count > 0:
        low = mask & -mask
        out |= low
        mask ^= low
        count -= 1
    return out
