"""Which jobs the admission loop asks dry runs for: every job that needs one, each cycle, even
when the job needed none the cycle before (``AdmissionLoop._verdicts`` skips the same object it
found needing none, never a job that changed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob
from gpusched.core.lifecycle import JobFacts, Verdict
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.store import Store, World

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def _job(generation: int, status: dict[str, object]) -> JobFacts:
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {
                "name": "train",
                "namespace": "team",
                "uid": "u",
                "generation": generation,
            },
            "spec": {
                "gpusPerReplica": 1,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": status,
        }
    )


class _Checker:
    """Records the jobs asked about."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def verdicts(
        self, jobs: Iterable[tuple[str, GpuJob, str | None]]
    ) -> dict[str, Verdict | None]:
        keys_asked = [key for key, _, _ in jobs]
        self.asked.append(keys_asked)
        return dict.fromkeys(keys_asked, Verdict())


def _world(job: JobFacts) -> World:
    return World(
        now=NOW,
        jobs=(job,),
        quotas=(),
        nodes=(),
        topologies={},
        priorities={},
        default_priority=0,
        pods=(),
    )


def test_a_job_refused_as_invalid_is_asked_again_once_its_spec_changes() -> None:
    loop = AdmissionLoop(cast(Any, None), Store())
    checker = _Checker()
    loop.checker = cast(Any, checker)
    failed = {
        "phase": "Failed",
        "reason": "InvalidPodTemplate",
        "message": "bad label",
        "observedGeneration": 1,
    }
    refused = _job(1, failed)
    asyncio.run(loop._verdicts(_world(refused)))
    asyncio.run(loop._verdicts(_world(refused)))
    edited = _job(2, failed)  # the user fixed the template: a new generation
    asyncio.run(loop._verdicts(_world(edited)))
    assert checker.asked == [[], [], ["team/train"]]
