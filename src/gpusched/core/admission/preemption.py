"""Choosing the victims that make a blocked job placeable, at the least cost.

**What a victim costs**: the GPU-seconds of work it loses (GPUs x time since its start or its
last reported checkpoint) plus a restart penalty (GPUs x ``CycleConfig.restart_penalty_seconds``:
rescheduling, image pulls, loading the checkpoint). **Its rank** comes before its cost: jobs
that overran a reservation they were backfilled onto first, then other tenants' borrowed jobs
whatever their priority (for a tenant reclaiming its guarantee, evicting its own jobs brings it
no closer to it; a borrower's priority orders its own tenant's jobs and is no shield for what it
borrows), then the tenant's own jobs, lower priority first, its borrowed jobs before its
guaranteed ones. A victim set is
compared by (highest rank in it, total cost, size): a set of lower-ranked victims wins whatever
it costs, then the cheaper one.

**The search.** Every test runs the placement engine on the GPUs as they would be, so what is
freed is what the job can use under its topology policy, not a GPU count.

* One replica (most jobs, and gangs that fit one node): node by node, the cheapest set of the
  node's victims that frees a placement there; exact (every subset, cheapest first) for up to
  :data:`EXACT_VICTIMS` victims on a node, greedy then minimised beyond; nodes whose cheapest
  conceivable set already costs more than the best found are skipped. The node chosen is the
  one whose victims cost least: a tenant reclaiming its guarantee for an 8-GPU NVLink job gets
  the node whose borrowers lose least, freed whole, not GPUs scattered over many nodes.
* Several replicas: release every candidate and place the gang, give up at once if even that
  fails. Then two passes, each walked back afterwards (most expensive first, keeping each
  victim only if needed), and the cheaper set wins: release the cheapest victims first until
  placeable (the search Kueue uses, with real placements), and release node after node the
  cheapest set that frees one replica there, cheapest node first (a gang of whole-node
  replicas needs whole nodes; the cheapest victims, scattered over many nodes, may add up to
  them only at a higher price). Nodes are priced lazily, in order of the least a set on them
  could cost (:func:`cheapest_first`): a gang that needs two nodes prices a few of them.

A victim set must also keep the quota rules (:data:`QuotaCheck`) and leave every lending tenant
at or above its guarantee (:data:`LenderCheck`): reclaim takes borrowed GPUs only, however many
victims one eviction needs.

**Searches that cannot succeed end before any pass** (the same blocked jobs search every cycle,
and most of them find nothing): when no set passes the quota and the lenders' check, as told
from the victims one at a time (:func:`_never_passes`), and when no set the job's wait can pay
for frees enough of its tenant's own GPUs for the quota (:func:`_unaffordable`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations, islice
from typing import Final, Protocol, TypeVar, overload

from gpusched.core.admission.model import Job, PreemptReason, ReplicaPlan
from gpusched.core.admission.pool import GangFailure, Pool, Request
from gpusched.core.placement import Placement, place

#: Full placement checks one search may make during the greedy pass before it falls back to the
#: victims under the all-released placement (keeps a cycle bounded on huge clusters).
MAX_GREEDY_CHECKS = 48
#: Victims on one node up to which the cheapest set there is found exactly (2^n subsets, tried
#: cheapest first); beyond it greedy, then minimised, which can miss the cheapest set when
#: victims differ in size (a bound on the cycle's work: searches that fail try every node).
EXACT_VICTIMS: Final = 4
#: Nodes one single-replica search examines, those whose cheapest conceivable victim set costs
#: least first: a search that fails (every set breaks a lender's guarantee or is not worth its
#: cost) would otherwise try every node of the cluster in every cycle.
MAX_NODES_SEARCHED: Final = 16
#: Protection against priority preemption after a restart, for a job preempted before: this
#: long after its first preemption, doubling with each further one up to
#: :data:`REPREEMPT_PROTECTION_CAP_SECONDS` (never below its own ``minRuntimeSeconds``). A job
#: evicted once is not the cheapest victim again the moment it restarts; reclaiming a guarantee
#: is bounded by the job's protection on borrowed GPUs instead.
REPREEMPT_PROTECTION_SECONDS: Final = 1800.0
REPREEMPT_PROTECTION_CAP_SECONDS: Final = 8 * 3600.0

Rank = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job that may be evicted for the job being admitted."""

    job: Job
    reason: PreemptReason
    borrowed: bool
    """Whether it runs on capacity borrowed from another tenant."""
    lost: float
    """GPU-seconds of work since its start or last checkpoint."""
    penalty: float = 0.0
    """GPU-seconds a restart costs besides the lost work."""
    price: float = field(init=False, repr=False, compare=False)
    """GPU-seconds its eviction costs: lost work plus the restart penalty."""
    rank: Rank = field(init=False, repr=False, compare=False)
    """Lower goes first, whatever the price (see the module docstring). A borrower's priority
    orders its own tenant's jobs, not what another tenant may take back: among jobs reclaimed
    for a guarantee the price alone decides, so a tenant cannot shield what it borrows by
    raising its jobs' priority."""
    cost: tuple[Rank, float, float] = field(init=False, repr=False, compare=False)
    """Sort key, cheapest first: rank, price; ties go to the job submitted last."""

    def __post_init__(self) -> None:
        # Worked out once: victim searches sort and compare candidates thousands of times.
        overrun = 0 if self.reason is PreemptReason.BACKFILL_OVERRUN else 1
        own = 1 if self.reason is PreemptReason.HIGHER_PRIORITY else 0
        reclaim = self.reason is PreemptReason.RECLAIM_GUARANTEE
        rank = (overrun, own, 0 if reclaim else self.job.priority, 0 if self.borrowed else 1)
        price = self.lost + self.penalty
        object.__setattr__(self, "price", price)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "cost", (rank, price, -self.job.submitted_at))

    def own(self, preemptor: Job) -> bool:
        """Whether its GPUs count against the preemptor's own tenant's quota."""
        return self.reason is PreemptReason.HIGHER_PRIORITY or (
            self.reason is PreemptReason.BACKFILL_OVERRUN and self.job.tenant == preemptor.tenant
        )

    def lent(self, preemptor: Job) -> bool:
        """Whether evicting it takes GPUs from another tenant, which must keep what its
        guarantee covers of its jobs: a reclaim, or another tenant's backfill overrun (an
        overrun taken together with that tenant's reclaimed jobs could otherwise leave it
        below its guarantee)."""
        return self.reason is PreemptReason.RECLAIM_GUARANTEE or (
            self.reason is PreemptReason.BACKFILL_OVERRUN and self.job.tenant != preemptor.tenant
        )


