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
* **Fair share** is computed here, independently of any policy, by weighted water-filling at
  every sample: the cluster's capacity is split among tenants in proportion to their weights,
  no tenant getting more than its demand (GPUs it holds + GPUs its queued jobs ask for, from
  ``Sample.queued_by_tenant``), the excess split again among the rest. It ignores GPU models and
  wiring (a fluid ideal). Shares are fractions of the cluster's capacity.
* **Jain's index** at an instant is ``(sum x)^2 / (n * sum x^2)`` over the n tenants with a
  positive fair share, ``x = share / fair share``; it is 1 when every tenant holds exactly in
  proportion to its fair share. The figure is its time-weighted mean over the instants where
  some tenant has demand.
* **Makespan** = last completion - first submission.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

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

_HOUR = 3600.0


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

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SizeFigures:
        """Inverse of ``asdict``."""
        return cls(
            d["bucket"], int(d["jobs"]), Stats.from_json(d["jct"]), Stats.from_json(d["queueing"])
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
    mean_fair_share: float | None
    """Time-weighted mean of the water-filled fair share / capacity."""
    below_guarantee_hours: float
    """Hours it held fewer GPUs than min(guarantee, demand) while another tenant held more than
    its own guarantee."""
    share: Series
    fair_share: Series

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
            mean_fair_share=d["mean_fair_share"],
            below_guarantee_hours=float(d["below_guarantee_hours"]),
            share=Series.from_json(d["share"]),
            fair_share=Series.from_json(d["fair_share"]),
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
    by_size: tuple[SizeFigures, ...]
    allocation_mean: float | None
    """Time-weighted mean of allocated / capacity (0..1)."""
    allocation: Series
    """allocated / capacity over time."""
    queue_length_mean: float | None
    queue_length: Series
    """Queued jobs over time."""
    gpu_hours: float
    """GPU-hours held by all attempts."""
    slow_gpu_hours: float
    """sum over attempts of gpus * (end - start) * (1 - 1/slowdown), in hours."""
    link_share: Mapping[str, float]
    """Fraction of the GPU-hours held on each worst link (keys: :class:`Link` values)."""
    stranded_mean: float | None
    """Time-weighted mean of stranded GPUs."""
    stranded_pct: float | None
    """The same as % of capacity."""
    tenants: tuple[TenantFigures, ...]
    jain: float | None
    demand_known: bool
    """The samples carried queued_by_tenant (otherwise demand = GPUs held and the fair share
    only echoes the allocation)."""
    preemptions: int
    preempted_attempts: int
    preempted_gpu_hours: float
    """GPU-hours of the attempts that preemption ended (their work is lost)."""
    makespan: float | None
    jct_cdf: Series
    """JCT distribution: ``times`` are JCTs (s), ``values`` the fraction of finished jobs <= it."""
    cpu_seconds: float

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
            by_size=tuple(SizeFigures.from_json(s) for s in d["by_size"]),
            allocation_mean=d["allocation_mean"],
            allocation=Series.from_json(d["allocation"]),
            queue_length_mean=d["queue_length_mean"],
            queue_length=Series.from_json(d["queue_length"]),
            gpu_hours=float(d["gpu_hours"]),
            slow_gpu_hours=float(d["slow_gpu_hours"]),
            link_share={str(k): float(v) for k, v in d["link_share"].items()},
            stranded_mean=d["stranded_mean"],
            stranded_pct=d["stranded_pct"],
            tenants=tuple(TenantFigures.from_json(t) for t in d["tenants"]),
            jain=d["jain"],
            demand_known=bool(d["demand_known"]),
            preemptions=int(d["preemptions"]),
            preempted_attempts=int(d["preempted_attempts"]),
            preempted_gpu_hours=float(d["preempted_gpu_hours"]),
            makespan=d["makespan"],
            jct_cdf=Series.from_json(d["jct_cdf"]),
            cpu_seconds=float(d["cpu_seconds"]),
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


def water_fill(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: in proportion to weight, none above demand.

    Tenants missing from ``weights`` weigh 1; a tenant of weight <= 0 gets only what is left
    when every positive-weight tenant is satisfied (split evenly among them).
    """
    alloc = dict.fromkeys(demands, 0.0)
    remaining = float(capacity)
    for positive in (True, False):
        active = {
            t
            for t, d in demands.items()
            if d > 0 and alloc[t] < d and (weights.get(t, 1.0) > 0) == positive
        }
        while active and remaining > 1e-9:

            def w(t: str, positive: bool = positive) -> float:
                return weights.get(t, 1.0) if positive else 1.0

            total = sum(w(t) for t in active)
            satisfied = {t for t in active if demands[t] <= remaining * w(t) / total}
            if not satisfied:
                for t in active:
                    alloc[t] = remaining * w(t) / total
                remaining = 0.0
                break
            for t in satisfied:
                alloc[t] = float(demands[t])
                remaining -= demands[t]
            active -= satisfied
    return alloc


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


def figures(run: RunResult) -> Figures:
    """All figures of one replay."""
    jobs = run.jobs
    jcts = [v for v in (jct(j) for j in jobs) if v is not None]
    delays = [v for v in (queueing_delay(j) for j in jobs) if v is not None]

    by_size = []
    for label, _, _ in SIZE_BUCKETS:
        mine = [j for j in jobs if size_bucket(j.gpus) == label]
        by_size.append(
            SizeFigures(
                label,
                len(mine),
                Stats.of([v for v in (jct(j) for j in mine) if v is not None]),
                Stats.of([v for v in (queueing_delay(j) for j in mine) if v is not None]),
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
    slow_seconds = 0.0
    preempted_seconds = 0.0
    preempted_attempts = 0
    by_link: dict[str, float] = {link.value: 0.0 for link in LINK_ORDER}
    for j in jobs:
        for a in j.attempts:
            held = j.gpus * (a.end - a.start)
            gpu_seconds += held
            if a.slowdown > 1:
                slow_seconds += held * (1 - 1 / a.slowdown)
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

    tenants, jain, demand_known = _tenant_figures(run, w)

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
        by_size=tuple(by_size),
        allocation_mean=time_mean(alloc_ratio, w),
        allocation=step_series(times, alloc_ratio, SERIES_POINTS),
        queue_length_mean=time_mean(queue, w),
        queue_length=step_series(times, queue, SERIES_POINTS),
        gpu_hours=gpu_seconds / _HOUR,
        slow_gpu_hours=slow_seconds / _HOUR,
        link_share=link_share,
        stranded_mean=stranded_mean,
        stranded_pct=None if stranded_mean is None or not cap else 100 * stranded_mean / cap,
        tenants=tenants,
        jain=jain,
        demand_known=demand_known,
        preemptions=run.preemptions,
        preempted_attempts=preempted_attempts,
        preempted_gpu_hours=preempted_seconds / _HOUR,
        makespan=makespan,
        jct_cdf=cdf(jcts),
        cpu_seconds=run.cpu_seconds,
    )


def _tenant_figures(
    run: RunResult, w: Sequence[float]
) -> tuple[tuple[TenantFigures, ...], float | None, bool]:
    samples = run.samples
    cap = run.capacity
    spec = {t.name: t for t in run.tenants}
    names: list[str] = list(spec)
    seen = set(names)

    def add(more: Iterable[str]) -> None:
        for n in more:
            if n not in seen:
                seen.add(n)
                names.append(n)

    add(j.tenant for j in run.jobs)
    for s in samples:
        add(s.by_tenant)
        add(s.queued_by_tenant)
    weights = {n: (spec[n].weight if n in spec else 1.0) for n in names}
    guarantee = {n: (spec[n].guaranteed if n in spec else 0) for n in names}
    demand_known = any(s.queued_by_tenant for s in samples) or all(
        s.queued_gpus == 0 for s in samples
    )

    share: dict[str, list[float]] = {n: [] for n in names}
    fair: dict[str, list[float]] = {n: [] for n in names}
    below: dict[str, float] = dict.fromkeys(names, 0.0)
    jain_values: list[float] = []
    jain_weights: list[float] = []
    for s, width in zip(samples, w, strict=True):
        held = {n: s.by_tenant.get(n, 0) for n in names}
        demand = {n: held[n] + s.queued_by_tenant.get(n, 0) for n in names}
        fill = water_fill(cap, demand, weights)
        for n in names:
            share[n].append(held[n] / cap if cap else 0.0)
            fair[n].append(fill[n] / cap if cap else 0.0)
        # A tenant below its guarantee is not itself borrowing: any borrower is another tenant.
        if width > 0 and any(held[n] > guarantee[n] for n in names):
            for n in names:
                if held[n] < min(guarantee[n], demand[n]):
                    below[n] += width
        ratios = [held[n] / fill[n] for n in names if fill[n] > 0]
        if ratios:
            squares = sum(x * x for x in ratios)
            jain_values.append(sum(ratios) ** 2 / (len(ratios) * squares) if squares else 0.0)
            jain_weights.append(width)

    times = [s.time for s in samples]
    out = []
    jobs_of: dict[str, list[JobRecord]] = {n: [] for n in names}
    for j in run.jobs:
        jobs_of[j.tenant].append(j)
    for n in names:
        mine = jobs_of[n]
        out.append(
            TenantFigures(
                name=n,
                weight=weights[n],
                guaranteed=guarantee[n],
                jobs=len(mine),
                gpu_hours=sum(j.gpus * (a.end - a.start) for j in mine for a in j.attempts) / _HOUR,
                queueing=Stats.of([v for v in (queueing_delay(j) for j in mine) if v is not None]),
                mean_share=time_mean(share[n], w),
                mean_fair_share=time_mean(fair[n], w),
                below_guarantee_hours=below[n] / _HOUR,
                share=step_series(times, share[n], SERIES_POINTS),
                fair_share=step_series(times, fair[n], SERIES_POINTS),
            )
        )
    return tuple(out), time_mean(jain_values, jain_weights), demand_known


def headline(f: Figures) -> dict[str, float | None]:
    """The figures of the summary table, by name (what a what-if compares)."""
    return {
        "mean JCT (s)": f.jct.mean,
        "p50 JCT (s)": f.jct.p50,
        "p99 JCT (s)": f.jct.p99,
        "mean queueing delay (s)": f.queueing.mean,
        "allocation (%)": None if f.allocation_mean is None else 100 * f.allocation_mean,
        "GPU-hours lost to slow placement": f.slow_gpu_hours,
        "stranded (%)": f.stranded_pct,
        "Jain's index": f.jain,
        "preemptions": float(f.preemptions),
        "GPU-hours lost to preemption": f.preempted_gpu_hours,
        "makespan (s)": f.makespan,
        "jobs finished": float(f.jobs.finished),
        "jobs never started": float(f.jobs.never_started),
    }
