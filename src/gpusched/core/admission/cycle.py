"""One admission cycle: which queued jobs start, which running jobs make room, who waits and why.

Order of work:

* jobs of each tenant are taken in queue order (priority, then FIFO); a job that cannot start does
  not block smaller ones behind it (best-effort FIFO);
* across tenants, jobs inside their tenant's guarantee go first; jobs that would borrow idle GPUs
  go next, from the tenant with the lowest weighted borrowing (borrowed GPUs / weight, counting
  the job), so idle capacity is shared by weight and none stays idle while someone can use it;
* a job is admitted only when the placement engine places every replica on free GPUs now (never
  on quota alone); otherwise it may preempt (lower-priority jobs of its tenant, or borrowed jobs
  of other tenants when it claims its guarantee), else it waits with a reason;
* the first job of each tenant that waits for GPUs alone (its quota would admit it, within its
  entitlement) gets a **reservation**: the GPUs where it fits soonest, worked out from the running
  jobs' expected ends (:mod:`gpusched.core.admission.profile`). Jobs decided after it may use
  those GPUs only if they are expected to end before the reservation starts (**backfill**); a
  preemptible one that runs past it is evicted for the reserving job (``BackfillOverrun``), a
  non-preemptible one only with a declared run-time limit that ends in time.

Everything is deterministic for a given snapshot: inputs are sorted by name first and every
ordering ends in a unique key.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.admission.arrivals import is_arrival
from gpusched.core.admission.forecast import Entry, Forecast, ReservationRules
from gpusched.core.admission.model import (
    Admission,
    AdmitReason,
    Assignment,
    CycleResult,
    Job,
    JobState,
    Preemption,
    PreemptReason,
    ReplicaPlan,
    Reservation,
    Snapshot,
    Tenant,
    TenantUsage,
    Waiting,
    WaitReason,
)
from gpusched.core.admission.pool import GangFailure, Pool, Request
from gpusched.core.admission.preemption import (
    Candidate,
    VictimSearch,
    find_victims,
    gpu_seconds_lost,
    may_be_victim,
    unprotected_at,
)
from gpusched.core.admission.profile import NEVER, Profile, Slotting
from gpusched.core.admission.quota import (
    Ledger,
    claims,
    classify_ordered,
    covering_of_sizes,
    fair_shares,
    job_sizes,
    rounds_up,
    running_borrowed,
    usable_guarantee,
    usable_of_sizes,
)
from gpusched.core.admission.tree import TenantTree

UNKNOWN_MODEL = "unknown"
#: Key prefix of a reservation's GPUs in the pool (never a job key: those hold a ``/``
#: after a namespace, and namespaces do not start with a space).
RESERVED_PREFIX = " reserved:"
#: Blocked jobs of one tenant per cycle whose reservation search may end past the tenant's
#: entitlement before it gets no more searches (Slurm's ``bf_max_job_user`` plays this part):
#: bounds the cycle's cost when a tenant's whole queue is past its share.
RESERVATION_ATTEMPTS_PER_TENANT = 4
#: A job keeps last cycle's reserved GPUs while they are expected free no later than this many
#: seconds (or this fraction of the wait) after the start expected then: reservations do not
#: move for small changes in predicted ends.
RESERVATION_SLACK_SECONDS = 300.0
RESERVATION_SLACK_FRACTION = 0.1
#: Failures that GPUs alone stand behind (a reservation can help).
_GPU_BOUND = frozenset(
    {
        WaitReason.WAITING_FOR_CAPACITY,
        WaitReason.TOPOLOGY_UNSATISFIABLE,
        WaitReason.DOMAIN_DEGRADED,
    }
)


#: Failures decided on quota alone, before any placement was tried.
_QUOTA_BOUND = frozenset({WaitReason.QUOTA_EXCEEDED, WaitReason.GUARANTEE_EXCEEDED})


class _Claims(dict[str, set[str]]):
    """Keys of each tenant's jobs inside its guarantee, computed on first use."""

    def __init__(self, compute: Callable[[str], set[str]], tenants: Collection[str]) -> None:
        super().__init__()
        self._compute = compute
        self._tenants = tenants

    def __missing__(self, tenant: str) -> set[str]:
        if tenant not in self._tenants:
            raise KeyError(tenant)
        value = self._compute(tenant)
        self[tenant] = value
        return value


@dataclass(frozen=True, slots=True)
class _Failed:
    """How a tenant's last decided job waited, for the alike jobs behind it."""

    request: Request
    priority: int
    preemptible: bool
    claim: str | None
    version: int
    reason: WaitReason
    message: str
    backfill: frozenset[str]
    submitter: str
    reservations: int
    """The cycle's count of reservation changes then (another job's reservation moves the free
    GPUs a waiting job reports and the start a reservation would get)."""
    attempted: bool
    """Whether deciding it used one of its tenant's reservation attempts (an alike job decided
    on its own would use one too)."""


