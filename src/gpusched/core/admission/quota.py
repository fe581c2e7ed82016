"""Tenant guarantees, borrowing and fair share, as arithmetic on GPU counts.

A tenant's guarantee is split into buckets: one per GPU model named in
``guaranteedGpusByModel`` and an ``any`` bucket for the rest of ``guaranteedGpus``. A job draws
from the bucket of the model it asks for (``spec.gpuModel``) first, then from ``any``; a job that
names no model draws from ``any`` only. Buckets follow the job's spec, not where it happened to
land, so the same job is classified the same way whether it is queued or running.

Two classifications drive preemption (see docs/quotas.md for the argument):

* **claims** (:func:`claims`) go over *all* of a tenant's demand, queued and admitted, in queue
  order (priority, then FIFO) and mark the jobs that fit the guarantee, skipping those that do not.
  With unchanged demand the set is fixed, so a job's claim cannot flip because others were admitted
  or evicted. Only claiming jobs may reclaim GPUs from other tenants, and a claiming job is never
  a reclaim victim: that is what rules out two jobs evicting each other in turn.
* **running** (:func:`running_borrowed`) goes over the admitted jobs only, the same way; a job
  that does not fit is on borrowed capacity. A tenant whose running jobs fit its guarantee has
  none, so it never loses a job to reclaim.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpusched.core.admission.model import Job, Tenant
from gpusched.core.admission.tree import TenantTree

ANY_MODEL = ""


@dataclass(slots=True)
class Buckets:
    """Remaining guaranteed GPUs of one tenant, per bucket."""

    by_model: dict[str, int]
    any: int

    @classmethod
    def of(cls, tenant: Tenant) -> Buckets:
        """A tenant's full guarantee."""
        by_model = {m: n for m, n in tenant.guaranteed_by_model.items() if n > 0}
        return cls(by_model, max(0, tenant.guaranteed - sum(by_model.values())))

    def fits(self, model: str | None, size: int) -> bool:
        """Whether ``size`` GPUs of ``model`` fit entirely in what is left."""
        own = self.by_model.get(model, 0) if model else 0
        return size - min(size, own) <= self.any

    def take(self, model: str | None, size: int) -> int:
        """Draw up to ``size`` GPUs (model bucket first); returns how many were covered."""
        covered = 0
        if model and model in self.by_model:
            own = min(size, self.by_model[model])
            self.by_model[model] -= own
            covered += own
        rest = min(size - covered, self.any)
        self.any -= rest
        return covered + rest


def bucket_model(tenant: Tenant, job: Job) -> str | None:
    """The model bucket a job draws from first (None: only the ``any`` bucket)."""
    model = job.gpu_model
    return model if model and tenant.guaranteed_by_model.get(model, 0) > 0 else None


def classify(tenant: Tenant, jobs: Iterable[Job]) -> set[str]:
    """Keys of the jobs that fit the guarantee, going in queue order and skipping misfits."""
    return classify_ordered(tenant, sorted(jobs, key=lambda j: j.order))


def classify_ordered(tenant: Tenant, ordered: Iterable[Job], *, round_up: bool = False) -> set[str]:
    """:func:`classify` over jobs already in queue order. Stops once the guarantee is used up
    (every job asks for at least one GPU), so a long queue behind a full guarantee costs
    nothing: only the lazily merged front of it is ever looked at.

    ``round_up`` (:func:`rounds_up`): when the jobs that fit leave some of the guarantee
    unclaimed, the first preemptible job that did not fit takes the rest of it too: a tenant
    guaranteed 26 GPUs whose jobs ask 8 each claims four of them, not three. A job that fits
    is never displaced by one rounded up."""
    buckets = Buckets.of(tenant)
    inside: set[str] = set()
    first_misfit: str | None = None
    for job in ordered:
        if not buckets.any and not any(buckets.by_model.values()):
            return inside
        model = bucket_model(tenant, job)
        if buckets.fits(model, job.total_gpus):
            buckets.take(model, job.total_gpus)
            inside.add(job.key)
        elif first_misfit is None and job.preemptible:
            first_misfit = job.key
    if round_up and first_misfit is not None and buckets.any > 0 and rounds_up(tenant):
        inside.add(first_misfit)
    return inside


def rounds_up(tenant: Tenant) -> bool:
    """Whether the tenant's guarantee can be rounded up to whole jobs (the cycle's
    ``guarantee_rounding`` "up"): guarantees by GPU model are kept as they are."""
    return not tenant.guaranteed_by_model and tenant.guaranteed > 0


def claims(
    tenant: Tenant, admitted: Iterable[Job], queued: Iterable[Job], *, round_up: bool = False
) -> set[str]:
    """Jobs of the tenant's whole demand (admitted, and feasible queued ones already in queue
    order) inside its guarantee; the admitted ones are sorted and merged in lazily."""
    order = sorted(admitted, key=lambda j: j.order)
    return classify_ordered(
        tenant, heapq.merge(order, queued, key=lambda j: j.order), round_up=round_up
    )