SetKey = tuple[Rank, float, int]


def set_key(victims: Sequence[Candidate]) -> SetKey:
    """How a victim set compares: its highest rank, its total price, its size."""
    if not victims:
        return ((0, 0, 0, 0), 0.0, 0)
    return (max(c.rank for c in victims), sum(c.price for c in victims), len(victims))


def _tie(victims: Sequence[Candidate]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Among equally costly sets, the one holding the job submitted last (as single victims
    tie), then by name."""
    return (
        tuple(sorted(-c.job.submitted_at for c in victims)),
        tuple(sorted(c.job.key for c in victims)),
    )


def by_cost(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Cheapest first, deterministic."""
    by_key = sorted(candidates, key=lambda c: c.job.key, reverse=True)
    return sorted(by_key, key=lambda c: c.cost)


def gpu_seconds_lost(job: Job, now: float) -> float:
    """Work a preemption would throw away: GPUs x time since start or last checkpoint."""
    if job.started_at is None:
        return 0.0
    since = job.started_at
    if job.last_checkpoint_at is not None and job.last_checkpoint_at > since:
        since = job.last_checkpoint_at
    return max(0.0, now - since) * job.total_gpus


def repreempt_protection(job: Job) -> float:
    """Seconds after a restart during which a job preempted before is no priority victim."""
    if job.preemptions <= 0:
        return 0.0
    return min(
        REPREEMPT_PROTECTION_SECONDS * 2.0 ** (job.preemptions - 1),
        REPREEMPT_PROTECTION_CAP_SECONDS,
    )


def protected_until(job: Job, *, reclaim: bool = False) -> float | None:
    """When the job's protection ends (None: not started, so not yet counting): its minimum
    runtime, longer after earlier preemptions; against a tenant reclaiming its guarantee, the
    job's (shorter) protection on borrowed GPUs."""
    if job.started_at is None:
        return None
    seconds = job.min_runtime_seconds
    if reclaim:
        if job.reclaim_min_runtime_seconds is not None:
            seconds = min(seconds, job.reclaim_min_runtime_seconds)
    else:
        seconds = max(seconds, repreempt_protection(job))
    return job.started_at + seconds


def may_be_victim(job: Job, now: float, *, reclaim: bool = False) -> bool:
    """Preemptible, running, and past its protection (``reclaim``: as it protects borrowed
    GPUs against a guarantee)."""
    if not job.preemptible or job.started_at is None:
        return False
    until = protected_until(job, reclaim=reclaim)
    return until is not None and now >= until


def unprotected_at(job: Job, now: float, *, reclaim: bool = False) -> float | None:
    """When a preemptible running job that :func:`may_be_victim` turns down at ``now`` for
    its protection alone may be one (None: it may be one now, or never): the cycle decides
    again then, as a preemption its protection blocks can happen at that moment."""
    if not job.preemptible or job.started_at is None:
        return None
    until = protected_until(job, reclaim=reclaim)
    return until if until is not None and until > now else None


@dataclass(frozen=True, slots=True)
class VictimSearch:
    """Result of a successful search."""

    plans: list[ReplicaPlan]
    victims: list[Candidate]


def _overlaps(pool: Pool, held: dict[str, int], plans: Sequence[ReplicaPlan]) -> bool:
    for plan in plans:
        mask = held.get(plan.node, 0)
        if mask and mask & pool.slots[plan.node].node.topology.mask(plan.gpus):
            return True
    return False


QuotaCheck = Callable[[Sequence[Job], bool, Sequence["Candidate"]], bool]
"""``quota_ok(own_victims, any_reclaim_victim, victims)``: may the preemptor's tenant (and
every level above it) admit it once those victims are gone? The first two are what a flat
tenant's limit needs, kept cheap by the searches; all the victims count under a parent's."""


class _Without(Sequence[Candidate]):
    """``victims`` but ``gone``, without copying: a minimisation asks the quota of every
    set one victim smaller, and only a tenant tree's levels walk the set."""

    __slots__ = ("_gone", "_victims")

    def __init__(self, victims: Sequence[Candidate], gone: Candidate) -> None:
        self._victims = victims
        self._gone = gone

    def __len__(self) -> int:
        return len(self._victims) - 1

    @overload
    def __getitem__(self, index: int) -> Candidate: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Candidate]: ...
    def __getitem__(self, index: int | slice) -> Candidate | Sequence[Candidate]:
        return list(self)[index]

    def __iter__(self) -> Iterator[Candidate]:
        gone = self._gone
        return (c for c in self._victims if c is not gone)


