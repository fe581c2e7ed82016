"""With ``--forecast-arrivals-window`` the operator's forecast expects the GpuJobs created within
the window (finished or not) to go on arriving at their steady rate, and every snapshot carries
what its last forecast expected (so ``explain`` plays the kept cycle forward as that forecast
did). Off by default."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpusched.api import keys
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.admission.arrivals import is_arrival
from gpusched.core.lifecycle import JobFacts
from gpusched.operator.decide import Memo, OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import World

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
HOUR = 3600.0


def _job(name: str, created: datetime, phase: str, gpus: int) -> JobFacts:
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {
                "name": name,
                "namespace": "team",
                "uid": f"u-{name}",
                "generation": 1,
                "creationTimestamp": created.isoformat().replace("+00:00", "Z"),
            },
            "spec": {
                "gpusPerReplica": gpus,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": {"phase": phase, "tenant": "team"},
        }
    )


def _world(now: datetime) -> World:
    quota = TenantQuota.model_validate(
        {
            "metadata": {"name": "team", "creationTimestamp": "2025-12-01T00:00:00Z"},
            "spec": {"namespaces": ["team"], "guaranteedGpus": 8},
        }
    )
    # One job an hour over the last 12 hours, all but the last finished (1 GPU, then 2, ...),
    # and one of 20 hours ago.
    hourly = [
        _job(
            f"h{h}",
            NOW - timedelta(hours=h, minutes=1),
            "Queued" if h == 0 else "Succeeded",
            1 + h % 2,
        )
        for h in range(12)
    ]
    return World(
        now=now,
        jobs=(*hourly, _job("long-ago", NOW - timedelta(hours=20), "Succeeded", 4)),
        quotas=(quota,),
        nodes=(),
        topologies={},
        priorities={},
        default_priority=0,
        pods=(),
    )


WINDOW = OperatorConfig(forecast_arrivals_window=12 * HOUR)


def test_jobs_created_within_the_window_finished_or_not_are_expected_again() -> None:
    memo = Memo()
    decision = decide(_world(NOW), {}, WINDOW, NodeReader(), memo=memo)
    arrivals = decision.snapshot.arrivals
    assert all(is_arrival(a.key) and a.tenant == "team" for a in arrivals)
    # One an hour from half an hour on, shaped as the jobs came (the oldest, 2 GPUs, first).
    assert [a.submitted_at - NOW.timestamp() for a in arrivals] == [
        (h + 0.5) * HOUR for h in range(12)
    ]
    assert [a.total_gpus for a in arrivals] == [2, 1] * 6
    # Between forecasts every snapshot carries the last forecast's arrivals.
    later = decide(_world(NOW + timedelta(seconds=10)), {}, WINDOW, NodeReader(), memo=memo)
    assert later.snapshot.arrivals == arrivals


def test_by_default_nothing_is_expected() -> None:
    decision = decide(_world(NOW), {}, OperatorConfig(), NodeReader())
    assert decision.snapshot.arrivals == ()


def test_a_decision_made_for_explain_alone_expects_them_too() -> None:
    """``gpusched explain --local`` decides once without a forecast and plays the job forward:
    with the same arrivals the operator's forecast would have."""
    decision = decide(_world(NOW), {}, WINDOW, NodeReader(), forecast=False)
    assert len(decision.snapshot.arrivals) == 12
