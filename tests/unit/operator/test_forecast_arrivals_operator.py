"""The operator's forecast expects the GpuJobs created within ``--forecast-arrivals-window``
(finished or not) to go on arriving, and every snapshot carries what its last forecast
expected (so ``explain`` plays the kept cycle forward as that forecast did)."""

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
    return World(
        now=now,
        jobs=(
            _job("done", NOW - timedelta(hours=2), "Succeeded", 2),
            _job("long-ago", NOW - timedelta(hours=20), "Succeeded", 4),
            _job("waiting", NOW - timedelta(minutes=10), "Queued", 1),
        ),
        quotas=(quota,),
        nodes=(),
        topologies={},
        priorities={},
        default_priority=0,
        pods=(),
    )


def test_jobs_created_within_the_window_finished_or_not_are_expected_again() -> None:
    memo = Memo()
    decision = decide(_world(NOW), {}, OperatorConfig(), NodeReader(), memo=memo)
    arrivals = decision.snapshot.arrivals
    assert sorted(a.total_gpus for a in arrivals) == [1, 2]  # not the job of 20 h ago
    assert all(is_arrival(a.key) and a.tenant == "team" for a in arrivals)
    # Spread over the 12 h ahead in the order they came: the 2-GPU job at 3 h, the other at 9 h.
    assert sorted(a.submitted_at - NOW.timestamp() for a in arrivals) == [3 * HOUR, 9 * HOUR]
    # Between forecasts every snapshot carries the last forecast's arrivals.
    later = decide(
        _world(NOW + timedelta(seconds=10)), {}, OperatorConfig(), NodeReader(), memo=memo
    )
    assert later.snapshot.arrivals == arrivals


def test_no_window_expects_nothing() -> None:
    config = OperatorConfig(forecast_arrivals_window=0.0)
    decision = decide(_world(NOW), {}, config, NodeReader())
    assert decision.snapshot.arrivals == ()


def test_a_decision_made_for_explain_alone_expects_them_too() -> None:
    """``gpusched explain --local`` decides once without a forecast and plays the job forward:
    with the same arrivals the operator's forecast would have."""
    decision = decide(_world(NOW), {}, OperatorConfig(), NodeReader(), forecast=False)
    assert sorted(a.total_gpus for a in decision.snapshot.arrivals) == [1, 2]
