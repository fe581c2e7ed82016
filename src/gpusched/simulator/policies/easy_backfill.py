"""EASY backfill with oracle run times: the Slurm-like baseline for large jobs.

Best fit (``packing.py``) backfills without reservations, so a large job at the head of the queue
waits until small jobs happen to leave a node empty: it can starve. EASY backfill (Lifka 1995,
Slurm's ``sched/backfill``) fixes that with one reservation. This policy is EASY in its classic
form, with the *oracle* run times that make it the best case of the method (real clusters only
have user estimates or predictions, as gpusched has), so the comparison with gpusched's
predicted reservations is against what reservations can achieve at best.

Semantics (one pass, at every decision):

1. One FIFO queue by submission time (the engine hands arrivals in ``(submit, trace order)``);
   no tenants, quotas, priorities or preemption, like best fit.
2. Jobs start in queue order while they fit now, placed by the same :class:`Book` rules best fit
   uses (:attr:`NodeRule.BEST_FIT`: the node with the fewest free GPUs left, ties by name; GPUs:
   the lowest free indices; a gang's replicas one per pick, several may share a node).
3. The first job that does not fit gets the reservation: its *shadow time* is the earliest
   instant at which, releasing the running jobs' GPUs at their oracle ends, the job fits by the
   same per-node rule (``sum over nodes of floor(free / gpus_per_replica) >= replicas``, which is
   exactly when :meth:`Book.place_gang` succeeds); the GPUs it would take then are chosen by the
   best-fit rule on the counts free at that instant. On each node it would use, the GPUs free at
   the shadow time beyond what it needs are the *extra* GPUs.
4. Every later job may start now only if it fits now and either ends (oracle) no later than the
   shadow time, or takes on the reserved nodes only extra GPUs (then those are used up). Nodes
   the reservation does not use are free for anyone.

A job whose shape no node set of the empty cluster can hold (larger than any node, or no node of
its GPU model) gets no reservation and blocks nobody; nor does one that no finite end of a
running job would make fit (only with jobs that never end, the FGD experiment).

**Oracle run time.** A job runs, in the replay, its trace ``duration`` (the run time on a
well-wired set) times the speed model's slowdown of the placement it gets: ``speed(link, gpus) /
speed(measured_on, gpus)`` (1.0 for one GPU), ``link`` the worst link of its GPUs
(:func:`gpusched.simulator.engine.worst_link`). This policy computes exactly that, with the same
expression the engine uses, so its ends are the replay's to the bit when both use the same speed
model: :data:`gpusched.simulator.speed.DEFAULT`, which ``gpusched simulate`` uses unless
``--speed-model none`` (the registry cannot pass the replay's model to a policy; under ``none``
or on openb, where the engine charges no slowdown, the oracle still holds for every 1-GPU job and
for jobs placed on the link they were measured on, and is off by the speed factor otherwise).
A job that runs past its oracle end is expected to end at once; one that ends before it frees
its GPUs then, and the next decision plans from there.

With exact ends the reservation never moves: every job that got an expected start (the head's
shadow time, told once in :attr:`Decisions.estimates`) starts exactly then.

**Cost.** A pass decides the whole queue only when GPUs were freed (or the shadow time was
reached); between completions only new arrivals are looked at, against the standing reservation
(GPUs only got fewer and the clock later, so every job that waited still waits). Within a pass a
shape (replicas, GPUs per replica, model) that does not fit now is not tried again, nor, among
jobs that would end after the shadow time, one that does not fit in the extra GPUs.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpusched.simulator.model import Link, SimNode, TraceJob
from gpusched.simulator.policies.base import Decisions, Placed, Start
from gpusched.simulator.policies.book import Book, GpuRule, NodeRule
from gpusched.simulator.speed import DEFAULT as DEFAULT_SPEED

#: Slowdown of a job on a set whose worst link is ``link`` (``gpus`` GPUs in all): the engine's
#: :data:`gpusched.simulator.engine.SpeedModel`, spelled here so this module does not import the
#: engine at load time (the engine imports the policies package).
SpeedFn = Callable[[Link, int], float]
#: A gang's shape: what decides whether it fits (replicas, GPUs per replica, GPU model).
Shape = tuple[int, int, str | None]

ASSUMPTIONS: Final = (
    "one FIFO queue by submission; whole jobs (gangs); no quotas, tenants, priorities or "
    "preemption",
    "EASY backfill: the first job that does not fit is reserved the earliest time enough GPUs "
    "of its shape come free (shadow time); later jobs start only if they fit now and end by then "
    "or use only GPUs the reservation leaves spare",
    "run times: ORACLE, the trace's duration times the speed model's slowdown on the placement "
    "it gets (what the replay charges); gpusched has only predictions",
    "node choice: best fit by free GPU count; GPUs: the lowest free indices (as best-fit)",
)


@dataclass
class Reservation:
    """The head job's reservation: when and where it is expected to start."""

    job: str
    shadow: float
    """The earliest time enough GPUs of its shape come free (oracle ends)."""
    gpus: dict[str, int]
    """GPUs it would take on each node at the shadow time."""
    extra: dict[str, int] = field(default_factory=dict)
    """Per reserved node: GPUs a job ending after the shadow time may still take now (free at
    the shadow time beyond what the reservation needs). Nodes not listed are not reserved."""


