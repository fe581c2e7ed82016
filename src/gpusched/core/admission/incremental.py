"""Cycles one after another over snapshots that mostly agree, keeping what they share.

A cycle starts by building the pool of free GPUs from every node and every running job, and the
pool's memos (which nodes each kind of request may use, what an idle cluster could offer it,
how many replicas a node in a given state can take) start empty. From one cycle to the next
almost all of it stays the same: a few jobs started, ended or were evicted. :class:`Cycles`
keeps the pool from the last cycle, undoes what that cycle did to it (recorded as it went), and
rebuilds only the nodes whose holders changed since, each exactly as a new pool would build
it, so every decision is the one a cycle from scratch makes (a property test runs both side by
side on generated histories). A change to the nodes themselves (topology, health, labels,
pods outside GpuJobs) or to the network levels starts over with a new pool, and so does a cycle
after the pool's memos have grown past :data:`MAX_MEMO_ENTRIES`.

The snapshot's job and node objects are compared by identity first (the operator's store and
the simulator hand the same object for what did not change), then by placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpusched.core.admission.cycle import Cycle, holders
from gpusched.core.admission.model import Assignment, Job, Node, Snapshot
from gpusched.core.admission.pool import Pool

#: Memo answers a kept pool may hold before the next cycle starts over with a new pool: the
#: memos grow with every kind of request seen (replicas a node can take, per request and node),
#: and an operator runs for months.
MAX_MEMO_ENTRIES: Final = 200_000


class Cycles:
    """Runs cycles on a kept pool. A :class:`Cycle` it returns is good until the next call
    of :meth:`cycle` (which takes its pool back).

    ``arrivals_within``: when the last cycle changed nothing and the snapshot differs from its
    own only by jobs that arrived at most this many seconds later, those jobs are decided on top
    of that cycle (:meth:`Cycle.decide_arrivals`), as of its time, instead of deciding the whole
    queue again; 0 (the default): only within the same instant, where it is exact."""

    def __init__(self, arrivals_within: float = 0.0) -> None:
        self.arrivals_within = arrivals_within
        self._last: Cycle | None = None
        """The last cycle returned, while it may still take arrivals."""
        self._last_jobs: dict[str, Job] = {}
        """Its snapshot's jobs by key."""
        self.extended = 0
        """Cycles that were the last one with arrivals decided on top."""
        self._pool: Pool | None = None
        self._nodes: tuple[Node, ...] = ()
        self._shape: tuple[object, ...] = ()
        self._held: dict[str, tuple[Assignment, ...]] = {}
        """Key -> placement of every job the kept pool holds GPUs for."""
        self._on_node: dict[str, set[str]] = {}
        """Node -> keys of the jobs holding GPUs on it."""
        self.rebuilt_nodes = 0
        """Nodes rebuilt by the last :meth:`cycle` (all of them when it started over)."""

    def cycle(self, snapshot: Snapshot, *, whole: bool = False) -> Cycle:
        """A cycle over ``snapshot`` whose pool is the last one's, brought up to date; or the
        last cycle with the jobs that arrived since decided on top of it, when exact (not with
        ``whole``: a cycle whose order a forecast will play)."""
        last, self._last = self._last, None
        if last is not None and not whole:
            arrivals = self._arrivals(last, snapshot)
            if arrivals is not None and last.decide_arrivals(snapshot, arrivals):
                self._last = last
                self._last_jobs.update((j.key, j) for j in arrivals)
                self.extended += 1
                self.rebuilt_nodes = 0
                return last
        jobs = sorted(snapshot.jobs, key=lambda j: j.key)
        previous = last.waiting_entries() if last is not None else None
        cycle = Cycle(
            snapshot, pool=self._pool_for(snapshot, holders(jobs)), jobs=jobs, previous=previous
        )
        self._last = cycle
        self._last_jobs = {j.key: j for j in jobs}
        return cycle

    def _arrivals(self, last: Cycle, snapshot: Snapshot) -> list[Job] | None:
        """The jobs ``snapshot`` adds to the last cycle's, if it adds nothing else."""
        before = last.snapshot
        if (
            not last.unchanged_by_run()
            or not before.now <= snapshot.now <= before.now + self.arrivals_within
            or (last.wake_at is not None and snapshot.now >= last.wake_at)
            or snapshot.config != before.config
            or snapshot.tenants != before.tenants
            or snapshot.levels != before.levels
            or snapshot.down_labels != before.down_labels
            or snapshot.arrivals
            or before.arrivals
            or not _same_nodes(snapshot.nodes, before.nodes)
            or len(snapshot.jobs) < len(self._last_jobs)
        ):
            return None
        known = self._last_jobs
        arrivals: list[Job] = []
        for job in snapshot.jobs:
            found = known.get(job.key)
            if found is None:
                arrivals.append(job)
            elif found is not job and found != job:
                return None
        if len(snapshot.jobs) - len(arrivals) != len(known):
            return None
        return arrivals

    def _pool_for(self, snapshot: Snapshot, holding: Sequence[Job]) -> Pool:
        pool = self._pool
        if pool is not None:
            pool.rollback()
        shape = (snapshot.levels, snapshot.down_labels)
        if (
            pool is None
            or shape != self._shape
            or not _same_nodes(snapshot.nodes, self._nodes)
            or pool.memo_entries() > MAX_MEMO_ENTRIES
        ):
            pool = Pool(
                snapshot.nodes,
                [(j.key, a) for j in holding for a in j.placement],
                snapshot.levels,
                snapshot.down_labels,
            )
            self._pool = pool
            self._nodes = tuple(snapshot.nodes)
            self._shape = shape
            self._held = {j.key: j.placement for j in holding}
            self._on_node = {}
            for job in holding:
                for assignment in job.placement:
                    self._on_node.setdefault(assignment.node, set()).add(job.key)
            self.rebuilt_nodes = len(pool.slots)
        else:
            self._catch_up(pool, holding)
        pool.begin()
        return pool

    def _catch_up(self, pool: Pool, holding: Sequence[Job]) -> None:
        """Rebuild the nodes whose holders changed since the pool was last brought up to
        date."""
        held = self._held
        now = {j.key: j for j in holding}
        dirty: set[str] = set()
        for key, placement in list(held.items()):
            job = now.get(key)
            if job is None or job.placement != placement:
                for assignment in placement:
                    dirty.add(assignment.node)
                    self._on_node[assignment.node].discard(key)
                del held[key]
        for key, job in now.items():
            if key not in held:
                held[key] = job.placement
                for assignment in job.placement:
                    dirty.add(assignment.node)
                    self._on_node.setdefault(assignment.node, set()).add(key)
        refill: dict[str, list[tuple[str, Assignment]]] = {}
        for node in dirty:
            if node not in pool.slots:
                continue
            refill[node] = [
                (key, a)
                for key in sorted(self._on_node.get(node, ()))
                for a in held[key]
                if a.node == node
            ]
        pool.refill(refill)
        self.rebuilt_nodes = len(refill)


def _same_nodes(new: Sequence[Node], old: Sequence[Node]) -> bool:
    """Whether two node lists are the same nodes in the same state (identity first)."""
    return len(new) == len(old) and all(a is b or a == b for a, b in zip(new, old, strict=True))
