"""The figures of Kueue's scheduler benchmark, computed the way its runner and checker compute
them, for either scheduler's observations.

Kueue's recorder (``test/performance/scheduler/runner/recorder``) keeps, per ClusterQueue, every
status event it sees: between two events the queue is taken to have used what the earlier event
said, so its usage is the sum of ``usage x time to the next event``; a queue class adds up its
queues' usage and nominal quotas and spans from its first queue's first event to its last
queue's last event. The checker's **usage** of a class is ``used / (nominal x span)`` in percent,
and the range spec asks a minimum of it. A workload's **time to admission** is from the first
event seen of it to the event that shows it admitted; a class's figure is the mean.

Here the same arithmetic runs on :class:`QueueEvent` and :class:`JobTimes` values, whichever
scheduler they come from (gpusched's queue is a TenantQuota, its usage ``status.usedGpus``), and
on the ``summary.yaml`` Kueue's runner writes. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_FRACTION = re.compile(r"(\.\d+)")


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time, with up to nanoseconds (Go writes nine
    digits; Python's parser takes six) and ``Z`` or an offset."""
    text = stamp.strip().replace("Z", "+00:00").replace("z", "+00:00")
    match = _FRACTION.search(text)
    if match:
        text = text[: match.start()] + match.group(1)[:7] + text[match.end() :]
    return datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class QueueEvent:
    """One observed state of a queue: Kueue's ClusterQueue status, or gpusched's TenantQuota."""

    time: float
    queue: str
    class_name: str
    #: Nominal quota (Kueue) or guarantee (gpusched), in the unit of ``usage``.
    nominal: float
    #: What the queue's admitted workloads hold, as the event says.
    usage: float


@dataclass(frozen=True)
class ClassUsage:
    """Usage of one queue class over the run."""

    #: Sum over its queues of usage x time (GPU-seconds; Kueue's summary: mCPU x ms).
    used: float
    #: Sum of its queues' nominal quotas.
    nominal: float
    first: float
    last: float

    @property
    def span(self) -> float:
        """From the class's first queue event to its last."""
        return self.last - self.first

    @property
    def percent(self) -> float | None:
        """``used / (nominal x span)`` in percent: the checker's usage; None without a span."""
        if self.nominal <= 0 or self.span <= 0:
            return None
        return 100.0 * self.used / (self.nominal * self.span)


def class_usage(events: Iterable[QueueEvent]) -> dict[str, ClassUsage]:
    """Kueue's recorder and checker over queue events (taken in time order): each queue's
    usage x time until its next event, summed per class with the classes' nominal quotas (each
    queue's last value) and span."""
    states: dict[str, tuple[QueueEvent, QueueEvent, float]] = {}  # first, latest, used
    for event in sorted(events, key=lambda e: e.time):
        found = states.get(event.queue)
        if found is None:
            states[event.queue] = (event, event, 0.0)
            continue
        first, latest, used = found
        used += latest.usage * (event.time - latest.time) if latest.usage > 0 else 0.0
        states[event.queue] = (first, event, used)
    classes: dict[str, ClassUsage] = {}
    for first, latest, used in states.values():
        name = latest.class_name
        known = classes.get(name)
        if known is None:
            classes[name] = ClassUsage(used, latest.nominal, first.time, latest.time)
        else:
            classes[name] = ClassUsage(
                known.used + used,
                known.nominal + latest.nominal,
                min(known.first, first.time),
                max(known.last, latest.time),
            )
    return classes


@dataclass(frozen=True)
class JobTimes:
    """One workload's life: when it was created, (last) admitted and finished, in seconds."""

    class_name: str
    created: float
    admitted: float | None
    finished: float | None
    evictions: int = 0


@dataclass(frozen=True)
class ClassAdmission:
    """Time to admission of one workload class."""

    count: int
    #: Workloads admitted by the end (None: the source does not say; Kueue's summary).
    admitted: int | None
    #: Mean seconds from creation to admission, over the admitted workloads.
    mean_time_to_admission: float | None
    #: Mean seconds from creation to the end, over the finished workloads.
    mean_time_to_finish: float | None
    evictions: int


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def class_admission(jobs: Iterable[JobTimes]) -> dict[str, ClassAdmission]:
    """Per class: how many, how many admitted, mean time to admission and to the end, and
    evictions. A workload never admitted is counted apart, not averaged in as zero (Kueue's
    recorder would add 0 ms for it; in a complete run there is none)."""
    by_class: dict[str, list[JobTimes]] = {}
    for job in jobs:
        by_class.setdefault(job.class_name, []).append(job)
    result = {}
    for name, members in by_class.items():
        waits = [j.admitted - j.created for j in members if j.admitted is not None]
        ends = [j.finished - j.created for j in members if j.finished is not None]
        result[name] = ClassAdmission(
            count=len(members),
            admitted=len(waits),
            mean_time_to_admission=_mean(waits),
            mean_time_to_finish=_mean(ends),
            evictions=sum(j.evictions for j in members),
        )
    return result


def kueue_summary_admission(summary: Mapping[str, Any]) -> dict[str, ClassAdmission]:
    """The workload classes of the ``summary.yaml`` Kueue's runner writes."""
    result = {}
    for name, raw in (summary.get("workloadClasses") or {}).items():
        result[name] = ClassAdmission(
            count=int(raw.get("count", 0)),
            admitted=None,
            mean_time_to_admission=int(raw.get("averageTimeToAdmissionMs", 0)) / 1000,
            mean_time_to_finish=int(raw.get("averageTimeToFinishMs", 0)) / 1000,
            evictions=int(raw.get("totalEvictions", 0)),
        )
    return result


def kueue_summary_usage(summary: Mapping[str, Any]) -> dict[str, ClassUsage]:
    """The ClusterQueue classes of Kueue's ``summary.yaml`` (``cpuUsed`` in mCPU x ms,
    ``nominalQuota`` in mCPU), in the units of :class:`ClassUsage`: GPU-seconds and GPUs."""
    result = {}
    for name, raw in (summary.get("clusterQueueClasses") or {}).items():
        result[name] = ClassUsage(
            used=int(raw.get("cpuUsed", 0)) / 1000 / 1000,
            nominal=int(raw.get("nominalQuota", 0)) / 1000,
            first=parse_time(str(raw["firstEventTime"])),
            last=parse_time(str(raw["lastEventTime"])),
        )
    return result


_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Seconds of a Go ``time.Duration`` as Go prints it (``1m35.25s``, ``15.8s``, ``250ms``)."""
    text = text.strip()
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def ratio(gpusched: float | None, kueue: float | None) -> float | None:
    """gpusched's figure over Kueue's (None when either is missing or Kueue's is 0)."""
    if gpusched is None or kueue is None or kueue == 0:
        return None
    return gpusched / kueue
