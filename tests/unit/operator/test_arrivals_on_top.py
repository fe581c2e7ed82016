"""With ``--arrivals-on-top`` the operator decides jobs that arrived shortly after a cycle that
changed nothing on top of that cycle (the core's ``Cycles``), and takes a whole cycle for a
forecast (10 s by default; 0: only within the same instant)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpusched.api import keys
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle import JobFacts
from gpusched.operator.decide import Decision, Memo, OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import World

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _job(name: str, created: datetime) -> JobFacts:
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
                "gpusPerReplica": 8,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": {"phase": "Queued", "tenant": "team"},
        }
    )


QUOTA = TenantQuota.model_validate(
    {
        "metadata": {"name": "team", "creationTimestamp": "2025-12-01T00:00:00Z"},
        "spec": {"namespaces": ["team"], "guaranteedGpus": 8},
    }
)


def _world(now: datetime, jobs: tuple[JobFacts, ...]) -> World:
    """No node offers GPUs: every job waits, and a cycle changes nothing."""
    return World(
        now=now,
        jobs=jobs,
        quotas=(QUOTA,),
        nodes=(),
        topologies={},
        priorities={},
        default_priority=0,
        pods=(),
    )


def _cycles(config: OperatorConfig) -> tuple[Memo, Decision]:
    """Four cycles a second apart, the last after one job arrived (the first one forecasts,
    and the cycles take the memo's two pools in turn)."""
    memo = Memo()
    queue = tuple(_job(f"q{i}", NOW - timedelta(minutes=10 - i)) for i in range(3))
    for second in range(3):
        world = _world(NOW + timedelta(seconds=second), queue)
        decide(world, {}, config, NodeReader(), memo=memo)
    arrived = (*queue, _job("late", NOW + timedelta(seconds=2)))
    return memo, decide(
        _world(NOW + timedelta(seconds=3), arrived), {}, config, NodeReader(), memo=memo
    )


def test_a_job_arriving_after_a_quiet_cycle_is_decided_on_top_of_it() -> None:
    memo, decision = _cycles(OperatorConfig())
    assert sum(c.extended for c in memo.pools) == 1
    fresh = decide(decision.world, {}, OperatorConfig(), NodeReader(), forecast=False)
    assert decision.result.wait_reasons == fresh.result.wait_reasons
    assert [w.message for w in decision.result.waiting] == [w.message for w in fresh.result.waiting]


def test_with_none_every_cycle_is_whole() -> None:
    memo, _ = _cycles(OperatorConfig(arrivals_on_top=0.0))
    assert sum(c.extended for c in memo.pools) == 0


def test_a_forecast_takes_a_whole_cycle() -> None:
    config = OperatorConfig(arrivals_on_top=30.0, forecast_interval=2.5)
    memo, decision = _cycles(config)
    assert sum(c.extended for c in memo.pools) == 0
    assert "team/late" in decision.forecast
