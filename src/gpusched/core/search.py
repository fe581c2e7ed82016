"""Finding the best GPU set under :func:`gpusched.core.objective.evaluate`.

Exact search (nodes up to :data:`~gpusched.core.prepared.EXACT_MAX_GPUS` GPUs) rests on two
facts, both checked against brute force by the property tests:

* **Bandwidth levels.** The bottleneck is the second key of the objective and the scope flag the
  first. Walking the node's distinct pair bandwidths from the fastest down, the first level at
  which some qualifying k-set has every pair at least that fast is the optimal bottleneck, and
  every qualifying set found there has exactly that bottleneck. Such sets are k-cliques of the
  "at least this fast" graph, and they live inside one of its connected components (an NVLink
  island at the top level, a switch tree or socket further down), so components with fewer than
  k free GPUs are skipped whole.
* **Twins.** GPUs that see every other GPU the same way (same links, bandwidths, NUMA node, NIC
  proximity, health) are interchangeable; among them only the lowest free ones are tried. The
  canonical set so reached scores the same and has the lowest indices, so the tie-break holds.

Larger nodes use a heuristic: greedy growth from every free GPU, then pairwise swaps until no swap
improves the objective; when no grown set meets the scope, a clique search of the scope's graph
supplies one if any exists, so a feasible scope is never missed. The benchmark measures it against
the exact answer.
"""

from __future__ import annotations

from itertools import combinations
from typing import Final

from gpusched.core.objective import (
    SOLO_BOTTLENECK,
    Objective,
    SearchContext,
    Sums,
    compose,
    evaluate,
    in_scope,
    set_class,
)
from gpusched.core.prepared import CLASS_NODE, EXACT_MAX_GPUS

Found = tuple[Objective, tuple[int, ...]]

#: Upper bound on improvement rounds of the heuristic's local search.
_MAX_SWAP_ROUNDS: Final = 32
#: How many of the best greedy results the heuristic polishes with swaps.
_POLISHED: Final = 4


def _better(objective: Objective, positions: tuple[int, ...], best: Found | None) -> bool:
    if best is None:
        return True
    if objective != best[0]:
        return objective > best[0]
    return positions < best[1]


def _twin_predecessors(ctx: SearchContext) -> list[int]:
    """For each free position, the previous free member of its twin class (same health), or -1."""
    w = ctx.wiring
    pred = [-1] * w.n
    last = [-1] * (2 * w.n)  # slot per (twin class, degraded or not)
    twin_class = w.twin_class
    degraded = ctx.degraded
    for p in w.positions_of(ctx.free):
        slot = 2 * twin_class[p] + (degraded >> p & 1)
        pred[p] = last[slot]
        last[slot] = p
    return pred


