"""Jobs expected to arrive while others wait, for the forecast of expected starts.

Played forward with nothing arriving, the forecast told most long-waiting jobs on Philly a
start that came and went: jobs submitted after them that the cycle ranks ahead (their tenant's
higher-priority jobs, tenants within their share) took the GPUs the play had given them. With
the trace's real next-day submissions in the play, nine in ten long waits start within their
band; with none, about half (docs/benchmarks.md, "Expected starts played forward").

What a cluster knows of its future submissions is its recent past. The shell (the operator, the
simulator) hands the core the jobs submitted within the last ``window`` seconds, as submitted
(shape, tenant, priority, predicted run time); :func:`expected_arrivals` expects each tenant's
submissions at each priority to go on at their steady rate over the next ``window``, spread
evenly: the rate is the median count of the window's :data:`BINS` slices, so a burst (Philly's
submissions come in bursts of hundreds) is not expected to come again. Counted as a plain mean, a
burst of one tenant's jobs an hour ago made the forecast tell the jobs behind it to wait 14 h for
a start that came after 2 h. Off by default: on Philly no setting put more long waits within
their band than expecting nothing (docs/benchmarks.md, "Expected starts with arrivals").

The forecast (:meth:`gpusched.core.admission.cycle.Cycle.forecast`) ranks each expected arrival
as the cycle would rank it: in its tenant's queue by priority then submission, so ahead of its
tenant's waiting jobs of lower priority and behind the rest; a tenant with nothing waiting
(within its share, as far as the queue shows) ahead of every waiting job. Expected arrivals
only take GPUs in the play; they are never admitted, never told a start and never shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from statistics import median
from typing import Final

from gpusched.core.admission.model import Job, JobState

WINDOW_SECONDS: Final = 12 * 3600.0
"""The window the simulator's ``gpusched-arrivals`` policy replays, and a first setting to try
for the operator's ``--forecast-arrivals-window`` (off by default)."""

BINS: Final = 12
"""Slices of the window whose median count of submissions sets the rate (hours, at 12 h)."""

MOST_ARRIVALS: Final = 2000
"""At most this many expected arrivals, the soonest first: each is one more job in the play."""

ARRIVAL_NAMESPACE: Final = "~arrival"
"""Namespace part of an expected arrival's key: not a valid namespace, so never a job's."""


def is_arrival(key: str) -> bool:
    """Whether ``key`` names an expected arrival rather than a job."""
    return key.startswith(ARRIVAL_NAMESPACE + "/")


def expected_arrivals(
    submitted: Iterable[Job], now: float, window: float, most: int = MOST_ARRIVALS
) -> tuple[Job, ...]:
    """The jobs expected to be submitted within ``window`` seconds after ``now``, from those
    ``submitted`` within the ``window`` before it (others are ignored), per tenant and priority:
    as many as the median of its :data:`BINS` slices of the window saw, times :data:`BINS`,
    spread evenly over the window ahead, shaped as its jobs in the order they came, queued.
    At most ``most``, the soonest first; none when ``window`` is not positive."""
    if window <= 0 or most <= 0:
        return ()
    groups: dict[tuple[str, int], list[Job]] = {}
    recent = (
        j for j in submitted if j.tenant is not None and now - window <= j.submitted_at <= now
    )
    for job in sorted(recent, key=lambda j: (j.submitted_at, j.key)):
        assert job.tenant is not None
        groups.setdefault((job.tenant, job.priority), []).append(job)
    out: list[Job] = []
    for (tenant, priority), jobs in sorted(groups.items()):
        count = _steady_count([j.submitted_at for j in jobs], now, window)
        step = window / count if count else 0.0
        for i in range(count):
            key = f"{ARRIVAL_NAMESPACE}/{tenant}.{priority}.{i}"
            out.append(_as_arrival(jobs[i % len(jobs)], key, now + (i + 0.5) * step))
    out.sort(key=lambda j: (j.submitted_at, j.key))
    return tuple(out[:most])


def _steady_count(times: Sequence[float], now: float, window: float) -> int:
    """Submissions the window would have seen at its steady rate: the median count of its
    :data:`BINS` slices, times :data:`BINS` (a burst fills a slice or two and moves nothing)."""
    width = window / BINS
    counts = [0] * BINS
    for at in times:
        counts[min(BINS - 1, int((now - at) / width))] += 1
    return int(median(counts) * BINS)


def _as_arrival(job: Job, key: str, at: float) -> Job:
    """``job`` submitted again at ``at``, waiting and new."""
    return replace(
        job,
        key=key,
        submitted_at=at,
        state=JobState.QUEUED,
        placement=(),
        started_at=None,
        last_checkpoint_at=None,
        not_before=None,
        reserved_for=None,
        expected_end=None,
        backfill_until=None,
        reservation=(),
        reservation_start=None,
        preemptions=0,
    )
