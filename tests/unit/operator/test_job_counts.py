"""The queue gauges kept per job (``gpusched.operator.counts``) follow a tenant's queue as it
changes: its oldest wait moves on when the oldest job starts, and a job deleted leaves every
count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from gpusched.api import keys
from gpusched.core.lifecycle import JobContext, JobFacts, Settled
from gpusched.operator.counts import JobCounts
from gpusched.operator.decide import Decision

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _job(name: str, phase: str, waited_minutes: int) -> JobFacts:
    submitted = (NOW - timedelta(minutes=waited_minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": name, "namespace": "team", "uid": f"u-{name}", "generation": 1},
            "spec": {
                "gpusPerReplica": 2,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": {"phase": phase, "tenant": "team", "submittedAt": submitted},
        }
    )


CONTEXT = JobContext(tenant="team")


def _decision(*jobs: JobFacts) -> Decision:
    """What :meth:`JobCounts.update` reads of a decision."""
    fields: dict[str, Any] = {
        "world": SimpleNamespace(jobs=jobs, now=NOW),
        "final": {},
        "settled": {job.key: Settled(job.key, job.status) for job in jobs},
        "contexts": dict.fromkeys((job.key for job in jobs), CONTEXT),
    }
    return cast(Decision, SimpleNamespace(**fields))


def test_the_oldest_wait_moves_on_when_the_oldest_job_starts() -> None:
    counts = JobCounts()
    first, second = _job("first", "Queued", 30), _job("second", "Queued", 10)
    counts.update(_decision(first, second))
    assert counts.oldest_wait(["team"], NOW) == {"team": 30 * 60.0}
    counts.update(_decision(_job("first", "Running", 30), second))
    assert counts.oldest_wait(["team"], NOW) == {"team": 10 * 60.0}
    assert counts.pending(["team"]) == {"team": 2.0}
    assert counts.phases == {("team", "Running"): 1, ("team", "Queued"): 1}


def test_a_deleted_job_leaves_every_count() -> None:
    counts = JobCounts()
    first, second = _job("first", "Queued", 30), _job("second", "Queued", 10)
    counts.update(_decision(first, second))
    counts.update(_decision(second))
    assert counts.oldest_wait(["team"], NOW) == {"team": 10 * 60.0}
    assert counts.pending(["team"]) == {"team": 2.0}
    counts.update(_decision())
    assert counts.oldest_wait(["team"], NOW) == {"team": 0.0}
    assert counts.pending(["team"]) == {"team": 0.0}
    assert not counts.phases


def test_a_job_queued_since_longer_ago_than_the_others_becomes_the_oldest() -> None:
    """A job read for the first time may have waited longer than the queue counted so far
    (the operator restarted, or its watch delivered it late)."""
    counts = JobCounts()
    second = _job("second", "Queued", 10)
    counts.update(_decision(second))
    assert counts.oldest_wait(["team"], NOW) == {"team": 10 * 60.0}
    counts.update(_decision(_job("first", "Queued", 30), second))
    assert counts.oldest_wait(["team"], NOW) == {"team": 30 * 60.0}