def _exact_phase(ctx: SearchContext, k: int, scope: int | None) -> Found | None:
    """Best set with class rank <= ``scope`` (any set when None).

    Sets are grown one GPU at a time in increasing position order (so leaves come in
    lexicographic order) while their sums are accumulated; :func:`compose` turns the sums of a
    complete set into the same objective :func:`evaluate` would.
    """
    w = ctx.wiring
    pred = _twin_predecessors(ctx)
    best: Found | None = None
    if k == 1:
        for p in w.positions_of(ctx.free):
            if pred[p] < 0:
                objective = evaluate(ctx, (p,))
                if _better(objective, (p,), best):
                    best = (objective, (p,))
        return best

    bw = w.bw
    aff = w.aff
    numa_bit = w.numa_bit
    nic_points = w.nic_points
    free_affinity = ctx.free_affinity
    # In the scope phase every kept set is in scope; in the fallback phase of a preferred scope
    # the flag still has to be computed like evaluate() does.
    flag_needed = scope is None and ctx.scope_rank < CLASS_NODE

    def grow(  # noqa: PLR0917 - positional on purpose: this is the innermost loop
        adj: list[int] | tuple[int, ...],
        cand: int,
        chosen: int,
        members: tuple[int, ...],
        bottleneck: int,
        aggregate: int,
        internal: int,
        numa: int,
        nic: int,
        spent: int,
    ) -> None:
        nonlocal best
        need = k - len(members)
        if need == 0:
            if scope is not None and set_class(w, members) > scope:
                return
            scope_ok = in_scope(ctx, members) if flag_needed else True
            sums = Sums(chosen, bottleneck, aggregate, internal, numa, nic, spent)
            objective = compose(ctx, sums, scope_ok)
            if _better(objective, members, best):
                best = (objective, members)
            return
        while cand:
            if cand.bit_count() < need:
                return
            low = cand & -cand
            v = low.bit_length() - 1
            cand ^= low
            p = pred[v]
            if p >= 0 and not (chosen >> p) & 1:
                continue  # a lower twin is free and unused: the set with it is the canonical one
            row = bw[v]
            arow = aff[v]
            slowest = bottleneck
            total = aggregate
            inner = internal
            for m in members:
                x = row[m]
                total += x
                inner += arow[m]
                if x < slowest:  # noqa: PLR1730 - min() is slower in this loop
                    slowest = x
            grow(
                adj,
                cand & adj[v],
                chosen | low,
                (*members, v),
                slowest,
                total,
                inner,
                numa | numa_bit[v],
                nic + nic_points[v],
                spent + free_affinity[v],
            )

    scope_adj = None if scope is None else w.scope_adj[scope]
    for level_index in range(len(w.levels)):
        adj_level = w.adj_ge[level_index]
        adj = adj_level if scope_adj is None else [adj_level[p] & scope_adj[p] for p in range(w.n)]
        for component in w.comps_ge[level_index]:
            region = component & ctx.free
            if region.bit_count() >= k:
                grow(adj, region, 0, (), SOLO_BOTTLENECK, 0, 0, 0, 0, 0)
        if best is not None:
            return best
    return None


def _heuristic_phase(ctx: SearchContext, k: int, scope: int | None) -> Found | None:
    """Greedy growth from every free GPU, then best-improvement swaps on the best few."""
    w = ctx.wiring
    scope_adj = None if scope is None else w.scope_adj[scope]
    grown: dict[tuple[int, ...], Objective] = {}
    for seed in w.positions_of(ctx.free):
        members = _grow_greedily(ctx, seed, k, scope_adj)
        if (
            members is not None
            and members not in grown
            and (scope is None or set_class(w, members) <= scope)
        ):
            grown[members] = evaluate(ctx, members)
    if not grown and scope_adj is not None:
        # Greedy growth can walk into dead ends of the scope's graph from every seed (a GPU's
        # fastest partner outside the only qualifying set); a qualifying set must still be
        # found when one exists, or a feasible request would be refused.
        members = _first_clique(ctx, k, scope, scope_adj)
        if members is not None:
            grown[members] = evaluate(ctx, members)
    if not grown:
        return None
    ranked = sorted(grown.items(), key=lambda item: (item[1], [-p for p in item[0]]), reverse=True)
    best: Found | None = None
    for members, objective in ranked[:_POLISHED]:
        found = _swap_search(ctx, (objective, members), scope)
        if _better(found[0], found[1], best):
            best = found
    return best