class _Minimised:
    """The quota of a victim set that only shrinks, kept as it shrinks: the preemptor's own
    victims and the count of reclaims are updated per victim dropped, so the check of "this
    set without one victim" costs the own victims, not the whole set (a gang's greedy pass can
    take hundreds of one-GPU victims, then tries to spare each)."""

    def __init__(self, quota_ok: QuotaCheck, preemptor: Job, chosen: Sequence[Candidate]) -> None:
        self._quota_ok = quota_ok
        self.chosen = list(chosen)
        self._own = [c for c in chosen if c.own(preemptor)]
        self._reclaims = sum(c.reason is PreemptReason.RECLAIM_GUARANTEE for c in chosen)

    def passes_without(self, gone: Candidate) -> bool:
        """The quota of the set without ``gone`` (the set itself unchanged)."""
        own = self._own
        if any(c is gone for c in own):
            own = [c for c in own if c is not gone]
        reclaims = self._reclaims - (gone.reason is PreemptReason.RECLAIM_GUARANTEE)
        return self._quota_ok([c.job for c in own], reclaims > 0, _Without(self.chosen, gone))

    def drop(self, gone: Candidate) -> None:
        """Take ``gone`` out of the set."""
        self.chosen = [c for c in self.chosen if c is not gone]
        self._own = [c for c in self._own if c is not gone]
        self._reclaims -= gone.reason is PreemptReason.RECLAIM_GUARANTEE


def _quota(
    quota_ok: QuotaCheck, preemptor: Job, candidates: Sequence[Candidate]
) -> Callable[[Sequence[Candidate]], bool]:
    """``quota_ok`` of a victim set drawn from ``candidates`` (which of them are the
    preemptor's own is worked out once per search: sets are checked thousands of times)."""
    mine = {id(c) for c in candidates if c.own(preemptor)}

    def check(victims: Sequence[Candidate]) -> bool:
        own = [c.job for c in victims if id(c) in mine]
        cross = any(c.reason is PreemptReason.RECLAIM_GUARANTEE for c in victims)
        return quota_ok(own, cross, victims)

    return check


