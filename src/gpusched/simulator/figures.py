"""The figures of one replay: pure functions from a :class:`RunResult` to a :class:`Figures`.

Conventions (docs/simulator.md, "Reading the report"):

* Times are seconds of virtual time; GPU-hours are hours. The report converts to hours.
* **JCT** (job completion time) = completion - submission, over finished jobs only.
  **Queueing delay** = first start - submission, over jobs that started at least once (jobs that
  never started are counted separately, with their reasons, not folded into the delay).
* **Percentiles are nearest-rank**: the p-th percentile of n sorted values is the value at
  1-based rank ``ceil(p * n / 100)`` (rank 1 for p = 0). It is always one of the values; no
  interpolation. p50 of (1, 2, 3, 4) is 2; p99 of 100 values is the 99th.
* **Samples are a step function**: sample i holds from its time until the next sample's time.
  Time-weighted means run from the first sample to the last; the last sample itself has no
  width (the engine takes it when the replay ends). A mean over no time is ``None``.
* **Entitlement** is computed here from the trace alone, the same for every policy: a tenant's
  *offered demand* at an instant is the GPUs of its jobs submitted and not yet done had each
  started at once and run its recorded duration; its entitlement is its guarantee (up to that
  demand) plus its weighted share of what the others leave idle, capped by demand and borrowing
  limit: the rule the admission core follows (:func:`gpusched.core.admission.quota.fair_shares`).
  Jobs of a namespace no TenantQuota lists belong to no tenant there: entitled to nothing.
  It ignores GPU models and wiring (a fluid ideal). Shares are fractions of the capacity.
* **Jain's index** at an instant is ``(sum x)^2 / (n * sum x^2)`` over the n tenants with a
  positive entitlement, ``x = share / entitlement``; it is 1 when every tenant holds exactly in
  proportion to its entitlement, and never below ``1 / n``. The figure is its time-weighted mean
  over the instants it is defined: some tenant is entitled and some entitled tenant holds GPUs
  (when none does it is ``0 / 0``; how idle the cluster was is the allocation's figure).
* **Finish-time fairness** (Themis): ``rho = JCT / T_alone`` per finished job, ``T_alone`` the
  run time it would have on its equal part of its tenant's entitlement at its submission
  (entitlement / the tenant's offered jobs then): its recorded duration, stretched by
  ``gpus / that part`` when it asks more. ``rho <= 1``: no worse than its fair slice alone. A JCT
  equal to ``T_alone`` up to the rounding of the virtual clock (a few units in the last place of
  the end time) is rho 1: ``end - submit`` differs from the duration in its last bits for most
  fractional times, which would read as a job worse off than alone.
* **Slow placement** splits the GPU-hours lost against a well-wired run (``W * (f - 1)``, ``W``
  the attempt's work at full speed, ``f`` its speed factor) into *unavoidable* (the best set of
  the empty cluster is that slow: a gang larger than any node), *contention* (the best set free
  at the start was slower than the empty cluster's) and *avoidable* (a better-wired set was free
  at the start: what the node and GPU choice decided).
* **Busy-period allocation**: allocated / capacity, time-weighted over the instants some job
  waits (a drain tail with an empty queue does not count as idle GPUs).
* **Makespan** = last completion - first submission. GPU-hours of attempts still running at the
  end count up to the end.
* **Expected-start accuracy** judges the first expected start a job was told (``estimate``, told
  at ``estimated_at``; only policies that tell any) against its first start, over the jobs that
  started after waiting more than an hour (first start - submission > 3600 s) and were told one
  before starting. The signed error is ``first start - estimate`` (positive: later than told);
  the start is *within* when ``|error| <= max(3600, 0.25 * (first start - estimated_at))``: a
  quarter of the wait that remained when the job was told, or an hour, whichever is larger.
  Jobs that never started are not judged (their start is unknown).
* **No waits in a one-batch replay**: when the engine decided every event at once (an infinite
  cycle interval, the FGD experiment), a start is that one decision's time, not when the job
  could have started, so queueing delays (overall, by size, per tenant, with the never-started
  counted) and expected-start accuracy are not measured (``None``, count 0); which jobs started
  and what they hold still are.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

from gpusched.core.admission import Tenant
from gpusched.core.admission.quota import fair_shares
from gpusched.core.admission.tree import TenantTree
from gpusched.simulator.model import LINK_ORDER, JobRecord, RunResult, Sample

#: Job size buckets by GPUs: (label, smallest, largest or None for no bound).
SIZE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-8", 5, 8),
    ("9-32", 9, 32),
    (">32", 33, None),
)
#: Most points a stored series keeps (long series are averaged into equal time bins).
SERIES_POINTS = 2000
#: Most points of the stored JCT distribution.
CDF_POINTS = 1000
#: How many never-started reasons are kept (most frequent first).
TOP_REASONS = 5
#: Expected starts are judged for jobs that waited longer than this (s): a short wait's estimate
#: is right or wrong by minutes nobody plans around.
ESTIMATE_MIN_WAIT = 3600.0
#: An expected start is within when off by at most the larger of this (s) ...
ESTIMATE_SLACK = 3600.0
#: ... and this share of the wait that remained when the job was told.
ESTIMATE_SHARE = 0.25
#: Percentiles of the signed error kept (nearest rank).
ESTIMATE_PERCENTILES = (10, 25, 50, 75, 90)

_HOUR = 3600.0
#: Units in the last place of a job's end time within which its JCT equals its run time alone:
#: the engine's ``start + duration * slowdown`` and the JCT's ``end - submit`` each round once.
_CLOCK_ULPS = 4


def nearest_rank(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile (0 <= p <= 100) by nearest rank; ``None`` when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(p * len(ordered) / 100))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Stats:
    """Mean and nearest-rank percentiles of some durations (seconds)."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Stats of ``values``."""
        if not values:
            return cls(0, None, None, None)
        mean = sum(values) / len(values)
        return cls(len(values), mean, nearest_rank(values, 50), nearest_rank(values, 99))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Stats:
        """Inverse of ``asdict``."""
        return cls(int(d["count"]), d["mean"], d["p50"], d["p99"])