class _Candidates(NamedTuple):
    """Who may be evicted for a job (:meth:`Cycle.candidates`)."""

    found: list[Candidate]
    cross: bool
    """Whether one of them belongs to another tenant."""
    unprotected_at: float | None
    """When the first job kept from them for now by its protection (or a backfill deadline
    not passed yet) stops being kept out; None: none is."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    admitted: bool
    failure: GangFailure | None = None


def holders(jobs: Sequence[Job]) -> list[Job]:
    """The jobs holding GPUs: running, or terminating until their pods are gone."""
    return [j for j in jobs if j.state in (JobState.ADMITTED, JobState.TERMINATING)]


def run_cycle(snapshot: Snapshot) -> CycleResult:
    """Decide one cycle over ``snapshot`` (pure and deterministic)."""
    return Cycle(snapshot).run()


class Cycle:
    """State of one cycle; :meth:`run` once. Kept as an object so ``explain`` can look inside."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        pool: Pool | None = None,
        jobs: Sequence[Job] | None = None,
        previous: Mapping[str, Waiting] | None = None,
    ) -> None:
        """``pool``: the free GPUs of ``snapshot`` already built (by
        :class:`~gpusched.core.admission.incremental.Cycles`); ``jobs``: the snapshot's jobs
        already sorted by key; ``previous``: the waiting entries of an earlier cycle, whose
        objects :meth:`result` hands out again where this cycle says the same (so that what
        readers keep per entry, as the operator's plan does, stays good)."""
        self._previous: Mapping[str, Waiting] = previous or {}
        self.snapshot = snapshot
        self.now = snapshot.now
        self.tenants: dict[str, Tenant] = {
            t.name: t for t in sorted(snapshot.tenants, key=lambda t: t.name)
        }
        self.tree = TenantTree.of(self.tenants.values())
        self._levels: dict[str, tuple[str, ...]] = {n: self.tree.levels(n) for n in self.tenants}
        """Each tenant and its ancestors, nearest first."""
        if jobs is None:
            jobs = sorted(snapshot.jobs, key=lambda j: j.key)
        self.jobs: dict[str, Job] = {j.key: j for j in jobs}
        if pool is None:
            holdings = [(j.key, a) for j in holders(jobs) for a in j.placement]
            pool = Pool(snapshot.nodes, holdings, snapshot.levels, snapshot.down_labels)
        self.pool = pool
        self.admitted: dict[str, dict[str, Job]] = {name: {} for name in self.tenants}
        self.queued: dict[str, list[Job]] = {name: [] for name in self.tenants}
        self.orphans: list[Job] = []
        self.reservations: dict[str, list[str]] = {}
        for job in jobs:
            if job.state is JobState.ADMITTED:
                if job.tenant in self.tenants:
                    self.admitted[job.tenant][job.key] = job
            elif job.state is JobState.TERMINATING:
                if job.reserved_for:
                    self.reservations.setdefault(job.reserved_for, []).append(job.key)
            elif job.tenant in self.tenants and not self.tree.is_parent(job.tenant):
                self.queued[job.tenant].append(job)
            else:
                self.orphans.append(job)
        for queue in self.queued.values():
            queue.sort(key=lambda j: j.order)
        # Requests are interned: jobs asking the same share one object.
        self.requests: dict[str, Request] = {
            j.key: Request.of(j) for queue in self.queued.values() for j in queue
        }
        self.ledgers = {
            name: Ledger(t, self.admitted[name].values()) for name, t in self.tenants.items()
        }
        self.below: dict[str, int] = dict.fromkeys(self.tree.children, 0)
        """Parent tenant -> GPUs held by the jobs of the tenants below it."""
        for name in self.tenants:
            for level in self._levels[name][1:]:
                self.below[level] += self.ledgers[name].used
        self._capped_levels: dict[str, tuple[str, ...]] = {
            name: tuple(lv for lv in self._levels[name] if self.tenants[lv].caps_users)
            for name in self.tenants
        }
        """Each tenant's levels that cap one user."""
        self.users: dict[tuple[str, str], list[int]] = {}
        """(level, submitter) -> [GPUs, jobs] admitted below it, for levels that cap one user."""
        for name in self.tenants:
            if self._capped_levels[name]:
                for job in self.admitted[name].values():
                    self._count_user(job, 1)
        self._over_cap_at_start = {
            j.key
            for name in self.tenants
            if self._capped_levels[name]
            for j in self.queued[name]
            if self._user_cap_text(j) is not None
        }
        """Queued jobs over their submitter's cap when the cycle began: no claim, no demand."""
        self._feasible_request = {
            request: self.pool.static_failure(request) is None
            for request in set(self.requests.values())
        }
        # Claims are fixed by the demand at the start of the cycle; each tenant's are worked out
        # the first time they are asked for (many tenants never are in a cycle).
        self._admitted_at_start = {
            name: tuple(self.admitted[name].values()) for name in self.tenants
        }
        self.claims = _Claims(self._claims_of, self.tenants)
        self._leaf_claims: dict[str, frozenset[str]] = {}
        """Tenant -> keys of its jobs inside its own guarantee (set with :attr:`claims`)."""
        self._level_claims: dict[str, set[str]] = {}
        """Parent tenant -> keys of the jobs below it inside its guarantee (on first use)."""
        self._claiming: str | None = None
        """During a victim search: the level the preemptor claims at."""
        self._preemptor: Job | None = None
        """During a victim search: the job it is for."""
        self.report = not snapshot.config.decisions_only
        self._round_up = snapshot.config.guarantee_rounding == "up"
        """Guarantees rounded up to whole jobs (:func:`~gpusched.core.admission.quota.claims`)."""
        self.demand: dict[str, int] = {}
        if self.report:
            for name in self.tenants:
                self.demand[name] = self._demand_of(name)
        self.positions = (
            {j.key: i + 1 for queue in self.queued.values() for i, j in enumerate(queue)}
            if self.report
            else {}
        )
        self.admissions: list[Admission] = []
        self.waiting: list[Waiting] = []
        self.wait_reasons: dict[str, WaitReason] = {}
        self._last_wait: tuple[str, WaitReason, str] | None = None
        """The last job parked, with its reason (kept even when waiting records are not)."""
        self._failed: dict[str, _Failed] = {}
        self._failed_kinds: dict[str, dict[tuple[object, ...], tuple[_Failed, int]]] = {}
        """Per tenant and kind of job (:func:`_kind_key`): how its last decided job of that kind
        waited, and the pool's change count then."""
        self.placement_failures: dict[Request, GangFailure] = {}
        self.preemption_failures: set[tuple[object, ...]] = set()
        self._declined: set[tuple[object, ...]] = set()
        """Failed searches (keys of ``preemption_failures``) that turned down a reclaim for
        its cost (:meth:`weighs_reclaim`)."""
        self._declined_now = False
        """Whether the last search turned down a reclaim for its cost."""
        self.no_candidates: set[tuple[tuple[object, ...], int]] = set()
        self._admitted_version = 0
        self._candidate_lists: dict[tuple[object, ...], _Candidates] = {}
        """Victim candidates per kind of preemptor, made at :attr:`_candidate_lists_at`."""
        self._candidate_lists_at = 0
        """The ``_admitted_version`` the kept candidate lists were made at."""
        self._reclaimable: dict[tuple[str, object], tuple[int, list[Job], list[Job]]] = {}
        """Per lender and kind of node filter: its running jobs on those nodes that may be
        reclaimed now and those their protection on borrowed GPUs keeps from it for now, with
        the count of changes to its running jobs they were listed at."""
        self._lender_changes: Counter[str] = Counter()
        self._segments: dict[
            tuple[str, object, int, int | None], tuple[int, list[Candidate], float | None]
        ] = {}
        """Per lender, node filter, spare GPUs and priority bound: the candidates a reclaim may
        take from it and when the first job kept from them by its protection may join them,
        with the count of changes to its running jobs they were listed at."""
        self._candidates: dict[tuple[int, PreemptReason, bool], Candidate] = {}
        """Each running job as a candidate, per reason (its lost work is priced at ``now``)."""
        self.searches = 0
        self._search_budget: float = snapshot.config.max_preemption_searches
        """Victim searches this cycle may make (:meth:`decide_arrivals` lifts it)."""
        self._borrowed: dict[str, set[str]] = {}
        self._usable_gpus: dict[str, int] = {}
        self._sizes: dict[str, Counter[int]] = {}
        self._heads: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self._versions: dict[str, int] = dict.fromkeys(self.tenants, 0)
        # Reservations and backfill.
        self.reserved: dict[str, Reservation] = {}
        """Reservations held now: confirmed this cycle, or carried over and not yet decided."""
        self._confirmed: set[str] = set()
        self._unheld: dict[str, dict[str, int]] = {}
        """GPUs released for a carried-over reservation's own job while it is decided."""
        self._reserving: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self._attempts: dict[str, int] = dict.fromkeys(self.tenants, 0)
        """Reservation searches per tenant that ended past its entitlement."""
        self._reservation_changes = 0
        """Reservations confirmed or dropped so far in this cycle (a parked job stands for the
        job before it only while this stays the same)."""
        self._reserved_gpus: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self.ends: dict[str, float | None] = {}
        """Expected end of everything holding GPUs (jobs, reservations)."""
        for job in jobs:
            if job.state is JobState.ADMITTED:
                self.ends[job.key] = job.expected_end
            elif job.state is JobState.TERMINATING:
                self.ends[job.key] = self.now
        self._profile: Profile | None = None
        self._played: str | None = None
        """How far the forecast played: "all", the key it stopped at, or None (not yet)."""
        self._entitlements: dict[str, float] | None = None
        self.backfill_failures: set[tuple[Request, frozenset[str]]] = set()
        self.order: list[str] = []
        """Keys of the jobs that waited, in the order the cycle decided them."""
        self.expected: dict[str, float | None] = {}
        """Expected starts worked out so far (reservations; :meth:`forecast` adds the rest)."""
        self._recent_asks: dict[str, tuple[int, float]] = self._asks_within(
            snapshot.config.lending_hold_seconds, jobs
        )
        """Tenant -> GPUs its jobs submitted within the lending hold ask, and when the first
        of those leaves the window (tenants with a guarantee only)."""
        self._wake_at: float | None = None
        """When time alone may unblock a waiting job: the first hold it waited for lapses, the
        patience of a job that turned a reclaim down runs out, a protection that kept victims
        out ends, a spent budget's period ends (:attr:`CycleResult.wake_at`)."""
        self._holds: tuple[int, dict[str, int], int] = (-1, {}, 0)
        """(``_admitted_version``, GPUs each lender keeps, their sum) as last worked out."""
        self.ran = False
        """Whether :meth:`run` decided the queue."""
        self.arrived: list[str] = []
        """Jobs :meth:`decide_arrivals` added after the run (their place in :attr:`order`
        is not the one a cycle from scratch would give them)."""
        self._result: CycleResult | None = None
        """:meth:`result` as last worked out, until arrivals or a forecast add to it (a kept
        cycle that nothing arrived on answers every later cycle with it)."""
        self._carry()

    def _asks_within(self, window: float, jobs: Sequence[Job]) -> dict[str, tuple[int, float]]:
        """Per tenant with a guarantee: the GPUs its queued and running jobs submitted within
        the window ask (a requeued job counts from its first submission, so an eviction does
        not renew a hold), and when the first of them leaves the window. A tenant that spent
        its budget (or one above it did) keeps nothing: none of its next jobs could start
        before the period turns, however often it submits. Nor does a queued job that could
        never start (:meth:`never_starts`) ask anything: it would never take the GPUs kept
        for it, so borrowers would wait out the whole hold for nothing."""
        if window <= 0:
            return {}
        since = self.now - window
        spent = {
            name
            for name in self.tenants
            if any(self.tenants[lv].budget_exhausted(self.now) for lv in self._levels[name])
        }
        asks: dict[str, tuple[int, float]] = {}
        for job in jobs:
            if (
                job.submitted_at > since
                and job.state is not JobState.TERMINATING
                and job.tenant in self.tenants
                and self.tenants[job.tenant].guaranteed > 0
                and job.tenant not in spent
                and (job.state is JobState.ADMITTED or not self.never_starts(job))
            ):
                gpus, lapse = asks.get(job.tenant, (0, math.inf))
                asks[job.tenant] = (gpus + job.total_gpus, min(lapse, job.submitted_at + window))
        return asks

    def never_starts(self, job: Job) -> bool:
        """Whether a queued job could never start as the cluster and its tenant's limits
        stand: it waits at a parent tenant, no node could hold it even idle, or it is larger
        than a borrowing limit or a per-user GPU cap of its tenant or above. Read from what the
        cycle keeps per kind of request (no placement is tried)."""
        request = self.requests.get(job.key)
        return (
            request is None
            or not self._feasible_request[request]
            or self._beyond_a_limit(job)
            or self._user_cap_beyond(job) is not None
        )

    def _held_for_lenders(self) -> tuple[dict[str, int], int]:
        """Idle GPUs kept for each tenant that asked for GPUs within the lending hold (as many
        as it asked then, at most what of its guarantee it does not use), and their sum. Kept
        until a job is admitted or evicted: every borrower's decision asks it."""
        version, held, total = self._holds
        if version == self._admitted_version:
            return held, total
        held = {}
        for name, (asked, _) in self._recent_asks.items():
            unused = self.tenants[name].guaranteed - self.ledgers[name].used
            if unused > 0:
                held[name] = min(unused, asked)
        total = sum(held.values())
        self._holds = (self._admitted_version, held, total)
        return held, total

    def _held_idle(self) -> dict[str, int]:
        """Idle GPUs each tenant keeps from borrowers after the cycle (the GPUs kept for all
        of them are at most the idle ones; shared out in name order)."""
        idle = self.pool.free_total
        held: dict[str, int] = {}
        for name, gpus in sorted(self._held_for_lenders()[0].items()):
            held[name] = min(gpus, idle)
            idle -= held[name]
        return held

    def _lender_hold(self, job: Job, ledger: Ledger, within: bool) -> GangFailure | None:
        """Why a job that would borrow waits for idle GPUs kept for lenders (None: it may
        go ahead). A job inside its tenant's guarantee, or claiming the rest of it, never
        waits for another tenant's hold."""
        if within or not self._recent_asks:
            return None
        assert job.tenant is not None
        if self._rounding_up(job.tenant) and self._takes_the_rest(job, ledger):
            return None
        held, total = self._held_for_lenders()
        kept = total - held.get(job.tenant, 0)
        free = self.pool.free_total
        if not kept or free - job.total_gpus >= kept:
            return None
        others = {name: gpus for name, gpus in held.items() if name != job.tenant}
        lapse = min(self._recent_asks[name][1] for name in others)
        self._wake_by(lapse)
        window = self.snapshot.config.lending_hold_seconds
        names = ", ".join(f"{name} {gpus}" for name, gpus in sorted(others.items()))
        return GangFailure(
            WaitReason.HELD_FOR_LENDERS,
            f"it would borrow {job.total_gpus} GPU(s) and {free} are idle, but {kept} of them "
            f"are kept for tenants that asked for GPUs inside their guarantee in the last "
            f"{window:.0f}s ({names}); lent again when they take them or stay quiet "
            f"(first in {max(0.0, lapse - self.now):.0f}s)",
        )

    def _feasible(self, tenant: str) -> list[Job]:
        """The tenant's queued jobs that could be placed on an empty cluster, in queue order
        (none while its budget is spent; none over its submitter's cap)."""
        if any(self.tenants[lv].budget_exhausted(self.now) for lv in self._levels[tenant]):
            return []
        feasible = self._feasible_request
        requests = self.requests
        capped = self._over_cap_at_start
        return [
            j
            for j in self.queued[tenant]
            if feasible[requests[j.key]] and j.key not in capped and not self._beyond_a_limit(j)
        ]

    def _demand_of(self, tenant: str) -> int:
        """GPUs the tenant holds and asks for with jobs that could start (as the cycle began)."""
        return sum(j.total_gpus for j in self._admitted_at_start[tenant]) + sum(
            j.total_gpus for j in self._feasible(tenant)
        )

    # --- per-user caps and budgets -------------------------------------------------------

    def _count_user(self, job: Job, sign: int) -> None:
        assert job.tenant is not None
        for level in self._capped_levels[job.tenant]:
            held = self.users.setdefault((level, job.submitter), [0, 0])
            held[0] += sign * job.total_gpus
            held[1] += sign

    def _user_cap_beyond(self, job: Job) -> str | None:
        """The lowest level of the job's tenant whose per-user GPU cap is below the job's size
        (None: every cap can hold it): no job of its submitter ending lets it start."""
        assert job.tenant is not None
        for level in self._capped_levels[job.tenant]:
            cap = self.tenants[level].user_max_gpus
            if cap is not None and job.total_gpus > cap:
                return level
        return None

    def _user_cap_text(self, job: Job) -> str | None:
        """Why admitting the job would take its submitter past the tenant's per-user cap
        (None: it would not)."""
        assert job.tenant is not None
        who = f"user {job.submitter}" if job.submitter else "jobs with no recorded submitter"
        level = self._user_cap_beyond(job)
        if level is not None:
            cap = self.tenants[level].user_max_gpus
            # Said apart from a cap merely reached: no job of the user ending helps.
            return (
                f"needs {job.total_gpus} GPUs, more than the {cap} GPUs tenant {level} "
                f"allows one user: it can never start under that cap; ask for at most "
                f"{cap} GPUs, or have the cap (its spec.perUser.maxGpus) raised"
            )
        for level in self._capped_levels[job.tenant]:
            tenant = self.tenants[level]
            gpus, jobs = self.users.get((level, job.submitter), (0, 0))
            if tenant.user_max_gpus is not None and gpus + job.total_gpus > tenant.user_max_gpus:
                return (
                    f"needs {job.total_gpus} GPUs; {who} holds {gpus} of the "
                    f"{tenant.user_max_gpus} GPUs tenant {tenant.name} allows one user"
                )
            if tenant.user_max_jobs is not None and jobs + 1 > tenant.user_max_jobs:
                return (
                    f"{who} has {jobs} of the {tenant.user_max_jobs} jobs holding GPUs tenant "
                    f"{tenant.name} allows one user"
                )
        return None

    def _tenant_rule(self, job: Job) -> GangFailure | None:
        """The tenant's budget or per-user cap standing in the job's way, whatever GPUs are
        free (None: neither does)."""
        assert job.tenant is not None
        for level in self._levels[job.tenant]:
            tenant = self.tenants[level]
            if tenant.budget_exhausted(self.now):
                assert tenant.budget_exhausted_until is not None
                # The next period begins by time alone: the job may start then.
                self._wake_by(tenant.budget_exhausted_until)
                turns = _in(tenant.budget_exhausted_until - self.now)
                return GangFailure(
                    WaitReason.BUDGET_EXHAUSTED,
                    f"tenant {tenant.name} has spent its budget's hard cap for this period; "
                    f"new jobs start when the next period begins, {turns}",
                )
        text = self._user_cap_text(job)
        if text is not None:
            return GangFailure(WaitReason.USER_CAP_EXCEEDED, text)
        return None

    def _claims_of(self, tenant: str) -> set[str]:
        """The tenant's jobs inside its own guarantee, or inside an ancestor's (in the queue
        order of all the jobs below that ancestor)."""
        own = claims(
            self.tenants[tenant],
            self._admitted_at_start[tenant],
            self._feasible(tenant),
            round_up=self._rounding_up(tenant),
        )
        self._leaf_claims[tenant] = frozenset(own)
        for level in self._levels[tenant][1:]:
            own |= {k for k in self._claims_at(level) if self.jobs[k].tenant == tenant}
        return own

    def _claims_at(self, level: str) -> set[str]:
        """Jobs below a parent tenant that fit its guarantee, in their queue order: what the
        parent's guarantee is claimed by (fixed by the demand at the start of the cycle)."""
        found = self._level_claims.get(level)
        if found is None:
            members = [t for t in self.tenants if level in self._levels[t][1:]]
            demand = sorted(
                (j for t in members for j in (*self._admitted_at_start[t], *self._feasible(t))),
                key=lambda j: j.order,
            )
            parent = replace(self.tenants[level], guaranteed_by_model={})
            found = classify_ordered(parent, demand)
            self._level_claims[level] = found
        return found

    def claim_level(self, job: Job) -> str | None:
        """The lowest level whose guarantee the job claims (None: it claims none)."""
        assert job.tenant is not None
        if job.key not in self.claims[job.tenant]:
            return None
        if job.key in self._leaf_claims[job.tenant]:
            return job.tenant
        for level in self._levels[job.tenant][1:]:
            if job.key in self._claims_at(level):
                return level
        return None

    # --- the tenant tree -----------------------------------------------------------------

    def used_at(self, level: str) -> int:
        """GPUs held at a level: its own jobs' and those of every tenant below it."""
        return self.ledgers[level].used + self.below.get(level, 0)

    def _count_levels(self, job: Job, sign: int) -> None:
        assert job.tenant is not None
        for level in self._levels[job.tenant][1:]:
            self.below[level] += sign * job.total_gpus
            self._usable_gpus.pop(level, None)
            self._sizes.pop(level, None)

    def _level_limit_text(self, job: Job, freed: Mapping[str, int] | None = None) -> str | None:
        """Why admitting the job would take an ancestor of its tenant above its borrowing
        limit (after ``freed`` GPUs per level leave), or None."""
        assert job.tenant is not None
        for level in self._levels[job.tenant][1:]:
            limit = self.tenants[level].borrowing_limit
            if limit is None:
                continue
            used = self.used_at(level) - (freed or {}).get(level, 0)
            if used + job.total_gpus > limit:
                return (
                    f"needs {job.total_gpus} GPUs; tenant {level} (above {job.tenant}) holds "
                    f"{used} of its borrowing limit {limit}"
                )
        return None

    def _frees_limit(self, job: Job) -> Callable[[Candidate], bool] | None:
        """Which reclaim victims count against a borrowing limit above the job's tenant (those
        of tenants under the same limited ancestor); None when no ancestor has a limit."""
        assert job.tenant is not None
        limited = {
            lv
            for lv in self._levels[job.tenant][1:]
            if self.tenants[lv].borrowing_limit is not None
        }
        if not limited:
            return None

        def frees(c: Candidate) -> bool:
            tenant = c.job.tenant
            return (
                c.reason is PreemptReason.RECLAIM_GUARANTEE
                and tenant is not None
                and bool(limited.intersection(self._levels[tenant]))
            )

        return frees

    def _beyond_a_limit(self, job: Job) -> bool:
        """Whether the job asks more GPUs than the borrowing limit of its tenant or of a level
        above it: it can never start, so it neither claims a guarantee nor holds back the
        tenant's jobs behind it."""
        return self._limit_beyond(job) is not None

    def _limit_beyond(self, job: Job) -> str | None:
        """The lowest level of the job's tenant whose borrowing limit is below the job's size
        (None: every limit can hold it)."""
        assert job.tenant is not None
        size = job.total_gpus
        for level in self._levels[job.tenant]:
            limit = self.tenants[level].borrowing_limit
            if limit is not None and size > limit:
                return level
        return None

    def _never_text(self, job: Job) -> str | None:
        """Why the job can never start under a borrowing limit of its tenant or above it
        (None: it can): said apart from a limit merely reached, since no job ending helps."""
        level = self._limit_beyond(job)
        if level is None:
            return None
        tenant = self.tenants[level]
        limit = tenant.borrowing_limit
        above = "" if level == job.tenant else f" (above {job.tenant})"
        return (
            f"needs {job.total_gpus} GPUs, more than the {limit} tenant {level}{above} may ever "
            f"hold (its borrowing limit; {tenant.guaranteed} guaranteed): it can never start "
            f"under that limit; ask for at most {limit} GPUs, or have the limit (its "
            "spec.borrowingLimit) raised"
        )

    def _within_an_ancestor(self, job: Job) -> bool:
        """Whether the job fits the unused guarantee of one of its tenant's ancestors."""
        assert job.tenant is not None
        return any(
            self.used_at(level) + job.total_gpus <= self.tenants[level].guaranteed
            for level in self._levels[job.tenant][1:]
        )

    # --- ordering ------------------------------------------------------------------------

    def _head(self, tenant: str) -> Job | None:
        queue = self.queued[tenant]
        i = self._heads[tenant]
        return queue[i] if i < len(queue) else None

    def _entry(self, tenant: str) -> tuple[int, float, tuple[int, float, str], str, int] | None:
        self._park_unstartable(tenant)
        job = self._head(tenant)
        if job is None:
            return None
        ledger = self.ledgers[tenant]
        if ledger.fits_within(job) or self._takes_the_rest(job, ledger):
            return (0, 0.0, job.order, tenant, self._versions[tenant])
        borrowed_after = ledger.used + job.total_gpus - ledger.covered(job)
        standing = self.tenants[tenant]
        share = (borrowed_after + standing.recent_borrowed) / standing.weight
        # Inside an ancestor's guarantee (a sibling's idle share) before beyond every level.
        rank = 1 if self._within_an_ancestor(job) else 2
        return (rank, share, job.order, tenant, self._versions[tenant])

    def _takes_the_rest(self, job: Job, ledger: Ledger, without: Sequence[Job] = ()) -> bool:
        """With guarantees rounded up: whether the job claims the rest of its tenant's own
        guarantee, rounded up to it (it is larger than what is left, and the tenant holds less
        than its guarantee once ``without`` are gone): it goes ahead of borrowers and may
        reclaim from them as a job inside the guarantee does."""
        assert job.tenant is not None
        if not job.preemptible or not self._rounding_up(job.tenant):
            return False
        used = ledger.used - sum(j.total_gpus for j in without)
        return used < self.tenants[job.tenant].guaranteed and self.claim_level(job) == job.tenant

    def _rounding_up(self, tenant: str) -> bool:
        """Whether this tenant's own guarantee is rounded up to whole jobs (the cycle's
        setting, for a tenant without children or guarantees by model)."""
        return (
            self._round_up and rounds_up(self.tenants[tenant]) and not self.tree.is_parent(tenant)
        )

    def _park_unstartable(self, tenant: str) -> None:
        """Park the jobs at the head of the tenant's queue that cannot start in this cycle
        whatever others do (no node could ever hold them, or in requeue backoff) before the
        tenant's turn is ranked: the tenant is ranked by the first job that can start. Ranked
        by an unplaceable head, a tenant below its guarantee would let a borrower take the idle
        GPUs first and then reclaim them from it for the job behind that head."""
        while (job := self._head(tenant)) is not None and (
            not self._feasible_request[self.requests[job.key]]
            or (job.not_before is not None and job.not_before > self.now)
            or self._tenant_rule(job) is not None
            or self._beyond_a_limit(job)
        ):
            tried = self._attempts[tenant]
            touched = self._decide(job)
            assert not touched, "a job that cannot start changed another tenant's standing"
            self._remember(tenant, job, touched, self._attempts[tenant] > tried)
            self._heads[tenant] += 1

    def _refresh(
        self, heap: list[tuple[int, float, tuple[int, float, str], str, int]], tenant: str
    ) -> None:
        self._versions[tenant] += 1
        entry = self._entry(tenant)
        if entry is not None:
            heapq.heappush(heap, entry)

    # --- the cycle -----------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Decide every queued job once (a cycle that already ran, or that
        :meth:`decide_arrivals` extended, returns its decisions)."""
        if self.ran:
            return self.result()
        self.ran = True
        self._result = None
        for job in self.orphans:
            parent = job.tenant is not None and self.tree.is_parent(job.tenant)
            self._wait(job, WaitReason.NO_TENANT, _no_tenant_text(job, parent=parent))
        heap: list[tuple[int, float, tuple[int, float, str], str, int]] = []
        for tenant in self.tenants:
            entry = self._entry(tenant)
            if entry is not None:
                heap.append(entry)
        heapq.heapify(heap)
        while heap:
            standing, share, _, tenant, version = heapq.heappop(heap)
            if version != self._versions[tenant]:
                continue
            head = self._head(tenant)
            assert head is not None
            if self._wait_alike(tenant, head, any_before=True):
                touched: set[str] = set()
            else:
                tried = self._attempts[tenant]
                touched = self._decide(head)
                self._remember(tenant, head, touched, self._attempts[tenant] > tried)
            self._heads[tenant] += 1
            if not touched:
                self._park_run(heap, tenant, standing, share)
            for name in sorted({tenant, *touched}) if touched else (tenant,):
                self._refresh(heap, name)
        return self.result()

    def unchanged_by_run(self) -> bool:
        """Whether the run changed nothing: no admission, eviction or reservation, and none
        held or carried over (each job's decision then saw the state the cycle started in)."""
        return (
            self.ran
            and not self.admissions
            and self._admitted_version == 0
            and self._reservation_changes == 0
            and not self.reserved
            and not self.reservations
            and self._played is None
        )

    def decide_arrivals(self, snapshot: Snapshot, arrivals: Sequence[Job]) -> bool:
        """Decide jobs that arrived since :meth:`run`, on top of what it left, as a cycle over
        ``snapshot`` (the cycle's snapshot and the arrivals) at this cycle's time decides them.

        Exact only when the run changed nothing (:meth:`unchanged_by_run`), and when each
        arrival comes last in its tenant's queue (and in the queues below each of its tenant's
        ancestors), leaves the guarantee claims and the lenders' holds of everyone else as
        they were, and waits: then every job before it saw the same state, so decided the
        same, and it sees the state a cycle from scratch shows it at its turn.

        The victim-search budget is the one thing an arrival's turn can take from a job after
        it: ahead of the jobs that searched, it would take a search from the last of them. So
        each arrival may search whatever the budget says; a search that would evict ends the
        attempt, and a search that fails changes nobody's decision (the job that would have
        lost its search had failed with it, with the same reason) as long as no search turned
        a reclaim down for its cost (whose reason says so). The count of searches is what a
        cycle from scratch makes: the budget, or less.

        Returns False as soon as one of these fails (the cycle is then spent: start a new
        one); True when every arrival waited.
        """
        # (A reclaim turned down already: the check after each arrival would find it too.)
        if not self.unchanged_by_run() or self._declined:
            return False
        if arrivals:
            self._result = None
        budget = self.snapshot.config.max_preemption_searches
        self._search_budget = math.inf
        try:
            for job in sorted(arrivals, key=lambda j: (j.tenant or "", j.order)):
                if not self._arrive(job) or self._declined:
                    return False
        finally:
            self._search_budget = budget
            self.searches = min(self.searches, budget)
        self.snapshot = replace(snapshot, now=self.now)
        return True

    def _arrive(self, job: Job) -> bool:
        if job.key in self.jobs or job.state is not JobState.QUEUED or job.reservation:
            return False
        self.jobs[job.key] = job
        self.arrived.append(job.key)
        tenant = job.tenant
        if tenant not in self.tenants or self.tree.is_parent(tenant):
            self.orphans.append(job)
            parent = tenant is not None and self.tree.is_parent(tenant)
            self._wait(job, WaitReason.NO_TENANT, _no_tenant_text(job, parent=parent))
            return True
        queue = self.queued[tenant]
        assert self._heads[tenant] == len(queue), "the run decided every queued job"
        for level in self._levels[tenant]:
            members = [t for t in self.tenants if level in self._levels[t]]
            if any(q and q[-1].order >= job.order for q in (self.queued[t] for t in members)):
                return False
        ancestors = self._levels[tenant][1:]
        # Claims of the tenant and of those sharing an ancestor with it are worked out again
        # with it; being last in every queue they are counted over, it takes no one's claim.
        moved = [t for t in self.tenants if t == tenant or set(ancestors) & set(self._levels[t])]
        holds_before = self._lender_holds()
        queue.append(job)
        request = self.requests[job.key] = Request.of(job)
        if request not in self._feasible_request:
            self._feasible_request[request] = self.pool.static_failure(request) is None
        if self._capped_levels[tenant] and self._user_cap_text(job) is not None:
            self._over_cap_at_start.add(job.key)
        if self.report:
            self.positions[job.key] = len(queue)
            self.demand[tenant] = self._demand_of(tenant)
        self._entitlements = None
        # Last in its queues it takes no one's claim, but with guarantees rounded up a job
        # that fits what is left takes the rest of the guarantee from the first job that did
        # not (quota.classify_ordered): then the jobs decided before it claimed otherwise.
        rounded = [name for name in moved if self._rounding_up(name)]
        claimed = {name: frozenset(self.claims[name]) - {job.key} for name in rounded}
        for name in moved:
            self.claims.pop(name, None)
            self._leaf_claims.pop(name, None)
        for level in ancestors:
            self._level_claims.pop(level, None)
        if any(frozenset(self.claims[name]) - {job.key} != claimed[name] for name in rounded):
            return False
        window = self.snapshot.config.lending_hold_seconds
        for name, (gpus, lapse) in self._asks_within(window, [job]).items():
            had, first = self._recent_asks.get(name, (0, math.inf))
            self._recent_asks[name] = (had + gpus, min(first, lapse))
            self._holds = (-1, {}, 0)
            if self._lender_holds() != holds_before:
                return False
        # Its turn, as :meth:`run` takes it.
        # (A job that cannot start is decided rather than parked there: the same answer.)
        tried = self._attempts[tenant]
        if self._wait_alike(tenant, job, any_before=True):
            touched = set()
        else:
            touched = self._decide(job)
            self._remember(tenant, job, touched, self._attempts[tenant] > tried)
        self._heads[tenant] += 1
        return (
            self.unchanged_by_run() and not touched and self.wait_reasons.get(job.key) is not None
        )

    @property
    def wake_at(self) -> float | None:
        """When a decision of this cycle may turn by time alone (:attr:`CycleResult.wake_at`)."""
        return self._wake_at

    def _lender_holds(self) -> dict[str, tuple[int, float]]:
        """GPUs kept for each lender and when its first ask leaves the hold window."""
        held, _ = self._held_for_lenders()
        return {name: (gpus, self._recent_asks[name][1]) for name, gpus in held.items()}

    def waiting_entries(self) -> dict[str, Waiting]:
        """The waiting entries of the last :meth:`result` by job (none before one)."""
        return {w.job: w for w in self._result.waiting} if self._result is not None else {}

    def result(self) -> CycleResult:
        """The decisions so far (after :meth:`run`; again after :meth:`forecast` for the
        expected starts). The same object while nothing was decided since."""
        if self._result is not None:
            return self._result
        waiting = sorted(self.waiting, key=lambda w: w.job)
        if self.expected:
            waiting = [
                replace(w, expected_start=self.expected.get(w.job, w.expected_start))
                for w in waiting
            ]
        if self._previous:
            previous = self._previous
            waiting = [
                w if (before := previous.get(w.job)) is None or before != w else before
                for w in waiting
            ]
        self._result = CycleResult(
            admissions=tuple(self.admissions),
            waiting=tuple(waiting),
            tenants=self._usage() if self.report else (),
            preemption_searches=self.searches,
            wait_reasons=self.wait_reasons,
            reservations=tuple(r for k, r in self.reserved.items() if k in self._confirmed),
            largest_free=self.pool.largest_free() if self.report else (),
            wake_at=self._wake_at,
        )
        return self._result

    def _wait_alike(self, tenant: str, job: Job, any_before: bool = False) -> bool:
        """Park ``job`` with the reason of the job before it in its tenant's queue, when that job
        asked exactly the same and nothing was admitted or evicted since it waited.

        Same request, priority, preemptibility and claim on the guarantee, an unchanged tenant
        ledger (nothing admitted or evicted anywhere), the same placement and preemption memos
        (both only grow within a cycle), the same search budget and no reservation confirmed
        or dropped since: deciding it would end the same way. What deciding it would use up is
        used up too (a reservation attempt its tenant has left, when the job before it used
        one). The job keeps its turn in the order across tenants; only the deciding is skipped,
        so long queues of alike jobs (thousands of one-GPU jobs) cost a heap step each.

        ``any_before``: failing that, park it with the reason of any earlier job of its tenant
        that asked the same, when besides nothing admitted or evicted no GPU was held or freed
        since that job waited (queues that interleave a few kinds of job: a small, a medium and
        a large class). It then stands for the job before it (:meth:`_park_run`).
        """
        before = self._failed.get(tenant)
        if not self._alike(tenant, job, before):
            kinds = self._failed_kinds.get(tenant) if any_before else None
            if not kinds:
                return False
            found = kinds.get(
                _kind_key(
                    self.requests[job.key],
                    priority=job.priority,
                    preemptible=job.preemptible,
                    claim=self.claim_level(job),
                    backfill=self._backfill_options(job),
                    submitter=job.submitter if self._capped_levels[tenant] else None,
                )
            )
            if (
                found is None
                or found[1] != self.pool.changes
                or not self._alike(tenant, job, found[0])
            ):
                return False
            before = self._failed[tenant] = found[0]
        assert before is not None
        if before.attempted and self._attempts[tenant] < RESERVATION_ATTEMPTS_PER_TENANT:
            self._attempts[tenant] += 1
        self._wait(job, before.reason, before.message)
        return True

    def _alike(self, tenant: str, job: Job, before: _Failed | None) -> bool:
        """Whether ``job`` would wait as ``before`` did (:meth:`_wait_alike`)."""
        return not (
            before is None
            or before.version != self._admitted_version
            or before.reservations != self._reservation_changes
            or self.requests[job.key] is not before.request
            or job.priority != before.priority
            or job.preemptible != before.preemptible
            or job.not_before is not None
            or job.key in self.reservations
            or job.key in self.reserved
            or self.claim_level(job) != before.claim
            or self._backfill_options(job) != before.backfill
            or (job.submitter != before.submitter and bool(self._capped_levels[tenant]))
        )

    def _park_run(
        self,
        heap: list[tuple[int, float, tuple[int, float, str], str, int]],
        tenant: str,
        standing: int,
        share: float,
    ) -> None:
        """Park the alike jobs behind a job that just waited for as long as each would be the
        next one taken anyway.

        An alike job's entry has the standing and share of the one before it (same size, same
        ledger) and a later queue order; while that entry is below everything else in the heap,
        the heap would hand it over next, so it is parked here without the heap round trip.
        """
        while True:
            job = self._head(tenant)
            if job is None or (heap and heap[0][:3] < (standing, share, job.order)):
                return
            if not self._wait_alike(tenant, job):
                return
            self._heads[tenant] += 1

    def _remember(self, tenant: str, job: Job, touched: set[str], attempted: bool) -> None:
        """Keep what the job just decided ended in, if it waited without changing anything
        (``attempted``: its decision used a reservation attempt)."""
        last = self._last_wait
        if (
            touched
            or last is None
            or last[0] != job.key
            or job.not_before is not None
            or job.key in self.reservations
            or job.key in self.reserved
        ):
            self._failed.pop(tenant, None)
            return
        failed = self._failed[tenant] = _Failed(
            request=self.requests[job.key],
            priority=job.priority,
            preemptible=job.preemptible,
            claim=self.claim_level(job),
            version=self._admitted_version,
            reason=last[1],
            message=last[2],
            backfill=self._backfill_options(job),
            submitter=job.submitter,
            reservations=self._reservation_changes,
            attempted=attempted,
        )
        kind = _kind_key(
            failed.request,
            priority=failed.priority,
            preemptible=failed.preemptible,
            claim=failed.claim,
            backfill=failed.backfill,
            submitter=failed.submitter if self._capped_levels[tenant] else None,
        )
        self._failed_kinds.setdefault(tenant, {})[kind] = (failed, self.pool.changes)

    def _decide(self, job: Job) -> set[str]:
        """Admit or park one job; returns tenants whose standing changed besides its own."""
        carried = self._unhold_carried(job)
        try:
            return self._decide_one(job, carried)
        finally:
            if carried is not None:
                self._forget(job)

    def _decide_one(self, job: Job, carried: Reservation | None) -> set[str]:
        assert job.tenant is not None
        tenant = self.tenants[job.tenant]
        ledger = self.ledgers[tenant.name]
        if job.not_before is not None and job.not_before > self.now:
            self._wait(
                job,
                WaitReason.REQUEUE_BACKOFF,
                f"requeued after its pods were not all running in time; next attempt in "
                f"{job.not_before - self.now:.0f}s",
            )
            return set()
        request = self.requests[job.key]
        static = self.pool.static_failure(request)
        if static is not None:
            self._wait(job, static.reason, static.message)
            return set()
        rule = self._tenant_rule(job)
        if rule is not None:
            self._wait(job, rule.reason, rule.message)
            return set()
        within = ledger.fits_within(job)
        failure: GangFailure | None = None
        above = self._level_limit_text(job)
        if (never := self._never_text(job)) is not None:
            failure = GangFailure(WaitReason.QUOTA_EXCEEDED, never)
        elif not ledger.within_limit(job):
            failure = GangFailure(WaitReason.QUOTA_EXCEEDED, _limit_text(tenant, ledger, job))
        elif above is not None:
            failure = GangFailure(WaitReason.QUOTA_EXCEEDED, above)
        elif not job.preemptible and not within:
            failure = GangFailure(
                WaitReason.GUARANTEE_EXCEEDED, _guarantee_text(tenant, ledger, job)
            )
        elif (hold := self._lender_hold(job, ledger, within)) is not None:
            # Nothing is evicted or reserved for it either: the idle GPUs are the lenders'.
            self._wait(job, hold.reason, hold.message)
            return set()
        else:
            outcome = self._try_place(job, request, within, carried is not None)
            if outcome.admitted:
                return set()
            failure = outcome.failure
        assert failure is not None
        if (
            failure.reason is WaitReason.QUOTA_EXCEEDED
            and (hold := self._lender_hold(job, ledger, within)) is not None
        ):
            # Over a limit and borrowing while lenders keep their idle GPUs: it would evict
            # its own jobs for the limit and take the kept GPUs. Nothing is evicted for it.
            self._wait(job, hold.reason, hold.message)
            return set()
        reserving = self._may_reserve(job, failure)
        touched = self._try_preempt(job, request, failure, reserving)
        if touched is not None:
            return touched
        if self._declined_now:
            patience = self.snapshot.config.reclaim_patience_seconds
            failure = GangFailure(failure.reason, f"{failure.message}; {_declined_text(patience)}")
        if reserving:
            reservation = self._reserve(job, request, carried)
            if reservation is not None:
                self._wait(
                    job,
                    failure.reason,
                    f"{failure.message}; {_reservation_text(reservation, self.now)}",
                )
                return set()
        self._wait(job, failure.reason, failure.message)
        return set()

    def _try_place(self, job: Job, request: Request, within: bool, carried: bool) -> _Outcome:
        """Place the job on free GPUs (its own reserved ones included), else by backfill.
        ``carried``: its reservation was just released, so others' failures say nothing."""
        reserved = self.reservations.get(job.key, [])
        if not reserved and not carried:
            memo = self.placement_failures.get(request)
            if memo is not None:
                return self._try_backfill(job, request, within, memo, carried)
        released = {key: self.pool.release(key) for key in reserved}
        result = self.pool.place_gang(job.key, request)
        for key, held in released.items():
            self.pool.restore(key, held)
        if isinstance(result, GangFailure):
            if not reserved:
                self.placement_failures[request] = result
            return self._try_backfill(job, request, within, result, carried)
        self.reservations.pop(job.key, None)
        reason = AdmitReason.WITHIN_GUARANTEE if within else AdmitReason.BORROWING
        self._admit(job, result, reason, ())
        return _Outcome(True)

    # --- expected starts -----------------------------------------------------------------

    def forecast(
        self, limit: int | None = None, *, until: str | frozenset[str] | None = None
    ) -> dict[str, float | None]:
        """Expected start of the jobs that waited in :meth:`run` (at most ``limit`` of them
        beyond the reservations, first in the cycle's order; None: all). With ``until`` (a
        waiting job's key, or a set of them) the play stops once that job (each of them) is
        decided: ``explain`` asks for one job, a replay for the jobs not told yet, and the rest
        of the queue's future does not change their answers. The forecast is played once per
        cycle: later calls return its answers.

        A reserving job starts with its reservation. The others are planned by playing the
        cycle forward on the running jobs' expected ends (:mod:`gpusched.core.admission.forecast`):
        greedily in the cycle's order, no earlier than their backoff and their tenant's budget
        period, under their tenant's borrowing limit (or, for a non-preemptible job, its
        guarantee), its parents' limits and its per-submitter caps, with reservations made as
        the cycle makes them. Assumed: running jobs end when expected, jobs arrive as the
        snapshot's expected arrivals say (:mod:`gpusched.core.admission.arrivals`; none when
        it has none), nobody is preempted, the order stays. Jobs that can never run here get
        None.
        """
        if self.arrived:
            raise RuntimeError("arrivals decided on top of a cycle have no place in its order")
        self._result = None
        if self._played is not None:
            if until is None and self._played != "all":
                raise RuntimeError("the forecast stopped at one job; a cycle plays it once")
            return dict(self.expected)
        self._played = "all" if until is None else "part"
        wanted = frozenset((until,)) if isinstance(until, str) else until
        config = self.snapshot.config
        profile = self.profile()
        held: dict[str, list[float]] = {}
        for reservation in self.reserved.values():
            held.setdefault(reservation.tenant, []).append(reservation.start)
            # The cycle's claim holds the GPUs from now; played forward they are held from the
            # start, and a job that ends before it may use them (the backfill rule).
            profile.unclaim(RESERVED_PREFIX + reservation.job)
            profile.take(reservation.placement, reservation.end, reservation.start)
        play = Forecast(
            profile,
            self.now,
            self.tenants,
            self._levels,
            ReservationRules(
                per_tenant=config.reservations_per_tenant,
                most=config.max_reservations,
                held=held,
                entitled=self._reservable,
            ),
        )
        for name in self.tenants:
            for j in self.admitted[name].values():
                play.hold(j, self.now, _end(self.ends.get(j.key)))
        for reservation in self.reserved.values():
            play.hold(self.jobs[reservation.job], reservation.start, reservation.end)
        entries: list[Entry] = []
        for key in self.order:
            if key in self.expected:
                continue
            job = self.jobs[key]
            reason = self.wait_reasons.get(key)
            if (
                job.tenant not in self.tenants
                or reason is WaitReason.NO_FEASIBLE_NODES
                or reason is WaitReason.NO_TENANT
            ):
                self.expected[key] = None
                continue
            if limit is not None and len(entries) >= limit:
                break
            entries.append(Entry(job, self.requests.get(key) or Request.of(job), self._floor(job)))
        if self.snapshot.arrivals:
            entries = self._with_arrivals(entries)
        # The same budget with ``until``: the play stopped at some jobs is then exactly the
        # first part of the whole play, so it answers as the whole play would, and costs no
        # more. (A job that is no entry has its answer already, or none.)
        budget = _PLAY_TRIES_PER_JOB * len(entries) + _PLAY_TRIES
        stop = None if wanted is None else wanted & {e.job.key for e in entries}
        starts = play.run(entries, stop, budget)
        self.expected.update((k, t) for k, t in starts.items() if not is_arrival(k))
        # Past its budget the play stopped: the rest is planned in turn (up to ``until``).
        for entry in play.left:
            if stop is not None and stop <= self.expected.keys():
                break
            if is_arrival(entry.job.key):
                continue
            self.expected[entry.job.key] = self._plan_in_turn(entry, play, profile)
        return dict(self.expected)

    def _with_arrivals(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` with the snapshot's expected arrivals among them, each where the cycle
        would rank it (:mod:`gpusched.core.admission.arrivals`): in its tenant's queue order,
        so before its tenant's first waiting job it goes ahead of and otherwise after its
        tenant's last; before every entry when its tenant has none waiting, after every entry
        when its tenant's waiting jobs lie beyond the forecast's limit. Arrivals due by now
        and of tenants unknown or with children are left out."""
        positions: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            positions.setdefault(entry.job.tenant or "", []).append(i)
        orders = {t: [entries[i].job.order for i in found] for t, found in positions.items()}
        first: list[Entry] = []
        last: list[Entry] = []
        before: dict[int, list[Entry]] = {}
        after: dict[int, list[Entry]] = {}
        waiting: dict[str, bool] = {}  # tenant without entries -> jobs waiting beyond the limit
        for job in self.snapshot.arrivals:
            tenant = job.tenant
            if (
                job.submitted_at <= self.now
                or tenant not in self.tenants
                or self.tree.is_parent(tenant)
            ):
                continue
            entry = Entry(job, Request.of(job), max(job.submitted_at, self._floor(job)))
            found = positions.get(tenant)
            if not found:
                # Its tenant has none waiting, or only beyond the forecast's limit (then its
                # turn comes after every entry).
                waits = waiting.get(tenant)
                if waits is None:
                    waits = waiting[tenant] = any(
                        j.key in self.wait_reasons for j in self.queued[tenant]
                    )
                (last if waits else first).append(entry)
                continue
            k = bisect_right(orders[tenant], job.order)
            if k < len(found):
                before.setdefault(found[k], []).append(entry)
            else:
                after.setdefault(found[-1], []).append(entry)
        out = first
        for i, entry in enumerate(entries):
            out.extend(before.get(i, ()))
            out.append(entry)
            out.extend(after.get(i, ()))
        return out + last

    def _plan_in_turn(self, entry: Entry, play: Forecast, profile: Profile) -> float | None:
        """Plan ``entry`` where it fits soonest after the jobs planned before it and those
        the play started (conservative backfill, as Slurm's ``squeue --start``). The play
        records no gaps, so GPUs it started jobs on are not offered before those starts."""
        job = entry.job
        limits = [(usage.intervals, n, cap) for usage, n, cap in play.limits(job)]
        found = self._plan_one(job, entry.request, profile, limits, entry.floor)
        if found is None:
            return None
        runtime = job.expected_runtime
        end = found.start + runtime if runtime is not None else NEVER
        profile.take(found.plans, end, found.start)
        play.hold(job, found.start, end)
        return found.start

    def _reservable(self, tenant: str) -> float:
        """GPUs a tenant may hold with a reservation among them (its entitlement or
        guarantee; unbounded when reservations beyond it are allowed)."""
        if self.snapshot.config.reserve_beyond_entitlement:
            return NEVER
        return max(float(self.tenants[tenant].guaranteed), self.entitlement(tenant))

    def _floor(self, job: Job) -> float:
        """Not before: the job's backoff, the budget period of its tenant and of every
        tenant above it (a parent's spent budget stops its teams' jobs too)."""
        assert job.tenant is not None
        floor = max(self.now, job.not_before or self.now)
        for level in self._levels[job.tenant]:
            budget = self.tenants[level]
            if budget.budget_exhausted(self.now):
                assert budget.budget_exhausted_until is not None
                floor = max(floor, budget.budget_exhausted_until)
        return floor

    def _plan_one(
        self,
        job: Job,
        request: Request,
        profile: Profile,
        limits: Sequence[tuple[Sequence[_Interval], int, int | None]],
        not_before: float | None = None,
    ) -> Slotting | None:
        """Where and when the job fits soonest on ``profile`` under ``limits``: (what is
        planned over time, what the job adds, the cap) for its tenant and its submitter; and
        not before its backoff ends or its tenant's budget period turns."""
        assert job.tenant is not None
        # Caps that all of the planned jobs at once would fit under are not checked.
        checks = [
            (planned, n, cap)
            for planned, n, cap in limits
            if cap is not None and sum(x for _, _, x in planned) + n > cap
        ]
        floor = max(self._floor(job), not_before or self.now)
        for _ in range(_FORECAST_ROUNDS):
            found = profile.earliest(request, floor, job.expected_runtime)
            if found is None:
                return None
            later = found.start
            for planned, n, cap in checks:
                allowed = _quota_allows(planned, found.start, n, cap)
                if allowed is None:
                    return None
                later = max(later, allowed)
            if later <= found.start:
                return found
            floor = later
        return None

    # --- reservations and backfill -------------------------------------------------------

    def profile(self) -> Profile:
        """When each GPU is expected free (built on first use; kept in step with the cycle's
        decisions from then on)."""
        if self._profile is None:
            self._profile = Profile(self.pool, self.now, self.ends)
        return self._profile

    def entitlement(self, tenant: str) -> float:
        """The tenant's fair share now (guarantee plus weighted share of idle GPUs)."""
        if self._entitlements is None:
            capacity = sum(
                (slot.node.topology.placeable_mask & ~slot.foreign).bit_count()
                for slot in self.pool.slots.values()
            )
            demand = self.demand or {name: self._demand_of(name) for name in self.tenants}
            self._entitlements = fair_shares(capacity, list(self.tenants.values()), demand)
        return self._entitlements.get(tenant, 0.0)

    def _may_reserve(self, job: Job, failure: GangFailure) -> bool:
        """Whether ``job`` may get a reservation if it stays blocked: GPUs alone stand in its
        way and its tenant has reservations left (the entitlement is checked at the
        reservation's start, :meth:`_entitled_at`)."""
        config = self.snapshot.config
        if failure.reason not in _GPU_BOUND or job.tenant is None:
            return False
        if self._reserving[job.tenant] >= config.reservations_per_tenant:
            return False
        if len(self._confirmed) >= config.max_reservations:
            return False
        if self._attempts[job.tenant] >= RESERVATION_ATTEMPTS_PER_TENANT:
            return False
        return self._may_be_entitled(job)

    def _may_be_entitled(self, job: Job) -> bool:
        """A cheap bound of :meth:`_entitled_at` before any search: even if every running job
        of the tenant with a predicted end had ended, would the job fit its entitlement?"""
        assert job.tenant is not None
        if self.snapshot.config.reserve_beyond_entitlement:
            return True
        never = sum(
            other.total_gpus
            for other in self.admitted[job.tenant].values()
            if self.ends.get(other.key) is None
        )
        held = never + self._reserved_gpus[job.tenant]
        entitled = self._reservable(job.tenant)
        return held + job.total_gpus <= entitled + 1e-9

    def _entitled_at(self, job: Job, start: float) -> bool:
        """Whether the tenant stays within its entitlement (or guarantee) when ``job`` starts
        at ``start``: what it holds then (its running jobs not expected to have ended, its
        other reservations) plus the job. A tenant whose own small jobs fill its share may
        reserve for its gang the GPUs those jobs free."""
        assert job.tenant is not None
        if self.snapshot.config.reserve_beyond_entitlement:
            return True
        ending = 0
        for other in self.admitted[job.tenant].values():
            end = self.ends.get(other.key)
            if end is not None and end <= start:
                ending += other.total_gpus
        held = self.ledgers[job.tenant].used - ending + self._reserved_gpus[job.tenant]
        entitled = self._reservable(job.tenant)
        return held + job.total_gpus <= entitled + 1e-9

    def _reserve(
        self, job: Job, request: Request, carried: Reservation | None = None
    ) -> Reservation | None:
        """Hold the GPUs where ``job`` fits soonest (or keep last cycle's, if about as early)."""
        assert job.tenant is not None
        profile = self.profile()
        if (
            carried is not None
            and self._still_as_early(job, carried.start)
            and not self._sooner_elsewhere(job, request, carried)
        ):
            if not self._entitled_at(job, carried.start):
                self._forget(job)
                return None
            key = RESERVED_PREFIX + job.key
            for plan in carried.placement:
                self.pool.hold(key, plan.node, plan.gpus)
            idle = sum(mask.bit_count() for mask in self.pool.holdings(key).values())
            reservation = replace(carried, idle_gpus=idle)
            self.reserved[job.key] = reservation
            return self._confirm(job, reservation)
        if carried is not None:
            self._forget(job)
        kept = self._kept_reservation(job, request, profile)
        fresh = profile.earliest(request, job.not_before)
        if kept is not None and (
            fresh is None or kept.start <= fresh.start + self._slack(fresh.start)
        ):
            slotting, is_kept = kept, True
        else:
            if fresh is None:
                return None
            slotting, is_kept = fresh, False
            prior = self._prior_start(job, request, profile)
            if prior is not None and prior <= fresh.start + self._slack(fresh.start):
                slotting = Slotting(prior, profile.plans_of(job.reservation, request))
                is_kept = True
        if not self._entitled_at(job, slotting.start):
            self._attempts[job.tenant] += 1
            return None
        return self._confirm(job, self._hold(job, slotting, is_kept))

    def _confirm(self, job: Job, reservation: Reservation) -> Reservation:
        assert job.tenant is not None
        self._reservation_changes += 1
        self._confirmed.add(job.key)
        self._reserving[job.tenant] += 1
        self._reserved_gpus[job.tenant] += job.total_gpus
        return reservation

    def _sooner_elsewhere(self, job: Job, request: Request, carried: Reservation) -> bool:
        """Whether the job now fits markedly sooner (by more than the slack) somewhere other
        than where its carried reservation holds GPUs. Compared with the previous cycle's
        start alone, a reservation behind a job that keeps overrunning its prediction would
        slip a little every cycle and stay there for ever, though another node frees first."""
        profile = self.profile()
        key = RESERVED_PREFIX + job.key
        profile.unclaim(key)
        try:
            fresh = profile.earliest(request, job.not_before)
        finally:
            profile.claim(key, carried.placement, carried.end)
        return fresh is not None and carried.start > fresh.start + self._slack(fresh.start)

    def _still_as_early(self, job: Job, start: float) -> bool:
        """Whether last cycle's GPUs are expected free no later than the start expected then
        (within the slack), and not before the job may run."""
        before = job.reservation_start
        if before is None or start > before + self._slack(before):
            return False
        return job.not_before is None or start >= job.not_before

    def _hold(self, job: Job, slotting: Slotting, kept: bool) -> Reservation:
        """Hold the free GPUs of a reservation in the pool and claim all of them on the
        profile from when they come free."""
        assert job.tenant is not None
        runtime = job.expected_runtime
        end = slotting.start + runtime if runtime is not None else NEVER
        key = RESERVED_PREFIX + job.key
        for plan in slotting.plans:
            self.pool.hold(key, plan.node, plan.gpus)
        idle = sum(mask.bit_count() for mask in self.pool.holdings(key).values())
        self.ends[key] = end
        self.profile().claim(key, slotting.plans, end)
        reservation = Reservation(
            job=job.key,
            tenant=job.tenant,
            start=slotting.start,
            end=end,
            placement=slotting.plans,
            idle_gpus=idle,
            kept=kept,
        )
        self.reserved[job.key] = reservation
        self.expected[job.key] = slotting.start
        return reservation

    def _carry(self) -> None:
        """Hold last cycle's reservations before anything is decided: GPUs that came free for a
        reserving job stay free for it against every job decided before it (except by the
        backfill rule). Each is confirmed, moved or dropped when its job's turn comes."""
        config = self.snapshot.config
        if config.reservations_per_tenant <= 0 or config.max_reservations <= 0:
            return
        carried = [j for queue in self.queued.values() for j in queue if j.reservation]
        if not carried:
            return
        profile = self.profile()
        for job in sorted(carried, key=lambda j: j.order):
            request = self.requests[job.key]
            start = self._prior_start(job, request, profile)
            if start is None:
                continue
            self._hold(job, Slotting(start, profile.plans_of(job.reservation, request)), True)

    def _unhold_carried(self, job: Job) -> Reservation | None:
        """The reservation carried over for ``job``, its GPUs released in the pool for the
        job's own attempt (its claim on the profile stays until the job's turn ends)."""
        found = self.reserved.get(job.key)
        if found is None or job.key in self._confirmed:
            return None
        self._unheld[job.key] = self.pool.release(RESERVED_PREFIX + job.key)
        return found

    def _forget(self, job: Job) -> None:
        """Drop a reservation carried over for ``job`` that its turn did not confirm."""
        if job.key not in self.reserved or job.key in self._confirmed:
            return
        self._reservation_changes += 1
        del self.reserved[job.key]
        self.expected.pop(job.key, None)
        key = RESERVED_PREFIX + job.key
        freed = self.pool.release(key)
        for node, mask in self._unheld.pop(job.key, {}).items():
            freed[node] = freed.get(node, 0) | mask
        self.ends.pop(key, None)
        self.profile().unclaim(key)
        self._rehold(freed)

    def _rehold(self, freed: dict[str, int]) -> None:
        """GPUs a dropped reservation held go to the reservations that claim them later (the
        earliest first), so they stay reserved against jobs decided after."""
        profile = self.profile()
        for node, mask in freed.items():
            slot = self.pool.slots[node]
            left = mask
            keys = sorted(profile.claims_on(node), key=self._claim_order)
            for key in keys:
                claimed = profile.claimed_by(key, node) & left & slot.free
                if claimed:
                    self.pool.hold(key, node, slot.node.topology.indices(claimed))
                    left &= ~claimed

    def _claim_order(self, key: str) -> tuple[float, str]:
        return self.reserved[key[len(RESERVED_PREFIX) :]].start, key

    def _slack(self, start: float) -> float:
        return max(RESERVATION_SLACK_SECONDS, RESERVATION_SLACK_FRACTION * (start - self.now))

    def _prior_start(self, job: Job, request: Request, profile: Profile) -> float | None:
        prior = job.reservation
        if len(prior) != request.replicas or any(
            len(a.gpus) != request.gpus_per_replica for a in prior
        ):
            return None
        if any(
            not self.pool.eligible(self.pool.slots[a.node], request)
            for a in prior
            if a.node in self.pool.slots
        ):
            return None
        return profile.start_of(prior)

    def _kept_reservation(self, job: Job, request: Request, profile: Profile) -> Slotting | None:
        """Last cycle's GPUs, when they are expected free about as early as they were then
        (no search needed)."""
        if not job.reservation or job.reservation_start is None:
            return None
        start = self._prior_start(job, request, profile)
        if start is None or not self._still_as_early(job, start):
            return None
        return Slotting(start, profile.plans_of(job.reservation, request))

    def _backfill_options(self, job: Job) -> frozenset[str]:
        """Reservations whose GPUs ``job`` may use: it is expected to end before they start,
        and either can be evicted by then or has a declared limit that ends it in time."""
        if not self.reserved:
            return frozenset()
        runtime = job.expected_runtime
        out = []
        for key, reservation in self.reserved.items():
            window = reservation.start - self.now
            limit = job.max_runtime_seconds
            if (limit is not None and limit <= window) or (
                runtime is not None
                and runtime <= window
                and job.preemptible
                and job.min_runtime_seconds <= window
            ):
                out.append(key)
        return frozenset(out)

    def _try_backfill(
        self, job: Job, request: Request, within: bool, failure: GangFailure, carried: bool
    ) -> _Outcome:
        options = self._backfill_options(job)
        if not options:
            return _Outcome(False, failure)
        memo = (request, options)
        if memo in self.backfill_failures and not carried:
            return _Outcome(False, failure)
        released = {key: self.pool.release(RESERVED_PREFIX + key) for key in sorted(options)}
        result = self.pool.place_gang(job.key, request)
        for key, held in released.items():
            self.pool.restore(RESERVED_PREFIX + key, held)
        if isinstance(result, GangFailure):
            self.backfill_failures.add(memo)
            return _Outcome(False, failure)
        until: float | None = None
        for plan in result:
            mask = self.pool.slots[plan.node].node.topology.mask(plan.gpus)
            for key, held in released.items():
                if held.get(plan.node, 0) & mask:
                    start = self.reserved[key].start
                    until = start if until is None else min(until, start)
        reason = AdmitReason.WITHIN_GUARANTEE if within else AdmitReason.BORROWING
        self._admit(job, result, reason, (), backfill_until=until)
        return _Outcome(True)

    # --- preemption ----------------------------------------------------------------------

    def borrowed_jobs(self, tenant: str) -> set[str]:
        """Admitted jobs of the tenant on borrowed capacity (cached until its jobs change)."""
        found = self._borrowed.get(tenant)
        if found is None:
            found = running_borrowed(
                self.tenants[tenant],
                self.admitted[tenant].values(),
                round_up=self._rounding_up(tenant),
            )
            self._borrowed[tenant] = found
        return found

    def candidates(
        self, job: Job, tenant: Tenant, request: Request, reserving: bool = False
    ) -> _Candidates:
        """Who may be evicted for ``job``, whether any of them belongs to another tenant, and
        when the first job kept from them for now by its protection (or, for a reservation,
        by the start it was backfilled up to) may join them.

        ``reserving``: the job would get a reservation, so jobs that were started on reserved
        GPUs and ran past the start they were expected to end by may be evicted for it.

        What it reads of ``job``: its tenant, priority, claim level and which nodes it may use
        (and, while reservations are held, which are its own): without reservations the list
        is kept per those until a job is admitted or evicted, as victim searches of one kind of
        job repeat within a cycle. A caller gets its own copy."""
        level = self.claim_level(job)
        if self.reserved and self._profile is not None:
            # Which victims hold GPUs another job's reservation claims changes as reservations
            # are made within the cycle: not kept.
            return self._find_candidates(job, tenant, request, reserving, level)
        if self._candidate_lists_at != self._admitted_version:
            self._candidate_lists.clear()  # made before the last admission or eviction
            self._candidate_lists_at = self._admitted_version
        memo = (
            tenant.name,
            job.priority,
            level,
            job.reservation if reserving else None,
            request.filter_key,
        )
        kept = self._candidate_lists.get(memo)
        if kept is None:
            kept = self._candidate_lists[memo] = self._find_candidates(
                job, tenant, request, reserving, level
            )
        return _Candidates(list(kept.found), kept.cross, kept.unprotected_at)

    def _find_candidates(
        self, job: Job, tenant: Tenant, request: Request, reserving: bool, level: str | None
    ) -> _Candidates:
        out: list[Candidate] = []
        # Jobs that would be candidates but for their protection (or a backfill deadline not
        # passed yet), with the time they stop being kept out.
        later: list[tuple[Job, float]] = []
        reclaim_later: float | None = None
        penalty = self.snapshot.config.restart_penalty_seconds
        made = self._candidates

        def candidate(victim: Job, reason: PreemptReason, borrowed: bool) -> Candidate:
            found = made.get((id(victim), reason, borrowed))
            if found is None or found.job is not victim:
                lost = gpu_seconds_lost(victim, self.now)
                found = Candidate(victim, reason, borrowed, lost, penalty * victim.total_gpus)
                made[(id(victim), reason, borrowed)] = found
            return found

        if reserving and job.reservation:
            for name in self.tenants:
                # As every eviction (quotas.md, "Why preemption never loops"): of its own
                # tenant's jobs none of a higher priority, of another tenant's only jobs that
                # run on borrowed capacity. The reservation moves past the others' ends.
                # Only a job overrunning on GPUs this job reserved delays it: one backfilled
                # onto another reservation (or one since dropped) is no overrun of this one.
                others = None if name == tenant.name else self.borrowed_jobs(name)
                for victim in self.admitted[name].values():
                    until = victim.backfill_until
                    if (
                        until is None
                        or not _overlaps(victim.placement, job.reservation)
                        or not (
                            victim.priority <= job.priority
                            if others is None
                            else victim.key in others
                        )
                    ):
                        continue
                    if until <= self.now and may_be_victim(victim, self.now):
                        out.append(candidate(victim, PreemptReason.BACKFILL_OVERRUN, True))
                    elif victim.preemptible and victim.started_at is not None:
                        when = max(until, unprotected_at(victim, self.now) or until)
                        later.append((victim, when))
        seen = {c.job.key for c in out}
        own_borrowed = self.borrowed_jobs(tenant.name)
        if tenant.within_tenant is WithinTenantPreemption.LOWER_PRIORITY:
            for victim in self.admitted[tenant.name].values():
                if victim.key in seen:
                    continue
                if victim.priority >= job.priority:
                    continue
                if may_be_victim(victim, self.now):
                    out.append(
                        candidate(victim, PreemptReason.HIGHER_PRIORITY, victim.key in own_borrowed)
                    )
                elif (protected := unprotected_at(victim, self.now)) is not None:
                    later.append((victim, protected))
        cross = False
        if tenant.reclaim is not ReclaimPolicy.NEVER and level is not None:
            lower_only = tenant.reclaim is ReclaimPolicy.LOWER_PRIORITY
            for name in self.tenants:
                if name == tenant.name or self.ledgers[name].borrowed() <= 0:
                    continue
                # Any of a borrowing tenant's jobs may go, the cheapest first, as long as what
                # it keeps covers its guarantee as before (:meth:`lenders_ok` checks the whole
                # set); which of its jobs came last in its queue says nothing about what
                # evicting them costs or where they run. A job larger than what the tenant
                # holds beyond the guarantee it uses would cut into that, alone or with others.
                # In a tree, the same holds at every level of the lender below where the two
                # meet; a lender at or below the level claimed at lends nothing to it.
                path = self.tree.lending_path(name, level) if not self.tree.flat else (name,)
                if not path:
                    continue
                spare = min(self.used_at(lv) - self._usable(lv) for lv in path)
                below = job.priority if lower_only else None
                segment, kept_out = self._lender_segment(name, request, spare, below, candidate)
                if seen:
                    segment = [c for c in segment if c.job.key not in seen]
                if segment:
                    cross = True
                    out.extend(segment)
                if kept_out is not None and (reclaim_later is None or kept_out < reclaim_later):
                    reclaim_later = kept_out
        if self.reserved and self._profile is not None:
            out = [c for c in out if not self._on_reserved(c.job, job)]
            cross = any(c.reason is PreemptReason.RECLAIM_GUARANTEE for c in out)
            later = [(victim, when) for victim, when in later if not self._on_reserved(victim, job)]
        times = [when for _, when in later]
        if reclaim_later is not None:
            times.append(reclaim_later)
        return _Candidates(out, cross, min(times, default=None))

    def _lender_segment(
        self,
        lender: str,
        request: Request,
        spare: int,
        below: int | None,
        candidate: Callable[[Job, PreemptReason, bool], Candidate],
    ) -> tuple[list[Candidate], float | None]:
        """The lender's jobs a reclaim may take for ``request``: those no larger than the
        ``spare`` GPUs it holds beyond the guarantee it uses, below priority ``below`` when
        set; and when the first job that would be one but for its protection on borrowed
        GPUs may be (None: none is kept out). Kept until the lender's running jobs change: a
        cycle lists them for every search, and an admission or eviction changes one or two
        lenders."""
        key = (lender, request.filter_key, spare, below)
        changes = self._lender_changes[lender]
        kept = self._segments.get(key)
        if kept is not None and kept[0] == changes:
            return kept[1], kept[2]
        reclaimable, protected = self._reclaimable_of(lender, request)

        def takes(victim: Job) -> bool:
            return victim.total_gpus <= spare and (below is None or victim.priority < below)

        found = [
            candidate(victim, PreemptReason.RECLAIM_GUARANTEE, True)
            for victim in reclaimable
            if takes(victim)
        ]
        later = [
            until
            for victim in protected
            if takes(victim)
            and (until := unprotected_at(victim, self.now, reclaim=True)) is not None
        ]
        when = min(later, default=None)
        self._segments[key] = (changes, found, when)
        return found, when

    def _reclaimable_of(self, lender: str, request: Request) -> tuple[list[Job], list[Job]]:
        """The lender's running jobs, in order, that hold GPUs on nodes ``request`` may use
        (another tenant's job helps only if it frees GPUs the job may use) and are past their
        protection on borrowed GPUs; and those on those nodes still inside it. Kept until the
        lender's running jobs change: every victim search of the cycle asks it of every
        lender."""
        key = (lender, request.filter_key)
        changes = self._lender_changes[lender]
        kept = self._reclaimable.get(key)
        if kept is not None and kept[0] == changes:
            return kept[1], kept[2]
        eligible = self.pool.eligible_nodes(request).name_set
        found: list[Job] = []
        protected: list[Job] = []
        for victim in self.admitted[lender].values():
            if not any(a.node in eligible for a in victim.placement):
                continue
            if may_be_victim(victim, self.now, reclaim=True):
                found.append(victim)
            elif unprotected_at(victim, self.now, reclaim=True) is not None:
                protected.append(victim)
        self._reclaimable[key] = (changes, found, protected)
        return found, protected

    def _usable(self, tenant: str) -> int:
        """GPUs of the tenant's guarantee its running jobs use (:func:`usable_guarantee`); at
        a parent, the jobs of every tenant below it count, by size."""
        found = self._usable_gpus.get(tenant)
        if found is None:
            if self.tree.is_parent(tenant):
                found = usable_of_sizes(self.tenants[tenant].guaranteed, self._level_sizes(tenant))
            else:
                found = usable_guarantee(
                    self.tenants[tenant],
                    self.admitted[tenant].values(),
                    round_up=self._rounding_up(tenant),
                )
            self._usable_gpus[tenant] = found
        return found

    def _usable_of(self, level: str, sizes: Mapping[int, int]) -> int:
        """:meth:`_usable` of a level holding jobs of ``sizes`` (rounded up at a tenant without
        children when the cycle rounds guarantees up)."""
        guaranteed = self.tenants[level].guaranteed
        if self._rounding_up(level):
            return covering_of_sizes(guaranteed, sizes)
        return usable_of_sizes(guaranteed, sizes)

    def _level_sizes(self, level: str) -> Counter[int]:
        """How many admitted jobs of each size are held at a level (its own and below it)."""
        sizes = self._sizes.get(level)
        if sizes is None:
            if self.tree.is_parent(level):
                sizes = Counter()
                for name in self.tenants:
                    if level in self._levels[name]:
                        sizes.update(job_sizes(self.admitted[name].values()))
            else:
                sizes = job_sizes(self.admitted[level].values())
            self._sizes[level] = sizes
        return sizes

    def lenders_ok(self, victims: Sequence[Candidate]) -> bool:
        """Whether every tenant losing jobs to a reclaim keeps using as much of its guarantee
        as it does now, in the shape of its jobs, however many of its jobs the eviction takes:
        it loses only GPUs its guarantee does not cover. A tenant at or below its guarantee
        never loses a job; one holding 17 GPUs against 16 it can fill loses at most 1 GPU,
        whichever of its jobs came last in its queue. (What a lender keeps only shrinks as
        victims are added, so checking them one at a time decides the whole set.)"""
        preemptor = self._preemptor
        assert preemptor is not None
        if not any(c.lent(preemptor) for c in victims):
            return True  # only other tenants' jobs are taken from lenders
        take = self.lender_tracker()
        return all(take(c) for c in victims)

    def lender_tracker(self) -> Callable[[Candidate], bool]:
        """:meth:`lenders_ok` for victims added one at a time: each reclaim victim is checked
        against what its tenant keeps after the ones before it, in time independent of how
        many came before."""
        left: dict[str, Counter[int]] = {}
        covered_without: dict[str, list[Job]] = {}

        claiming = self._claiming
        preemptor = self._preemptor
        assert preemptor is not None
        assert preemptor.tenant is not None
        own: str = preemptor.tenant
        flat = self.tree.flat

        def take(c: Candidate) -> bool:
            name = c.job.tenant
            if not c.lent(preemptor) or name is None:
                return True
            # Another tenant's overrun is taken as from a lender to the preemptor's tenant
            # (the overrun was a candidate only on its tenant's borrowed capacity).
            claimant = claiming if c.reason is PreemptReason.RECLAIM_GUARANTEE else None
            claimant = claimant or own
            path = (name,) if flat else self.tree.lending_path(name, claimant)
            size = c.job.total_gpus
            checked: list[Counter[int]] = []
            for level in path:
                tenant = self.tenants[level]
                if tenant.guaranteed_by_model and not self.tree.is_parent(level):
                    taken = [*covered_without.get(level, []), c.job]
                    if self.ledgers[level].covered(None, taken) < self._usable(level):
                        for undo in checked:
                            undo[size] += 1
                        return False
                    continue
                sizes = left.get(level)
                if sizes is None:
                    sizes = left[level] = self._level_sizes(level).copy()
                sizes[size] -= 1
                checked.append(sizes)
                if self._usable_of(level, sizes) < self._usable(level):
                    for undo in checked:
                        undo[size] += 1
                    return False
            for level in path:
                if self.tenants[level].guaranteed_by_model and not self.tree.is_parent(level):
                    covered_without[level] = [*covered_without.get(level, []), c.job]
            return True

        return take

    def _wake_when_unprotected(self, when: float | None) -> None:
        """A job waits that found no victims, and ``when`` the first job its protection kept
        from them may be one (:meth:`candidates`): nothing announces that moment, and a victim
        set may then be found, so the cycle decides again by it."""
        if when is not None:
            self._wake_by(when)

    def _wake_by(self, when: float) -> None:
        """Have the caller decide again by ``when`` (:attr:`CycleResult.wake_at`)."""
        if self._wake_at is None or when < self._wake_at:
            self._wake_at = when

    def gain(self, job: Job, request: Request, candidates: Sequence[Candidate]) -> float:
        """GPU-seconds the victims priced for ``job`` may lose (its tenant's own lower-priority
        jobs, and borrowed jobs while it weighs a reclaim, :meth:`weighs_reclaim`): its GPUs
        times the wait it would have without evicting them (its earliest start on the running
        jobs' expected ends, under its tenant's limit; inf when no end is known). A preemption
        that costs more than that waits instead. Evicting backfill overruns is not weighed (the
        reservation was promised), nor reclaiming a guarantee past the job's patience or when
        its GPUs are not expected to free within it
        (:attr:`CycleConfig.reclaim_patience_seconds`)."""
        weighs = self.weighs_reclaim(job)
        if not any(
            c.reason is PreemptReason.HIGHER_PRIORITY
            or (weighs and c.reason is PreemptReason.RECLAIM_GUARANTEE)
            for c in candidates
        ):
            return float("inf")
        return job.total_gpus * self._wait_without_preemption(job, request)

    def weighs_reclaim(self, job: Job) -> bool:
        """Whether a reclaim for ``job`` may be weighed against its wait: it was submitted
        less than :attr:`CycleConfig.reclaim_patience_seconds` ago."""
        return self.patience_left(job) > 0

    def patience_left(self, job: Job) -> float:
        """Seconds until ``job`` reclaims its guarantee whatever it costs (0: it does now)."""
        patience = self.snapshot.config.reclaim_patience_seconds
        return max(0.0, job.submitted_at + patience - self.now) if patience > 0 else 0.0

    def _wait_without_preemption(self, job: Job, request: Request) -> float:
        """Seconds until ``job`` is expected to fit without evicting anyone (inf: never, as
        far as the running jobs' expected ends tell)."""
        assert job.tenant is not None
        tenant = self.tenants[job.tenant]
        planned = [
            (self.now, _end(self.ends.get(j.key)), j.total_gpus)
            for j in self.admitted[job.tenant].values()
        ]
        cap = tenant.borrowing_limit if job.preemptible else tenant.guaranteed
        found = self._plan_one(job, request, self.profile(), [(planned, job.total_gpus, cap)])
        return float("inf") if found is None or found.start >= NEVER else found.start - self.now

    def _on_reserved(self, victim: Job, preemptor: Job) -> bool:
        """Whether ``victim`` holds GPUs another job's reservation claims: evicting it would
        hand a job decided later GPUs promised to one decided before it."""
        assert self._profile is not None
        skip = RESERVED_PREFIX + preemptor.key
        return any(
            mask & self._profile.claimed(node, skip)
            for node, mask in self.pool.holding(victim.key).items()
        )

    def _try_preempt(
        self, job: Job, request: Request, failure: GangFailure, reserving: bool = False
    ) -> set[str] | None:
        self._declined_now = False
        if failure.reason not in (
            WaitReason.WAITING_FOR_CAPACITY,
            WaitReason.TOPOLOGY_UNSATISFIABLE,
            WaitReason.DOMAIN_DEGRADED,
            WaitReason.QUOTA_EXCEEDED,
            WaitReason.GUARANTEE_EXCEEDED,
        ):
            return None
        assert job.tenant is not None
        tenant = self.tenants[job.tenant]
        ledger = self.ledgers[tenant.name]
        claiming = self.claim_level(job)
        # The patience left (:meth:`weighs_reclaim`) is not part of the key: alike jobs of a
        # tenant come oldest first, and more patience left only turns more sets down, so a
        # younger job never finds a set where an older one found none.
        memo = (
            tenant.name,
            request,
            job.priority,
            job.preemptible,
            claiming,
            reserving,
        )
        self._declined_now = memo in self._declined
        if memo in self.preemption_failures:
            return None
        if self.searches >= self._search_budget:
            return None
        # Who may be evicted changes only when a job is admitted or evicted.
        if (memo, self._admitted_version) in self.no_candidates:
            return None
        candidates, _, unprotected = self.candidates(job, tenant, request, reserving)
        if not candidates:
            self.no_candidates.add((memo, self._admitted_version))
            self._wake_when_unprotected(unprotected)
            return None
        self.searches += 1

        levels = self._levels[tenant.name][1:]

        def quota_ok(own: Sequence[Job], cross: bool, victims: Sequence[Candidate]) -> bool:
            if not ledger.within_limit(job, own):
                return False
            freed: dict[str, int] = {}
            if levels:
                for c in victims:
                    assert c.job.tenant is not None
                    for level in self._levels[c.job.tenant]:
                        if level in levels:
                            freed[level] = freed.get(level, 0) + c.job.total_gpus
                if self._level_limit_text(job, freed) is not None:
                    return False
            if cross and claiming is not None and claiming != tenant.name and job.preemptible:
                # Claimed above the tenant: the job must fit that level's guarantee once the
                # victims below it are gone, as a tenant's own claim must fit its own.
                room = self.tenants[claiming].guaranteed - self.used_at(claiming)
                return job.total_gpus <= room + freed.get(claiming, 0)
            if cross or not job.preemptible:
                # The rest of a guarantee rounded up is claimed by a tenant short of it as it
                # stands: one at or above it does not get below it by evicting its own jobs,
                # and so earn a reclaim.
                return ledger.fits_within(job, own) or self._takes_the_rest(job, ledger)
            return True

        self._claiming = claiming
        self._preemptor = job

        # The wait without preemption is worked out on the pool as it is, so before a gang's
        # search (which releases victims as it goes); a one-replica search leaves the pool
        # alone until it commits, so there only when a set needs it.
        budget: list[float] = []
        if request.replicas > 1 or request.across is not None:
            budget.append(self.gain(job, request, candidates))

        declined: list[bool] = []

        patience_left = self.patience_left(job)

        def worth_it(victims: Sequence[Candidate]) -> bool:
            own = taken = 0.0
            for c in victims:
                if c.reason is PreemptReason.HIGHER_PRIORITY:
                    own += c.price
                elif c.reason is PreemptReason.RECLAIM_GUARANTEE and patience_left:
                    taken += c.price
            if not own and not taken:
                return True
            if not budget:
                budget.append(self.gain(job, request, candidates))
            if own > budget[0]:
                return False
            # A reclaim waits only for GPUs expected to free within the job's patience:
            # past it, the borrowers would be evicted anyway, having lost more.
            expected_in_time = budget[0] < job.total_gpus * patience_left
            if taken and expected_in_time and own + taken > budget[0]:
                declined.append(True)
                return False
            return True

        found = find_victims(
            self.pool,
            job,
            request,
            candidates,
            quota_ok,
            lenders_ok=self.lenders_ok,
            worth_it=worth_it,
            lender_tracker=self.lender_tracker,
            # Only a job refused for its quota was not just tried on the free GPUs.
            may_place_now=failure.reason in _QUOTA_BOUND,
            frees_quota=self._frees_limit(job),
            quota_by_count=not tenant.guaranteed_by_model,
        )
        self._claiming = None
        self._preemptor = None
        if not isinstance(found, VictimSearch):
            self.preemption_failures.add(memo)
            self._wake_when_unprotected(unprotected)
            if declined:
                self._declined.add(memo)
                self._declined_now = True
                self._wake_by(self.now + patience_left)
            return None
        own_jobs = own_victims(job, found.victims)
        within = ledger.fits_within(job, own_jobs)
        touched: set[str] = set()
        preemptions = []
        profile = self._profile
        for c in found.victims:
            victim = c.job
            assert victim.tenant is not None
            touched.add(victim.tenant)
            self.ends[victim.key] = self.now
            if profile is not None:
                for node, mask in self.pool.holdings(victim.key).items():
                    profile.free_from(node, mask, self.now)
            self.ledgers[victim.tenant].remove(victim)
            self._count_levels(victim, -1)
            if self._capped_levels[victim.tenant]:
                self._count_user(victim, -1)
            del self.admitted[victim.tenant][victim.key]
            self._lender_changes[victim.tenant] += 1
            self._admitted_version += 1
            self._borrowed.pop(victim.tenant, None)
            self._usable_gpus.pop(victim.tenant, None)
            self._sizes.pop(victim.tenant, None)
            preemptions.append(
                Preemption(
                    victim=victim.key,
                    victim_tenant=victim.tenant,
                    preemptor=job.key,
                    reason=c.reason,
                    message=_preemption_text(job, c, tenant),
                    gpus=victim.total_gpus,
                    gpu_seconds_lost=round(c.lost, 1),
                )
            )
        reason = AdmitReason.WITHIN_GUARANTEE if within else AdmitReason.BORROWING
        self._admit(job, found.plans, reason, tuple(preemptions))
        touched.discard(tenant.name)
        return touched

    # --- bookkeeping ---------------------------------------------------------------------

    def _admit(
        self,
        job: Job,
        plans: Sequence[ReplicaPlan],
        reason: AdmitReason,
        victims: tuple[Preemption, ...],
        backfill_until: float | None = None,
    ) -> None:
        assert job.tenant is not None
        runtime = job.expected_runtime
        end = self.now + runtime if runtime is not None else None
        self.ends[job.key] = end
        if self._profile is not None:
            self._profile.take(plans, NEVER if end is None else end)
        placement = tuple(
            Assignment(p.node, p.gpus) if not p.count_only else Assignment(p.node, (), len(p.gpus))
            for p in plans
        )
        admitted = replace(
            job,
            state=JobState.ADMITTED,
            placement=placement,
            started_at=None,
            expected_end=end,
            backfill_until=backfill_until,
        )
        self.admitted[job.tenant][job.key] = admitted
        self._lender_changes[job.tenant] += 1
        self._admitted_version += 1
        self.ledgers[job.tenant].add(admitted)
        self._count_levels(admitted, 1)
        if self._capped_levels[job.tenant]:
            self._count_user(admitted, 1)
        self._borrowed.pop(job.tenant, None)
        self._usable_gpus.pop(job.tenant, None)
        self._sizes.pop(job.tenant, None)
        nodes = sorted({p.node for p in plans})
        where = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
        text = f"placed {Request.of(job).describe()} on {where}; " + (
            f"inside tenant {job.tenant}'s guarantee"
            if reason is AdmitReason.WITHIN_GUARANTEE
            else f"on GPUs borrowed from idle capacity (tenant {job.tenant} guarantees "
            f"{self.tenants[job.tenant].guaranteed})"
        )
        if victims:
            text += f"; preempting {', '.join(v.victim for v in victims)}"
        if backfill_until is not None:
            text += (
                f"; backfilled onto GPUs reserved from {_in(backfill_until - self.now)} "
                "(expected to end before then)"
            )
        self.admissions.append(
            Admission(job.key, job.tenant, reason, text, tuple(plans), victims, backfill_until, end)
        )

    def _wait(self, job: Job, reason: WaitReason, message: str) -> None:
        self._last_wait = (job.key, reason, message)
        self.wait_reasons[job.key] = reason
        self.order.append(job.key)
        if not self.report:
            return
        self.waiting.append(
            Waiting(job.key, job.tenant, reason, message, self.positions.get(job.key))
        )

    def _usage(self) -> tuple[TenantUsage, ...]:
        capacity = sum(
            (slot.node.topology.placeable_mask & ~slot.foreign).bit_count()
            for slot in self.pool.slots.values()
        )
        shares = fair_shares(capacity, list(self.tenants.values()), self.demand)
        admitted_now = {a.job for a in self.admissions}
        held = self._held_idle()
        own: dict[str, TenantUsage] = {}
        for name, tenant in self.tenants.items():
            ledger = self.ledgers[name]
            by_model: dict[str, int] = {}
            users: dict[str, tuple[int, int]] = {}
            for job in self.admitted[name].values():
                gpus, count = users.get(job.submitter, (0, 0))
                users[job.submitter] = (gpus + job.total_gpus, count + 1)
                for assignment in job.placement:
                    slot = self.pool.slots.get(assignment.node)
                    model = (slot.node.model if slot else None) or UNKNOWN_MODEL
                    by_model[model] = by_model.get(model, 0) + assignment.size
            pending = sum(1 for j in self.queued[name] if j.key not in admitted_now)
            own[name] = TenantUsage(
                name=name,
                guaranteed=tenant.guaranteed,
                borrowing_limit=tenant.borrowing_limit,
                weight=tenant.weight,
                used=ledger.used,
                borrowed=ledger.borrowed(),
                used_by_model=dict(sorted(by_model.items())),
                fair_share=shares.get(name, 0.0),
                pending=pending,
                running=sum(1 for j in self.admitted[name].values() if j.started_at is not None),
                demand=self.demand[name],
                admitted=len(self.admitted[name]),
                users=dict(sorted(users.items())),
                lending_hold=held.get(name, 0),
            )
        return tuple(
            self._level_usage(name, own) if self.tree.is_parent(name) else own[name]
            for name in self.tenants
        )

    def _level_usage(self, level: str, own: Mapping[str, TenantUsage]) -> TenantUsage:
        """A parent tenant's standing: its own and every tenant's below it, summed; what it
        borrows is what the sum holds beyond its guarantee."""
        members = [own[n] for n in self.tenants if level in self._levels[n]]
        tenant = self.tenants[level]
        by_model: dict[str, int] = {}
        users: dict[str, tuple[int, int]] = {}
        for usage in members:
            for model, n in usage.used_by_model.items():
                by_model[model] = by_model.get(model, 0) + n
            for user, (gpus, jobs) in usage.users.items():
                held = users.get(user, (0, 0))
                users[user] = (held[0] + gpus, held[1] + jobs)
        used = sum(u.used for u in members)
        return TenantUsage(
            name=level,
            guaranteed=tenant.guaranteed,
            borrowing_limit=tenant.borrowing_limit,
            weight=tenant.weight,
            used=used,
            borrowed=max(0, used - tenant.guaranteed),
            used_by_model=dict(sorted(by_model.items())),
            fair_share=own[level].fair_share,
            pending=sum(u.pending for u in members),
            running=sum(u.running for u in members),
            demand=sum(u.demand for u in members),
            admitted=sum(u.admitted for u in members),
            users=dict(sorted(users.items())),
        )


def _no_tenant_text(job: Job, *, parent: bool = False) -> str:
    if parent:
        return (
            f"TenantQuota {job.tenant} of namespace {job.namespace} has child TenantQuotas; "
            "jobs belong to the tenants below it: move the namespace to one of them"
        )
    if job.tenant is None:
        return (
            f"namespace {job.namespace} is not owned by any TenantQuota; a cluster admin must "
            "add it to one"
        )
    return f"TenantQuota {job.tenant} of namespace {job.namespace} no longer exists"


def _limit_text(tenant: Tenant, ledger: Ledger, job: Job) -> str:
    return (
        f"needs {job.total_gpus} GPUs; tenant {tenant.name} holds {ledger.used} of its "
        f"borrowing limit {tenant.borrowing_limit}"
    )


def _guarantee_text(tenant: Tenant, ledger: Ledger, job: Job) -> str:
    free = max(0, tenant.guaranteed - ledger.covered())
    return (
        f"non-preemptible jobs run only inside the tenant's guarantee: needs {job.total_gpus} "
        f"GPUs, tenant {tenant.name} has {free} of {tenant.guaranteed} guaranteed GPUs unused"
    )


#: The forecast's play tries at most this many jobs per waiting job, plus a constant: a queue
#: of jobs that all ask differently (every tenant, shape and run time apart) can make each
#: moment try every job; past the bound the rest is planned in turn (docs/benchmarks.md).
_PLAY_TRIES_PER_JOB = 5
_PLAY_TRIES = 10_000

#: Rounds of (GPUs, quota) a forecast tries per job before it gives up on an answer.
_FORECAST_ROUNDS = 32
#: (start, end, amount) of something planned to be held.
_Interval = tuple[float, float, int]


def _kind_key(
    request: Request,
    *,
    priority: int,
    preemptible: bool,
    claim: str | None,
    backfill: frozenset[str],
    submitter: str | None,
) -> tuple[object, ...]:
    """What a job asks, as :meth:`Cycle._alike` compares it (the submitter only where its
    tenant caps one): the key of ``Cycle._failed_kinds``. Requests are interned, so by
    identity."""
    return (id(request), priority, preemptible, claim, backfill, submitter)


def _declined_text(patience: float) -> str:
    """Why a job inside its guarantee waits although borrowed GPUs could be reclaimed."""
    return (
        "reclaiming lent GPUs for it would throw away more work than its expected wait costs, "
        f"so it waits for GPUs to free (first in line) and reclaims them once it has waited "
        f"{span(patience)}"
    )


def _end(end: float | None) -> float:
    return NEVER if end is None else end


def _quota_allows(planned: Sequence[_Interval], at: float, gpus: int, cap: int) -> float | None:
    """First time from ``at`` when the tenant's jobs (start, end, GPUs) leave room for
    ``gpus`` under ``cap`` (None: never): ``at`` if they do then, else the first end of what
    is held then, and so on, for at most :data:`_FORECAST_ROUNDS` times.

    Most answers are ``at`` (one pass over the plan). Past it, the plan's intervals still to
    end are swept by start with what is held in a heap by end: a forecast plans thousands of
    jobs of a tenant in turn, and a pass over the whole plan per time tried made it quadratic.
    """
    used = 0
    upcoming = NEVER
    for start, end, n in planned:
        if start <= at < end:
            used += n
            upcoming = min(upcoming, end)
    if used + gpus <= cap:
        return at
    if upcoming == NEVER:
        return None
    pending = sorted(x for x in planned if x[1] > at)
    held: list[tuple[float, int]] = []
    used = 0
    nxt = 0
    when = upcoming
    for _ in range(_FORECAST_ROUNDS - 1):
        while nxt < len(pending) and pending[nxt][0] <= when:
            _, end, n = pending[nxt]
            nxt += 1
            heapq.heappush(held, (end, n))
            used += n
        while held and held[0][0] <= when:
            used -= heapq.heappop(held)[1]
        if used + gpus <= cap:
            return when
        if not held or held[0][0] == NEVER:
            return None
        when = held[0][0]
    return None


def _overlaps(placement: Sequence[Assignment], reserved: Sequence[Assignment]) -> bool:
    """Whether a job placed at ``placement`` holds any GPU of ``reserved`` (on a count-only
    node, any GPU of a node the reservation holds GPUs on)."""
    for held in placement:
        for want in reserved:
            if held.node == want.node and (
                not held.gpus or not want.gpus or set(held.gpus) & set(want.gpus)
            ):
                return True
    return False


def own_victims(preemptor: Job, victims: Sequence[Candidate]) -> list[Job]:
    """Victims whose GPUs count against the preemptor's own tenant's quota."""
    return [
        c.job
        for c in victims
        if c.reason is PreemptReason.HIGHER_PRIORITY
        or (c.reason is PreemptReason.BACKFILL_OVERRUN and c.job.tenant == preemptor.tenant)
    ]


def _in(seconds: float) -> str:
    """``now`` / ``in 3h 20m`` / ``in 12m``."""
    return "now" if seconds < 60 else f"in {span(seconds)}"


def span(seconds: float) -> str:
    """``3h 20m`` / ``12m`` / ``2d 1h``: how a wait is written in statuses and events."""
    minutes = int(seconds // 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m"


def _reservation_text(reservation: Reservation, now: float) -> str:
    nodes = sorted({p.node for p in reservation.placement})
    where = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    return (
        f"GPUs reserved on {where}, expected to start {_in(reservation.start - now)}"
        f" ({reservation.idle_gpus} of them idle until then)"
    )


def _preemption_text(job: Job, c: Candidate, tenant: Tenant) -> str:
    hours = c.lost / 3600
    if c.reason is PreemptReason.BACKFILL_OVERRUN:
        why = (
            f"this job was started on GPUs reserved for others, expected to end before the "
            f"reservation; it ran past it and {job.key} needs the GPUs"
        )
        return f"{why} ({hours:.2f} GPU-hours since start or last checkpoint)"
    if c.reason is PreemptReason.HIGHER_PRIORITY:
        why = (
            f"{job.key} (priority {job.priority}) of the same tenant needs its GPUs; this job "
            f"has priority {c.job.priority}"
        )
    else:
        why = (
            f"tenant {tenant.name} reclaims guaranteed GPUs for {job.key}; this job ran on "
            f"GPUs borrowed beyond tenant {c.job.tenant}'s guarantee"
        )
    return f"{why} ({hours:.2f} GPU-hours since start or last checkpoint)"
