"""EASY backfill with oracle run times: the Slurm-like baseline for large jobs.

Best fit (``packing.py``) backfills without reservations, so a large job at the head of the queue
waits until small jobs happen to leave a node empty: it can starve. EASY backfill (Lifka 1995;
Slurm's backfill scheduler generalises it to many reservations) fixes that with one
reservation. This policy is EASY in its classic form, with the *oracle* run times that make it
the best case of the method (real clusters only have user estimates or predictions, as gpusched
has), so gpusched's predicted reservations are compared with what reservations can do at best.

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
(:func:`gpusched.simulator.engine.worst_link`, across nodes the narrowest network level of the
cluster holding them all). This policy computes exactly that, with the same expression the
engine uses, so its ends are the replay's to the bit: the replay hands it its own cluster (with
its network levels: an NVLink clique, a leaf switch), its own speed model, or none (openb,
``--speed-model none``), and the trace's run times before the first event
(:meth:`replay_started`); jobs are submitted to it, as to every policy, without them. Until
then it assumes :data:`gpusched.simulator.speed.DEFAULT` and no network levels. A job that runs
past its oracle end is expected to end at once; one that ends before it frees its GPUs then,
and the next decision plans from there. The policy asks the engine to wake it at the shadow time
(:attr:`Decisions.wake_at`), which matters only when ends are not exact.

With exact ends the reservation never moves: every job that got an expected start (the head's
shadow time, told once in :attr:`Decisions.estimates`) starts exactly then.

**Cost.** Every decision looks at the whole queue again (the oracle end depends on the
placement, and a gang can end sooner on fewer free GPUs that force it onto one node, so a job
that had to wait may start without anything ending). Within a pass, a shape (replicas, GPUs per
replica, model) that does not fit now is not tried again, nor, among jobs that cannot end by the
shadow time on any set, one that does not fit in the extra GPUs; once the reservation is made
and no GPU is free, the pass stops. The whole Philly trace replays in about the time best fit
takes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpusched.simulator.model import Cluster, JobSpec, Link, SimNode
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


#: Why a job waited behind the reservation or held it, stored per job and formatted only when
#: asked: (what, the reserved job, its shadow time, the pass). A job with no entry of the pass
#: asked about waited because no node had room for it (most of the queue: nothing is stored).
Wait = tuple[str, str, float, int]
_NO_FIT: Final = "no-fit"
_RESERVED: Final = "reserved"
_DELAYS: Final = "delays"
_NO_FIT_WAIT: Final[Wait] = (_NO_FIT, "", 0.0, 0)


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
        cluster: Cluster | None = None,
    ) -> None:
        # Imported here: the engine imports this package (policies.base) at load time.
        from gpusched.simulator.engine import worst_link

        self._worst_link = worst_link
        self.speed = speed
        """The speed model the oracle assumes the replay uses (None: no slowdown); the replay's
        own, once it starts (:meth:`replay_started`)."""
        self.cluster = cluster
        """The cluster whose network levels decide a gang's link across nodes (None: any two
        nodes talk over the network); the replay's own, once it starts."""
        self.book = Book(nodes, NodeRule.BEST_FIT, GpuRule.LOWEST, seed)
        self.nodes = {n.name: n for n in nodes}
        self.capacity = {name: len(slot.free) for name, slot in self.book.slots.items()}
        """Placeable GPUs per node (the empty cluster)."""
        self.queue: dict[str, tuple[JobSpec, Shape, float]] = {}
        """Waiting jobs in submission order (dicts keep insertion order), with their shape and
        their shortest run time on any set (:meth:`least_run`)."""
        self.running: dict[str, _Running] = {}
        self.ends: list[tuple[float, int, str]] = []
        """(oracle end, sequence, job) of running jobs, ascending."""
        self.seq = 0
        self.reservation: Reservation | None = None
        self.told: set[str] = set()
        self.waits: dict[str, Wait] = {}
        """Why a job waited behind the reservation, or held it (see :data:`Wait`)."""
        self.passes = 0
        self._possible: dict[Shape, bool] = {}
        self.run_times: Mapping[str, float] = {}
        """The trace's run time of every job by id: the oracle, handed over by the replay
        (:meth:`replay_started`); jobs themselves are told without it."""

    # --- events ----------------------------------------------------------------------------

    def replay_started(
        self, cluster: Cluster, speed: SpeedFn | None, run_times: Mapping[str, float]
    ) -> None:
        """Take the replay's cluster, speed model and the trace's run times
        (:class:`KnowsReplay`): an oracle's run times are the replay's only if the links and the
        slowdown are the ones it charges."""
        self.cluster = cluster
        self.speed = speed
        self.run_times = run_times
        for job, shape, _ in self.queue.values():
            self.queue[job.id] = (job, shape, self.least_run(job))

    def submit(self, job: JobSpec, now: float) -> None:
        shape = (job.replicas, job.gpus_per_replica, job.gpu_model)
        self.queue[job.id] = (job, shape, self.least_run(job))

    def finished(self, job: str, now: float) -> None:
        done = self.running.pop(job)
        for placed in done.placed:
            self.book.give_back(placed)
        del self.ends[bisect_left(self.ends, done.key)]

    # --- oracle ----------------------------------------------------------------------------

    def oracle_end(self, job: JobSpec, placed: tuple[Placed, ...], now: float) -> float:
        """When the replay will end ``job`` started now on ``placed`` (the engine's expression,
        so the float is the same)."""
        duration = self.run_times[job.id]
        if not math.isfinite(duration):
            return math.inf
        if self.speed is None or job.gpus <= 1:
            slowdown = 1.0
        else:
            factor = self.speed(self._worst_link(self.nodes, placed, self.cluster), job.gpus)
            measured = self.speed(job.measured_on, job.gpus) if job.measured_on else 1.0
            slowdown = factor / measured
        return now + duration * slowdown

    def least_run(self, job: JobSpec) -> float:
        """The shortest run time ``job`` has on any set (the best link): ``now`` plus it bounds
        :meth:`oracle_end` from below without placing the job."""
        duration = self.run_times[job.id]
        if not math.isfinite(duration):
            return math.inf
        if self.speed is None or job.gpus <= 1:
            return duration
        measured = self.speed(job.measured_on, job.gpus) if job.measured_on else 1.0
        return duration * (self.speed(Link.NVLINK, job.gpus) / measured)

    # --- the pass --------------------------------------------------------------------------

    def schedule(self, now: float) -> Decisions:
        self.passes += 1
        res: Reservation | None = None
        delays: Wait = _NO_FIT_WAIT
        starts: list[Start] = []
        estimates: list[tuple[str, float]] = []
        no_fit: set[Shape] = set()
        no_extra: set[Shape] = set()
        unreservable: set[Shape] = set()
        free = sum(len(slot.free) for slot in self.book.slots.values())
        for job_id, (job, shape, least) in self.queue.items():
            if res is not None and not free:
                break  # nothing later can start; absent from ``waits``: no node had room
            if shape in no_fit:
                continue
            if res is not None and shape in no_extra and now + least > res.shadow:
                # Its shape fits only where the reservation needs the GPUs, and on no set does
                # it end by the shadow time: no need to place it.
                self.waits[job_id] = delays
                continue
            placed = self.book.place_gang(job)
            if placed is None:
                no_fit.add(shape)
                if res is None and shape not in unreservable:
                    res = self._reserve(job, now)
                    if res is None:
                        unreservable.add(shape)
                        continue
                    delays = (_DELAYS, job_id, res.shadow, self.passes)
                    self.waits[job_id] = (_RESERVED, job_id, res.shadow, self.passes)
                    if job_id not in self.told:
                        self.told.add(job_id)
                        estimates.append((job_id, res.shadow))
                continue
            if res is not None and self.oracle_end(job, placed, now) > res.shadow:
                inside = self._place_within(job, res.extra)
                if inside is None:
                    no_extra.add(shape)
                    self.waits[job_id] = delays
                    continue
                placed = inside
                for p in placed:
                    if p.node in res.extra:
                        res.extra[p.node] -= len(p.gpus)
            self._start(job, placed, now)
            free -= job.gpus
            starts.append(Start(job_id, placed))
        for start in starts:
            del self.queue[start.job]
        self.reservation = res
        wake = res.shadow if res is not None and now < res.shadow < math.inf else None
        return Decisions(starts=tuple(starts), estimates=tuple(estimates), wake_at=wake)

    def _start(self, job: JobSpec, placed: tuple[Placed, ...], now: float) -> None:
        """Take the GPUs and note the oracle end (the caller removes it from the queue)."""
        for p in placed:
            self.book.take(p)
        self.seq += 1
        key = (self.oracle_end(job, placed, now), self.seq, job.id)
        insort(self.ends, key)
        self.running[job.id] = _Running(key[0], placed, key)

    def _place_within(self, job: JobSpec, extra: dict[str, int]) -> tuple[Placed, ...] | None:
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

    def possible(self, job: JobSpec) -> bool:
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

    def _reserve(self, job: JobSpec, now: float) -> Reservation | None:
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
        job_spec = found[0]
        return _format(
            self._wait_in(job, self.passes), job_spec.replicas, job_spec.gpus_per_replica
        )

    def last_wait(self, job: str) -> str | None:
        # Asked just after the pass that started it: it waited in the pass before (every pass
        # looks at every waiting job).
        running = self.running.get(job)
        if running is None:
            return None
        why = self._wait_in(job, self.passes - 1)
        self.waits.pop(job, None)
        return _format(why, len(running.placed), len(running.placed[0].gpus))

    def _wait_in(self, job: str, when: int) -> Wait:
        """Why ``job`` waited in pass ``when``."""
        why = self.waits.get(job)
        return why if why is not None and why[3] == when else _NO_FIT_WAIT


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
