"""When GPUs come free: the time profile behind reservations and expected starts.

Every GPU of the cluster gets one time, the moment it is expected to be free for good: now if
nobody holds it, the expected end of the job holding it (:mod:`gpusched.core.runtime`), never
(infinity) for GPUs held by pods whose end nobody can predict. A job planned on the profile (a
reservation, or a waiting job in a forecast) moves its GPUs' times to its own expected end.

Reservations *claim* their GPUs (:meth:`Profile.claim`) and can give them back
(:meth:`Profile.unclaim`) when the cycle moves or drops them; forecast plans only take.

A request's *earliest start* is the first of those times at which the placement engine finds a
set meeting the request's topology policy on GPUs free by then, on as many nodes as it has
replicas (in one node-label domain when the gang requires one). One time per GPU means a planned
job holds its GPUs from the moment they come free until it ends: the gaps before a planned start
are not offered to later jobs (a forecast is therefore conservative for small jobs that could
backfill into them; the admission cycle does offer reserved GPUs to jobs that end in time, see
docs/quotas.md).

Each node's answer is cached until one of its GPUs changes; single-replica requests keep a heap
of nodes by earliest time, so planning thousands of alike jobs costs a heap step and one node's
placement each.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpusched.core.admission.domains import level_of
from gpusched.core.admission.model import Assignment, ReplicaPlan
from gpusched.core.admission.pool import FilterKey, Pool, Request
from gpusched.core.placement import Placement, Policy, evaluate_set, place
from gpusched.core.ranking import NodeRank, node_rank

NEVER: Final = math.inf

_HeapEntry = tuple[float, str, int]


@dataclass(frozen=True, slots=True)
class Slotting:
    """Where and when a request fits on the profile."""

    start: float
    plans: tuple[ReplicaPlan, ...]


class Profile:
    """Per GPU, when it is free from (see the module docstring)."""

    def __init__(self, pool: Pool, now: float, ends: Mapping[str, float | None]) -> None:
        self.pool = pool
        self.now = now
        self.free_at: dict[str, list[float]] = {}
        """Per node and GPU position: when it is free for good (claims included)."""
        self._base: dict[str, list[float]] = {}
        """The same without claims."""
        self._claims: dict[str, dict[str, tuple[int, float]]] = {}
        """Claim key -> node -> (positions, until)."""
        self._claims_on: dict[str, set[str]] = {}
        """Node -> keys of the claims on it."""
        self._version: dict[str, int] = {}
        self._times: dict[tuple[str, int, int, int], tuple[int, tuple[float, ...]]] = {}
        """(node, GPUs, policy id, replicas) -> (node version, times)."""
        self._policies: dict[Policy, int] = {}
        """Each distinct policy's small id: jobs carry equal but distinct Policy objects, and
        comparing those in cache keys costs more than the answer."""
        self._policy_ids: dict[int, int] = {}
        self._keep: list[Policy] = []
        """The policies seen (their ids stay theirs while the profile lives)."""
        self._changes: list[str] = []
        """Nodes in the order their times changed (gang caches catch up from it)."""
        self._gang_times: dict[
            tuple[int, int, int, FilterKey], tuple[int, dict[str, tuple[float, ...]]]
        ] = {}
        """Per gang request: how far into :attr:`_changes` it is current, and each eligible
        node's times."""
        self._heaps: dict[tuple[int, Policy, FilterKey], list[_HeapEntry]] = {}
        for name, slot in pool.slots.items():
            topo = slot.node.topology
            at = [NEVER] * topo.wiring.n
            for p in _positions(slot.free & topo.placeable_mask):
                at[p] = now
            for job, mask in slot.held.items():
                end = ends.get(job)
                when = NEVER if end is None else max(now, end)
                for p in _positions(mask):
                    at[p] = when
            self._base[name] = at
            self.free_at[name] = list(at)
            self._version[name] = 0

    # --- changes -------------------------------------------------------------------------

    def take(self, plans: Iterable[ReplicaPlan | Assignment], until: float) -> None:
        """Hold the GPUs of ``plans`` until ``until`` (a GPU already held longer keeps its
        later time)."""
        for node, mask in self._masks(plans).items():
            base = self._base[node]
            for p in _positions(mask):
                base[p] = max(base[p], until)
            self._refresh(node)

    def free_from(self, node: str, mask: int, when: float) -> None:
        """GPUs (positions ``mask``) of ``node`` are free from ``when`` (a victim leaving)."""
        base = self._base.get(node)
        if base is None:
            return
        for p in _positions(mask):
            base[p] = max(self.now, when)
        self._refresh(node)

    def claim(self, key: str, plans: Iterable[ReplicaPlan | Assignment], until: float) -> None:
        """Reserve the GPUs of ``plans`` until ``until`` under ``key`` (undone by
        :meth:`unclaim`)."""
        self.unclaim(key)
        masks = self._masks(plans)
        self._claims[key] = {node: (mask, until) for node, mask in masks.items()}
        for node in masks:
            self._claims_on.setdefault(node, set()).add(key)
            self._refresh(node)

    def unclaim(self, key: str) -> None:
        """Give back what :meth:`claim` reserved under ``key``."""
        claimed = self._claims.pop(key, None)
        if claimed is None:
            return
        for node in claimed:
            self._claims_on[node].discard(key)
            self._refresh(node)

    def claims_on(self, node: str) -> frozenset[str]:
        """Keys of the reservations claiming GPUs of ``node``."""
        return frozenset(self._claims_on.get(node, ()))

    def claimed_by(self, key: str, node: str) -> int:
        """Positions of ``node`` the reservation ``key`` claims."""
        found = self._claims.get(key, {}).get(node)
        return 0 if found is None else found[0]

    def claimed(self, node: str, skip: str = "") -> int:
        """Positions of ``node`` claimed by any reservation but ``skip``."""
        mask = 0
        for key in self._claims_on.get(node, ()):
            if key != skip:
                mask |= self._claims[key][node][0]
        return mask

    def _masks(self, plans: Iterable[ReplicaPlan | Assignment]) -> dict[str, int]:
        out: dict[str, int] = {}
        for plan in plans:
            slot = self.pool.slots.get(plan.node)
            if slot is None or not plan.gpus:
                continue
            out[plan.node] = out.get(plan.node, 0) | slot.node.topology.mask(plan.gpus)
        return out

    def _refresh(self, node: str) -> None:
        at = list(self._base[node])
        for key in sorted(self._claims_on.get(node, ())):
            mask, until = self._claims[key][node]
            for p in _positions(mask):
                at[p] = max(at[p], until)
        self.free_at[node] = at
        self._version[node] += 1
        self._changes.append(node)

    # --- questions -----------------------------------------------------------------------

    def start_of(self, placement: Sequence[Assignment]) -> float | None:
        """When every GPU of a given placement is free (None: a GPU is gone, never free, or
        not known by index)."""
        latest = self.now
        for assignment in placement:
            slot = self.pool.slots.get(assignment.node)
            if slot is None or not assignment.gpus:
                return None
            topo = slot.node.topology
            try:
                mask = topo.mask(assignment.gpus)
            except ValueError:
                return None
            if mask & ~topo.placeable_mask or mask.bit_count() != len(assignment.gpus):
                return None
            at = self.free_at[assignment.node]
            for p in _positions(mask):
                latest = max(latest, at[p])
        return latest if latest < NEVER else None

    def plans_of(
        self, placement: Sequence[Assignment], request: Request
    ) -> tuple[ReplicaPlan, ...]:
        """A given placement as replica plans (scored as the placement engine scores a set)."""
        out = []
        for i, assignment in enumerate(placement):
            slot = self.pool.slots[assignment.node]
            found = evaluate_set(
                slot.node.topology,
                assignment.gpus,
                request.policy,
                free_mask=slot.node.topology.placeable_mask,
            )
            out.append(
                ReplicaPlan(
                    i,
                    assignment.node,
                    found.gpus,
                    found.topology_class,
                    found.score,
                    slot.node.count_only,
                )
            )
        return tuple(out)

    def earliest(self, request: Request, not_before: float | None = None) -> Slotting | None:
        """The earliest start of ``request`` on the profile, and its placement (None: never,
        as far as the profile knows)."""
        floor = self.now if not_before is None else max(self.now, not_before)
        if request.replicas == 1 and request.across is None:
            return self._earliest_single(request, floor)
        return self._earliest_gang(request, floor)

    # --- single replica ------------------------------------------------------------------

    def _earliest_single(self, request: Request, floor: float) -> Slotting | None:
        k = request.gpus_per_replica
        policy = request.policy
        key = (k, policy, request.filter_key)
        heap = self._heaps.get(key)
        if heap is None:
            heap = []
            for name in self.pool.eligible_nodes(request).names:
                times = self._node_times(name, k, policy, 1)
                if times:
                    heap.append((times[0], name, self._version[name]))
            heapq.heapify(heap)
            self._heaps[key] = heap
        # Drop entries of nodes that changed since they were pushed (push their new time).
        while heap and heap[0][2] != self._version[heap[0][1]]:
            _, name, _ = heapq.heappop(heap)
            times = self._node_times(name, k, policy, 1)
            if times:
                heapq.heappush(heap, (times[0], name, self._version[name]))
        if not heap:
            return None
        first = max(floor, heap[0][0])
        # Every node free by ``first`` is as early; the node ranking picks among them.
        tied: list[_HeapEntry] = []
        while heap and max(floor, heap[0][0]) <= first:
            entry = heapq.heappop(heap)
            if entry[2] != self._version[entry[1]]:
                times = self._node_times(entry[1], k, policy, 1)
                if times:
                    heapq.heappush(heap, (times[0], entry[1], self._version[entry[1]]))
                continue
            tied.append(entry)
        best: tuple[NodeRank, str, Placement] | None = None
        for _, name, _ in tied:
            found = self._place_at(name, k, policy, first, 0)
            if found is None:
                continue
            rank = node_rank(found)
            if best is None or rank > best[0] or (rank == best[0] and name < best[1]):
                best = (rank, name, found)
        for entry in tied:
            heapq.heappush(heap, entry)
        if best is None:
            return None
        _, name, found = best
        slot = self.pool.slots[name]
        plan = ReplicaPlan(
            0, name, found.gpus, found.topology_class, found.score, slot.node.count_only
        )
        return Slotting(first, (plan,))

    # --- gangs ---------------------------------------------------------------------------

    def _earliest_gang(self, request: Request, floor: float) -> Slotting | None:
        r = request.replicas
        if request.across is not None and request.across.segment_label is not None:
            return self._earliest_segmented(request, floor)
        pairs = [
            (max(floor, t), name)
            for name, times in self._gang_node_times(request).items()
            for t in times
        ]
        across = request.across
        if across is not None and across.required:
            best: tuple[float, str, list[tuple[float, str]]] | None = None
            by_domain: dict[str, list[tuple[float, str]]] = {}
            for t, name in pairs:
                value = self.pool.slots[name].node.labels.get(across.node_label)
                if value is not None:
                    by_domain.setdefault(value, []).append((t, name))
            whole = level_of(self.pool.levels, across.node_label).whole_domains
            for value, mine in sorted(by_domain.items()):
                if len(mine) < r or (whole and self.pool.degraded(across.node_label, value)):
                    continue
                mine.sort()
                at = mine[r - 1][0]
                if best is None or at < best[0]:
                    best = (at, value, mine)
            if best is None:
                return None
            start, _, chosen = best
        else:
            if len(pairs) < r:
                return None
            pairs.sort()
            start = pairs[r - 1][0]
            chosen = pairs
        order: list[str] = []
        for t, name in chosen:
            if t > start:
                break
            if name not in order:
                order.append(name)
        plans = self._segments_at([(order, request.replicas)], request, start)
        if plans is None:
            return None
        return Slotting(start, plans)

    def _earliest_segmented(self, request: Request, floor: float) -> Slotting | None:
        """The earliest start of a gang in segments (runs of ``segment_replicas`` consecutive
        replicas, each inside one domain of the segment level), all inside one domain of the
        outer level when it is required, as the pool places it: a segment domain can take a
        segment when its ``s``-th replica slot comes free, a second one at its ``2s``-th."""
        across = request.across
        assert across is not None
        assert across.segment_label is not None
        size = max(1, across.segment_replicas or 1)
        need = request.replicas // size
        levels = self.pool.levels
        whole_outer = across.required and level_of(levels, across.node_label).whole_domains
        whole_segment = level_of(levels, across.segment_label).whole_domains
        # outer domain ("" when the outer level is only preferred) -> segment domain -> slots
        groups: dict[str, dict[str, list[tuple[float, str]]]] = {}
        for name, times in self._gang_node_times(request).items():
            labels = self.pool.slots[name].node.labels
            segment = labels.get(across.segment_label)
            outer = labels.get(across.node_label) if across.required else ""
            if segment is None or outer is None:
                continue
            slots = groups.setdefault(outer, {}).setdefault(segment, [])
            slots.extend((max(floor, t), name) for t in times)
        best: tuple[float, str, list[tuple[float, str]]] | None = None
        for outer, segments in sorted(groups.items()):
            if whole_outer and self.pool.degraded(across.node_label, outer):
                continue
            ready: list[tuple[float, str]] = []
            for segment, slots in sorted(segments.items()):
                if whole_segment and self.pool.degraded(across.segment_label, segment):
                    continue
                slots.sort()
                ready.extend((slots[i][0], segment) for i in range(size - 1, len(slots), size))
            if len(ready) < need:
                continue
            ready.sort()
            if best is None or ready[need - 1][0] < best[0]:
                best = (ready[need - 1][0], outer, ready[:need])
        if best is None:
            return None
        start, outer, chosen = best
        counts: dict[str, int] = {}
        for _, segment in chosen:
            counts[segment] = counts.get(segment, 0) + 1
        parts = [
            ([name for t, name in groups[outer][segment] if t <= start], n * size)
            for segment, n in sorted(counts.items())
        ]
        plans = self._segments_at(parts, request, start)
        return Slotting(start, plans) if plans is not None else None

    def _segments_at(
        self, parts: Sequence[tuple[Sequence[str], int]], request: Request, start: float
    ) -> tuple[ReplicaPlan, ...] | None:
        """Place ``count`` consecutive replicas on the nodes of each part in turn (nodes in the
        order their GPUs come free); an unsegmented gang is one part of all its replicas."""
        k = request.gpus_per_replica
        plans: list[ReplicaPlan] = []
        for names, count in parts:
            placed = 0
            for name in dict.fromkeys(names):
                slot = self.pool.slots[name]
                topo = slot.node.topology
                mask = self._mask_at(name, start)
                while placed < count:
                    found = place(topo, k, request.policy, free_mask=mask)
                    if not isinstance(found, Placement):
                        break
                    plans.append(
                        ReplicaPlan(
                            len(plans),
                            name,
                            found.gpus,
                            found.topology_class,
                            found.score,
                            slot.node.count_only,
                        )
                    )
                    mask &= ~topo.mask(found.gpus)
                    placed += 1
                if placed == count:
                    break
            if placed < count:
                return None
        return tuple(plans)

    def _gang_node_times(self, request: Request) -> dict[str, tuple[float, ...]]:
        """Every eligible node's times for the gang's replicas, brought up to date with only
        the nodes that changed since the last request alike."""
        k, r, policy = request.gpus_per_replica, request.replicas, request.policy
        key = (k, self._policy_id(policy), r, request.filter_key)
        found = self._gang_times.get(key)
        if found is None:
            times = {
                name: t
                for name in self.pool.eligible_nodes(request).names
                if (t := self._node_times(name, k, policy, r))
            }
        else:
            seen, times = found
            eligible = self.pool.eligible_nodes(request).name_set
            for name in set(self._changes[seen:]):
                if name not in eligible:
                    continue
                t = self._node_times(name, k, policy, r)
                if t:
                    times[name] = t
                else:
                    times.pop(name, None)
        self._gang_times[key] = (len(self._changes), times)
        return times

    # --- one node ------------------------------------------------------------------------

    def _mask_at(self, name: str, when: float) -> int:
        mask = 0
        for p, t in enumerate(self.free_at[name]):
            if t <= when:
                mask |= 1 << p
        return mask

    def _place_at(
        self, name: str, k: int, policy: Policy, when: float, taken: int
    ) -> Placement | None:
        slot = self.pool.slots[name]
        found = place(slot.node.topology, k, policy, free_mask=self._mask_at(name, when) & ~taken)
        return found if isinstance(found, Placement) else None

    def _policy_id(self, policy: Policy) -> int:
        found = self._policy_ids.get(id(policy))
        if found is None:
            found = self._policies.setdefault(policy, len(self._policies))
            self._policy_ids[id(policy)] = found
            self._keep.append(policy)
        return found

    def _node_times(self, name: str, k: int, policy: Policy, most: int) -> tuple[float, ...]:
        """When the node can first host 1, 2, ... up to ``most`` replicas of ``k`` GPUs."""
        pid = self._policy_id(policy)
        key = (name, k, pid, most)
        version = self._version[name]
        found = self._times.get(key)
        if found is not None and found[0] == version:
            return found[1]
        at = self.free_at[name]
        topo = self.pool.slots[name].node.topology
        out: list[float] = []
        for when in sorted({t for t in at if t < NEVER}):
            mask = 0
            for p, t in enumerate(at):
                if t <= when:
                    mask |= 1 << p
            if mask.bit_count() < k * (len(out) + 1):
                continue
            count = 0
            while count < most:
                result = place(topo, k, policy, free_mask=mask)
                if not isinstance(result, Placement):
                    break
                count += 1
                mask &= ~topo.mask(result.gpus)
            while len(out) < count:
                out.append(when)
            if len(out) >= most:
                break
        times = tuple(out)
        self._times[key] = (version, times)
        if len(self._times) > _MAX_TIMES:
            self._times.clear()
            self._times[key] = (version, times)
        return times


#: Cached per-node answers kept (the cache starts over past it).
_MAX_TIMES: Final = 200_000


def _positions(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
