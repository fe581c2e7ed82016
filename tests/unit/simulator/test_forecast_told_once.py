"""The replay records only the first expected start a job is told before it ever runs, so it
plays a forecast only when some waiting job has not been told one: a forecast in which every
waiting job was told before feeds no decision and no figure."""

from __future__ import annotations

import pytest

from gpusched.core.admission import Tenant
from gpusched.core.admission.cycle import Cycle
from gpusched.simulator.engine import replay
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from tests.unit.simulator.simdata import cluster, speed, trace_job, workload

H100 = "hgx-h100-sxm-8gpu-8nic"
HOUR = 3600.0


def _plays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times of the forecasts played from now on."""
    played: list[float] = []
    forecast = Cycle.forecast

    def counted(
        self: Cycle, limit: int | None = None, *, until: str | frozenset[str] | None = None
    ) -> dict[str, float | None]:
        played.append(self.now)
        return forecast(self, limit, until=until)

    monkeypatch.setattr(Cycle, "forecast", counted)
    return played


def _replay(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], dict[str, tuple[float, float]]]:
    """Whole-node jobs of two hours, one after the other on one node: ``p`` from 0 h teaches
    the run time; ``a`` (1 h) waits before any run time is known, so is told nothing; ``b``
    (3 h) and ``c`` (3.5 h) wait behind ``a`` and are told 4 h and 6 h. When ``a`` ends, ``c``
    still waits, told already."""
    played = _plays(monkeypatch)
    tenants = (Tenant("t", guaranteed=8),)
    jobs = workload(
        trace_job("p", 0.0, 8, 2 * HOUR),
        trace_job("a", 1 * HOUR, 8, 2 * HOUR),
        trace_job("b", 3 * HOUR, 8, 2 * HOUR),
        trace_job("c", 3.5 * HOUR, 8, 2 * HOUR),
        tenants=tenants,
    )
    nodes = cluster((H100, "h1"))
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants), speed=speed)
    told = {
        j.id: (j.estimated_at, j.estimate)
        for j in result.jobs
        if j.estimated_at is not None and j.estimate is not None
    }
    return played, told


def test_each_waiting_job_is_told_its_first_expected_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, told = _replay(monkeypatch)
    assert told == {"b": (3 * HOUR, 4 * HOUR), "c": (3.5 * HOUR, 6 * HOUR)}


def test_a_forecast_is_played_only_while_a_waiting_job_was_not_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    played, _ = _replay(monkeypatch)
    # 1 h: a waits untold (and stays so: nothing is known of run times yet); 3 h and 3.5 h: b
    # and c arrive. Not at 0 h, 2 h or 6 h (nobody waits), nor at 4 h (c was told at 3.5 h).
    assert played == [1 * HOUR, 3 * HOUR, 3.5 * HOUR]


def test_a_job_that_ran_before_is_not_told_again_so_its_wait_plays_no_forecast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``x1`` borrows ``h1`` until ``y1`` takes its guarantee back at 1 h; at 2 h one of ``z``'s
    jobs ends (4 GPUs free, too few for ``x1``), with ``x1`` the only job waiting."""
    played = _plays(monkeypatch)
    tenants = (Tenant("x", guaranteed=0), Tenant("y", guaranteed=8), Tenant("z", guaranteed=8))
    jobs = workload(
        trace_job("x1", 0.0, 8, 10 * HOUR, "x"),
        trace_job("z0a", 0.0, 4, 2 * HOUR, "z"),
        trace_job("z0b", 0.0, 4, 20 * HOUR, "z"),
        trace_job("y1", 1 * HOUR, 8, 2 * HOUR, "y"),
        tenants=tenants,
    )
    nodes = cluster((H100, "h1"), (H100, "h2"))
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants), speed=speed)
    (x1,) = [j for j in result.jobs if j.id == "x1"]
    assert [a.preempted for a in x1.attempts] == [True, False]
    assert x1.estimate is None
    assert played == []


def test_forecasts_run_at_the_first_event_after_the_interval_never_on_a_wake_of_their_own() -> None:
    # Z (100 s) finishes first, so 8-GPU jobs of t have a predicted run time. A runs from 100;
    # B waits from 160. The forecast of 0 is due again at 300, but nothing happens then: the
    # policy asks for no wake-up, and B is first told at 500, when C arrives. No wake-up means
    # no cycle the events did not cause, so the decisions are those of the events alone.
    nodes = cluster(("hgx-h100-sxm-8gpu-8nic", "h100"))
    tenants = (Tenant("t", guaranteed=8),)
    jobs = workload(
        trace_job("Z", 0, 8, 100),
        trace_job("A", 100, 8, 7200),
        trace_job("B", 160, 8, 100),
        trace_job("C", 500, 8, 50),
        tenants=tenants,
    )
    result = replay(jobs, nodes, GpuschedPolicy(nodes.nodes, tenants))
    told = {j.id: j.estimated_at for j in result.jobs}
    assert told["B"] == 500
    assert told["C"] == 500
    assert {j.id: j.attempts[0].start for j in result.jobs} == {
        "Z": 0,
        "A": 100,
        "B": 7300,
        "C": 7400,
    }