def _without_reclaim(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates that do not reclaim a guarantee.

    The quota rule only gets easier with more of the preemptor's own victims (each frees
    room under its tenant's limit and guarantee) and more victims below a limited level, and
    only harder with a reclaim victim among them (the job must then fit its guarantee): no
    victim set passes it when neither all the candidates nor all those without a reclaim do."""
    return [c for c in candidates if c.reason is not PreemptReason.RECLAIM_GUARANTEE]


LenderCheck = Callable[[Sequence[Candidate]], bool]


def _never_passes(
    ordered: Sequence[Candidate],
    quota: Callable[[Sequence[Candidate]], bool],
    lenders_ok: LenderCheck,
) -> bool:
    """Whether no victim set among ``ordered`` passes both ``quota`` and ``lenders_ok``, told
    without a search (False: one may).

    A set passes ``lenders_ok`` only if each of its victims does alone (adding victims never
    makes a failing set pass). The quota rule only gets easier with more victims, and harder
    with a reclaim among them (:func:`_without_reclaim`): no set without a reclaim passes when
    all the others that pass alone do not, and no set with one passes when those together with
    every reclaim do not. Reclaims are not checked alone (their lenders' check is the costly
    one): taking them all only makes the second test looser."""
    reclaims = [c for c in ordered if c.reason is PreemptReason.RECLAIM_GUARANTEE]
    others = [
        c for c in ordered if c.reason is not PreemptReason.RECLAIM_GUARANTEE and lenders_ok([c])
    ]
    if others and quota(others):
        return False
    return not (reclaims and quota([*others, *reclaims]))


"""``lenders_ok(victims)``: does every other tenant losing victims keep its guarantee? Adding
victims never makes a failing set pass."""


def _unaffordable(
    ordered: Sequence[Candidate],
    quota: Callable[[Sequence[Candidate]], bool],
    worth_it: LenderCheck,
    short: int,
) -> bool:
    """Whether no victim set passes ``quota`` and ``worth_it`` and frees the ``short`` GPUs
    the job lacks on the nodes it may use, told without a search, for a quota rule that reads
    the preemptor's own victims by their GPUs alone (True: none can; False: one may).

    ``worth_it`` bounds the price of the priority victims of a set. No affordable set of them
    frees more GPUs than the cheapest per GPU taken in order up to and including the first
    that makes them unaffordable (the fractional knapsack bound); the set used frees exactly
    the most any affordable set does (:func:`_most_gpus_affordable`, counted up to that bound).
    The quota rule only gets easier with more of the preemptor's own GPUs freed and with more
    victims of any kind, except that a reclaim among them makes it stricter
    (:func:`_never_passes`). So a set without a reclaim passes only if that set, with every
    backfill overrun, passes the quota and frees ``short`` GPUs; a set with one only if that
    set with every reclaim added passes the quota. A gang whose tenant must shed more of its
    own work than its wait is worth fails here, instead of in both passes of its search every
    cycle."""
    priced = sorted(
        (c for c in ordered if c.reason is PreemptReason.HIGHER_PRIORITY),
        key=lambda c: c.price / c.job.total_gpus,
    )
    if not priced:
        return False
    reach: list[Candidate] = []
    for c in priced:
        reach.append(c)
        if not worth_it(reach):
            reach = _most_gpus_affordable(priced, worth_it, sum(x.job.total_gpus for x in reach))
            break
    bound = [*(c for c in ordered if c.reason is PreemptReason.BACKFILL_OVERRUN), *reach]
    if sum(c.job.total_gpus for c in bound) >= short and quota(bound):
        return False
    reclaims = [c for c in ordered if c.reason is PreemptReason.RECLAIM_GUARANTEE]
    return not (reclaims and quota([*bound, *reclaims]))


def _most_gpus_affordable(
    priced: Sequence[Candidate], worth_it: LenderCheck, most: int
) -> list[Candidate]:
    """A set of ``priced`` freeing as many GPUs as any set ``worth_it`` allows (at most
    ``most``): for each GPU count, the cheapest set of exactly that many (a 0/1 knapsack over
    counts), the largest count whose cheapest set is affordable."""
    cheapest: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for i, c in enumerate(priced):
        size, price = c.job.total_gpus, c.price
        for count in sorted(cheapest, reverse=True):
            to = count + size
            if to > most:
                continue
            total = cheapest[count][0] + price
            if to not in cheapest or total < cheapest[to][0]:
                cheapest[to] = (total, (*cheapest[count][1], i))
    for count in sorted(cheapest, reverse=True):
        chosen = [priced[i] for i in cheapest[count][1]]
        if not chosen or worth_it(chosen):
            return chosen
    return []


def find_victims(
    pool: Pool,
    preemptor: Job,
    request: Request,
    candidates: Sequence[Candidate],
    quota_ok: QuotaCheck,
    *,
    lenders_ok: LenderCheck = lambda _: True,
    worth_it: LenderCheck = lambda _: True,
    lender_tracker: Callable[[], Callable[[Candidate], bool]] | None = None,
    may_place_now: bool = True,
    frees_quota: Callable[[Candidate], bool] | None = None,
    quota_by_count: bool = False,
) -> VictimSearch | GangFailure | None:
    """The cheapest minimal victim set that makes the gang placeable.

    On success the pool holds the preemptor's GPUs under its key and the victims' other GPUs
    stay held by them (they are terminating). Returns None when no subset works, or the
    placement failure with every candidate gone (for the wait message). ``worth_it``: whether
    a set's gain outweighs its cost (adding victims never makes a failing set pass).
    ``lender_tracker``: a new tracker of ``lenders_ok`` as reclaim victims are added one by
    one (True and the victim counted when the lenders still keep their guarantee), for a
    greedy pass over many candidates in linear time. ``may_place_now``: False when the caller
    has just seen the job fail to place on the free GPUs as they are (no victim set for its
    limit alone is then worth looking for). ``frees_quota``: which other tenants' candidates
    count against a limit the job is refused for (the jobs of a sibling team under a parent
    at its borrowing limit); None: only the tenant's own. ``quota_by_count``: ``quota_ok``
    reads the preemptor's own victims by their GPUs alone, more being easier (the tenant has
    no per-model guarantee), so searches no affordable set could pass are skipped
    (:func:`_unaffordable`).
    """
    if request.replicas == 1 and request.across is None:
        static = pool.static_failure(request)
        if static is not None:
            return static
        passes: LenderCheck = lambda v: lenders_ok(v) and worth_it(v)  # noqa: E731
        quota_of = _quota(quota_ok, preemptor, candidates)
        if _never_passes(candidates, quota_of, passes):
            return None
        if quota_by_count and _unaffordable(
            candidates, quota_of, worth_it, request.total - pool.free_gpus(request)[0]
        ):
            return None
        return _one_replica(
            pool,
            preemptor,
            request,
            by_cost(candidates),
            quota_ok=quota_ok,
            lenders_ok=passes,
            may_place_now=may_place_now,
            frees_quota=frees_quota,
        )
    ordered = by_cost(candidates)
    quota = _quota(quota_ok, preemptor, ordered)
    if not ordered or not quota(ordered):
        # Reclaim victims may be what breaks the quota rule; try without them.
        ordered = _without_reclaim(ordered)
        if not ordered or not quota(ordered):
            return None

    def ok(victims: Sequence[Candidate]) -> bool:
        return quota(victims) and lenders_ok(victims) and worth_it(victims)

    search = _GangSearch(
        pool, preemptor, request, ordered=ordered, quota_ok=quota_ok, ok=ok, lenders_ok=lenders_ok
    )
    # 1. Upper bound: everything released.
    upper = search.upper_bound()
    if isinstance(upper, GangFailure):
        return upper
    if quota_by_count and _unaffordable(
        ordered, quota, worth_it, request.total - pool.free_gpus(request)[0]
    ):
        return None
    # 2. Two passes, each minimised; the cheaper set wins. By victim: the cheapest victims
    # first, wherever they run. By node: node after node, the cheapest set that frees one
    # replica there (a gang of whole-node replicas needs whole nodes, which the cheapest
    # victims, scattered over many nodes, may add up to only at a higher price).
    found: list[list[Candidate]] = []
    greedy_passes: tuple[Callable[[], _Passed | None], ...] = (
        lambda: search.by_victim(upper, lender_tracker),
        search.by_node,
    )
    for greedy in greedy_passes:
        passed = greedy()
        if passed is not None:
            kept = search.minimise(*passed)
            found.append(kept)
            search.undo(kept)
    if not found:
        return None
    best = min(found, key=lambda victims: (set_key(victims), _tie(victims)))
    for c in best:
        search.release(c)
    result = pool.place_gang(preemptor.key, request)
    assert not isinstance(result, GangFailure), "placement vanished between identical checks"
    # What the preemptor does not use stays with the terminating victims; a victim whose GPUs
    # the final placement does not touch is spared when the quota allows.
    kept_set = _Minimised(quota_ok, preemptor, best)
    for c in reversed(best):
        if (
            len(kept_set.chosen) > 1
            and not _overlaps(pool, search.released[c.job.key], result)
            and kept_set.passes_without(c)
        ):
            kept_set.drop(c)
        search.restore(c)
    return VictimSearch(result, kept_set.chosen)


_Passed = tuple[list[Candidate], list[ReplicaPlan]]
"""A victim set that passed every check, released in the pool, and the gang's placement."""


