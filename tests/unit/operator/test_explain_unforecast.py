"""The operator's ``explain`` answer for a waiting job its last forecast gave no start for its
current wait (queued since that forecast, new or back from a preemption, or beyond the jobs the
forecast covers): the start played forward for that job alone over the cycle's snapshot, and
why, instead of "not forecast yet"; the operator's own decision and forecast unchanged.

Two nodes of 8 GPUs, both held by 8-GPU jobs that declared their run times: ``a`` on n0 ends
at NOW + 3,000 s, ``b`` on n1 at NOW + 6,600 s (started 600 s ago, 3,600 s and 7,200 s). An
8-GPU job waiting first in line starts when ``a`` ends; one behind it when ``b`` ends."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any, cast

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gpusched.api.tenantquota import TenantQuota
from gpusched.core.admission.explain import Explanation
from gpusched.core.lifecycle import JobFacts
from gpusched.metrics import OperatorMetrics
from gpusched.operator.answers import AnswerServer
from gpusched.operator.decide import Decision, Memo, OperatorConfig, decide
from gpusched.operator.explainer import render
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store, World
from tests.unit.core.lifecycle_testdata import NOW, job, pod, stamp, with_pods
from tests.unit.operator.node_testdata import h100_node, h100_topology

QUOTA = TenantQuota.model_validate(
    {
        "metadata": {"name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"namespaces": ["ns"], "guaranteedGpus": 16},
    }
)
STARTED = NOW - timedelta(seconds=600)
A_ENDS = (NOW + timedelta(seconds=3000)).timestamp()
B_ENDS = (NOW + timedelta(seconds=6600)).timestamp()


def _condition(type_: str, value: str, reason: str, at: datetime) -> dict[str, Any]:
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": reason,
        "lastTransitionTime": stamp(at),
    }


def _running(name: str, node: str, runtime: int) -> JobFacts:
    status = {
        "phase": "Running",
        "tenant": "t",
        "admission": 1,
        "submittedAt": stamp(STARTED - timedelta(minutes=1)),
        "admittedAt": stamp(STARTED),
        "startedAt": stamp(STARTED),
        "placement": [{"replica": 0, "node": node, "gpuIndices": list(range(8))}],
        "conditions": [
            _condition("QuotaReserved", "True", "WithinGuarantee", STARTED),
            _condition("Admitted", "True", "Placed", STARTED),
            _condition("PodsReady", "True", "Running", STARTED),
        ],
    }
    facts = job(name, replicas=1, gpus=8, status=status, maxRuntimeSeconds=runtime)
    return with_pods(facts, pod(facts, 0, node=node, created=STARTED))


def _waiting(
    name: str, since: datetime, created: datetime | None = None, **status: Any
) -> JobFacts:
    """An 8-GPU job created at ``created`` (default ``since``: its place in line) and queued
    since ``since`` (its QuotaReserved condition turned False then)."""
    raw = job(name, replicas=1, gpus=8, maxRuntimeSeconds=36_000).job
    assert raw is not None
    manifest = raw.to_k8s()
    manifest["metadata"]["creationTimestamp"] = stamp(created or since)
    if status.get("phase") == "Suspended":
        manifest["spec"]["suspend"] = True
    manifest["status"] = {
        "phase": "Queued",
        "tenant": "t",
        "submittedAt": stamp(created or since),
        "reason": "WaitingForCapacity",
        "conditions": [_condition("QuotaReserved", "False", "WaitingForCapacity", since)],
        **status,
    }
    return JobFacts.from_api(manifest)


def _world(now: datetime, *waiting: JobFacts) -> World:
    return World(
        now=now,
        jobs=(_running("a", "n0", 3600), _running("b", "n1", 7200), *waiting),
        quotas=(QUOTA,),
        nodes=(h100_node("n0"), h100_node("n1")),
        topologies={n: h100_topology(n) for n in ("n0", "n1")},
        priorities={},
        default_priority=0,
        pods=(),
    )


def _ask(decision: Decision, name: str, *, sooner: bool = False) -> dict[str, Any]:
    """The operator's HTTP answer on ``ns/name`` from ``decision`` as its last cycle (with
    ``sooner``: the slower answer, which plays a job's start forward when it must)."""
    loop = AdmissionLoop(cast(Any, None), Store())
    loop._pool_owner[decision.pool] = loop.last = decision
    server = AnswerServer(loop, OperatorMetrics(), 0)

    async def ask() -> web.Response:
        request = make_mocked_request(
            "GET",
            f"/explain/ns/{name}" + ("/sooner" if sooner else ""),
            match_info={"namespace": "ns", "name": name},
        )
        return await (server._sooner if sooner else server._explain)(request)

    response = asyncio.run(ask())
    assert response.status == 200
    assert isinstance(response.body, bytes)
    body: dict[str, Any] = json.loads(response.body)
    return body


def _lines(answer: dict[str, Any], later: dict[str, Any] | None = None) -> list[str]:
    """What the CLI prints of ``answer``, with the played start of the slower answer ``later``
    put in as the CLI puts it in."""
    e = Explanation.from_dict(answer["explanation"])
    if later is not None and later.get("playedBecause"):
        e.expected_start = later["expectedStart"]
        e.forecast_at = later["forecastAt"]
        e.played_because = later["playedBecause"]
        e.unforecast = None
    return render(e, answer["status"])


