"""Expected starts: the admission cycle played forward on predicted run times.

A pending job's expected start is when the cycle would start it if every job ends when its run
time predicts, jobs arrive as expected (:mod:`gpusched.core.admission.arrivals`: entries with a
floor in the future, ranked as the cycle would rank them), nobody is preempted and the admission
order stays. The cycle
admits greedily: at each moment it walks the queue in order and starts every job that fits on
the GPUs free then and under its tenant's limits, so a small job behind a blocked gang starts as
soon as GPUs for it come free. The forecast does the same (:class:`Forecast`): at now, and then
at each time some GPUs come free or a tenant's usage drops, every job whose turn can have come
is tried in the cycle's order and starts if it fits then.

Reservations are played forward too. With ``CycleConfig.reservations_per_tenant`` set, a
tenant's first job blocked by GPUs alone (within its entitlement) is planned where it fits
soonest, as the cycle reserves, and holds those GPUs from then: later jobs may use them only if
they end before it starts (single-node jobs of known run time, through the profile's gaps,
:mod:`gpusched.core.admission.profile`). A reservation the cycle already holds keeps its start.

Why not plan each job in turn where it fits without delaying those before it (conservative
backfill, what Slurm's ``squeue --start`` reports)? Because the cycle does not run that way: it
told small jobs to wait for every gang ahead of them, which the cycle then let them overtake.
On Philly the greedy play puts more expected starts within their error band (docs/benchmarks.md
"Expected starts played forward").

Cost. Jobs asking alike (tenant, submitter where the tenant caps one, request, duration class)
form a *kind*. A kind whose first job cannot start at some time cannot start before its answer
can change: the profile's earliest start for its request, or the next time its tenant's usage
drops. The profile only fills as the play goes on, so that time is a lower bound that stays
true, and the kind sleeps until then. Each moment costs the kinds whose time came, not the
queue, and a request that did not fit at that moment is not placed again then (nor for a
longer run time). Where nearly every job is a kind of its own (every tenant, shape and run time
apart) every kind of a request wakes at each time GPUs come free and all but the first fail: the
play is bounded by a number of tries (:attr:`Forecast.tries`), and the caller plans the jobs it
did not decide in turn from where it stopped. Sleeping a request's kinds together, so that one
failure puts them all back to sleep, would lift the bound's need; it is not built.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpusched.core.admission.model import Job, Tenant
from gpusched.core.admission.pool import Request
from gpusched.core.admission.profile import NEVER, Profile, Slotting, duration_class
from gpusched.core.admission.quota import Buckets, bucket_model

_Interval = tuple[float, float, int]
"""(start, end, amount) of a running, reserved or planned job."""


class Usage:
    """What a tenant level holds over the forecast's time (GPUs, or jobs for a submitter's job
    cap), asked at times that only move forward."""

    def __init__(self) -> None:
        self._running: list[tuple[float, int]] = []
        """(end, amount) of what has started by the last time asked."""
        self._upcoming: list[_Interval] = []
        """What starts later (reservations), by start."""
        self.used = 0
        self._at = -NEVER
        self.intervals: list[_Interval] = []
        """Everything added: for planning at times out of the clock's order."""

    def add(self, start: float, end: float, amount: int) -> None:
        if end <= start:
            return
        self.intervals.append((start, end, amount))
        if start <= self._at:
            if end > self._at:
                heapq.heappush(self._running, (end, amount))
                self.used += amount
            return
        heapq.heappush(self._upcoming, (start, end, amount))

    def advance(self, when: float) -> None:
        """Move the clock to ``when`` (never back)."""
        self._at = max(self._at, when)
        while self._upcoming and self._upcoming[0][0] <= self._at:
            _, end, amount = heapq.heappop(self._upcoming)
            if end > self._at:
                heapq.heappush(self._running, (end, amount))
                self.used += amount
        while self._running and self._running[0][0] <= self._at:
            self.used -= heapq.heappop(self._running)[1]

    def room(self, when: float, amount: int, cap: int) -> float | None:
        """``when`` if ``amount`` more fits under ``cap`` then; else the next time what is held
        drops, before which it cannot fit (None: it never will)."""
        self.advance(when)
        if self.used + amount <= cap:
            return when
        if amount > cap:
            return None
        if not self._running:
            return None
        return self._running[0][0]

    def next_drop(self) -> float:
        """When what is held next drops (infinity: never)."""
        return self._running[0][0] if self._running else NEVER

    def held_at(self, when: float) -> int:
        """What is held at ``when``, a time not before the clock (a reservation's start)."""
        held = sum(amount for end, amount in self._running if end > when)
        return held + sum(a for start, end, a in self._upcoming if start <= when < end)