class _GangSearch:
    """One victim search for a gang: which candidates are released from the pool (their
    GPUs back with :meth:`restore`), and the checks the passes share. Every pass leaves the
    pool as it found it or returns its set released."""

    def __init__(
        self,
        pool: Pool,
        preemptor: Job,
        request: Request,
        *,
        ordered: Sequence[Candidate],
        quota_ok: QuotaCheck,
        ok: LenderCheck,
        lenders_ok: LenderCheck,
    ) -> None:
        self.pool = pool
        self.preemptor = preemptor
        self.request = request
        self.ordered = ordered
        self.quota_ok = quota_ok
        self.ok = ok
        self.lenders_ok = lenders_ok
        self.released: dict[str, dict[str, int]] = {}

    def release(self, c: Candidate) -> None:
        self.released[c.job.key] = self.pool.release(c.job.key)

    def restore(self, c: Candidate) -> None:
        self.pool.restore(c.job.key, self.released.pop(c.job.key))

    def undo(self, chosen: Sequence[Candidate]) -> None:
        for c in reversed(chosen):
            self.restore(c)

    def placeable(self, names: Sequence[str] | None = None) -> list[ReplicaPlan] | None:
        """The gang's placement on the pool as it is (only on ``names`` for one replica)."""
        if names is not None:
            choice, _ = self.pool.choose(self.request, names)
            if choice is None:
                return None
        result = self.pool.place_gang(self.preemptor.key, self.request)
        if isinstance(result, GangFailure):
            return None
        self.pool.release(self.preemptor.key)
        return result

    def upper_bound(self) -> list[ReplicaPlan] | GangFailure:
        """The placement with every candidate gone (the failure: no set can work)."""
        for c in self.ordered:
            self.release(c)
        upper = self.pool.place_gang(self.preemptor.key, self.request)
        if not isinstance(upper, GangFailure):
            self.pool.release(self.preemptor.key)
        self.undo(self.ordered)
        return upper

    def by_victim(
        self,
        upper: list[ReplicaPlan],
        lender_tracker: Callable[[], Callable[[Candidate], bool]] | None,
    ) -> _Passed | None:
        """Release the cheapest victims first until the gang places; failing that, the
        victims under the all-released placement. Single-replica jobs only need the nodes
        freed since the last check looked at (the others could not host it then and have
        not changed)."""
        pool, request, preemptor = self.pool, self.request, self.preemptor
        chosen: list[Candidate] = []
        own: list[Job] = []
        cross = False
        lends = (
            lender_tracker()
            if lender_tracker is not None
            else (lambda c: self.lenders_ok([*chosen, c]))
        )
        plans = self.placeable()
        touched: list[str] = []
        checks = 0
        incremental = request.replicas == 1 and plans is None
        for c in self.ordered:
            if plans is not None:
                break
            # Only victims taken from other tenants bear on the lenders (``chosen`` already
            # passed).
            if c.lent(preemptor) and not lends(c):
                continue
            self.release(c)
            chosen.append(c)
            if c.own(preemptor):
                own.append(c.job)
            if c.reason is PreemptReason.RECLAIM_GUARANTEE:
                cross = True
            touched.extend(n for n in self.released[c.job.key] if n not in touched)
            if not self.quota_ok(own, cross, chosen):
                continue
            if incremental:
                plans = self.placeable(touched)
                touched = []
                continue
            if checks >= MAX_GREEDY_CHECKS:
                break
            checks += 1
            plans = self.placeable()
        if plans is not None and self.ok(chosen):
            return chosen, plans
        self.undo(chosen)
        chosen = [c for c in self.ordered if _overlaps(pool, pool.holdings(c.job.key), upper)]
        for c in chosen:
            self.release(c)
        plans = self.placeable() if self.ok(chosen) else None
        if plans is None:
            self.undo(chosen)
            return None
        return chosen, plans

    def by_node(self) -> _Passed | None:
        """Release, node after node in order of what it costs, the cheapest set of a node's
        victims that frees one replica there, until the gang places (at most
        :data:`MAX_GREEDY_CHECKS` placement checks). A node's set is worked out only when the
        nodes before it in that order are known: in order of the least any set on it could
        cost (:func:`_bound`), a node is priced once no node left could beat the cheapest
        priced one, so a gang that needs two nodes prices a few, not every node with a
        candidate."""
        pool, request = self.pool, self.request
        on_node, bounds = _nodes_by_bound(pool, request, self.ordered)

        def price(node: str) -> _NodeOption | None:
            return _cheapest_on_node(
                pool,
                node,
                request,
                on_node[node],
                ok=self.lenders_ok,
                lenders=self.lenders_ok,
                best=None,
            )

        options = cheapest_first(bounds, price)
        chosen: list[Candidate] = []
        plans: list[ReplicaPlan] | None = None
        for option in islice(options, MAX_GREEDY_CHECKS):
            for c in option.victims:
                if c.job.key not in self.released:
                    self.release(c)
                    chosen.append(c)
            if self.ok(chosen):
                plans = self.placeable()
                if plans is not None:
                    break
        if plans is None:
            self.undo(chosen)
            return None
        # Minimisation tries the most expensive first, as for the other pass.
        index = {id(c): i for i, c in enumerate(self.ordered)}
        chosen.sort(key=lambda c: index[id(c)])
        return chosen, plans

    def minimise(self, chosen: list[Candidate], plans: list[ReplicaPlan]) -> list[Candidate]:
        """Spare victims, most expensive first, until none can be: one whose GPUs the
        placement does not use goes if the quota allows it; one whose GPUs it uses, if the
        gang still places without them. Passes repeat while a victim goes: sparing another
        tenant's victim can make own victims unneeded that the quota needed beside it (a
        reclaim is only for a job inside the guarantee), and a new placement can leave others'
        GPUs unused. (A pass goes on after a victim goes rather than starting over: the same
        end, no victim that can be spared, in a number of checks linear in the victims per
        pass.) Every set tried is a subset of one that passed the checks: fewer victims leave
        every lender at least as much (a subset sum over more jobs) and cost less, so only
        the quota is left to check, kept as the set shrinks. The set stays released."""
        kept = _Minimised(self.quota_ok, self.preemptor, chosen)
        dropped = True
        while dropped and len(kept.chosen) > 1:
            dropped = False
            for c in reversed(list(kept.chosen)):
                if len(kept.chosen) == 1:
                    break
                if not kept.passes_without(c):
                    continue
                used = _overlaps(self.pool, self.released[c.job.key], plans)
                self.restore(c)
                again = self.placeable() if used else plans
                if again is None:
                    self.release(c)
                    continue
                kept.drop(c)
                plans = again
                dropped = True
        return kept.chosen


