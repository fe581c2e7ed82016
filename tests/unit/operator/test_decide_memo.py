"""What the operator's cycle keeps from one cycle to the next (``decide.Memo``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpusched.api import keys
from gpusched.core.lifecycle import JobContext, JobFacts, LifecycleConfig, Verdict
from gpusched.operator.decide import Memo

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
