"""Which of a cycle's groups the executor starts: decisions always, waiting jobs' reports only
as far as the bound on reports in flight allows."""

from __future__ import annotations

from gpusched.core.lifecycle import Event, Group, Stage, Step, Urgency
from gpusched.operator.executor import startable


def _group(job: str, urgency: Urgency) -> Group:
    event = Event({"kind": "GpuJob", "name": job}, "Queued", "waits", False)
    return Group(frozenset({job}), (Step(Stage.SETTLE, (event,)),), urgency)


def test_reports_beyond_the_bound_wait_and_decisions_never_do() -> None:
    groups = [
        _group("r1", Urgency.REPORT),
        _group("a1", Urgency.DECIDE),
        _group("r2", Urgency.REPORT),
        _group("s1", Urgency.SETTLE),
        _group("r3", Urgency.REPORT),
        _group("a2", Urgency.DECIDE),
    ]
    chosen, deferred = startable(groups, set(), reports=2)
    assert [min(g.jobs) for g in chosen] == ["r1", "a1", "r2", "s1", "a2"]
    assert deferred == 1
    chosen, deferred = startable(groups, set(), reports=0)
    assert [min(g.jobs) for g in chosen] == ["a1", "s1", "a2"]
    assert deferred == 3


def test_groups_of_busy_jobs_and_empty_groups_are_not_started_nor_counted() -> None:
    groups = [
        _group("r1", Urgency.REPORT),
        _group("r2", Urgency.REPORT),
        Group(frozenset({"e"}), (), Urgency.DECIDE),
        _group("a1", Urgency.DECIDE),
    ]
    chosen, deferred = startable(groups, {"r1", "a1"}, reports=1)
    assert [min(g.jobs) for g in chosen] == ["r2"]
    assert deferred == 0
