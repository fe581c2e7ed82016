"""Choosing the victims that make a blocked gang placeable.

Candidates come sorted cheapest first (lower priority, borrowed before guaranteed, fewest
GPU-hours lost since the victim's start or last checkpoint). The search is the one Kueue uses,
made topology-aware by testing real placements instead of GPU counts:

1. release every candidate and place the gang; if it does not fit even then, give up at once;
2. release candidates one by one, cheapest first, until the gang is placeable;
3. walk the chosen victims back, most expensive first, and keep each one only if the gang stops
   being placeable without it (so no victim is evicted for nothing).

Every test runs the placement engine on the pool as it would be, so the GPUs freed are GPUs the
gang can use under its topology policy, not just a count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpusched.core.admission.model import Job, PreemptReason, ReplicaPlan
from gpusched.core.admission.pool import GangFailure, Pool, Request

#: Full placement checks one search may make during the greedy pass before it falls back to the
#: victims under the all-released placement (keeps a cycle bounded on huge clusters).
MAX_GREEDY_CHECKS = 48


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job that may be evicted for the job being admitted."""

    job: Job
    reason: PreemptReason
    borrowed: bool
    """Whether it runs on capacity borrowed from another tenant."""
    lost: float
    """GPU-seconds of work since its start or last checkpoint."""

    @property
    def cost(self) -> tuple[int, int, int, float, float]:
        """Sort key, cheapest first: jobs that overran a reservation they were backfilled onto
        (they were admitted on the understanding that they leave by then), then by priority,
        borrowed before guaranteed, least work lost; ties go to the job submitted last. (Sort
        by key, reversed, first: among equals the job last in queue order is the cheapest.)"""
        job = self.job
        overrun = 0 if self.reason is PreemptReason.BACKFILL_OVERRUN else 1
        return (overrun, job.priority, 0 if self.borrowed else 1, self.lost, -job.submitted_at)

    def own(self, preemptor: Job) -> bool:
        """Whether its GPUs count against the preemptor's own tenant's quota."""
        return self.reason is PreemptReason.HIGHER_PRIORITY or (
            self.reason is PreemptReason.BACKFILL_OVERRUN and self.job.tenant == preemptor.tenant
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


def protected_until(job: Job, *, reclaim: bool = False) -> float | None:
    """When the job's minimum runtime ends (None: not started, so not yet counting); against a
    tenant reclaiming its guarantee, the job's (shorter) protection on borrowed GPUs."""
    if job.started_at is None:
        return None
    seconds = job.min_runtime_seconds
    if reclaim and job.reclaim_min_runtime_seconds is not None:
        seconds = min(seconds, job.reclaim_min_runtime_seconds)
    return job.started_at + seconds


def may_be_victim(job: Job, now: float, *, reclaim: bool = False) -> bool:
    """Preemptible, running, and past its minimum runtime (``reclaim``: as it protects
    borrowed GPUs against a guarantee)."""
    if not job.preemptible or job.started_at is None:
        return False
    until = protected_until(job, reclaim=reclaim)
    return until is not None and now >= until


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


QuotaCheck = Callable[[Sequence[Job], bool], bool]
"""``quota_ok(own_victims, any_reclaim_victim)``: may the preemptor's tenant admit it once
those victims are gone?"""


def _reclaims(victims: Sequence[Candidate]) -> bool:
    return any(c.reason is PreemptReason.RECLAIM_GUARANTEE for c in victims)


def find_victims(
    pool: Pool,
    preemptor: Job,
    request: Request,
    candidates: Sequence[Candidate],
    quota_ok: QuotaCheck,
) -> VictimSearch | GangFailure | None:
    """The cheapest minimal victim set that makes the gang placeable.

    On success the pool holds the preemptor's GPUs under its key and the victims' other GPUs
    stay held by them (they are terminating). Returns None when no subset works, or the
    placement failure with every candidate gone (for the wait message).
    """
    ordered = by_cost(candidates)
    own_all = [c.job for c in ordered if c.own(preemptor)]
    if not ordered or not quota_ok(own_all, _reclaims(ordered)):
        # Reclaim victims may be what breaks the quota rule; try without them.
        ordered = [c for c in ordered if c.reason is not PreemptReason.RECLAIM_GUARANTEE]
        if not ordered or not quota_ok(own_all, False):
            return None
    key = preemptor.key
    released: dict[str, dict[str, int]] = {}

    def release(c: Candidate) -> None:
        released[c.job.key] = pool.release(c.job.key)

    def restore(c: Candidate) -> None:
        pool.restore(c.job.key, released.pop(c.job.key))

    def placeable(names: Sequence[str] | None = None) -> list[ReplicaPlan] | None:
        if names is not None:
            choice, _ = pool.choose(request, names)
            if choice is None:
                return None
        result = pool.place_gang(key, request)
        if isinstance(result, GangFailure):
            return None
        pool.release(key)
        return result

    def ok(victims: Sequence[Candidate]) -> bool:
        own = [c.job for c in victims if c.own(preemptor)]
        return quota_ok(own, _reclaims(victims))

    # 1. Upper bound: everything released.
    for c in ordered:
        release(c)
    upper = pool.place_gang(key, request)
    if isinstance(upper, GangFailure):
        for c in reversed(ordered):
            restore(c)
        return upper
    pool.release(key)
    for c in reversed(ordered):
        restore(c)

    # 2. Greedy, cheapest first. Single-replica jobs only need the nodes freed since the last
    # check looked at (the others could not host it then and have not changed).
    chosen: list[Candidate] = []
    own: list[Job] = []
    cross = False
    plans = placeable()
    touched: list[str] = []
    checks = 0
    incremental = request.replicas == 1 and plans is None
    for c in ordered:
        if plans is not None:
            break
        release(c)
        chosen.append(c)
        if c.own(preemptor):
            own.append(c.job)
        if c.reason is PreemptReason.RECLAIM_GUARANTEE:
            cross = True
        touched.extend(n for n in released[c.job.key] if n not in touched)
        if not quota_ok(own, cross):
            continue
        if incremental:
            plans = placeable(touched)
            touched = []
            continue
        if checks >= MAX_GREEDY_CHECKS:
            break
        checks += 1
        plans = placeable()
    if plans is None or not ok(chosen):
        # Fall back to the victims under the all-released placement.
        for c in reversed(chosen):
            restore(c)
        chosen = [c for c in ordered if _overlaps(pool, pool.holdings(c.job.key), upper)]
        for c in chosen:
            release(c)
        plans = placeable() if ok(chosen) else None
        if plans is None:
            for c in reversed(chosen):
                restore(c)
            return None

    # 3. Minimise, most expensive first. Victims none of whose GPUs the placement uses are
    # needed, if at all, only for the quota: other tenants' never (dropping them only relaxes
    # it), the tenant's own while the quota allows. The rest need a placement check each.
    spare = [c for c in chosen if not _overlaps(pool, released[c.job.key], plans)]
    for c in reversed(spare):
        own_without = [j for j in own if j is not c.job]
        if c.own(preemptor):
            rest_cross = _reclaims([x for x in chosen if x is not c])
            if len(chosen) == 1 or not quota_ok(own_without, rest_cross):
                continue
            own = own_without
        restore(c)
        chosen = [x for x in chosen if x is not c]
    for c in reversed(list(chosen)):
        if len(chosen) == 1 or not _overlaps(pool, released[c.job.key], plans):
            continue
        trial = [x for x in chosen if x is not c]
        if not ok(trial):
            continue
        restore(c)
        again = placeable()
        if again is not None:
            chosen = trial
            plans = again
            own = [x.job for x in chosen if x.own(preemptor)]
        else:
            release(c)

    result = pool.place_gang(key, request)
    assert not isinstance(result, GangFailure), "placement vanished between identical checks"
    # What the preemptor does not use stays with the terminating victims; a victim whose GPUs
    # the final placement does not touch is spared when the quota allows.
    for c in reversed(list(chosen)):
        trial = [x for x in chosen if x is not c]
        if trial and ok(trial) and not _overlaps(pool, released[c.job.key], result):
            chosen = trial
        pool.restore(c.job.key, released.pop(c.job.key))
    return VictimSearch(result, chosen)