@dataclass(frozen=True, slots=True)
class _Running:
    end: float
    """Oracle end."""
    placed: tuple[Placed, ...]
    key: tuple[float, int, str]
    """Its entry in the policy's list of ends."""


#: Why a job waited, as stored per job (formatted only when asked): (what, head job, shadow).
Wait = tuple[str, str, float]
_NO_FIT: Final = "no-fit"
_RESERVED: Final = "reserved"
_DELAYS: Final = "delays"
_NO_FIT_WAIT: Final[Wait] = (_NO_FIT, "", 0.0)


class EasyBackfillPolicy:
    """EASY backfill over a best-fit :class:`Book`, with oracle run times."""

    name: str = "easy-backfill"
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def __init__(
        self,
        nodes: Sequence[SimNode],
        seed: int = 0,
        *,
        speed: SpeedFn | None = DEFAULT_SPEED.slowdown,
    ) -> None:
        # Imported here: the engine imports this package (policies.base) at load time.
        from gpusched.simulator.engine import worst_link

        self._worst_link = worst_link
        self.speed = speed
        """The speed model the oracle assumes the replay uses (None: no slowdown)."""
        self.book = Book(nodes, NodeRule.BEST_FIT, GpuRule.LOWEST, seed)
        self.nodes = {n.name: n for n in nodes}
        self.capacity = {name: len(slot.free) for name, slot in self.book.slots.items()}
        """Placeable GPUs per node (the empty cluster)."""
        self.queue: dict[str, TraceJob] = {}
        """Waiting jobs in submission order (dicts keep insertion order)."""
        self.new: list[str] = []
        self.freed = False
        self.running: dict[str, _Running] = {}
        self.ends: list[tuple[float, int, str]] = []
        """(oracle end, sequence, job) of running jobs, ascending."""
        self.seq = 0
        self.reservation: Reservation | None = None
        self.told: set[str] = set()
        self.waits: dict[str, Wait] = {}
        """Why each waiting job waited in the last pass that looked at it."""
        self._possible: dict[Shape, bool] = {}

    # --- events ----------------------------------------------------------------------------

    def submit(self, job: TraceJob, now: float) -> None:
        self.queue[job.id] = job
        self.new.append(job.id)

    def finished(self, job: str, now: float) -> None:
        done = self.running.pop(job)
        for placed in done.placed:
            self.book.give_back(placed)
        del self.ends[bisect_left(self.ends, done.key)]
        self.freed = True

    # --- oracle ----------------------------------------------------------------------------

    def oracle_end(self, job: TraceJob, placed: tuple[Placed, ...], now: float) -> float:
        """When the replay will end ``job`` started now on ``placed`` (the engine's expression,
        so the float is the same)."""
        if not math.isfinite(job.duration):
            return math.inf
        if self.speed is None or job.gpus <= 1:
            slowdown = 1.0
        else:
            factor = self.speed(self._worst_link(self.nodes, placed), job.gpus)
            measured = self.speed(job.measured_on, job.gpus) if job.measured_on else 1.0
            slowdown = factor / measured
        return now + job.duration * slowdown

    def _earliest_end(self, job: TraceJob, now: float) -> float:
        """A lower bound of :meth:`oracle_end` over every placement (the best link)."""
        if not math.isfinite(job.duration):
            return math.inf
        if self.speed is None or job.gpus <= 1:
            return now + job.duration
        measured = self.speed(job.measured_on, job.gpus) if job.measured_on else 1.0
        return now + job.duration * (self.speed(Link.NVLINK, job.gpus) / measured)

    # --- the pass --------------------------------------------------------------------------

    def schedule(self, now: float) -> Decisions:
        res = self.reservation
        full = self.freed or res is None or now >= res.shadow
        order = list(self.queue) if full else self.new
        self.new = []
        self.freed = False
        if full:
            res = None
        starts: list[Start] = []
        estimates: list[tuple[str, float]] = []
        no_fit: set[Shape] = set()
        no_extra: set[Shape] = set()
        unreservable: set[Shape] = set()
        for job_id in order:
            job = self.queue.get(job_id)
            if job is None:
                continue
            shape = (job.replicas, job.gpus_per_replica, job.gpu_model)
            if shape in no_fit:
                self.waits[job_id] = _NO_FIT_WAIT
                continue
            if res is not None and shape in no_extra and self._earliest_end(job, now) > res.shadow:
                # Its shape fits only where the reservation needs the GPUs, and on no set does
                # it end by the shadow time: no need to place it.
                self.waits[job_id] = (_DELAYS, res.job, res.shadow)
                continue
            placed = self.book.place_gang(job)
            if placed is None:
                no_fit.add(shape)
                if res is None and shape not in unreservable:
                    res = self._reserve(job, now)
                    if res is not None:
                        self.waits[job_id] = (_RESERVED, job_id, res.shadow)
                        if job_id not in self.told:
                            self.told.add(job_id)
                            estimates.append((job_id, res.shadow))
                        continue
                    unreservable.add(shape)
                self.waits[job_id] = _NO_FIT_WAIT
                continue
            if res is not None:
                end = self.oracle_end(job, placed, now)
                if end > res.shadow:
                    inside = self._place_within(job, res.extra)
                    if inside is None:
                        no_extra.add(shape)
                        self.waits[job_id] = (_DELAYS, res.job, res.shadow)
                        continue
                    placed = inside
                    for p in placed:
                        if p.node in res.extra:
                            res.extra[p.node] -= len(p.gpus)
            self._start(job, placed, now)
            starts.append(Start(job_id, placed))
        self.reservation = res
        wake = res.shadow if res is not None and now < res.shadow < math.inf else None
        return Decisions(starts=tuple(starts), estimates=tuple(estimates), wake_at=wake)

    def _start(self, job: TraceJob, placed: tuple[Placed, ...], now: float) -> None:
        for p in placed:
            self.book.take(p)
        del self.queue[job.id]
        self.seq += 1
        key = (self.oracle_end(job, placed, now), self.seq, job.id)
        insort(self.ends, key)
        self.running[job.id] = _Running(key[0], placed, key)

    def _place_within(self, job: TraceJob, extra: dict[str, int]) -> tuple[Placed, ...] | None:
        """``job`` placed by the book's rules on the GPUs free now, taking on reserved nodes at
        most their extra GPUs (the rest counted as taken), or None."""
        k = job.gpus_per_replica
        taken = {
            name: max(0, len(self.book.slots[name].free) - spare) for name, spare in extra.items()
        }
        chosen: dict[str, list[int]] = {}
        out: list[Placed] = []
        for _ in range(job.replicas):
            slots = self.book.candidates(job, k, taken)
            if not slots:
                return None
            slot = self.book.pick_node(slots, taken)
            name = slot.node.name
            gpus = self.book.pick_gpus(slot, k, chosen.get(name, ()))
            taken[name] = taken.get(name, 0) + k
            chosen.setdefault(name, []).extend(gpus)
            out.append(Placed(name, gpus))
        return tuple(out)

    def possible(self, job: TraceJob) -> bool:
        """Whether the empty cluster could hold ``job`` at all (per node, by the book's rule)."""
        shape = (job.replicas, job.gpus_per_replica, job.gpu_model)
        found = self._possible.get(shape)
        if found is None:
            k = job.gpus_per_replica
            found = (
                sum(
                    self.capacity[name] // k
                    for name, slot in self.book.slots.items()
                    if self.book.fits(slot.node, job)
                )
                >= job.replicas
            )
            self._possible[shape] = found
        return found

    def _reserve(self, job: TraceJob, now: float) -> Reservation | None:
        """The reservation of ``job``, which does not fit now: its shadow time and the GPUs per
        node it would take then; None when no finite end of a running job makes it fit."""
        if not self.possible(job):
            return None
        k, need = job.gpus_per_replica, job.replicas
        free = {
            name: len(slot.free)
            for name, slot in self.book.slots.items()
            if self.book.fits(slot.node, job)
        }
        fit = sum(f // k for f in free.values())
        shadow = now
        ends = self.ends
        i = 0
        while fit < need:
            if i >= len(ends) or not math.isfinite(ends[i][0]):
                return None
            # A job past its oracle end is expected to end at once.
            shadow = max(ends[i][0], now)
            while i < len(ends) and ends[i][0] <= shadow:
                for p in self.running[ends[i][2]].placed:
                    before = free.get(p.node)
                    if before is not None:
                        after = before + len(p.gpus)
                        free[p.node] = after
                        fit += after // k - before // k
                i += 1
        # Where it would go then: the best-fit rule on the counts free at the shadow time.
        gpus: dict[str, int] = {}
        for _ in range(need):
            best: str | None = None
            best_left = 0
            for name, count in free.items():
                left = count - gpus.get(name, 0)
                if left >= k and (best is None or left < best_left):
                    best, best_left = name, left
            assert best is not None  # fit >= need
            gpus[best] = gpus.get(best, 0) + k
        extra = {name: free[name] - taken for name, taken in gpus.items()}
        return Reservation(job.id, shadow, gpus, extra)

    # --- reasons ---------------------------------------------------------------------------

    def reason(self, job: str) -> str | None:
        found = self.queue.get(job)
        if found is None:
            return None
        why = self.waits.get(job, _NO_FIT_WAIT)
        return _format(why, found.replicas, found.gpus_per_replica)

    def last_wait(self, job: str) -> str | None:
        # Asked just after its start; the job is running then.
        why = self.waits.pop(job, None)
        if why is None:
            return None
        running = self.running.get(job)
        if running is None:
            return None
        return _format(why, len(running.placed), len(running.placed[0].gpus))


def _format(why: Wait, replicas: int, gpus: int) -> str:
    """The reason a job of ``replicas`` x ``gpus`` waited, in words."""
    if why[0] == _RESERVED:
        return (
            f"reserved (first in the queue that does not fit): its GPUs are expected free at "
            f"{why[2]:.0f} s (EASY shadow time)"
        )
    if why[0] == _DELAYS:
        return (
            f"would delay {why[1]}'s reservation at {why[2]:.0f} s: ends after it, and the GPUs "
            "that reservation leaves spare are too few"
        )
    return f"no node with {gpus} free GPUs for each of {replicas} replicas"