@dataclass(frozen=True, slots=True)
class Entry:
    """A waiting job the forecast plans, in the cycle's order."""

    job: Job
    request: Request
    floor: float
    """Not before: its backoff, its tenant's budget period."""


@dataclass(slots=True)
class _Kind:
    """Jobs asking alike: while the first cannot start, none can."""

    request: Request
    runtime_class: float
    limits: tuple[tuple[Usage, int, int], ...]
    """(usage, what one job adds, cap) for each limit every job of the kind is under."""
    tenant: str
    queue: list[tuple[int, str]] = field(default_factory=list)
    """(position in the order, job key) of its jobs whose floor has passed."""
    awake: bool = False
    """Queued for a time (in the sleep heap or the moment's walk)."""
    gpu_bound: bool = False
    """Asleep because GPUs, not limits, kept its first job out."""
    never: bool = False
    version: int = 0
    """Bumped whenever it is queued anew: older sleep entries are stale."""


@dataclass(frozen=True, slots=True)
class ReservationRules:
    """How the forecast reserves (the cycle's ``CycleConfig`` and its state now)."""

    per_tenant: int
    most: int
    held: Mapping[str, Sequence[float]]
    """Per tenant, the starts of the reservations the cycle holds."""
    entitled: Callable[[str], float]
    """A tenant's entitlement (or guarantee) in GPUs; inf where reservations beyond it are
    allowed."""


def _guarantee_for(tenant: Tenant, job: Job) -> int:
    """What of the tenant's guarantee a job that runs only inside it may draw on: the whole
    guarantee, or with per-model guarantees its model's bucket and the ``any`` bucket."""
    if not tenant.guaranteed_by_model:
        return tenant.guaranteed
    buckets = Buckets.of(tenant)
    model = bucket_model(tenant, job)
    return min(tenant.guaranteed, buckets.any + (buckets.by_model.get(model, 0) if model else 0))