def test_a_job_queued_since_the_last_forecast_gets_the_start_played_for_it() -> None:
    """Forecast 30 s ago, before ``back`` was queued again (after a preemption, 5 s ago): the
    answer plays it forward now, first in line for n0 when ``a`` ends, and says why."""
    memo = Memo()
    decide(_world(NOW - timedelta(seconds=30)), {}, OperatorConfig(), NodeReader(), memo=memo)
    back = _waiting(
        "back",
        NOW - timedelta(seconds=5),
        NOW - timedelta(hours=1),
        reason="Requeued",
        admission=1,
        admittedAt=stamp(NOW - timedelta(minutes=5)),
        preemptionCount=1,
    )
    decision = decide(_world(NOW, back), {}, OperatorConfig(), NodeReader(), memo=memo)
    assert decision.forecast_at == NOW - timedelta(seconds=30)  # no forecast of its own
    [told] = [w for w in decision.result.waiting if w.job == "ns/back"]

    # The quick answer plays nothing (milliseconds at any scale) and says why it has no start.
    quick = _ask(decision, "back")
    assert quick["explanation"]["expected_start"] is None
    assert "before it was queued" in quick["explanation"]["unforecast"]
    [told_line] = [x for x in _lines(quick) if "expected start" in x]
    assert "not worked out in this answer" in told_line
    # The slower one (asked with the change that would start it sooner) plays it forward.
    later = _ask(decision, "back", sooner=True)
    assert later["expectedStart"] == A_ENDS
    assert "before it was queued" in later["playedBecause"]
    [line, basis] = [x for x in _lines(quick, later) if "expected start" in x or "played" in x]
    assert "(in about 50 min)" in line
    assert "played forward now for this job alone" in basis
    # The operator's decision and what it writes stay those of its last forecast.
    assert told.expected_start is None
    assert decision.result.waiting_of("ns/back") is told
    assert "ns/back" not in decision.forecast


def test_a_job_beyond_the_jobs_the_forecast_covers_gets_the_start_played_for_it() -> None:
    """The forecast covers one waiting job: ``first`` (ahead in line) gets n0 when ``a``
    ends; ``second`` had none, and is played behind ``first``: n1, when ``b`` ends."""
    first = _waiting("first", NOW - timedelta(minutes=20))
    second = _waiting("second", NOW - timedelta(minutes=10))
    config = OperatorConfig(forecast_limit=1)
    decision = decide(_world(NOW, first, second), {}, config, NodeReader(), forecast=True)
    assert decision.forecast["ns/first"] == A_ENDS
    assert "ns/second" not in decision.forecast

    assert _ask(decision, "first", sooner=True)["playedBecause"] is None
    assert _ask(decision, "first")["explanation"]["unforecast"] is None
    quick = _ask(decision, "second")
    assert "did not cover it" in quick["explanation"]["unforecast"]
    later = _ask(decision, "second", sooner=True)
    assert later["expectedStart"] == B_ENDS
    assert "did not cover it" in later["playedBecause"]
    assert "the first 1 in admission order" in later["playedBecause"]
    assert not any("not forecast yet" in x for x in _lines(quick, later))


def test_a_job_queued_again_since_the_forecast_of_its_earlier_wait_is_played_again() -> None:
    """``back`` waited at the last forecast (first in line: a start when ``a`` ends), then ran
    briefly and was preempted 5 s ago; ``early``, created before it and suspended then, was
    resumed meanwhile. The forecast's start is that of the earlier wait; the answer plays the
    current one: behind ``early``, when ``b`` ends."""
    memo = Memo()
    created = NOW - timedelta(minutes=30)
    suspended = _waiting("early", NOW - timedelta(minutes=40), phase="Suspended")
    world = _world(NOW - timedelta(seconds=30), _waiting("back", created), suspended)
    assert decide(world, {}, OperatorConfig(), NodeReader(), memo=memo).forecast == {
        "ns/back": A_ENDS
    }
    back = _waiting(
        "back",
        NOW - timedelta(seconds=5),
        created,
        reason="Requeued",
        admission=1,
        admittedAt=stamp(NOW - timedelta(seconds=20)),
        preemptionCount=1,
    )
    early = _waiting("early", NOW - timedelta(minutes=40))  # resumed: ahead of ``back``
    decision = decide(_world(NOW, back, early), {}, OperatorConfig(), NodeReader(), memo=memo)
    assert decision.forecast_at == NOW - timedelta(seconds=30)
    # What the operator writes into its status is not the earlier wait's start either: none
    # until its next forecast.
    [told] = [w for w in decision.result.waiting if w.job == "ns/back"]
    assert told.expected_start is None

    later = _ask(decision, "back", sooner=True)
    assert later["expectedStart"] == B_ENDS
    assert "an earlier wait" in later["playedBecause"]


def test_a_job_that_was_not_waiting_for_gpus_at_the_forecast_is_not_said_beyond_its_limit() -> None:
    """Its wait's record began before the forecast (a preemption's pods still leaving, a dry
    run pending), yet the forecast, far from its limit, did not cover it: the answer does not
    blame the limit."""
    memo = Memo()
    decide(_world(NOW - timedelta(seconds=30)), {}, OperatorConfig(), NodeReader(), memo=memo)
    back = _waiting("back", NOW - timedelta(seconds=60), reason="Requeued")
    decision = decide(_world(NOW, back), {}, OperatorConfig(), NodeReader(), memo=memo)
    why = _ask(decision, "back")["explanation"]["unforecast"]
    assert "did not wait for GPUs yet" in why
    assert "admission order" not in why