@dataclass(frozen=True, slots=True)
class Series:
    """A step function: ``values[i]`` holds from ``times[i]`` until ``times[i + 1]``."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Series:
        """Inverse of ``asdict``."""
        return cls(tuple(float(t) for t in d["times"]), tuple(float(v) for v in d["values"]))


@dataclass(frozen=True, slots=True)
class SizeFigures:
    """JCT and queueing delay of the jobs of one size bucket."""

    bucket: str
    jobs: int
    jct: Stats
    queueing: Stats
    never_started: int = 0
    """Jobs of the bucket that never started (not in ``queueing``)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SizeFigures:
        """Inverse of ``asdict``."""
        return cls(
            d["bucket"],
            int(d["jobs"]),
            Stats.from_json(d["jct"]),
            Stats.from_json(d["queueing"]),
            int(d.get("never_started", 0)),
        )


@dataclass(frozen=True, slots=True)
class JobCounts:
    """How many jobs finished, ran without finishing, never started (and why)."""

    total: int
    finished: int
    unfinished: int
    """Started at least once but not finished when the replay ended."""
    never_started: int
    top_reasons: Mapping[str, int]
    """Most frequent reasons of the never-started jobs, most frequent first."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobCounts:
        """Inverse of ``asdict``."""
        return cls(
            int(d["total"]),
            int(d["finished"]),
            int(d["unfinished"]),
            int(d["never_started"]),
            {str(k): int(v) for k, v in d["top_reasons"].items()},
        )


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant's share of the cluster against its weighted fair share."""

    name: str
    weight: float
    guaranteed: int
    jobs: int
    gpu_hours: float
    """GPU-hours its attempts held (preempted ones included)."""
    queueing: Stats
    mean_share: float | None
    """Time-weighted mean of GPUs held / capacity."""
    mean_entitlement: float | None
    """Time-weighted mean of its entitlement / capacity (module docstring)."""
    below_guarantee_hours: float
    """Hours it held fewer GPUs than min(guarantee, demand) while another tenant held more than
    its own guarantee (demand: GPUs held + asked by queued jobs)."""
    longest_below_hours: float
    """The longest such stretch without a break."""
    below_fitting_hours: float
    """Hours it held fewer GPUs than its guarantee while one of its waiting jobs fitted in what
    was left of the guarantee and another tenant held more than its own guarantee: what reclaim
    can act on (a job larger than what is left of the guarantee borrows, and waits its turn)."""
    longest_below_fitting_hours: float
    """The longest such stretch without a break."""
    unmet_guarantee_gpu_hours: float
    """GPU-hours of guarantee it wanted and did not hold over those stretches."""
    never_started: bool
    """It had jobs and none of them ever started (its figures are not zeros but absent)."""
    share: Series
    entitlement: Series

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TenantFigures:
        """Inverse of ``asdict``."""
        return cls(
            name=d["name"],
            weight=float(d["weight"]),
            guaranteed=int(d["guaranteed"]),
            jobs=int(d["jobs"]),
            gpu_hours=float(d["gpu_hours"]),
            queueing=Stats.from_json(d["queueing"]),
            mean_share=d["mean_share"],
            mean_entitlement=d["mean_entitlement"],
            below_guarantee_hours=float(d["below_guarantee_hours"]),
            longest_below_hours=float(d["longest_below_hours"]),
            below_fitting_hours=float(d.get("below_fitting_hours", 0.0)),
            longest_below_fitting_hours=float(d.get("longest_below_fitting_hours", 0.0)),
            unmet_guarantee_gpu_hours=float(d["unmet_guarantee_gpu_hours"]),
            never_started=bool(d["never_started"]),
            share=Series.from_json(d["share"]),
            entitlement=Series.from_json(d["entitlement"]),
        )