class Forecast:
    """Plans ``entries`` forward on ``profile`` (see the module docstring)."""

    def __init__(
        self,
        profile: Profile,
        now: float,
        tenants: Mapping[str, Tenant],
        levels: Mapping[str, tuple[str, ...]],
        reservations: ReservationRules,
    ) -> None:
        self.profile = profile
        self.now = now
        self.tenants = tenants
        self.levels = levels
        self.rules = reservations
        self.usage: dict[str, Usage] = {name: Usage() for name in tenants}
        """Per tenant and parent: GPUs held."""
        self.user_gpus: dict[tuple[str, str], Usage] = {}
        self.user_jobs: dict[tuple[str, str], Usage] = {}
        """Per (tenant or parent capping users, submitter): GPUs and jobs held."""
        self.capping: dict[str, tuple[str, ...]] = {
            name: tuple(lv for lv in levels.get(name, (name,)) if tenants[lv].caps_users)
            for name in tenants
        }
        """Per tenant: it and its parents that cap each user (the caps hold across a parent's
        teams)."""
        self.starts: dict[str, float | None] = {}
        self.tries = 0
        self.left: list[Entry] = []
        """Entries the play did not decide within its budget, in the cycle's order."""
        self._reserving: dict[str, list[float]] = {
            name: sorted(starts) for name, starts in reservations.held.items()
        }
        """Per tenant, starts of its reservations (the cycle's and the forecast's)."""
        self._freed: list[tuple[float, str]] = [
            (start, name) for name, starts in self._reserving.items() for start in starts
        ]
        """(start, tenant) of each reservation: then the tenant may reserve again."""
        heapq.heapify(self._freed)
        self._gpu_bound: dict[str, list[_Kind]] = {}
        """Per tenant, kinds asleep because GPUs kept them out (woken when it may reserve)."""
        self._sleeping: list[tuple[float, int, int, _Kind]] = []
        self._refused: dict[str, float] = {}
        """Per tenant refused a reservation for its entitlement: until when."""

    def hold(self, job: Job, start: float, end: float) -> None:
        """Count ``job`` against its tenant's limits from ``start`` to ``end``."""
        assert job.tenant is not None
        for level in self.levels[job.tenant]:
            self.usage[level].add(start, end, job.total_gpus)
        for level in self.capping[job.tenant]:
            user = (level, job.submitter)
            self.user_gpus.setdefault(user, Usage()).add(start, end, job.total_gpus)
            self.user_jobs.setdefault(user, Usage()).add(start, end, 1)

    def limits(self, job: Job) -> tuple[tuple[Usage, int, int], ...]:
        """(usage, what ``job`` adds, cap) for each limit it is under: its tenant's borrowing
        limit (its guarantee when it is not preemptible), its parents' borrowing limits, its
        submitter's GPU and job caps."""
        assert job.tenant is not None
        tenant = self.tenants[job.tenant]
        n = job.total_gpus
        out: list[tuple[Usage, int, int]] = []
        own = tenant.borrowing_limit if job.preemptible else _guarantee_for(tenant, job)
        if own is not None:
            out.append((self.usage[job.tenant], n, own))
        for level in self.levels[job.tenant][1:]:
            above = self.tenants[level].borrowing_limit
            if above is not None:
                out.append((self.usage[level], n, above))
        for level in self.capping[job.tenant]:
            capping = self.tenants[level]
            user = (level, job.submitter)
            if capping.user_max_gpus is not None:
                out.append((self.user_gpus.setdefault(user, Usage()), n, capping.user_max_gpus))
            if capping.user_max_jobs is not None:
                out.append((self.user_jobs.setdefault(user, Usage()), 1, capping.user_max_jobs))
        return tuple(out)

    def run(
        self,
        entries: Sequence[Entry],
        until: Collection[str] | None = None,
        budget: int | None = None,
    ) -> dict[str, float | None]:
        """Each entry's expected start (None: it never starts as far as the profile knows).
        With ``until``, only until those entries are decided: the others decided by then. Past
        ``budget`` tries the play stops at the moment it is in: :attr:`left` lists the
        entries it did not decide (the caller plans them in turn)."""
        kinds: dict[tuple[object, ...], _Kind] = {}
        kind_of: dict[str, _Kind] = {}
        arrivals: list[tuple[float, int, str]] = []
        by_key: dict[str, Entry] = {}
        for position, entry in enumerate(entries):
            key = entry.job.key
            by_key[key] = entry
            kind = kinds.get(k := self._kind_key(entry))
            if kind is None:
                kind = kinds[k] = self._new_kind(entry)
            kind_of[key] = kind
            heapq.heappush(arrivals, (max(self.now, entry.floor), position, key))
        tick = itertools.count()
        undecided = None if until is None else list(until)
        while arrivals or self._sleeping:
            if undecided is not None:
                while undecided and undecided[-1] in self.starts:
                    undecided.pop()
                if not undecided:
                    return self.starts
            if budget is not None and self.tries > budget:
                self._stop(entries)
                return self.starts
            now = min(
                arrivals[0][0] if arrivals else NEVER,
                self._sleeping[0][0] if self._sleeping else NEVER,
                self._freed[0][0] if self._freed else NEVER,
            )
            if now >= NEVER:
                break
            walk: list[tuple[int, int, _Kind]] = []
            while self._freed and self._freed[0][0] <= now:
                _, tenant = heapq.heappop(self._freed)
                # A reservation of the tenant starts: its next job blocked by GPUs may reserve.
                for kind in self._gpu_bound.pop(tenant, []):
                    if kind.gpu_bound and kind.queue:
                        kind.version += 1
                        kind.gpu_bound = False
                        walk.append((kind.queue[0][0], next(tick), kind))
            while arrivals and arrivals[0][0] <= now:
                _, position, key = heapq.heappop(arrivals)
                kind = kind_of[key]
                if kind.never:
                    self.starts[key] = None
                    continue
                heapq.heappush(kind.queue, (position, key))
                if not kind.awake:
                    kind.awake = True
                    kind.version += 1
                    walk.append((position, next(tick), kind))
            while self._sleeping and self._sleeping[0][0] <= now:
                _, _, version, kind = heapq.heappop(self._sleeping)
                if version == kind.version:
                    kind.gpu_bound = False
                    walk.append((kind.queue[0][0], next(tick), kind))
            heapq.heapify(walk)
            unfit: dict[Request, list[tuple[float, float | None]]] = {}
            """Requests found not to fit at ``now``: (duration class, next time) per failure."""
            while walk:
                _, _, kind = heapq.heappop(walk)
                key = kind.queue[0][1]
                later = self._try(by_key[key], kind, now, unfit)
                if later is not None and later <= now:
                    heapq.heappop(kind.queue)
                    if kind.queue:
                        heapq.heappush(walk, (kind.queue[0][0], next(tick), kind))
                    else:
                        kind.awake = False
                        kind.version += 1
                    continue
                kind.version += 1
                if later is None:
                    kind.never = True
                    kind.awake = False
                    for _, waiting in kind.queue:
                        self.starts[waiting] = None
                    kind.queue.clear()
                    continue
                heapq.heappush(self._sleeping, (later, next(tick), kind.version, kind))
                if kind.gpu_bound:
                    self._gpu_bound.setdefault(kind.tenant, []).append(kind)
        for _, _, key in arrivals:
            self.starts.setdefault(key, None)
        for kind in kinds.values():
            for _, key in kind.queue:
                self.starts.setdefault(key, None)
        return self.starts

    def _stop(self, entries: Sequence[Entry]) -> None:
        self.left = [e for e in entries if e.job.key not in self.starts]

    # --- one job -------------------------------------------------------------------------

    def _try(
        self,
        entry: Entry,
        kind: _Kind,
        now: float,
        unfit: dict[Request, list[tuple[float, float | None]]],
    ) -> float | None:
        """Start ``entry`` at ``now`` if it fits (returns ``now``), reserve for it, or say when
        its kind may next start (None: never)."""
        self.tries += 1
        job = entry.job
        later = now
        for usage, amount, cap in kind.limits:
            allowed = usage.room(now, amount, cap)
            if allowed is None:
                return None
            later = max(later, allowed)
        kind.gpu_bound = False
        if later > now:
            return later
        # A request that did not fit at this moment for some run time does not fit for any
        # longer one either, and not before that answer's time.
        failed = unfit.setdefault(kind.request, [])
        known = [at for length, at in failed if length <= kind.runtime_class]
        if known:
            if None in known:
                return None
            return self._blocked(entry, kind, now, max(at for at in known if at is not None))
        found = self.profile.earliest(kind.request, now, _gap_runtime(job))
        if found is None:
            failed.append((kind.runtime_class, None))
            return None
        if found.start > now:
            failed.append((kind.runtime_class, found.start))
            return self._blocked(entry, kind, now, found.start)
        self._start(job, found, now)
        return now

    def _blocked(self, entry: Entry, kind: _Kind, now: float, fits_at: float) -> float:
        """GPUs keep ``entry`` out until ``fits_at``: reserve for it if its tenant may (it is
        then planned, and its kind goes on at once), or sleep its kind until then."""
        if self._may_reserve(entry.job.tenant or "", now) and self._reserve(entry, now):
            return now
        kind.gpu_bound = True
        return fits_at

    def _start(self, job: Job, found: Slotting, start: float) -> None:
        runtime = job.expected_runtime
        end = start + runtime if runtime is not None else NEVER
        self.profile.take(found.plans, end, start, leave_gaps=False)
        self.hold(job, start, end)
        self.starts[job.key] = start

    # --- reservations --------------------------------------------------------------------

    def _may_reserve(self, tenant: str, now: float) -> bool:
        rules = self.rules
        if rules.per_tenant <= 0 or rules.most <= 0:
            return False
        starts = self._reserving.setdefault(tenant, [])
        while starts and starts[0] <= now:
            starts.pop(0)
        if len(starts) >= rules.per_tenant or now < self._refused.get(tenant, -NEVER):
            return False
        total = sum(1 for s in self._reserving.values() for start in s if start > now)
        return total < rules.most

    def _reserve(self, entry: Entry, now: float) -> bool:
        """Plan ``entry`` where it fits soonest for good, as the cycle reserves, if its tenant
        stays within its entitlement then."""
        job = entry.job
        assert job.tenant is not None
        found = self.profile.earliest(entry.request, now)
        if found is None or found.start >= NEVER:
            return False
        entitled = self.rules.entitled(job.tenant)
        if entitled < NEVER:
            usage = self.usage[job.tenant]
            if usage.held_at(found.start) + job.total_gpus > entitled + 1e-9:
                # Refused for its entitlement: not asked again before the tenant holds less.
                self._refused[job.tenant] = usage.next_drop()
                return False
        runtime = job.expected_runtime
        end = found.start + runtime if runtime is not None else NEVER
        self.profile.take(found.plans, end, found.start)
        self.hold(job, found.start, end)
        self.starts[job.key] = found.start
        starts = self._reserving.setdefault(job.tenant, [])
        starts.append(found.start)
        starts.sort()
        heapq.heappush(self._freed, (found.start, job.tenant))
        return True

    # --- kinds ---------------------------------------------------------------------------

    def _kind_key(self, entry: Entry) -> tuple[object, ...]:
        job = entry.job
        submitter = job.submitter if self.capping[job.tenant or ""] else ""
        return (
            job.tenant,
            job.preemptible,
            submitter,
            entry.request,
            duration_class(_gap_runtime(job)),
        )

    def _new_kind(self, entry: Entry) -> _Kind:
        job = entry.job
        assert job.tenant is not None
        return _Kind(
            request=entry.request,
            runtime_class=duration_class(_gap_runtime(job)),
            limits=self.limits(job),
            tenant=job.tenant,
        )


def _gap_runtime(job: Job) -> float | None:
    """The run time by which ``job`` may be planned in GPUs held for a later start (None: only
    GPUs free for good will do). As the cycle backfills: a job that can be evicted if it
    overruns, or whose declared limit ends it."""
    if job.preemptible or job.max_runtime_seconds is not None:
        return job.expected_runtime
    return None