@dataclass(frozen=True, slots=True)
class _NodeOption:
    """A victim set that frees a placement on one node."""

    key: SetKey
    node: str
    victims: tuple[Candidate, ...]
    placement: Placement


def _one_replica(
    pool: Pool,
    preemptor: Job,
    request: Request,
    ordered: Sequence[Candidate],
    *,
    quota_ok: QuotaCheck,
    lenders_ok: LenderCheck,
    may_place_now: bool = True,
    frees_quota: Callable[[Candidate], bool] | None = None,
) -> VictimSearch | GangFailure | None:
    """A single replica: the node whose cheapest freeing victim set costs least."""
    static = pool.static_failure(request)
    if static is not None:
        return static
    quota = _quota(quota_ok, preemptor, ordered)

    def ok(victims: Sequence[Candidate]) -> bool:
        return lenders_ok(victims) and quota(victims)

    quota_only = (
        _quota_only(pool, preemptor, request, ordered, ok, frees_quota=frees_quota)
        if may_place_now
        else None
    )
    if quota_only is not None:
        # The job places on free GPUs: victims are for its tenant's limit only, and any of
        # the tenant's jobs will do, wherever they run (a node's set would have to meet the
        # limit too, and free a placement besides).
        return quota_only
    on_node, bounds = _nodes_by_bound(pool, request, ordered)
    best: _NodeOption | None = None
    for bound, node in bounds[:MAX_NODES_SEARCHED]:
        if best is not None and bound > best.key:
            break
        found = _cheapest_on_node(
            pool, node, request, on_node[node], ok=ok, lenders=lenders_ok, best=best
        )
        if found is not None and (
            best is None
            or (found.key, _tie(found.victims), node) < (best.key, _tie(best.victims), best.node)
        ):
            best = found
    if best is None:
        return None
    slot = pool.slots[best.node]
    released = {c.job.key: pool.release(c.job.key) for c in best.victims}
    pool.hold(preemptor.key, best.node, best.placement.gpus)
    for key, held in released.items():
        pool.restore(key, held)
    plan = ReplicaPlan(
        replica=0,
        node=best.node,
        gpus=best.placement.gpus,
        topology_class=best.placement.topology_class,
        score=best.placement.score,
        count_only=slot.node.count_only,
    )
    return VictimSearch([plan], list(best.victims))