@dataclass(frozen=True, slots=True)
class Rho:
    """Distribution of finish-time fairness (Themis' rho) over finished jobs."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    above_one: float | None
    """Fraction of jobs with rho > 1 (worse off than on their fair slice alone)."""
    cdf: Series

    @classmethod
    def of(cls, values: Sequence[float]) -> Rho:
        """The distribution of ``values``."""
        if not values:
            return cls(0, None, None, None, None, None, None, Series((), ()))
        return cls(
            len(values),
            sum(values) / len(values),
            nearest_rank(values, 50),
            nearest_rank(values, 90),
            nearest_rank(values, 99),
            max(values),
            sum(1 for v in values if v > 1) / len(values),
            cdf(values),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Rho:
        """Inverse of ``asdict``."""
        return cls(
            int(d["count"]),
            d["mean"],
            d["p50"],
            d["p90"],
            d["p99"],
            d["max"],
            d["above_one"],
            Series.from_json(d["cdf"]),
        )


@dataclass(frozen=True, slots=True)
class EstimateAccuracy:
    """How well the first expected start each job was told matched its first start (module
    docstring); the errors are seconds."""

    estimated: int
    """Jobs told an expected start at all."""
    long_waits: int
    """Jobs that started after waiting more than :data:`ESTIMATE_MIN_WAIT`."""
    judged: int
    """Of those, the ones told an expected start before starting (the errors are theirs)."""
    within: int
    """Of ``judged``, started within max(:data:`ESTIMATE_SLACK`, :data:`ESTIMATE_SHARE` x the
    wait remaining when told) of it."""
    share: float | None
    """within / judged: how far a told expected start can be trusted."""
    share_of_long_waits: float | None
    """within / long_waits: the same counting the long waiters told nothing as misses (a policy
    that tells only some jobs scores lower here)."""
    error_percentiles: tuple[tuple[int, float | None], ...]
    """(p, nearest-rank p-th percentile of the signed error first start - estimate), for each
    p of :data:`ESTIMATE_PERCENTILES`."""
    error_cdf: Series
    """Signed errors and the fraction of judged jobs <= each."""

    def error(self, p: int) -> float | None:
        """The p-th percentile of the signed error (p one of :data:`ESTIMATE_PERCENTILES`)."""
        return dict(self.error_percentiles).get(p)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> EstimateAccuracy:
        """Inverse of ``asdict`` (no estimates when absent: a results.json from before)."""
        if d is None:
            return estimate_accuracy(())
        return cls(
            int(d["estimated"]),
            int(d["long_waits"]),
            int(d["judged"]),
            int(d["within"]),
            d["share"],
            d["share_of_long_waits"],
            tuple((int(p), v) for p, v in d["error_percentiles"]),
            Series.from_json(d["error_cdf"]),
        )


@dataclass(frozen=True)
class Figures:
    """Everything the report shows of one policy's replay (see the module docstring)."""

    policy: str
    workload: str
    cluster: str
    capacity: int
    jobs: JobCounts
    jct: Stats
    queueing: Stats
    queueing_all: Stats
    """Queueing delay with the never-started jobs counted up to the replay's end (a lower bound
    for them): a policy that starves jobs does not look better for leaving them out."""
    by_size: tuple[SizeFigures, ...]
    allocation_mean: float | None
    """Time-weighted mean of allocated / capacity (0..1)."""
    allocation_busy: float | None
    """The same over the instants some job waits."""
    allocation: Series
    """allocated / capacity over time."""
    queue_length_mean: float | None
    queue_length: Series
    """Queued jobs over time."""
    gpu_hours: float
    """GPU-hours held by all attempts."""
    slow_gpu_hours: float
    """GPU-hours lost against well-wired runs: unavoidable + contention + avoidable."""
    slow_unavoidable_gpu_hours: float
    """Lost because no set of the empty cluster is better wired (gangs larger than a node)."""
    slow_contention_gpu_hours: float
    """Lost because the better-wired sets were busy when the job started."""
    slow_avoidable_gpu_hours: float
    """Lost to the node and GPU choice: a better-wired set was free at the job's start."""
    link_share: Mapping[str, float]
    """Fraction of the GPU-hours held on each worst link (keys: :class:`Link` values)."""
    stranded_mean: float | None
    """Time-weighted mean of stranded GPUs."""
    stranded_pct: float | None
    """The same as % of capacity."""
    tenants: tuple[TenantFigures, ...]
    jain: float | None
    """Jain's index of share / entitlement, time-weighted."""
    rho: Rho
    """Finish-time fairness of the finished jobs."""
    preemptions: int
    preempted_attempts: int
    preempted_gpu_hours: float
    """GPU-hours of the attempts that preemption ended (their work is lost)."""
    makespan: float | None
    jct_cdf: Series
    """JCT distribution: ``times`` are JCTs (s), ``values`` the fraction of finished jobs <= it."""
    cpu_seconds: float
    estimates: EstimateAccuracy
    """Accuracy of the first expected start each job was told."""

    def to_json(self) -> dict[str, Any]:
        """A dict of plain JSON types; :meth:`from_json` reads it back."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Figures:
        """Read back :meth:`to_json` (after a trip through JSON)."""
        return cls(
            policy=d["policy"],
            workload=d["workload"],
            cluster=d["cluster"],
            capacity=int(d["capacity"]),
            jobs=JobCounts.from_json(d["jobs"]),
            jct=Stats.from_json(d["jct"]),
            queueing=Stats.from_json(d["queueing"]),
            queueing_all=Stats.from_json(d["queueing_all"]),
            by_size=tuple(SizeFigures.from_json(s) for s in d["by_size"]),
            allocation_mean=d["allocation_mean"],
            allocation_busy=d["allocation_busy"],
            allocation=Series.from_json(d["allocation"]),
            queue_length_mean=d["queue_length_mean"],
            queue_length=Series.from_json(d["queue_length"]),
            gpu_hours=float(d["gpu_hours"]),
            slow_gpu_hours=float(d["slow_gpu_hours"]),
            slow_unavoidable_gpu_hours=float(d["slow_unavoidable_gpu_hours"]),
            slow_contention_gpu_hours=float(d["slow_contention_gpu_hours"]),
            slow_avoidable_gpu_hours=float(d["slow_avoidable_gpu_hours"]),
            link_share={str(k): float(v) for k, v in d["link_share"].items()},
            stranded_mean=d["stranded_mean"],
            stranded_pct=d["stranded_pct"],
            tenants=tuple(TenantFigures.from_json(t) for t in d["tenants"]),
            jain=d["jain"],
            rho=Rho.from_json(d["rho"]),
            preemptions=int(d["preemptions"]),
            preempted_attempts=int(d["preempted_attempts"]),
            preempted_gpu_hours=float(d["preempted_gpu_hours"]),
            makespan=d["makespan"],
            jct_cdf=Series.from_json(d["jct_cdf"]),
            cpu_seconds=float(d["cpu_seconds"]),
            estimates=EstimateAccuracy.from_json(d.get("estimates")),
        )


# --- building blocks ------------------------------------------------------------------------


def size_bucket(gpus: int) -> str:
    """The label of the size bucket of a job of ``gpus`` GPUs."""
    for label, low, high in SIZE_BUCKETS:
        if gpus >= low and (high is None or gpus <= high):
            return label
    return SIZE_BUCKETS[0][0]  # 0-GPU jobs (not expected) count with the smallest


def jct(job: JobRecord) -> float | None:
    """Completion - submission, if finished."""
    end = job.end
    return None if end is None else end - job.submit


def queueing_delay(job: JobRecord) -> float | None:
    """First start - submission, if it ever started."""
    start = job.first_start
    return None if start is None else start - job.submit


def estimate_error(job: JobRecord) -> float | None:
    """First start - the first expected start the job was told (positive: it started later
    than told); None when it was told nothing or never started."""
    start = job.first_start
    if start is None or job.estimate is None:
        return None
    return start - job.estimate


def estimate_within(job: JobRecord) -> bool | None:
    """Whether the job started within max(1 h, 25 % of the wait remaining when told) of its
    first expected start; None when it was told nothing or never started."""
    error = estimate_error(job)
    start = job.first_start
    if error is None or start is None or job.estimated_at is None:
        return None
    return abs(error) <= max(ESTIMATE_SLACK, ESTIMATE_SHARE * (start - job.estimated_at))


def estimate_accuracy(jobs: Iterable[JobRecord]) -> EstimateAccuracy:
    """The accuracy of the first expected starts of ``jobs`` (module docstring)."""
    estimated = long_waits = within = 0
    errors: list[float] = []
    for j in jobs:
        if j.estimate is not None:
            estimated += 1
        delay = queueing_delay(j)
        if delay is None or delay <= ESTIMATE_MIN_WAIT:
            continue
        long_waits += 1
        error = estimate_error(j)
        if error is None:
            continue
        errors.append(error)
        if estimate_within(j):
            within += 1
    judged = len(errors)
    return EstimateAccuracy(
        estimated=estimated,
        long_waits=long_waits,
        judged=judged,
        within=within,
        share=within / judged if judged else None,
        share_of_long_waits=within / long_waits if long_waits else None,
        error_percentiles=tuple((p, nearest_rank(errors, p)) for p in ESTIMATE_PERCENTILES),
        error_cdf=cdf(errors),
    )


def widths(samples: Sequence[Sample]) -> list[float]:
    """How long each sample holds (the last: 0)."""
    out = [b.time - a.time for a, b in pairwise(samples)]
    return [*out, 0.0] if samples else []


def time_mean(values: Sequence[float], weights: Sequence[float]) -> float | None:
    """sum(v * w) / sum(w), or ``None`` over no time."""
    total = sum(weights)
    if total <= 0:
        return None
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


def step_series(times: Sequence[float], values: Sequence[float], max_points: int) -> Series:
    """A step function of at most ``max_points`` points.

    Short series are kept as they are. Long ones are cut into ``max_points - 1`` equal time bins,
    each given the time-weighted mean of the step function over it (so the area, hence every
    time-weighted mean, is kept), plus the last point.
    """
    if len(times) <= max_points:
        return Series(tuple(float(t) for t in times), tuple(float(v) for v in values))
    start, stop = times[0], times[-1]
    if stop <= start:
        return Series((float(stop),), (float(values[-1]),))
    cum = [0.0]
    for i in range(1, len(times)):
        cum.append(cum[-1] + values[i - 1] * (times[i] - times[i - 1]))

    def area(t: float) -> float:
        i = max(0, bisect_right(times, t) - 1)
        return cum[i] + values[i] * (t - times[i])

    bins = max_points - 1
    edges = [start + (stop - start) * k / bins for k in range(bins)] + [float(stop)]
    out_v = [
        (area(b) - area(a)) / (b - a) if b > a else float(values[0]) for a, b in pairwise(edges)
    ]
    out_v.append(float(values[-1]))
    return Series(tuple(edges), tuple(out_v))


def cdf(values: Sequence[float], max_points: int = CDF_POINTS) -> Series:
    """Empirical CDF of ``values``: each value and the fraction <= it (thinned to max_points)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return Series((), ())
    if n <= max_points:
        ranks: list[int] = list(range(1, n + 1))
    else:  # evenly spaced ranks, the last (fraction 1) included
        ranks = sorted({min(n, math.ceil(k * n / max_points)) for k in range(1, max_points + 1)})
    return Series(tuple(ordered[r - 1] for r in ranks), tuple(r / n for r in ranks))