def running_borrowed(
    tenant: Tenant, admitted: Iterable[Job], *, round_up: bool = False
) -> set[str]:
    """Admitted jobs of the tenant that run on borrowed capacity."""
    admitted = list(admitted)
    inside = classify_ordered(tenant, sorted(admitted, key=lambda j: j.order), round_up=round_up)
    return {job.key for job in admitted if job.key not in inside}


class Ledger:
    """A tenant's admitted usage per bucket, to tell whether one more job is inside the
    guarantee and how much the tenant borrows. Updated as the cycle admits and evicts."""

    __slots__ = ("_any", "_buckets", "_by_model", "_other", "tenant", "used")

    def __init__(self, tenant: Tenant, admitted: Iterable[Job] = ()) -> None:
        self.tenant = tenant
        self.used = 0
        self._by_model: dict[str, int] = {}
        self._other = 0
        full = Buckets.of(tenant)
        self._buckets = full.by_model
        self._any = full.any
        for job in admitted:
            self.add(job)

    def _apply(self, job: Job, sign: int) -> None:
        size = job.total_gpus * sign
        self.used += size
        model = bucket_model(self.tenant, job)
        if model is None:
            self._other += size
        else:
            self._by_model[model] = self._by_model.get(model, 0) + size

    def add(self, job: Job) -> None:
        """Count an admitted job."""
        self._apply(job, 1)

    def remove(self, job: Job) -> None:
        """Stop counting an evicted job."""
        self._apply(job, -1)

    def covered(self, extra: Job | None = None, without: Sequence[Job] = ()) -> int:
        """GPUs of usage the guarantee covers (optionally with one job added and some removed)."""
        if not self._buckets:
            # Only the ``any`` bucket: plain arithmetic (the common case, kept cheap).
            used = self.used
            if without:
                used -= sum(j.total_gpus for j in without)
            if extra is not None:
                used += extra.total_gpus
            return min(self._any, used)
        by_model = dict(self._by_model)
        other = self._other
        for job, sign in [(j, -1) for j in without] + ([(extra, 1)] if extra else []):
            model = bucket_model(self.tenant, job)
            if model is None:
                other += sign * job.total_gpus
            else:
                by_model[model] = by_model.get(model, 0) + sign * job.total_gpus
        covered = 0
        overflow = other
        for model, used in by_model.items():
            own = min(used, self._buckets.get(model, 0))
            covered += own
            overflow += used - own
        return covered + min(self._any, overflow)

    def borrowed(self) -> int:
        """Usage above the guarantee."""
        return self.used - self.covered()

    def fits_within(self, job: Job, without: Sequence[Job] = ()) -> bool:
        """Whether the job would run entirely inside the guarantee (after removing ``without``)."""
        if not self._buckets and not without:
            # covered(job) - covered() == size  <=>  the usage with the job stays within ``any``.
            return self.used + job.total_gpus <= self._any or job.total_gpus == 0
        return self.covered(job, without) - self.covered(None, without) == job.total_gpus

    def within_limit(self, job: Job, without: Sequence[Job] = ()) -> bool:
        """Whether admitting the job keeps the tenant within its borrowing limit."""
        limit = self.tenant.borrowing_limit
        if limit is None:
            return True
        return self.used - sum(j.total_gpus for j in without) + job.total_gpus <= limit

    def headroom(self) -> int | None:
        """GPUs the tenant may still take before its limit (None: unlimited)."""
        limit = self.tenant.borrowing_limit
        return None if limit is None else max(0, limit - self.used)


def usable_guarantee(tenant: Tenant, jobs: Iterable[Job], *, round_up: bool = False) -> int:
    """The most GPUs of the running ``jobs`` that fit the tenant's guarantee together: what of
    its guarantee the tenant uses, in the shape of its jobs. A tenant guaranteed 2 GPUs whose
    jobs ask 4 each uses none of it; one guaranteed 16 holding jobs of 8, 4, 2, 1, 1 and 1 uses
    all 16 whatever their queue order. Reclaim never lowers it: a lender loses only GPUs its
    guarantee could not cover. With per-model guarantees, the count the ledger covers.

    ``round_up``: the fewest GPUs of some of the jobs that cover the guarantee (all of them
    when they do not): one guaranteed 26 holding four jobs of 8 keeps all 32, so a job that
    took the rest of its guarantee (:func:`classify_ordered`) is not taken back from it."""
    if tenant.guaranteed_by_model:
        return Ledger(tenant, jobs).covered()
    if round_up and rounds_up(tenant):
        return covering_of_sizes(tenant.guaranteed, job_sizes(jobs))
    return usable_of_sizes(tenant.guaranteed, job_sizes(jobs))