def _quota_only(
    pool: Pool,
    preemptor: Job,
    request: Request,
    ordered: Sequence[Candidate],
    ok: LenderCheck,
    *,
    frees_quota: Callable[[Candidate], bool] | None = None,
) -> VictimSearch | None:
    """When the job places on free GPUs as they are, the cheapest own victims that bring its
    tenant within its limit (cheapest first, then each spared that can be, most expensive
    first); failing that, with ``frees_quota``, the same over its own and those candidates.
    None when it does not place, or no such set passes ``ok``."""
    plans = pool.place_gang(preemptor.key, request)
    if isinstance(plans, GangFailure):
        return None
    # Checks below may read the pool (the wait the job would have without preemption): not
    # with the job's GPUs held for a placement that is not made yet.
    pool.release(preemptor.key)
    passes: list[Callable[[Candidate], bool]] = [lambda c: c.own(preemptor)]
    if frees_quota is not None:
        also = frees_quota
        passes.append(lambda c: c.own(preemptor) or also(c))
    chosen: list[Candidate] = []
    passed = False
    for allowed in passes:
        chosen = []
        # The set is checked again only when it grew (a check costs as much as the set).
        passed = ok(chosen)
        if not passed:
            for c in ordered:
                if allowed(c):
                    chosen.append(c)
                    if ok(chosen):
                        passed = True
                        break
        if chosen and passed:
            break
    if not chosen or not passed:
        return None
    spared = True
    while spared:
        spared = False
        for c in sorted(chosen, key=lambda x: x.cost, reverse=True):
            trial = [x for x in chosen if x is not c]
            if trial and ok(trial):
                chosen, spared = trial, True
    for plan in plans:
        pool.hold(preemptor.key, plan.node, plan.gpus)
    return VictimSearch(plans, chosen)


def _nodes_by_bound(
    pool: Pool, request: Request, ordered: Sequence[Candidate]
) -> tuple[dict[str, list[tuple[Candidate, int]]], list[tuple[SetKey, str]]]:
    """The candidates on each node ``request`` may use (with the GPUs they hold there), and
    the nodes where they could free one replica, by the least a set of them could cost
    (:func:`_bound`), lowest first. Freeing more never hurts a placement: a node whose victims
    all together free none is left out."""
    eligible = pool.eligible_nodes(request).name_set
    on_node: dict[str, list[tuple[Candidate, int]]] = {}
    for c in ordered:
        for node, mask in pool.holding(c.job.key).items():
            if node in eligible:
                on_node.setdefault(node, []).append((c, mask))
    k = request.gpus_per_replica
    bounds: list[tuple[SetKey, str]] = []
    for node, options in on_node.items():
        slot = pool.slots[node]
        placeable = slot.node.topology.placeable_mask
        bound = _bound(options, k - slot.free_count, placeable)
        if bound is None:
            continue
        freed = slot.free
        for _, mask in options:
            freed |= mask & placeable
        if isinstance(place(slot.node.topology, k, request.policy, free_mask=freed), Placement):
            bounds.append((bound, node))
    bounds.sort()
    return on_node, bounds


class _Priced(Protocol):
    """What :func:`cheapest_first` orders: anything with a key."""

    @property
    def key(self) -> SetKey: ...


PricedT = TypeVar("PricedT", bound=_Priced)


