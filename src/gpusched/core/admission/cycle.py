"""One admission cycle: which queued jobs start, which running jobs make room, who waits and why.

Order of work:

* jobs of each tenant are taken in queue order (priority, then FIFO); a job that cannot start does
  not block smaller ones behind it (best-effort FIFO);
* across tenants, jobs inside their tenant's guarantee go first; jobs that would borrow idle GPUs
  go next, from the tenant with the lowest weighted borrowing (borrowed GPUs / weight, counting
  the job), so idle capacity is shared by weight and none stays idle while someone can use it;
* a job is admitted only when the placement engine places every replica on free GPUs now (never
  on quota alone); otherwise it may preempt (lower-priority jobs of its tenant, or borrowed jobs
  of other tenants when it claims its guarantee), else it waits with a reason.

Everything is deterministic for a given snapshot: inputs are sorted by name first and every
ordering ends in a unique key.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
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
)
from gpusched.core.admission.quota import Ledger, claims, fair_shares, running_borrowed

UNKNOWN_MODEL = "unknown"


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
    claim: bool
    version: int
    reason: WaitReason
    message: str


@dataclass(frozen=True, slots=True)
class _Outcome:
    admitted: bool
    failure: GangFailure | None = None


def run_cycle(snapshot: Snapshot) -> CycleResult:
    """Decide one cycle over ``snapshot`` (pure and deterministic)."""
    return Cycle(snapshot).run()


class Cycle:
    """State of one cycle; :meth:`run` once. Kept as an object so ``explain`` can look inside."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now
        self.tenants: dict[str, Tenant] = {
            t.name: t for t in sorted(snapshot.tenants, key=lambda t: t.name)
        }
        jobs = sorted(snapshot.jobs, key=lambda j: j.key)
        self.jobs: dict[str, Job] = {j.key: j for j in jobs}
        holdings = [
            (j.key, a)
            for j in jobs
            if j.state in (JobState.ADMITTED, JobState.TERMINATING)
            for a in j.placement
        ]
        self.pool = Pool(snapshot.nodes, holdings)
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
            elif job.tenant in self.tenants:
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
        self.report = not snapshot.config.decisions_only
        self.demand: dict[str, int] = {}
        if self.report:
            for name in self.tenants:
                self.demand[name] = sum(j.total_gpus for j in self._admitted_at_start[name]) + sum(
                    j.total_gpus for j in self._feasible(name)
                )
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
        self.placement_failures: dict[Request, GangFailure] = {}
        self.preemption_failures: set[tuple[object, ...]] = set()
        self.no_candidates: set[tuple[tuple[object, ...], int]] = set()
        self._admitted_version = 0
        self.searches = 0
        self._borrowed: dict[str, set[str]] = {}
        self._heads: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self._versions: dict[str, int] = dict.fromkeys(self.tenants, 0)

    def _feasible(self, tenant: str) -> list[Job]:
        """The tenant's queued jobs that could be placed on an empty cluster, in queue order."""
        feasible = self._feasible_request
        requests = self.requests
        return [j for j in self.queued[tenant] if feasible[requests[j.key]]]

    def _claims_of(self, tenant: str) -> set[str]:
        return claims(self.tenants[tenant], self._admitted_at_start[tenant], self._feasible(tenant))

    # --- ordering ------------------------------------------------------------------------

    def _head(self, tenant: str) -> Job | None:
        queue = self.queued[tenant]
        i = self._heads[tenant]
        return queue[i] if i < len(queue) else None

    def _entry(self, tenant: str) -> tuple[int, float, tuple[int, float, str], str, int] | None:
        job = self._head(tenant)
        if job is None:
            return None
        ledger = self.ledgers[tenant]
        if ledger.fits_within(job):
            return (0, 0.0, job.order, tenant, self._versions[tenant])
        borrowed_after = ledger.used + job.total_gpus - ledger.covered(job)
        share = borrowed_after / self.tenants[tenant].weight
        return (1, share, job.order, tenant, self._versions[tenant])

    def _refresh(
        self, heap: list[tuple[int, float, tuple[int, float, str], str, int]], tenant: str
    ) -> None:
        self._versions[tenant] += 1
        entry = self._entry(tenant)
        if entry is not None:
            heapq.heappush(heap, entry)

    # --- the cycle -----------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Decide every queued job once."""
        for job in self.orphans:
            self._wait(job, WaitReason.NO_TENANT, _no_tenant_text(job))
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
            if self._wait_alike(tenant, head):
                touched: set[str] = set()
            else:
                touched = self._decide(head)
                self._remember(tenant, head, touched)
            self._heads[tenant] += 1
            if not touched:
                self._park_run(heap, tenant, standing, share)
            for name in sorted({tenant, *touched}) if touched else (tenant,):
                self._refresh(heap, name)
        return CycleResult(
            admissions=tuple(self.admissions),
            waiting=tuple(sorted(self.waiting, key=lambda w: w.job)),
            tenants=self._usage() if self.report else (),
            preemption_searches=self.searches,
            wait_reasons=self.wait_reasons,
        )

    def _wait_alike(self, tenant: str, job: Job) -> bool:
        """Park ``job`` with the reason of the job before it in its tenant's queue, when that job
        asked exactly the same and nothing was admitted or evicted since it waited.

        Same request, priority, preemptibility and claim on the guarantee, an unchanged tenant
        ledger (nothing admitted or evicted anywhere), the same placement and preemption memos
        (both only grow within a cycle) and the same search budget: deciding it would end the
        same way. The job keeps its turn in the order across tenants; only the deciding is
        skipped, so long queues of alike jobs (thousands of one-GPU jobs) cost a heap step each.
        """
        before = self._failed.get(tenant)
        if (
            before is None
            or before.version != self._admitted_version
            or self.requests[job.key] is not before.request
            or job.priority != before.priority
            or job.preemptible != before.preemptible
            or job.not_before is not None
            or job.key in self.reservations
            or (job.key in self.claims[tenant]) != before.claim
        ):
            return False
        self._wait(job, before.reason, before.message)
        return True

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

    def _remember(self, tenant: str, job: Job, touched: set[str]) -> None:
        """Keep what the job just decided ended in, if it waited without changing anything."""
        last = self._last_wait
        if (
            touched
            or last is None
            or last[0] != job.key
            or job.not_before is not None
            or job.key in self.reservations
        ):
            self._failed.pop(tenant, None)
            return
        self._failed[tenant] = _Failed(
            request=self.requests[job.key],
            priority=job.priority,
            preemptible=job.preemptible,
            claim=job.key in self.claims[tenant],
            version=self._admitted_version,
            reason=last[1],
            message=last[2],
        )

    def _decide(self, job: Job) -> set[str]:
        """Admit or park one job; returns tenants whose standing changed besides its own."""
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
        within = ledger.fits_within(job)
        failure: GangFailure | None = None
        if not ledger.within_limit(job):
            failure = GangFailure(WaitReason.QUOTA_EXCEEDED, _limit_text(tenant, ledger, job))
        elif not job.preemptible and not within:
            failure = GangFailure(
                WaitReason.GUARANTEE_EXCEEDED, _guarantee_text(tenant, ledger, job)
            )
        else:
            outcome = self._try_place(job, request, within)
            if outcome.admitted:
                return set()
            failure = outcome.failure
        assert failure is not None
        touched = self._try_preempt(job, request, failure)
        if touched is not None:
            return touched
        self._wait(job, failure.reason, failure.message)
        return set()

    def _try_place(self, job: Job, request: Request, within: bool) -> _Outcome:
        reserved = self.reservations.get(job.key, [])
        if not reserved:
            memo = self.placement_failures.get(request)
            if memo is not None:
                return _Outcome(False, memo)
        released = {key: self.pool.release(key) for key in reserved}
        result = self.pool.place_gang(job.key, request)
        for key, held in released.items():
            self.pool.restore(key, held)
        if isinstance(result, GangFailure):
            if not reserved:
                self.placement_failures[request] = result
            return _Outcome(False, result)
        self.reservations.pop(job.key, None)
        reason = AdmitReason.WITHIN_GUARANTEE if within else AdmitReason.BORROWING
        self._admit(job, result, reason, ())
        return _Outcome(True)

    # --- preemption ----------------------------------------------------------------------

    def borrowed_jobs(self, tenant: str) -> set[str]:
        """Admitted jobs of the tenant on borrowed capacity (cached until its jobs change)."""
        found = self._borrowed.get(tenant)
        if found is None:
            found = running_borrowed(self.tenants[tenant], self.admitted[tenant].values())
            self._borrowed[tenant] = found
        return found

    def candidates(
        self, job: Job, tenant: Tenant, request: Request
    ) -> tuple[list[Candidate], bool]:
        """Who may be evicted for ``job``, and whether any of them belongs to another tenant."""
        out: list[Candidate] = []
        own_borrowed = self.borrowed_jobs(tenant.name)
        if tenant.within_tenant is WithinTenantPreemption.LOWER_PRIORITY:
            for victim in self.admitted[tenant.name].values():
                if victim.priority < job.priority and may_be_victim(victim, self.now):
                    out.append(
                        Candidate(
                            victim,
                            PreemptReason.HIGHER_PRIORITY,
                            victim.key in own_borrowed,
                            gpu_seconds_lost(victim, self.now),
                        )
                    )
        cross = False
        if tenant.reclaim is not ReclaimPolicy.NEVER and job.key in self.claims[tenant.name]:
            eligible = self.pool.eligible_nodes(request).name_set
            lower_only = tenant.reclaim is ReclaimPolicy.LOWER_PRIORITY
            for name in self.tenants:
                if name == tenant.name or self.ledgers[name].borrowed() <= 0:
                    continue
                borrowed = self.borrowed_jobs(name)
                claimed = self.claims[name]
                admitted = self.admitted[name]
                for key in borrowed:
                    if key in claimed:
                        continue
                    victim = admitted[key]
                    if lower_only and victim.priority >= job.priority:
                        continue
                    # Another tenant's job helps only if it frees GPUs the job may use.
                    if not any(a.node in eligible for a in victim.placement):
                        continue
                    if may_be_victim(victim, self.now, reclaim=True):
                        cross = True
                        out.append(
                            Candidate(
                                victim,
                                PreemptReason.RECLAIM_GUARANTEE,
                                True,
                                gpu_seconds_lost(victim, self.now),
                            )
                        )
        return out, cross

    def _try_preempt(self, job: Job, request: Request, failure: GangFailure) -> set[str] | None:
        if failure.reason not in (
            WaitReason.WAITING_FOR_CAPACITY,
            WaitReason.TOPOLOGY_UNSATISFIABLE,
            WaitReason.QUOTA_EXCEEDED,
            WaitReason.GUARANTEE_EXCEEDED,
        ):
            return None
        assert job.tenant is not None
        tenant = self.tenants[job.tenant]
        ledger = self.ledgers[tenant.name]
        memo = (
            tenant.name,
            request,
            job.priority,
            job.preemptible,
            job.key in self.claims[tenant.name],
        )
        if memo in self.preemption_failures:
            return None
        if self.searches >= self.snapshot.config.max_preemption_searches:
            return None
        # Who may be evicted changes only when a job is admitted or evicted.
        if (memo, self._admitted_version) in self.no_candidates:
            return None
        candidates, _ = self.candidates(job, tenant, request)
        if not candidates:
            self.no_candidates.add((memo, self._admitted_version))
            return None
        self.searches += 1

        def quota_ok(own: Sequence[Job], cross: bool) -> bool:
            if not ledger.within_limit(job, own):
                return False
            if cross or not job.preemptible:
                return ledger.fits_within(job, own)
            return True

        found = find_victims(self.pool, job, request, candidates, quota_ok)
        if not isinstance(found, VictimSearch):
            self.preemption_failures.add(memo)
            return None
        own_jobs = [c.job for c in found.victims if c.reason is PreemptReason.HIGHER_PRIORITY]
        within = ledger.fits_within(job, own_jobs)
        touched: set[str] = set()
        preemptions = []
        for c in found.victims:
            victim = c.job
            assert victim.tenant is not None
            touched.add(victim.tenant)
            self.ledgers[victim.tenant].remove(victim)
            del self.admitted[victim.tenant][victim.key]
            self._admitted_version += 1
            self._borrowed.pop(victim.tenant, None)
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
    ) -> None:
        assert job.tenant is not None
        placement = tuple(
            Assignment(p.node, p.gpus) if not p.count_only else Assignment(p.node, (), len(p.gpus))
            for p in plans
        )
        admitted = replace(job, state=JobState.ADMITTED, placement=placement, started_at=None)
        self.admitted[job.tenant][job.key] = admitted
        self._admitted_version += 1
        self.ledgers[job.tenant].add(admitted)
        self._borrowed.pop(job.tenant, None)
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
        self.admissions.append(Admission(job.key, job.tenant, reason, text, tuple(plans), victims))

    def _wait(self, job: Job, reason: WaitReason, message: str) -> None:
        self._last_wait = (job.key, reason, message)
        self.wait_reasons[job.key] = reason
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
        out = []
        for name, tenant in self.tenants.items():
            ledger = self.ledgers[name]
            by_model: dict[str, int] = {}
            for job in self.admitted[name].values():
                for assignment in job.placement:
                    slot = self.pool.slots.get(assignment.node)
                    model = (slot.node.model if slot else None) or UNKNOWN_MODEL
                    by_model[model] = by_model.get(model, 0) + assignment.size
            pending = sum(1 for j in self.queued[name] if j.key not in admitted_now)
            out.append(
                TenantUsage(
                    name=name,
                    guaranteed=tenant.guaranteed,
                    borrowing_limit=tenant.borrowing_limit,
                    weight=tenant.weight,
                    used=ledger.used,
                    borrowed=ledger.borrowed(),
                    used_by_model=dict(sorted(by_model.items())),
                    fair_share=shares.get(name, 0.0),
                    pending=pending,
                    running=sum(
                        1 for j in self.admitted[name].values() if j.started_at is not None
                    ),
                    demand=self.demand[name],
                    admitted=len(self.admitted[name]),
                )
            )
        return tuple(out)


def _no_tenant_text(job: Job) -> str:
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


def _preemption_text(job: Job, c: Candidate, tenant: Tenant) -> str:
    hours = c.lost / 3600
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