def job_sizes(jobs: Iterable[Job]) -> Counter[int]:
    """How many of the jobs hold each number of GPUs."""
    return Counter(j.total_gpus for j in jobs)


def usable_of_sizes(limit: int, sizes: Mapping[int, int]) -> int:
    """:func:`usable_guarantee` of jobs given by size (GPUs -> how many jobs): the largest sum
    of some of them that is at most ``limit`` (a subset sum over bits)."""
    key = tuple(sorted((size, count) for size, count in sizes.items() if 0 < size <= limit))
    return _usable(limit, key)


@lru_cache(maxsize=65_536)
def _usable(limit: int, sizes: tuple[tuple[int, int], ...]) -> int:
    return _subset_sums(limit, sizes).bit_length() - 1


def _subset_sums(top: int, sizes: tuple[tuple[int, int], ...]) -> int:
    """Bit n set: some of the jobs (``sizes``: (GPUs, how many)) hold exactly n GPUs, n up to
    ``top``."""
    reachable = 1
    mask = (1 << (top + 1)) - 1
    for size, count in sizes:
        for _ in range(min(count, top // size)):
            grown = (reachable | (reachable << size)) & mask
            if grown == reachable:
                break
            reachable = grown
    return reachable


def covering_of_sizes(limit: int, sizes: Mapping[int, int]) -> int:
    """The rounded-up :func:`usable_guarantee` of jobs given by size: the smallest sum of some
    of them that is at least ``limit``, or the sum of all of them when it is below."""
    total = sum(size * count for size, count in sizes.items() if size > 0)
    if total <= limit:
        return total
    key = tuple(sorted((size, count) for size, count in sizes.items() if size > 0 and count > 0))
    return _covering(limit, key)


@lru_cache(maxsize=65_536)
def _covering(limit: int, sizes: tuple[tuple[int, int], ...]) -> int:
    # A smallest covering set loses its cover without any one job, so it holds less than
    # ``limit`` plus its largest job.
    at_least = _subset_sums(limit + max(size for size, _ in sizes) - 1, sizes) >> limit
    return limit + (at_least & -at_least).bit_length() - 1


def fair_shares(
    capacity: int,
    tenants: Sequence[Tenant],
    demand: Mapping[str, int],
) -> dict[str, float]:
    """Each tenant's entitlement now: its guarantee (up to its demand), plus idle GPUs split by
    weight among tenants that want more, each capped by its demand and borrowing limit
    (water-filling, so GPUs one tenant cannot use go to the others: work-conserving).

    In a tenant tree the same is done level by level: the tenants at the top share the
    cluster by their subtrees' demand, then each parent's entitlement is shared among its
    children the same way (and a parent's is its subtree's)."""
    tree = TenantTree.of(tenants)
    if tree.flat:
        return _water_fill(capacity, tenants, demand)
    by_name = {t.name: t for t in tenants}
    total: dict[str, int] = {}
    for t in tenants:
        for level in tree.levels(t.name):
            total[level] = total.get(level, 0) + demand.get(t.name, 0)
    roots = [t for t in tenants if tree.parent.get(t.name) is None]
    out = _water_fill(capacity, roots, total)
    pending = [t.name for t in roots]
    while pending:
        name = pending.pop()
        children = [by_name[c] for c in tree.children.get(name, ())]
        if not children:
            continue
        share = out.get(name, 0.0)
        own = min(float(demand.get(name, 0)), share)
        out.update(_water_fill(max(0.0, share - own), children, total))
        pending.extend(c.name for c in children)
    return out


def _water_fill(
    capacity: float,
    tenants: Sequence[Tenant],
    demand: Mapping[str, int],
) -> dict[str, float]:
    """:func:`fair_shares` among ``tenants`` alone."""
    want: dict[str, float] = {}
    alloc: dict[str, float] = {}
    for t in tenants:
        cap = demand.get(t.name, 0)
        if t.borrowing_limit is not None:
            cap = min(cap, t.borrowing_limit)
        want[t.name] = float(cap)
        alloc[t.name] = float(min(cap, t.guaranteed))
    left = capacity - sum(alloc.values())
    active = [t for t in tenants if want[t.name] - alloc[t.name] > 1e-9]
    while left > 1e-9 and active:
        total_weight = sum(t.weight for t in active)
        step = left / total_weight
        still: list[Tenant] = []
        given = 0.0
        for t in active:
            give = min(step * t.weight, want[t.name] - alloc[t.name])
            alloc[t.name] += give
            given += give
            if want[t.name] - alloc[t.name] > 1e-9:
                still.append(t)
        left -= given
        if given <= 1e-9:
            break
        active = still
    return {name: round(value, 3) for name, value in alloc.items()}
