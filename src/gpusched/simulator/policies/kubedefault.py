"""Default Kubernetes: the Job controller, namespace ResourceQuotas, kube-scheduler and NVIDIA's
device plugin, with nothing that knows about gangs or wiring.

* Each replica is a pod. The Job controller creates a job's pods while the namespace's
  ResourceQuota (``requests.nvidia.com/gpu`` = the tenant's guarantee, a hard cap: nothing is
  borrowed) has room; a pod counts against the quota from creation, pending or not. Each Job is
  synced on its own and a refused creation is retried, so a small job is not held behind a large
  one of its tenant: any pod that fits the room left is created, oldest job first. Priority
  plays no part here: the Job controller creates pods as jobs come and knows no PriorityClass;
  only kube-scheduler's queue orders by it. Real controllers retry with backoff (up to
  minutes); this creates at the first instant it fits, which favours the baseline.
* kube-scheduler takes created pods by priority, then creation time, and binds each on its own to
  the node with the most free GPUs (LeastAllocated, ties at random). A pod that does not fit
  waits until GPUs are freed; pods of other jobs behind it go on (no head-of-line blocking).
* A multi-pod job runs once all its pods are bound; bound pods hold their GPUs meanwhile (the
  partial-gang waste gang schedulers exist to avoid), and two half-bound jobs can hold each other
  off forever.
* On the node, the device plugin's best-effort policy picks the GPUs (kubelet's own choice where
  the plugin's padding bug would fail the request).
* One PriorityClass for all: priority orders the queue; nothing is preempted.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence

from gpusched.core.admission import Tenant
from gpusched.simulator.model import JobSpec, SimNode
from gpusched.simulator.policies.base import Decisions, Placed, Start
from gpusched.simulator.policies.book import Book, GpuRule, NodeRule

ASSUMPTIONS = (
    "one pod per replica, created while the namespace ResourceQuota (= the tenant's guarantee, "
    "a hard cap) has room; pending pods count against it; any pod that fits the room is created, "
    "oldest job first (the Job controller's retries, without their backoff)",
    "kube-scheduler binds pods one at a time, priority then creation order, to the node with "
    "the most free GPUs (LeastAllocated; ties at random); no gangs: partly bound jobs hold GPUs",
    "GPUs inside the node: NVIDIA device plugin best-effort policy",
    "one PriorityClass: no preemption",
)


#: A replica not yet created: (submission, trace order, job, replica), the Job controller's order.
Uncreated = tuple[float, int, str, int]
#: A created pod in kube-scheduler's queue: (-priority, submission, trace order, job, replica).
Queued = tuple[int, float, int, str, int]

_QUOTA = "ResourceQuota: the tenant's hard limit is used by created pods"
_NODES = "a pod finds no node with room"


class KubeDefaultPolicy:
    """Per-pod scheduling under hard namespace quotas."""

    name: str = "kube-default"
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def __init__(self, nodes: Sequence[SimNode], tenants: Sequence[Tenant], seed: int = 0) -> None:
        self.book = Book(nodes, NodeRule.SPREAD, GpuRule.DEVICE_PLUGIN, seed)
        self.quota = {t.name: t.guaranteed for t in tenants}
        self.charged: dict[str, int] = {t.name: 0 for t in tenants}
        self.uncreated: dict[str, list[Uncreated]] = {}
        """Per tenant: replicas not yet created (heap by submission, trace order)."""
        self.pending: list[Queued] = []
        """Created pods not yet bound (kube-scheduler's queue)."""
        self.jobs: dict[str, JobSpec] = {}
        self.bound: dict[str, list[Placed]] = {}
        self.order: dict[str, int] = {}
        self.freed = False
        self.fresh: list[Queued] = []
        self.sizes: dict[str, Counter[int]] = {}
        """Per tenant: GPUs per replica of the pods not yet created (the smallest decides
        whether the room left can take any)."""
        self.waits: dict[str, str] = {}
        """Why each job's pods last waited (quota or nodes)."""

    def submit(self, job: JobSpec, now: float) -> None:
        self.jobs[job.id] = job
        seq = self.order.setdefault(job.id, len(self.order))
        queue = self.uncreated.setdefault(job.tenant, [])
        for replica in range(job.replicas):
            heapq.heappush(queue, (job.submit, seq, job.id, replica))
        self.sizes.setdefault(job.tenant, Counter())[job.gpus_per_replica] += job.replicas

    def finished(self, job: str, now: float) -> None:
        found = self.jobs.pop(job)
        for placed in self.bound.pop(job):
            self.book.give_back(placed)
        self.charged[found.tenant] -= found.gpus
        self.freed = True

    def _create(self) -> None:
        for tenant, queue in self.uncreated.items():
            room = self.quota.get(tenant, 0) - self.charged.get(tenant, 0)
            sizes = self.sizes.get(tenant, Counter())
            if not queue or room < min(k for k, n in sizes.items() if n > 0):
                continue
            kept: list[Uncreated] = []
            while queue and room >= min(k for k, n in sizes.items() if n > 0):
                pod = heapq.heappop(queue)
                job = self.jobs[pod[2]]
                k = job.gpus_per_replica
                if k > room:
                    kept.append(pod)
                    self.waits[job.id] = _QUOTA
                    continue
                room -= k
                sizes[k] -= 1
                self.charged[tenant] = self.charged.get(tenant, 0) + k
                self.fresh.append((-job.priority, *pod))
            for pod in kept:
                heapq.heappush(queue, pod)

    def schedule(self, now: float) -> Decisions:
        self._create()
        if self.freed:
            candidates = [*self.pending, *self.fresh]
            self.pending = []
        else:
            candidates = self.fresh
        self.fresh = []
        self.freed = False
        candidates.sort()
        starts: list[Start] = []
        failed: set[tuple[int, str | None]] = set()
        for pod in candidates:
            job = self.jobs[pod[3]]
            shape = (job.gpus_per_replica, job.gpu_model)
            placed = None if shape in failed else self._bind(job)
            if placed is None:
                failed.add(shape)
                self.pending.append(pod)
                self.waits[job.id] = _NODES
                continue
            self.book.take(placed)
            self.bound.setdefault(job.id, []).append(placed)
            starts.append(Start(job.id, (placed,)))
        return Decisions(starts=tuple(starts))

    def _bind(self, job: JobSpec) -> Placed | None:
        k = job.gpus_per_replica
        slots = self.book.candidates(job, k, {})
        if not slots:
            return None
        slot = self.book.pick_node(slots, {})
        return Placed(slot.node.name, self.book.pick_gpus(slot, k))

    def last_wait(self, job: str) -> str | None:
        return self.waits.pop(job, None)

    def reason(self, job: str) -> str | None:
        found = self.jobs.get(job)
        if found is None:
            return None
        bound = len(self.bound.get(job, ()))
        if any(p[2] == job for q in self.uncreated.values() for p in q):
            return (
                f"ResourceQuota: tenant {found.tenant}'s hard limit "
                f"{self.quota.get(found.tenant, 0)} GPUs is used by created pods"
            )
        if bound:
            return f"{bound} of {found.replicas} pods bound; the rest find no node with room"
        return f"no node with {found.gpus_per_replica} free GPUs"
