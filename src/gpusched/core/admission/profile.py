"""When GPUs come free: the time profile behind reservations and expected starts.

Every GPU of the cluster gets one time, the moment it is expected to be free for good: now if
nobody holds it, the expected end of the job holding it (:mod:`gpusched.core.runtime`), never
(infinity) for GPUs held by pods whose end nobody can predict. A job planned on the profile (a
reservation, or a waiting job in a forecast) moves its GPUs' times to its own expected end.

Reservations *claim* their GPUs (:meth:`Profile.claim`) and can give them back
(:meth:`Profile.unclaim`) when the cycle moves or drops them; forecast plans only take.

A request's *earliest start* is the first of those times at which the placement engine finds a
set meeting the request's topology policy on GPUs free by then, on as many nodes as it has
replicas (in one node-label domain when the gang requires one).

A job planned to start later than its GPUs come free leaves a *gap* on each of them: free from
when the GPU came free until the planned start. A single-node job of known run time may be
planned inside gaps (conservative backfill, as Slurm plans ``squeue --start``): it starts at the
first time at which the placement engine finds a set among the GPUs free for its whole run time,
so a short job is not told to wait behind a long one planned after a gang it does not delay. Run
times are rounded up (:func:`duration_class`, at most 19 % longer) so that jobs of similar length
share the search's indexes and cached answers; a job is never placed in a gap it does not fit.
Gangs across nodes are planned on the times when GPUs are free for good (they leave gaps others
may use, but do not use gaps themselves), and so are jobs of unknown run time. Reservations
*claim* their GPUs from now until they end: no gap is offered inside a claim.

Each node's answer is cached until one of its GPUs changes; single-replica requests keep a heap
of nodes by earliest time, so planning thousands of alike jobs costs a heap step and one node's
placement each. Gaps are searched only on nodes that have one long enough for the job's duration
class and opening before the best start found for good (a heap per duration class, by the start
of each node's first such gap).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpusched.core.admission.domains import level_of
from gpusched.core.admission.model import Assignment, ReplicaPlan
from gpusched.core.admission.pool import FilterKey, FreeShape, Pool, Request
from gpusched.core.placement import Placement, Policy, evaluate_set, place
from gpusched.core.ranking import NodeRank, node_rank

NEVER: Final = math.inf
_FREE: Final = -math.inf
"""The cycle's own time in the keys of answers kept across cycles."""

_HeapEntry = tuple[float, str, int]
_Gap = tuple[float, float]

#: Run times are rounded up to the next of these steps (a factor of 2 ** (1/4), 19 %) from a
#: minute: jobs of about the same length share the per-node answers of the gap search.
_DURATION_STEPS_PER_DOUBLING: Final = 4
_SHORTEST_DURATION: Final = 60.0


