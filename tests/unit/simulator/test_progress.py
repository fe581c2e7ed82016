"""The replay's progress line: throttled on a terminal, a line per 10 % in a log."""

from __future__ import annotations

import io

from gpusched.simulator.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_terminal_redraws_one_line_at_most_four_times_a_second() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("gpusched", stream=out, tty=True, clock=clock)
    for i in range(1, 100):  # 99 events in 0.99 s: draws at 0.01, 0.26, 0.51, 0.76
        clock.now += 0.01
        p.update(3600.0 * i, i, 100, 5, 7)
    assert out.getvalue().count("\r") == 4
    assert "\n" not in out.getvalue()
    clock.now += 0.01
    p.update(86400.0 * 2, 100, 100)  # the last event is always drawn
    p.close()
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 5
    assert text.endswith("\n")
    assert text.count("\n") == 1


def test_line_shows_policy_percent_day_jobs_elapsed_and_eta() -> None:
    clock = Clock()
    p = Progress("kueue", stream=io.StringIO(), tty=True, clock=clock)
    clock.now += 30.0
    # A quarter done in 30 s: 90 s to go.
    line = p.line(1.5 * 86400, 25, 100, running=3, queued=12)
    assert line == (
        "kueue:  25.0% of 100 events, day 1.5, 3 running, 12 queued, elapsed 30s, ETA 1m30s"
    )
    assert "running" not in p.line(0.0, 25, 100)


def test_shorter_line_blanks_the_rest_of_the_longer_one() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("x", stream=out, tty=True, clock=clock)
    p.update(0.0, 1, 10, 100000, 100000)
    clock.now += 1
    p.update(0.0, 2, 10)
    first, second = out.getvalue().split("\r")[1:]
    assert len(second) == len(first)
    assert second.rstrip() == p.line(0.0, 2, 10)


def test_log_gets_a_plain_line_per_ten_percent() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("best-fit", stream=out, tty=False, clock=clock)
    for i in range(1, 1001):
        clock.now += 0.001
        p(float(i), i, 1000, 1, 2)  # called like the engine's hook
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("best-fit:  10.0% of 1000 events")
    assert lines[-1].startswith("best-fit: 100.0% of 1000 events")