def _first_clique(
    ctx: SearchContext, k: int, scope: int | None, scope_adj: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The lowest set of ``k`` free GPUs of class rank <= ``scope`` (a k-clique of the scope's
    graph that :func:`set_class` confirms), or None when there is none."""
    w = ctx.wiring

    def grow(cand: int, members: tuple[int, ...]) -> tuple[int, ...] | None:
        if len(members) == k:
            return members if scope is None or set_class(w, members) <= scope else None
        while cand.bit_count() >= k - len(members):
            low = cand & -cand
            cand ^= low
            v = low.bit_length() - 1
            found = grow(cand & scope_adj[v], (*members, v))
            if found is not None:
                return found
        return None

    return grow(ctx.free, ())


def _grow_greedily(
    ctx: SearchContext, seed: int, k: int, scope_adj: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """Add, one at a time, the GPU that keeps the partial set best: highest new bottleneck, then
    healthier, then most added bandwidth, no new NUMA node, NIC proximity, least fragmentation."""
    w = ctx.wiring
    bw = w.bw
    members = [seed]
    allowed = ctx.free & ~(1 << seed)
    if scope_adj is not None:
        allowed &= scope_adj[seed]
    slowest = {j: bw[seed][j] for j in w.positions_of(allowed)}
    total = dict(slowest)
    current = SOLO_BOTTLENECK
    numa = w.numa_bit[seed]
    while len(members) < k and allowed:
        best_key: tuple[int, int, int, int, int, int] | None = None
        pick = -1
        for j in w.positions_of(allowed):
            key = (
                min(current, slowest[j]),
                -(ctx.degraded >> j & 1),
                total[j],
                -int((w.numa_bit[j] & ~numa) != 0),
                w.nic_points[j] if ctx.multi_node else 0,
                -ctx.free_affinity[j],
            )
            if best_key is None or key > best_key:
                best_key = key
                pick = j
        current = min(current, slowest[pick])
        members.append(pick)
        numa |= w.numa_bit[pick]
        allowed &= ~(1 << pick)
        if scope_adj is not None:
            allowed &= scope_adj[pick]
        for j in w.positions_of(allowed):
            slowest[j] = min(slowest[j], bw[pick][j])
            total[j] += bw[pick][j]
    return tuple(sorted(members)) if len(members) == k else None


def _swap_search(ctx: SearchContext, start: Found, scope: int | None) -> Found:
    """Best-improvement local search: replace one member by one outsider while it helps."""
    w = ctx.wiring
    best = start
    for _ in range(_MAX_SWAP_ROUNDS):
        improved = False
        members = best[1]
        inside = set(members)
        outside = [p for p in w.positions_of(ctx.free) if p not in inside]
        round_best = best
        for out in members:
            rest = [p for p in members if p != out]
            for incoming in outside:
                trial = tuple(sorted((*rest, incoming)))
                if scope is not None and set_class(w, trial) > scope:
                    continue
                objective = evaluate(ctx, trial)
                if _better(objective, trial, round_best):
                    round_best = (objective, trial)
                    improved = True
        best = round_best
        if not improved:
            break
    return best


def _phases(scope_rank: int, required: bool) -> list[int | None]:
    if scope_rank >= CLASS_NODE:
        return [None]
    return [scope_rank] if required else [scope_rank, None]


def search(
    ctx: SearchContext, k: int, *, required: bool, exact: bool | None = None
) -> Found | None:
    """Best set of ``k`` free GPUs, or None when ``required`` and no set meets the scope.

    ``exact`` forces the method; by default nodes up to EXACT_MAX_GPUS are searched exactly.
    With a ``preferred`` scope the qualifying sets are tried first (the objective ranks them
    first), then every set.
    """
    if exact is None:
        exact = ctx.wiring.n <= EXACT_MAX_GPUS
    phase = _exact_phase if exact else _heuristic_phase
    for scope in _phases(ctx.scope_rank, required):
        found = phase(ctx, k, scope)
        if found is not None:
            return found
    return None


def brute_force(ctx: SearchContext, k: int, *, required: bool) -> Found | None:
    """Every k-subset of the free GPUs, scored with the same objective: the reference the exact
    search is proven against, and the ``optimal_fraction`` yardstick of the benchmark."""
    best: Found | None = None
    for members in combinations(ctx.wiring.positions_of(ctx.free), k):
        objective = evaluate(ctx, members)
        if required and not objective.scope_ok:
            continue
        if _better(objective, members, best):
            best = (objective, members)
    return best