# --- the figures ----------------------------------------------------------------------------


def replay_end(run: RunResult) -> float:
    """When the replay ended: its last event (sample, submission or finite end of an attempt)."""
    ends = [a.end for j in run.jobs for a in j.attempts if math.isfinite(a.end)]
    return max(
        [*(s.time for s in run.samples[-1:]), *(j.submit for j in run.jobs), *ends], default=0.0
    )


def figures(run: RunResult) -> Figures:
    """All figures of one replay."""
    jobs = run.jobs
    end_of_replay = replay_end(run)
    jcts = [v for v in (jct(j) for j in jobs) if v is not None]
    delays = _delays(run, jobs)
    censored = (
        delays + [end_of_replay - j.submit for j in jobs if not j.attempts] if run.has_waits else []
    )

    by_size = []
    for label, _, _ in SIZE_BUCKETS:
        mine = [j for j in jobs if size_bucket(j.gpus) == label]
        by_size.append(
            SizeFigures(
                label,
                len(mine),
                Stats.of([v for v in (jct(j) for j in mine) if v is not None]),
                Stats.of(_delays(run, mine)),
                sum(1 for j in mine if not j.attempts),
            )
        )

    finished = sum(1 for j in jobs if j.finished)
    never = [j for j in jobs if not j.attempts]
    reasons = Counter(j.reason or "unknown" for j in never)
    counts = JobCounts(
        total=len(jobs),
        finished=finished,
        unfinished=len(jobs) - finished - len(never),
        never_started=len(never),
        top_reasons=dict(reasons.most_common(TOP_REASONS)),
    )

    gpu_seconds = 0.0
    lost = [0.0, 0.0, 0.0]  # unavoidable, contention, avoidable
    preempted_seconds = 0.0
    preempted_attempts = 0
    by_link: dict[str, float] = {link.value: 0.0 for link in LINK_ORDER}
    for j in jobs:
        for a in j.attempts:
            held = j.gpus * max(0.0, min(a.end, end_of_replay) - a.start)
            gpu_seconds += held
            work = held / a.factor
            lost[0] += work * (a.floor_factor - 1)
            lost[1] += work * (a.best_factor - a.floor_factor)
            lost[2] += work * (a.factor - a.best_factor)
            by_link[a.link.value] = by_link.get(a.link.value, 0.0) + held
            if a.preempted:
                preempted_attempts += 1
                preempted_seconds += held
    link_share = {k: (v / gpu_seconds if gpu_seconds > 0 else 0.0) for k, v in by_link.items()}

    samples = run.samples
    w = widths(samples)
    cap = run.capacity
    times = [s.time for s in samples]
    alloc_ratio = [s.allocated / cap if cap else 0.0 for s in samples]
    queue = [float(s.queued_jobs) for s in samples]
    stranded = [float(s.stranded) for s in samples]
    stranded_mean = time_mean(stranded, w)
    busy = [width if s.queued_jobs > 0 else 0.0 for s, width in zip(samples, w, strict=True)]

    entitled = entitlements(run)
    tenants, jain = _tenant_figures(run, w, entitled)

    ends = [e for e in (j.end for j in jobs) if e is not None]
    makespan = max(ends) - min(j.submit for j in jobs) if ends else None

    return Figures(
        policy=run.policy,
        workload=run.workload,
        cluster=run.cluster,
        capacity=cap,
        jobs=counts,
        jct=Stats.of(jcts),
        queueing=Stats.of(delays),
        queueing_all=Stats.of(censored),
        by_size=tuple(by_size),
        allocation_mean=time_mean(alloc_ratio, w),
        allocation_busy=time_mean(alloc_ratio, busy),
        allocation=step_series(times, alloc_ratio, SERIES_POINTS),
        queue_length_mean=time_mean(queue, w),
        queue_length=step_series(times, queue, SERIES_POINTS),
        gpu_hours=gpu_seconds / _HOUR,
        slow_gpu_hours=sum(lost) / _HOUR,
        slow_unavoidable_gpu_hours=lost[0] / _HOUR,
        slow_contention_gpu_hours=lost[1] / _HOUR,
        slow_avoidable_gpu_hours=lost[2] / _HOUR,
        link_share=link_share,
        stranded_mean=stranded_mean,
        stranded_pct=None if stranded_mean is None or not cap else 100 * stranded_mean / cap,
        tenants=tenants,
        jain=jain,
        rho=Rho.of(finish_time_fairness(run, entitled)),
        preemptions=run.preemptions,
        preempted_attempts=preempted_attempts,
        preempted_gpu_hours=preempted_seconds / _HOUR,
        makespan=makespan,
        jct_cdf=cdf(jcts),
        cpu_seconds=run.cpu_seconds,
        estimates=estimate_accuracy(jobs if run.has_waits else ()),
    )


