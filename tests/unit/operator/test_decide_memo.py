"""What the operator's cycle keeps from one cycle to the next (``decide.Memo``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpusched.api import keys
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.admission import Waiting, WaitReason
from gpusched.core.lifecycle import (
    JobContext,
    JobFacts,
    LifecycleConfig,
    Refusal,
    Verdict,
    tenant_map,
)
from gpusched.core.runtime import RuntimeHistory
from gpusched.operator.decide import Memo, job_contexts, job_kind
from gpusched.operator.store import World

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _job(status: dict[str, object] | None = None) -> JobFacts:
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": "train", "namespace": "team", "uid": "j", "generation": 1},
            "spec": {
                "gpusPerReplica": 4,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            **({"status": status} if status is not None else {}),
        }
    )


def test_a_new_jobs_first_settling_stands_until_its_status_is_written() -> None:
    """After a burst, thousands of new jobs wait for their first report: each is settled once
    (not again every cycle), and its submittedAt is when the operator first saw it."""
    memo, context, config = Memo(), JobContext(tenant="team", verdict=Verdict()), LifecycleConfig()
    new = _job()
    first = memo.settle(new, context, NOW, config)
    assert first.status.submitted_at == NOW
    assert memo.settle(new, context, NOW + timedelta(seconds=30), config) is first


def test_a_moved_run_time_prediction_does_not_settle_a_job_again_but_a_new_tenant_does() -> None:
    """Settling never reads the predicted run time, which moves for every waiting job of a kind
    each time one of that kind ends; anything else it reads settles the job again."""
    memo, config = Memo(), LifecycleConfig()
    new = _job()
    first = memo.settle(new, JobContext(tenant="team", verdict=Verdict()), NOW, config)
    later = NOW + timedelta(seconds=30)
    predicted = JobContext(tenant="team", verdict=Verdict(), runtime=600.0)
    assert memo.settle(new, predicted, later, config) is first
    moved = JobContext(tenant="other", verdict=Verdict(), runtime=600.0)
    again = memo.settle(new, moved, later, config)
    assert again is not first
    assert again.status.tenant == "other"


def _named(name: str, priority_class: str | None = None, gpus: int = 1) -> JobFacts:
    spec: dict[str, object] = {
        "gpusPerReplica": gpus,
        "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": name, "namespace": "team", "uid": f"u-{name}", "generation": 1},
            "spec": spec,
        }
    )


def _quota(guaranteed: int, allowed: list[str] | None = None) -> TenantQuota:
    spec: dict[str, object] = {"namespaces": ["team"], "guaranteedGpus": guaranteed}
    if allowed is not None:
        spec["allowedPriorityClasses"] = allowed
    return TenantQuota.model_validate(
        {"metadata": {"name": "team", "creationTimestamp": "2025-12-01T00:00:00Z"}, "spec": spec}
    )


def test_kept_job_contexts_are_those_worked_out_afresh_through_every_kind_of_change() -> None:
    """Between cycles a job keeps its context unless its facts, verdict, refusal, victims
    leaving, or the tables (PriorityClasses, TenantQuotas, run-time history) changed: each
    change below moves some job's context, and the kept ones must follow it."""
    jobs = [_named("a-1", "high"), _named("b-1"), _named("c-1", "low", gpus=2)]
    world = World(
        now=NOW,
        jobs=tuple(jobs),
        quotas=(_quota(8),),
        nodes=(),
        topologies={},
        priorities={"high": 100, "low": 1},
        default_priority=0,
        pods=(),
    )
    history = RuntimeHistory()
    memo = Memo()
    verdicts: dict[str, Verdict | None] = {}
    leaving: dict[str, list[str]] = {}
    until: dict[str, datetime | None] = {}
    b_key = jobs[1].key

    def changes() -> Iterator[World]:
        """Each step changes one thing from the step before."""
        now = world
        yield now  # nothing changed
        yield (now := replace(now, priorities={"high": 50, "low": 1}))
        yield (now := replace(now, default_priority=7))
        yield (now := replace(now, quotas=(_quota(8, allowed=["high"]),)))
        history.record(job_kind(jobs[2], "team"), 900.0)
        yield now
        verdicts[b_key] = Verdict(error="refused by the API server")
        yield now
        leaving[b_key] = ["victim"]
        yield now
        until[b_key] = NOW + timedelta(seconds=30)  # the victim's pods were deleted
        yield now
        until[b_key] = NOW + timedelta(seconds=60)  # and one more, with a longer grace
        yield now
        refused = Refusal(admission=jobs[0].status.admission, code=403, message="quota")
        yield (now := replace(now, refusals={(jobs[0].uid, refused.admission): refused}))
        yield (now := replace(now, jobs=(jobs[0], _named("b-1", "high"), jobs[2])))
        yield replace(now, jobs=(jobs[0], jobs[2]))

    for step, changed in enumerate(changes()):
        tenants = tenant_map(changed.quotas)
        kept = memo.job_contexts(changed, tenants, verdicts, leaving, history, until=until)
        fresh = job_contexts(changed, tenants, verdicts, leaving, history, until=until)
        assert kept == fresh, f"change {step}"
        assert list(kept) == list(fresh), f"change {step}: order"


def test_between_forecasts_a_job_that_lost_its_owner_or_every_node_keeps_no_start() -> None:
    """The last forecast told both jobs a start; since then one lost its TenantQuota and one
    every node that could hold it: the forecast would give them none, nor does the cycle in
    between (the start shown beside ``NoTenant`` would be one that cannot come)."""
    memo = Memo()
    start = NOW.timestamp() + 600
    memo.forecast = {"team/a": start, "team/b": start, "team/c": start}
    waiting = [
        Waiting("team/a", None, WaitReason.NO_TENANT, "no owner", None, None),
        Waiting("team/b", "team", WaitReason.NO_FEASIBLE_NODES, "no node", 1, None),
        Waiting("team/c", "team", WaitReason.WAITING_FOR_CAPACITY, "full", 2, None),
    ]
    merged = memo.with_forecast(waiting, 0)
    assert [w.expected_start for w in merged] == [None, None, start]
