"""The figures of Kueue's benchmark, against values worked out by hand (the arithmetic of Kueue's
recorder and checker: usage x time between a queue's status events; mean time to admission)."""

from __future__ import annotations

import pytest

from gpusched.dev.bench.kueue_stats import (
    JobTimes,
    QueueEvent,
    class_admission,
    class_usage,
    kueue_summary_admission,
    kueue_summary_usage,
    parse_go_duration,
    parse_time,
    ratio,
)

#: 2026-01-01T00:00:00Z: 56 years after 1970 with 14 leap days, 20,454 days of 86,400 s.
NEW_YEAR = 1_767_225_600.0


def _event(t: float, queue: str, usage: float, class_name: str = "cq") -> QueueEvent:
    return QueueEvent(time=t, queue=queue, class_name=class_name, nominal=4, usage=usage)


def test_usage_integrates_each_queue_between_its_events() -> None:
    events = [
        # Queue a: 0 until 10, 4 until 20, 2 until 30: 0 + 40 + 20 = 60 GPU-s.
        _event(20, "a", 2),
        _event(0, "a", 0),
        _event(30, "a", 0),
        _event(10, "a", 4),
        # Queue b: 4 from 15 to 25: 40 GPU-s.
        _event(5, "b", 0),
        _event(15, "b", 4),
        _event(25, "b", 0),
        # Another class with a single event: no span.
        _event(12, "c", 3, class_name="other"),
    ]
    usage = class_usage(events)
    cq = usage["cq"]
    assert cq.used == pytest.approx(100)
    assert cq.nominal == 8
    assert (cq.first, cq.last, cq.span) == (0, 30, 30)
    # 100 GPU-s of 8 GPUs x 30 s.
    assert cq.percent == pytest.approx(100 * 100 / 240)
    assert usage["other"].percent is None


def test_time_to_admission_is_the_mean_over_admitted_workloads() -> None:
    jobs = [
        JobTimes("small", created=0, admitted=2, finished=3),
        JobTimes("small", created=1, admitted=7, finished=8),
        JobTimes("small", created=2, admitted=None, finished=None),
        JobTimes("large", created=10, admitted=10.5, finished=12, evictions=2),
    ]
    figures = class_admission(jobs)
    small = figures["small"]
    assert (small.count, small.admitted) == (3, 2)
    assert small.mean_time_to_admission == pytest.approx((2 + 6) / 2)
    assert small.mean_time_to_finish == pytest.approx((3 + 7) / 2)
    assert small.evictions == 0
    large = figures["large"]
    assert large.mean_time_to_admission == pytest.approx(0.5)
    assert large.mean_time_to_finish == pytest.approx(2)
    assert large.evictions == 2


def test_kueue_summary_read_as_its_checker_reads_it() -> None:
    summary = {
        "clusterQueueClasses": {
            "cq": {
                # 50 % of 40 CPUs over 100.5 s: 0.5 x 40,000 mCPU x 100,500 ms.
                "cpuUsed": 2_010_000_000,
                "cpuAverageUsage": 20000,
                "nominalQuota": 40000,
                "firstEventTime": "2026-01-01T00:00:00Z",
                "lastEventTime": "2026-01-01T00:01:40.5Z",
            }
        },
        "workloadClasses": {
            "large": {
                "count": 250,
                "totalEvictions": 3,
                "averageTimeToAdmissionMs": 16501,
                "averageTimeToFinishMs": 17600,
            }
        },
        "droppedWorkloadEvents": 0,
    }
    usage = kueue_summary_usage(summary)["cq"]
    assert usage.used == pytest.approx(2010)
    assert usage.nominal == pytest.approx(40)
    assert usage.span == pytest.approx(100.5)
    assert usage.percent == pytest.approx(50.0)
    large = kueue_summary_admission(summary)["large"]
    assert (large.count, large.evictions, large.admitted) == (250, 3, None)
    assert large.mean_time_to_admission == pytest.approx(16.501)
    assert large.mean_time_to_finish == pytest.approx(17.6)


def test_times_with_nanoseconds_and_offsets() -> None:
    assert parse_time("2026-01-01T00:00:00Z") == NEW_YEAR
    # Compared as offsets from the new year: a relative tolerance at 1.7e9 s would hide seconds.
    assert parse_time("2026-01-01T00:00:01.123456789Z") - NEW_YEAR == pytest.approx(
        1.123456, abs=1e-6
    )
    assert parse_time("2026-01-01T02:00:00.5+02:00") - NEW_YEAR == pytest.approx(0.5, abs=1e-6)


def test_ratio() -> None:
    assert ratio(2, 4) == pytest.approx(0.5)
    assert ratio(None, 4) is None
    assert ratio(3, 0) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15.802118135s", 15.802118135), ("1m35.5s", 95.5), ("2h0m1s", 7201), ("250ms", 0.25)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


def test_a_go_duration_with_anything_else_is_refused() -> None:
    with pytest.raises(ValueError, match="Go duration"):
        parse_go_duration("15s and more")
