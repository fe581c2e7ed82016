"""A Kueue-like queue: ClusterQueues with nominal quotas in one cohort, borrowing, whole-gang
admission, preemption to reclaim quota, and kube-scheduler with the device plugin underneath.

* One ClusterQueue per tenant, ``nominalQuota`` = its guarantee; all in one cohort, so a queue
  may borrow what the others leave unused (up to ``borrowingLimit`` = limit - guarantee when the
  tenant has a limit).
* BestEffortFIFO: each queue's workloads by priority, then creation; a head that does not fit
  does not block the rest. Queues take turns by their heads, in the order Kueue's scheduler
  gives the heads of a cycle: a head within its queue's nominal quota before one that would
  borrow, then higher priority (PrioritySortingWithinCohort, Kueue's default), then older.
  Priority thus counts inside a queue before age, so an older low-priority workload is not
  admitted ahead of a waiting high-priority one of its queue only to be preempted by it.
* A workload is admitted when its quota fits *and* its pods fit on the nodes right now (what
  Kueue's waitForPodsReady converges to; without it, admitted pods would pend). Pods then land
  topology-blind: the node with the most free GPUs, GPUs by the device plugin.
* Preemption as Kueue configures it with ``reclaimWithinCohort: Any`` and
  ``withinClusterQueue`` from the tenant's ``withinTenant`` (``LowerPriority`` unless a TenantQuota
  says ``Never``): a workload that fits within its queue's nominal quota may evict workloads of
  queues that borrow; with ``LowerPriority`` any workload may evict lower-priority ones of its own
  queue. Candidates go lowest priority first, then most recently admitted; victims are added
  until the workload fits, then those not needed are dropped again (Kueue's minimal set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.api.tenantquota import WithinTenantPreemption
from gpusched.core.admission import Tenant
from gpusched.simulator.model import JobSpec, SimNode
from gpusched.simulator.policies.base import Decisions, Placed, Start
from gpusched.simulator.policies.book import Book, GpuRule, NodeRule

ASSUMPTIONS = (
    "one ClusterQueue per tenant, nominalQuota = guarantee, one cohort, borrowing up to the "
    "tenant's limit; BestEffortFIFO (priority, then creation) per queue; queues take turns by "
    "their heads: within nominal quota before borrowing, then priority, then creation",
    "admits a whole job when quota fits and its pods fit on nodes now; pods placed "
    "topology-blind (most free GPUs; GPUs by the NVIDIA device plugin)",
    "preemption: reclaimWithinCohort Any (only for workloads within nominal quota, victims from "
    "borrowing queues), withinClusterQueue as the tenant's withinTenant (LowerPriority unless "
    "Never); lowest priority, newest first; "
    "minimal set; preempted work is lost and the job queues again",
)


@dataclass
class _Admitted:
    job: JobSpec
    placed: tuple[Placed, ...]
    at: float
    seq: int


class KueueLikePolicy:
    """Quota-first gang admission with cohort borrowing and reclaim."""

    name: str = "kueue-like"
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def __init__(self, nodes: Sequence[SimNode], tenants: Sequence[Tenant], seed: int = 0) -> None:
        self.book = Book(nodes, NodeRule.SPREAD, GpuRule.DEVICE_PLUGIN, seed)
        self.tenants = {t.name: t for t in tenants}
        self.nominal = {t.name: t.guaranteed for t in tenants}
        self.cohort = sum(self.nominal.values())
        self.used: dict[str, int] = {t.name: 0 for t in tenants}
        self.queues: dict[str, dict[str, JobSpec]] = {t.name: {} for t in tenants}
        self.admitted: dict[str, _Admitted] = {}
        self.reasons: dict[str, str] = {}
        self.waited: dict[str, str] = {}
        """Reasons of jobs admitted this instant after waiting (until the replay asks)."""
        self.seq = 0
        self.changed = True
        self.now = 0.0

    # --- quota ---------------------------------------------------------------------------

    def _within_queue(self, tenant: str) -> bool:
        """Whether the queue's workloads may evict lower-priority ones of the same queue."""
        t = self.tenants.get(tenant)
        return t is None or t.within_tenant is not WithinTenantPreemption.NEVER

    def _limit(self, tenant: str) -> int | None:
        t = self.tenants.get(tenant)
        return None if t is None else t.borrowing_limit

    def _quota_fits(self, job: JobSpec, freed: dict[str, int] | None = None) -> bool:
        freed = freed or {}
        used = self.used.get(job.tenant, 0) - freed.get(job.tenant, 0) + job.gpus
        limit = self._limit(job.tenant)
        if limit is not None and used > limit:
            return False
        if used <= self.nominal.get(job.tenant, 0):
            return True
        # Borrowing: the cohort must have the GPUs unused by their owners.
        total = sum(self.used.values()) - sum(freed.values()) + job.gpus
        return total <= self.cohort and self.nominal.get(job.tenant, 0) >= 0

    def _borrowing(self, tenant: str, freed: dict[str, int]) -> bool:
        return self.used.get(tenant, 0) - freed.get(tenant, 0) > self.nominal.get(tenant, 0)

    # --- events --------------------------------------------------------------------------

    def submit(self, job: JobSpec, now: float) -> None:
        self.queues.setdefault(job.tenant, {})[job.id] = job
        self.changed = True

    def finished(self, job: str, now: float) -> None:
        done = self.admitted.pop(job)
        for placed in done.placed:
            self.book.give_back(placed)
        self.used[done.job.tenant] -= done.job.gpus
        self.changed = True

    def schedule(self, now: float) -> Decisions:
        if not self.changed:
            return Decisions()
        self.changed = False
        starts: list[Start] = []
        preempted: list[str] = []
        queues = {
            tenant: sorted(queue.values(), key=lambda j: (-j.priority, j.submit, j.id))
            for tenant, queue in self.queues.items()
            if queue
        }
        at = dict.fromkeys(queues, 0)
        failed: dict[tuple[str, int, int, int, str | None], str] = {}
        self.now = now
        while (job := self._next_head(queues, at)) is not None:
            at[job.tenant] += 1
            shape = (job.tenant, job.priority, job.replicas, job.gpus_per_replica, job.gpu_model)
            if shape in failed:
                self.reasons[job.id] = failed[shape]
                continue
            if job.tenant not in self.tenants:
                self.reasons[job.id] = f"no ClusterQueue for tenant {job.tenant}"
                continue
            placed = self.book.place_gang(job) if self._quota_fits(job) else None
            victims: list[_Admitted] = []
            if placed is None:
                found = self._preempt(job)
                if found is None:
                    failed[shape] = self.reasons[job.id] = self._why(job)
                    continue
                victims, placed = found
            for victim in victims:
                self._evict(victim)
                preempted.append(victim.job.id)
            for p in placed:
                self.book.take(p)
            del self.queues[job.tenant][job.id]
            self.used[job.tenant] += job.gpus
            self.seq += 1
            self.admitted[job.id] = _Admitted(job, placed, now, self.seq)
            waited = self.reasons.pop(job.id, None)
            if waited is not None:
                self.waited[job.id] = waited
            starts.append(Start(job.id, placed))
        if preempted:
            self.changed = True
        return Decisions(starts=tuple(starts), preempted=tuple(preempted))

    def _next_head(self, queues: dict[str, list[JobSpec]], at: dict[str, int]) -> JobSpec | None:
        """The next workload to try: of the heads of the queues (each queue in BestEffortFIFO
        order, priority then creation, a head tried once per pass), the one Kueue's scheduler
        takes first when it orders the ClusterQueues' heads of a cycle: one that fits within its
        queue's nominal quota before one that would borrow, then the higher priority
        (PrioritySortingWithinCohort, on by default), then the older. Whether a head borrows is
        judged on the usage as it is now, after the admissions and evictions before it."""
        best: JobSpec | None = None
        best_key: tuple[bool, int, float, str] | None = None
        for tenant, jobs in queues.items():
            i = at[tenant]
            if i >= len(jobs):
                continue
            head = jobs[i]
            borrows = self.used.get(tenant, 0) + head.gpus > self.nominal.get(tenant, 0)
            key = (borrows, -head.priority, head.submit, head.id)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def _why(self, job: JobSpec) -> str:
        if not self._quota_fits(job):
            return (
                f"quota: ClusterQueue {job.tenant} uses {self.used.get(job.tenant, 0)} of "
                f"nominal {self.nominal.get(job.tenant, 0)} and the cohort has no unused quota"
            )
        return f"quota reserved, but no nodes with room for {job.replicas} x {job.gpus_per_replica}"

    def _evict(self, victim: _Admitted) -> None:
        del self.admitted[victim.job.id]
        for p in victim.placed:
            self.book.give_back(p)
        self.used[victim.job.tenant] -= victim.job.gpus
        self.queues.setdefault(victim.job.tenant, {})[victim.job.id] = victim.job

    # --- preemption ----------------------------------------------------------------------

    def _preempt(self, job: JobSpec) -> tuple[list[_Admitted], tuple[Placed, ...]] | None:
        within_nominal = self.used.get(job.tenant, 0) + job.gpus <= self.nominal.get(job.tenant, 0)
        within_queue = self._within_queue(job.tenant)
        # Workloads admitted at this instant are not running yet: Kueue's next cycles see them.
        candidates = [
            a
            for a in self.admitted.values()
            if a.at < self.now
            and (
                (a.job.tenant == job.tenant and a.job.priority < job.priority and within_queue)
                or (
                    within_nominal
                    and a.job.tenant != job.tenant
                    and self._borrowing(a.job.tenant, {})
                )
            )
        ]
        if not candidates:
            return None
        candidates.sort(key=lambda a: (a.job.priority, -a.seq))
        chosen: list[_Admitted] = []
        for candidate in candidates:
            freed = _freed(chosen)
            if candidate.job.tenant != job.tenant and not self._borrowing(
                candidate.job.tenant, freed
            ):
                continue  # that queue no longer borrows once earlier victims leave
            chosen.append(candidate)
            if self._fits_without(job, chosen) is not None:
                break
        else:
            return None
        # Minimal set: drop victims (newest choice first) the workload does not need.
        for victim in list(reversed(chosen)):
            trial = [c for c in chosen if c is not victim]
            if trial and self._fits_without(job, trial) is not None:
                chosen = trial
        placed = self._fits_without(job, chosen)
        assert placed is not None
        return chosen, placed

    def _fits_without(self, job: JobSpec, victims: list[_Admitted]) -> tuple[Placed, ...] | None:
        if not self._quota_fits(job, _freed(victims)):
            return None
        for v in victims:
            for p in v.placed:
                self.book.give_back(p)
        try:
            return self.book.place_gang(job)
        finally:
            for v in victims:
                for p in v.placed:
                    self.book.take(p)

    def reason(self, job: str) -> str | None:
        return self.reasons.get(job)

    def last_wait(self, job: str) -> str | None:
        return self.waited.pop(job, None)


def _freed(victims: list[_Admitted]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in victims:
        out[v.job.tenant] = out.get(v.job.tenant, 0) + v.job.gpus
    return out
