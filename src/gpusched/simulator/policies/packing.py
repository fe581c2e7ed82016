"""Gang schedulers that only count GPUs: best fit (packing), first fit and random.

Each admits whole jobs in submission order with backfill (a job that does not fit does not block
later ones), with no quotas and no preemption; they differ only in the node they pick. They are
the placement baselines of the FGD experiment on openb, and best fit is the "packing" policy of
the Philly comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.simulator.model import JobSpec, SimNode
from gpusched.simulator.policies.base import Decisions, Placed, Start
from gpusched.simulator.policies.book import Book, GpuRule, NodeRule


class PackingPolicy:
    """FIFO with backfill over a count-based :class:`Book`."""

    def __init__(self, nodes: Sequence[SimNode], rule: NodeRule, seed: int = 0) -> None:
        self.name: str = rule.value
        self.assumptions: tuple[str, ...] = (
            f"node choice: {rule.value} by free GPU count; GPUs: the lowest free indices "
            "(the wiring is not looked at)",
            "whole jobs (gangs) in submission order with backfill; no quotas, no priorities, "
            "no preemption",
        )
        self.book = Book(nodes, rule, GpuRule.LOWEST, seed)
        self.queue: dict[str, JobSpec] = {}
        self.new: list[str] = []
        self.freed = False
        self.running: dict[str, tuple[Placed, ...]] = {}

    def submit(self, job: JobSpec, now: float) -> None:
        self.queue[job.id] = job
        self.new.append(job.id)

    def finished(self, job: str, now: float) -> None:
        for placed in self.running.pop(job):
            self.book.give_back(placed)
        self.freed = True

    def schedule(self, now: float) -> Decisions:
        # Nothing freed since the last pass: jobs that did not fit then do not fit now, only
        # the new arrivals need a look (same decisions as a full pass, without its cost).
        order = list(self.queue) if self.freed else self.new
        self.freed = False
        self.new = []
        starts: list[Start] = []
        failed: set[tuple[int, int, str | None]] = set()
        for job_id in order:
            job = self.queue.get(job_id)
            if job is None:
                continue
            shape = (job.replicas, job.gpus_per_replica, job.gpu_model)
            if shape in failed:
                continue
            placed = self.book.place_gang(job)
            if placed is None:
                failed.add(shape)
                continue
            for p in placed:
                self.book.take(p)
            del self.queue[job_id]
            self.running[job_id] = placed
            starts.append(Start(job_id, placed))
        return Decisions(starts=tuple(starts))

    def reason(self, job: str) -> str | None:
        found = self.queue.get(job)
        if found is None:
            return None
        return _why(found)

    def last_wait(self, job: str) -> str | None:
        # It waits for one reason only, asked just after its start (its replicas record it).
        placed = self.running.get(job)
        if placed is None:
            return None
        return f"no node with {len(placed[0].gpus)} free GPUs for each of {len(placed)} replicas"


def _why(job: JobSpec) -> str:
    return f"no node with {job.gpus_per_replica} free GPUs for each of {job.replicas} replicas"