def duration_class(seconds: float | None) -> float:
    """The run time a gap must hold for a job of ``seconds`` (None or infinite: only the time
    its GPUs are free for good will do): rounded up to a step of 19 %, at least a minute."""
    if seconds is None or not math.isfinite(seconds):
        return NEVER
    if seconds <= _SHORTEST_DURATION:
        return _SHORTEST_DURATION
    steps = math.ceil(math.log2(seconds / _SHORTEST_DURATION) * _DURATION_STEPS_PER_DOUBLING)
    return float(_SHORTEST_DURATION * 2 ** (steps / _DURATION_STEPS_PER_DOUBLING))


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
        self._gaps: dict[str, dict[int, list[_Gap]]] = {}
        """Per node and GPU position: the gaps before :attr:`_base`, earliest first."""
        self._open: dict[str, dict[int, list[_Gap]]] = {}
        """The same after claims (a claim holds its GPUs from now): what a plan may use."""
        self._version: dict[str, int] = {}
        self._times: dict[tuple[str, int, int, int], tuple[int, tuple[float, ...]]] = {}
        """(node, GPUs, policy id, replicas) -> (node version, times)."""
        self._shapes: dict[str, tuple[int, FreeShape]] = {}
        """Node -> (node version, what its free times depend on: wiring, healthy GPUs and the
        times with the cycle's own written as -inf), the key its answers are kept under."""
        self._policy_ids: dict[int, int] = {}
        """Policy object id -> its small number in :attr:`Pool.policy_index` (jobs carry equal
        but distinct Policy objects, and comparing those in cache keys costs more than the
        answer)."""
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
        self._gap_heaps: dict[float, list[_HeapEntry]] = {}
        """Per duration class: nodes with an open gap at least that long, by the start of the
        first such gap (entries of an older version of their node are stale)."""
        self._starts: dict[tuple[str, int, int, float], tuple[int, tuple[float, ...]]] = {}
        """(node, GPUs, policy id, duration class) -> (node version, its gap starts)."""
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

    def take(
        self,
        plans: Iterable[ReplicaPlan | Assignment],
        until: float,
        start: float | None = None,
        *,
        leave_gaps: bool = True,
    ) -> None:
        """Hold the GPUs of ``plans`` from ``start`` (default: now) until ``until``: inside a
        gap the gap's rest stays open on both sides; past a GPU's free time the time between
        becomes a gap (a GPU already held longer keeps its later time). Without
        ``leave_gaps`` no new gap is recorded: a forecast starting jobs at its clock never looks
        back before it."""
        begin = self.now if start is None else max(self.now, start)
        if until <= begin:
            return
        for node, mask in self._masks(plans).items():
            base = self._base[node]
            gaps = self._gaps.get(node, {})
            for p in _positions(mask):
                if begin >= base[p]:
                    if begin > base[p] and leave_gaps:
                        gaps.setdefault(p, []).append((base[p], begin))
                    base[p] = until
                    continue
                found = gaps.get(p)
                if found:
                    gaps[p] = _without(found, begin, until)
                base[p] = max(base[p], until)
            if gaps:
                self._gaps[node] = gaps
            self._refresh(node)

    def free_from(self, node: str, mask: int, when: float) -> None:
        """GPUs (positions ``mask``) of ``node`` are free from ``when`` (a victim leaving)."""
        base = self._base.get(node)
        if base is None:
            return
        gaps = self._gaps.get(node, {})
        for p in _positions(mask):
            base[p] = max(self.now, when)
            gaps.pop(p, None)
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
        claimed: dict[int, float] = {}
        for key in sorted(self._claims_on.get(node, ())):
            mask, until = self._claims[key][node]
            for p in _positions(mask):
                at[p] = max(at[p], until)
                claimed[p] = max(claimed.get(p, self.now), until)
        self.free_at[node] = at
        gaps = self._gaps.get(node)
        # A claim holds its GPUs from now: a gap opens only after the claim ends.
        open_gaps = {
            p: kept
            for p, found in (gaps or {}).items()
            if (kept := _without(found, self.now, claimed[p]) if p in claimed else found)
        }
        self._version[node] += 1
        self._changes.append(node)
        if open_gaps:
            self._open[node] = open_gaps
            for length, heap in self._gap_heaps.items():
                first = self._first_gap(node, length)
                if first is not None:
                    heapq.heappush(heap, (first, node, self._version[node]))
        else:
            self._open.pop(node, None)

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

    def earliest(
        self, request: Request, not_before: float | None = None, runtime: float | None = None
    ) -> Slotting | None:
        """The earliest start of ``request`` on the profile, and its placement (None: never,
        as far as the profile knows). With its ``runtime``, a single-node job may start in a
        gap that holds it (module docstring)."""
        floor = self.now if not_before is None else max(self.now, not_before)
        if request.replicas == 1 and request.across is None:
            return self._earliest_single(request, floor, duration_class(runtime))
        return self._earliest_gang(request, floor)

    # --- single replica ------------------------------------------------------------------

    def _earliest_single(self, request: Request, floor: float, duration: float) -> Slotting | None:
        """Two searches. Where the replica fits for good soonest: a heap per kind of request of
        each node's first such time (entries refreshed when their node changed); every node
        free by then ties. Then, for a job of known run time, the nodes with a gap opening no
        later than that (a heap of nodes by their first gap's start, a lower bound of any start
        a gap gives): the search stops at the first node whose bound is past the best start
        found. Nodes equally early are ranked by the node ranking."""
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
        best = NEVER
        tied: list[str] = []
        if heap:
            best = max(floor, heap[0][0])
            seen: list[_HeapEntry] = []
            while heap and max(floor, heap[0][0]) <= best:
                entry = heapq.heappop(heap)
                if entry[2] != self._version[entry[1]]:
                    times = self._node_times(entry[1], k, policy, 1)
                    if times:
                        heapq.heappush(heap, (times[0], entry[1], self._version[entry[1]]))
                    continue
                seen.append(entry)
                tied.append(entry[1])
            for entry in seen:
                heapq.heappush(heap, entry)
        if duration < NEVER and self._open:
            best, tied = self._earliest_in_gaps(request, floor, duration, best, tied)
        chosen: tuple[NodeRank, str, Placement] | None = None
        for name in tied:
            found = self._place_at(name, k, policy, best, duration)
            if found is None:
                continue
            rank = node_rank(found)
            if chosen is None or self.pool.ranks_before(rank, name, chosen[0], chosen[1]):
                chosen = (rank, name, found)
        if chosen is None:
            return None
        _, name, found = chosen
        slot = self.pool.slots[name]
        plan = ReplicaPlan(
            0, name, found.gpus, found.topology_class, found.score, slot.node.count_only
        )
        return Slotting(best, (plan,))

    def _earliest_in_gaps(
        self, request: Request, floor: float, duration: float, best: float, tied: list[str]
    ) -> tuple[float, list[str]]:
        """``best`` and the nodes ``tied`` at it, improved by the nodes whose gaps take the
        replica for ``duration`` no later than ``best``."""
        k, policy = request.gpus_per_replica, request.policy
        eligible = self.pool.eligible_nodes(request).name_set
        heap = self._gap_heap(duration)
        seen: list[_HeapEntry] = []
        while heap and max(floor, heap[0][0]) <= best:
            entry = heapq.heappop(heap)
            _, name, version = entry
            if version != self._version[name]:
                continue  # the node changed: its current entry was pushed then
            seen.append(entry)
            if name not in eligible:
                continue
            start = self._gap_start(name, k, policy, duration, floor)
            if start is None or start > best:
                continue
            if start < best:
                best, tied = start, []
            if name not in tied:
                tied.append(name)
        for entry in seen:
            heapq.heappush(heap, entry)
        return best, tied

    # --- gangs ---------------------------------------------------------------------------

    def _earliest_gang(self, request: Request, floor: float) -> Slotting | None:
        alternatives = request.segment_alternatives()
        if alternatives is not None:
            # Preferred segments: the pool keeps them whenever it can at the start, so the gang
            # starts unsegmented only where the segmented start is later.
            kept = self._earliest_gang(alternatives[0], floor)
            loose = self._earliest_gang(alternatives[1], floor)
            if kept is None or (loose is not None and loose.start < kept.start):
                return loose
            return kept
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

    def _mask_at(self, name: str, when: float, duration: float = NEVER) -> int:
        """GPUs of ``name`` free from ``when`` for ``duration`` (for good when infinite)."""
        mask = 0
        bit = 1
        for t in self.free_at[name]:
            if t <= when:
                mask |= bit
            bit <<= 1
        gaps = self._open.get(name) if duration < NEVER else None
        if gaps:
            end = when + duration
            for p, found in gaps.items():
                if mask >> p & 1:
                    continue
                for a, b in found:
                    if a <= when and end <= b:
                        mask |= 1 << p
                        break
        return mask

    def _place_at(
        self, name: str, k: int, policy: Policy, when: float, duration: float = NEVER
    ) -> Placement | None:
        mask = self._mask_at(name, when, duration)
        if mask.bit_count() < k:
            return None
        found = place(self.pool.slots[name].node.topology, k, policy, free_mask=mask)
        return found if isinstance(found, Placement) else None

    def _gap_heap(self, length: float) -> list[_HeapEntry]:
        heap = self._gap_heaps.get(length)
        if heap is None:
            heap = [
                (first, name, self._version[name])
                for name in self._open
                if (first := self._first_gap(name, length)) is not None
            ]
            heapq.heapify(heap)
            self._gap_heaps[length] = heap
        return heap

    def _first_gap(self, name: str, length: float) -> float | None:
        """The start of the first open gap of ``name`` at least ``length`` long."""
        starts = [a for found in self._open[name].values() for a, b in found if b - a >= length]
        return min(starts) if starts else None

    def _gap_start(
        self, name: str, k: int, policy: Policy, duration: float, floor: float
    ) -> float | None:
        """The first time from ``floor`` at which a gap of ``name`` helps it host one replica
        of ``k`` GPUs for ``duration`` before it can for good (None: no gap helps). A ``floor``
        between two of :meth:`_gap_starts` is tried itself."""
        times = self._node_times(name, k, policy, 1)
        for_good = times[0] if times else NEVER
        if floor >= for_good:
            return None
        starts = self._gap_starts(name, k, policy, duration, for_good)
        if floor <= self.now:
            return starts[0] if starts else None
        if self._place_at(name, k, policy, floor, duration) is not None:
            return floor
        i = bisect.bisect_right(starts, floor)
        return starts[i] if i < len(starts) else None

    def _gap_starts(
        self, name: str, k: int, policy: Policy, duration: float, for_good: float
    ) -> tuple[float, ...]:
        """The times before ``for_good`` at which ``name`` can host one replica of ``k`` GPUs
        for ``duration``, among those where that can begin: now, a GPU coming free for good, a
        gap opening (cached until the node changes)."""
        version = self._version[name]
        key = (name, k, self._policy_id(policy), duration)
        cached = self._starts.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        candidates = {self.now}
        candidates.update(t for t in self.free_at[name] if self.now < t < for_good)
        gaps = self._open.get(name, {})
        candidates.update(a for found in gaps.values() for a, _ in found if self.now < a < for_good)
        starts = tuple(
            when
            for when in sorted(candidates)
            if self._place_at(name, k, policy, when, duration) is not None
        )
        self._starts[key] = (version, starts)
        if len(self._starts) > _MAX_TIMES:
            self._starts.clear()
            self._starts[key] = (version, starts)
        return starts

    def _policy_id(self, policy: Policy) -> int:
        found = self._policy_ids.get(id(policy))
        if found is None:
            index = self.pool.policy_index
            found = index.setdefault(policy, len(index))
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
        now = self.now
        # The answer depends on the node's wiring and healthy GPUs and on the order of the
        # times only, so it is kept across cycles and shared by nodes alike, with the cycle's
        # own time (free GPUs) written as -inf: a node whose holders did not change gives the
        # same answer next cycle without a placement, and so does every node of the same
        # wiring whose GPUs come free in the same order.
        shape = self._shapes.get(name)
        if shape is None or shape[0] != version:
            topo = self.pool.slots[name].node.topology
            at = tuple(_FREE if t == now else t for t in self.free_at[name])
            shape = self._shapes[name] = (
                version,
                (topo.wiring.key, topo.placeable_mask, topo.degraded_mask, at),
            )
        content = (shape[1], k, pid, most)
        kept = self.pool.free_times.get(content)
        if kept is None:
            kept = tuple(_FREE if t == now else t for t in self._count_times(name, k, policy, most))
            self.pool.free_times[content] = kept
        times = tuple(now if t == _FREE else t for t in kept) if _FREE in kept else kept
        self._times[key] = (version, times)
        if len(self._times) > _MAX_TIMES:
            self._times.clear()
            self._times[key] = (version, times)
        return times

    def _count_times(self, name: str, k: int, policy: Policy, most: int) -> list[float]:
        """:meth:`_node_times` worked out on the placement engine."""
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
        return out


#: Cached per-node answers kept (the cache starts over past it).
_MAX_TIMES: Final = 200_000


def _without(gaps: Sequence[_Gap], start: float, end: float) -> list[_Gap]:
    """``gaps`` less the time from ``start`` to ``end``."""
    out: list[_Gap] = []
    for a, b in gaps:
        if b <= start or a >= end:
            out.append((a, b))
            continue
        if a < start:
            out.append((a, start))
        if end < b:
            out.append((end, b))
    return out


def _positions(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