def _delays(run: RunResult, jobs: Iterable[JobRecord]) -> list[float]:
    """Queueing delays of the jobs that started; none when the replay has no waits to measure
    (module docstring)."""
    if not run.has_waits:
        return []
    return [v for v in (queueing_delay(j) for j in jobs) if v is not None]


@dataclass(frozen=True)
class Entitled:
    """The offered demand and the entitlements of every tenant as step functions of time:
    ``values[i]`` holds from ``times[i]`` until ``times[i + 1]``."""

    tenants: tuple[str, ...]
    times: tuple[float, ...]
    demand: tuple[Mapping[str, int], ...]
    """Offered demand (GPUs) per tenant."""
    entitlement: tuple[Mapping[str, float], ...]
    """Entitlement (GPUs) per tenant."""
    active: tuple[Mapping[str, int], ...]
    """Offered jobs per tenant."""

    def at(self, t: float) -> int:
        """Index of the step holding at ``t`` (-1 before the first)."""
        return bisect_right(self.times, t) - 1


def _core_tenants(run: RunResult) -> list[Tenant]:
    known = {t.name: t for t in run.tenants}
    names = sorted({*known, *(j.tenant for j in run.jobs)})
    return [known.get(n) or Tenant(n) for n in names]


def entitlements(run: RunResult) -> Entitled:
    """Each tenant's offered demand and entitlement over time, from the trace alone (module
    docstring): the same for every policy of one workload. Only the workload's tenants are
    entitled: jobs of a namespace no TenantQuota lists have no tenant in the admission core (they
    wait ``NoTenant``) and are entitled to nothing; a run that names no tenant at all treats each
    job's tenant as one without a guarantee."""
    tenants = list(run.tenants) or _core_tenants(run)
    events: dict[float, list[tuple[str, int]]] = {}
    for j in run.jobs:
        events.setdefault(j.submit, []).append((j.tenant, j.gpus))
        if math.isfinite(j.duration):
            events.setdefault(j.submit + j.duration, []).append((j.tenant, -j.gpus))
    demand: Counter[str] = Counter()
    active: Counter[str] = Counter()
    times: list[float] = []
    demands: list[Mapping[str, int]] = []
    entitled: list[Mapping[str, float]] = []
    actives: list[Mapping[str, int]] = []
    for t in sorted(events):
        for tenant, gpus in events[t]:
            demand[tenant] += gpus
            active[tenant] += 1 if gpus > 0 else -1
        current = {k: v for k, v in demand.items() if v > 0}
        times.append(t)
        demands.append(current)
        entitled.append(fair_shares(run.capacity, tenants, current))
        actives.append({k: v for k, v in active.items() if v > 0})
    return Entitled(
        tuple(t.name for t in tenants),
        tuple(times),
        tuple(demands),
        tuple(entitled),
        tuple(actives),
    )