def cheapest_first(
    bounds: Sequence[tuple[SetKey, str]], price: Callable[[str], PricedT | None]
) -> Iterator[PricedT]:
    """What ``price`` gives for each name, cheapest key first (ties by name), priced only
    when needed: ``bounds`` holds a key no lower than each name's (sorted), so a name is
    priced once its bound could tie or beat the cheapest priced so far, and the cheapest is
    given once no name left could beat it. None from ``price``: the name gives nothing."""
    priced: list[tuple[SetKey, str, int, PricedT]] = []
    order = iter(bounds)
    waiting = next(order, None)
    count = 0
    while True:
        while waiting is not None and (not priced or waiting[0] <= priced[0][0]):
            name = waiting[1]
            waiting = next(order, None)
            found = price(name)
            if found is not None:
                heapq.heappush(priced, (found.key, name, count, found))
                count += 1
        if not priced:
            return
        yield heapq.heappop(priced)[3]


def _bound(options: Sequence[tuple[Candidate, int]], need: int, placeable: int) -> SetKey | None:
    """A key no victim set on the node can beat: the lowest rank any set freeing ``need`` GPUs
    must reach and the cheapest prices that free as many (None: the node's victims together
    do not hold enough GPUs)."""
    if need <= 0:
        return ((0, 0, 0, 0), 0.0, 0)
    gpus = [((mask & placeable).bit_count(), c) for c, mask in options]
    if sum(n for n, _ in gpus) < need:
        return None
    # The highest rank a set must include: the rank at which cheapest-ranked victims first
    # hold enough GPUs.
    held = 0
    rank = (0, 0, 0, 0)
    for n, c in sorted(gpus, key=lambda g: g[1].rank):
        held += n
        rank = c.rank
        if held >= need:
            break
    # The fewest victims that can hold enough GPUs, each at its cheapest price.
    prices = sorted(c.price for _, c in gpus)
    biggest = sorted((n for n, _ in gpus), reverse=True)
    fewest = 0
    total = 0
    while total < need:
        total += biggest[fewest]
        fewest += 1
    return (rank, sum(prices[:fewest]), fewest)


def _cheapest_on_node(
    pool: Pool,
    node: str,
    request: Request,
    options: Sequence[tuple[Candidate, int]],
    *,
    ok: LenderCheck,
    lenders: LenderCheck,
    best: _NodeOption | None,
) -> _NodeOption | None:
    """The cheapest victim set among ``options`` (cheapest first) that frees a placement on
    ``node`` and passes ``ok``; exact for few victims, greedy then minimised beyond."""
    slot = pool.slots[node]
    topology = slot.node.topology
    placeable = topology.placeable_mask
    k = request.gpus_per_replica

    def fits(victims: Sequence[tuple[Candidate, int]]) -> Placement | None:
        free = slot.free
        for _, mask in victims:
            free |= mask & placeable
        if free.bit_count() < k:
            return None
        result = place(topology, k, request.policy, free_mask=free)
        return result if isinstance(result, Placement) else None

    def option(victims: Sequence[tuple[Candidate, int]], placement: Placement) -> _NodeOption:
        chosen = tuple(c for c, _ in victims)
        return _NodeOption(set_key(chosen), node, chosen, placement)

    if len(options) <= EXACT_VICTIMS:
        for key, subset in _subsets_cheapest_first(options):
            if best is not None and key > best.key:
                return None
            found = fits(subset)
            if found is not None and ok([c for c, _ in subset]):
                return option(subset, found)
        return None
    chosen: list[tuple[Candidate, int]] = []
    placement: Placement | None = None
    for item in options:
        # Another tenant's job that would break its tenant's guarantee never passes later;
        # the preemptor's own jobs may (more own victims bring its tenant within its limit).
        if not lenders([c for c, _ in chosen] + [item[0]]):
            continue
        chosen.append(item)
        placement = fits(chosen)
        if placement is not None and ok([c for c, _ in chosen]):
            break
        placement = None
    if placement is None:
        return None
    # Minimise, most expensive first, until no victim can be spared: sparing one can make
    # others unneeded that were not before (the preemptor's own jobs, needed for its quota only
    # while another tenant's job was among the victims).
    spared = True
    while spared:
        spared = False
        for item in sorted(chosen, key=lambda i: i[0].cost, reverse=True):
            trial = [i for i in chosen if i is not item]
            if not trial:
                continue
            again = fits(trial)
            if again is not None and ok([c for c, _ in trial]):
                chosen, placement = trial, again
                spared = True
    return option(chosen, placement)


def _subsets_cheapest_first(
    options: Sequence[tuple[Candidate, int]],
) -> Iterator[tuple[SetKey, list[tuple[Candidate, int]]]]:
    """Every non-empty subset with its :func:`set_key`, ordered by it (then by :func:`_tie`).

    The tie-break is worked out only among subsets whose keys are equal (sorting by the key,
    then each run of equal keys by the tie-break, is the same order as sorting by both): this
    runs for every node of every single-replica victim search."""
    keyed = [
        (set_key([c for c, _ in combo]), list(combo))
        for size in range(1, len(options) + 1)
        for combo in combinations(options, size)
    ]
    keyed.sort(key=lambda item: item[0])
    start = 0
    while start < len(keyed):
        end = start + 1
        while end < len(keyed) and keyed[end][0] == keyed[start][0]:
            end += 1
        if end - start == 1:
            yield keyed[start]
        else:
            yield from sorted(keyed[start:end], key=lambda item: _tie([c for c, _ in item[1]]))
        start = end