def finish_time_fairness(run: RunResult, entitled: Entitled) -> list[float]:
    """Themis' rho of every finished job (module docstring); jobs whose tenant was entitled
    to nothing at their submission are left out (no fair slice to compare with)."""
    out = []
    for j in run.jobs:
        done = jct(j)
        if done is None:
            continue
        i = entitled.at(j.submit)
        if i < 0:
            continue
        part = entitled.entitlement[i].get(j.tenant, 0.0) / max(
            1, entitled.active[i].get(j.tenant, 1)
        )
        if part <= 0:
            continue
        alone = j.duration * max(1.0, j.gpus / part)
        end = j.submit + done
        if abs(done - alone) <= _CLOCK_ULPS * math.ulp(max(abs(end), alone)):
            out.append(1.0)
        else:
            out.append(done / alone)
    return out


def _tenant_figures(
    run: RunResult, w: Sequence[float], entitled: Entitled
) -> tuple[tuple[TenantFigures, ...], float | None]:
    samples = run.samples
    end_of_replay = replay_end(run)
    cap = run.capacity
    spec = {t.name: t for t in _core_tenants(run)}
    names: list[str] = list(spec)
    seen = set(names)
    for s in samples:
        for n in (*s.by_tenant, *s.queued_by_tenant):
            if n not in seen:
                seen.add(n)
                names.append(n)
                spec[n] = Tenant(n)
    guarantee = {n: spec[n].guaranteed for n in names}
    # A parent tenant (the tenant tree) is measured over its whole subtree; Jain's index is
    # over the tenants without children, each counted once.
    tree = TenantTree.of(spec.values())
    up = {n: tree.levels(n) if n in spec else (n,) for n in names}
    leaves = [n for n in names if not tree.is_parent(n)]

    def rolled(values: Mapping[str, int]) -> dict[str, int]:
        if tree.flat:
            return dict(values)
        out: dict[str, int] = {}
        for n, v in values.items():
            for level in up.get(n, (n,)):
                out[level] = out.get(level, 0) + v
        return out

    def smallest(values: Mapping[str, int]) -> dict[str, int]:
        if tree.flat:
            return dict(values)
        out: dict[str, int] = {}
        for n, v in values.items():
            for level in up.get(n, (n,)):
                out[level] = min(out.get(level, v), v)
        return out

    # Share (from the samples) against entitlement (from the trace), over every breakpoint of
    # either step function inside the replay.
    if samples:
        start, stop = samples[0].time, samples[-1].time
        cuts = sorted({s.time for s in samples} | {t for t in entitled.times if start < t < stop})
    else:
        cuts = []
    jain_values: list[float] = []
    jain_weights: list[float] = []
    ent_series: dict[str, list[float]] = {n: [] for n in names}
    ent_weights: list[float] = []
    for a, b in zip(cuts, [*cuts[1:], cuts[-1]] if cuts else [], strict=True):
        width = b - a
        ent_weights.append(width)
        i = entitled.at(a)
        ent = entitled.entitlement[i] if i >= 0 else {}
        if not tree.flat:
            ent = {n: sum(ent.get(m, 0.0) for m in leaves if n in up[m]) for n in names}
        for n in names:
            ent_series[n].append(ent.get(n, 0.0) / cap if cap else 0.0)
    sample_times = [s.time for s in samples]
    for k, (a, width) in enumerate(zip(cuts, ent_weights, strict=True)):
        s = samples[bisect_right(sample_times, a) - 1]
        ratios = [
            (s.by_tenant.get(n, 0) / cap) / ent_series[n][k] for n in leaves if ent_series[n][k] > 0
        ]
        squares = sum(x * x for x in ratios)
        # No entitled tenant holding anything: the index is 0/0 there (its range is [1/n, 1]),
        # not 0; such instants are left out like those with nobody entitled.
        if squares > 0 and width > 0:
            jain_values.append(sum(ratios) ** 2 / (len(ratios) * squares))
            jain_weights.append(width)

    share: dict[str, list[float]] = {n: [] for n in names}
    below: dict[str, float] = dict.fromkeys(names, 0.0)
    unmet: dict[str, float] = dict.fromkeys(names, 0.0)
    stretch: dict[str, float] = dict.fromkeys(names, 0.0)
    longest: dict[str, float] = dict.fromkeys(names, 0.0)
    fitting: dict[str, float] = dict.fromkeys(names, 0.0)
    fitting_stretch: dict[str, float] = dict.fromkeys(names, 0.0)
    fitting_longest: dict[str, float] = dict.fromkeys(names, 0.0)
    for s, width in zip(samples, w, strict=True):
        by_tenant, queued = rolled(s.by_tenant), rolled(s.queued_by_tenant)
        least = smallest(s.smallest_queued_by_tenant)
        held = {n: by_tenant.get(n, 0) for n in names}
        demand = {n: held[n] + queued.get(n, 0) for n in names}
        for n in names:
            share[n].append(held[n] / cap if cap else 0.0)
        # A tenant below its guarantee is not itself borrowing: any borrower is another tenant.
        borrowing = any(held[n] > guarantee[n] for n in names)
        for n in names:
            wanted = min(guarantee[n], demand[n])
            if borrowing and held[n] < wanted:
                if width > 0:
                    below[n] += width
                    unmet[n] += width * (wanted - held[n])
                    stretch[n] += width
                    longest[n] = max(longest[n], stretch[n])
            else:
                stretch[n] = 0.0
            fits = least.get(n)
            if borrowing and fits is not None and held[n] + fits <= guarantee[n]:
                if width > 0:
                    fitting[n] += width
                    fitting_stretch[n] += width
                    fitting_longest[n] = max(fitting_longest[n], fitting_stretch[n])
            else:
                fitting_stretch[n] = 0.0

    times = [s.time for s in samples]
    out = []
    jobs_of: dict[str, list[JobRecord]] = {n: [] for n in names}
    for j in run.jobs:
        for level in up.get(j.tenant, (j.tenant,)):
            jobs_of.setdefault(level, []).append(j)
    for n in names:
        mine = jobs_of.get(n, [])
        out.append(
            TenantFigures(
                name=n,
                weight=spec[n].weight,
                guaranteed=guarantee[n],
                jobs=len(mine),
                gpu_hours=sum(
                    j.gpus * max(0.0, min(a.end, end_of_replay) - a.start)
                    for j in mine
                    for a in j.attempts
                )
                / _HOUR,
                queueing=Stats.of(_delays(run, mine)),
                mean_share=time_mean(share[n], w),
                mean_entitlement=time_mean(ent_series[n], ent_weights),
                below_guarantee_hours=below[n] / _HOUR,
                longest_below_hours=longest[n] / _HOUR,
                below_fitting_hours=fitting[n] / _HOUR,
                longest_below_fitting_hours=fitting_longest[n] / _HOUR,
                unmet_guarantee_gpu_hours=unmet[n] / _HOUR,
                never_started=bool(mine) and not any(j.attempts for j in mine),
                share=step_series(times, share[n], SERIES_POINTS),
                entitlement=step_series(cuts, ent_series[n], SERIES_POINTS),
            )
        )
    return tuple(out), time_mean(jain_values, jain_weights)


def headline(f: Figures) -> dict[str, float | None]:
    """The figures of the summary table, by name (what a what-if compares)."""
    return {
        "mean JCT (s)": f.jct.mean,
        "p50 JCT (s)": f.jct.p50,
        "p99 JCT (s)": f.jct.p99,
        "mean queueing delay (s)": f.queueing.mean,
        "mean queueing, never-started counted (s)": f.queueing_all.mean,
        "allocation (%)": None if f.allocation_mean is None else 100 * f.allocation_mean,
        "allocation while jobs wait (%)": (
            None if f.allocation_busy is None else 100 * f.allocation_busy
        ),
        "GPU-hours lost to slow placement": f.slow_gpu_hours,
        "GPU-hours lost to avoidable slow placement": f.slow_avoidable_gpu_hours,
        "stranded (%)": f.stranded_pct,
        "Jain's index (share / entitlement)": f.jain,
        "finish-time fairness rho, p99": f.rho.p99,
        "preemptions": float(f.preemptions),
        "GPU-hours lost to preemption": f.preempted_gpu_hours,
        "makespan (s)": f.makespan,
        "jobs finished": float(f.jobs.finished),
        "jobs never started": float(f.jobs.never_started),
    }
