"""Under a burst the loop cycles every few hundred milliseconds; TenantQuota status is worked out
for every tenant at most once per :data:`~gpusched.operator.loop.QUOTA_MIN_INTERVAL`, and
within it only where waiting would lose something: a TenantQuota new or changed, and the
tenants (with their parents) of a job that stopped running in this cycle, whose GPU-seconds up
to now are counted only from the status it had when the cycle began."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.api.tenantquota import TenantQuota, TenantQuotaStatus
from gpusched.core.admission import Tenant
from gpusched.core.lifecycle import JobContext, JobFacts
from gpusched.core.lifecycle.tenants import MeteredJob
from gpusched.operator.api import Refused
from gpusched.operator.decide import Decision
from gpusched.operator.loop import QUOTA_MIN_INTERVAL, AdmissionLoop
from gpusched.operator.store import Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _quota(name: str) -> TenantQuota:
    return TenantQuota.model_validate(
        {"metadata": {"name": name}, "spec": {"namespaces": [name], "guaranteedGpus": 8}}
    )


def _running(name: str, namespace: str) -> JobFacts:
    return JobFacts.from_api(
        {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": name, "namespace": namespace, "uid": name, "generation": 1},
            "spec": {
                "gpusPerReplica": 1,
                "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
            },
            "status": {"phase": "Running", "tenant": namespace},
        }
    )


@dataclass
class _World:
    now: datetime
    quotas: tuple[TenantQuota, ...]
    jobs: tuple[JobFacts, ...]


@dataclass
class _Snapshot:
    tenants: tuple[Tenant, ...]


@dataclass
class _Decision:
    """Stands for a Decision: what the rule reads of one."""

    world: _World
    snapshot: _Snapshot
    contexts: dict[str, JobContext]
    after: dict[str, JobPhase] = field(default_factory=dict)

    def final_status(self, key: str) -> GpuJobStatus:
        found = self.after.get(key)
        if found is None:
            return next(j.status for j in self.world.jobs if j.key == key)
        return GpuJobStatus(phase=found)


QUOTAS = (_quota("org"), _quota("team"), _quota("other"))
TENANTS = (Tenant("org"), Tenant("team", parent="org"), Tenant("other"))
JOBS = (_running("train", "team"), _running("serve", "other"))


def _decision(*, stopped: str | None = None) -> Decision:
    job = next((j for j in JOBS if j.name == stopped), None)
    return cast(
        Decision,
        _Decision(
            world=_World(NOW, QUOTAS, JOBS),
            snapshot=_Snapshot(TENANTS),
            contexts={j.key: JobContext(tenant=j.namespace) for j in JOBS},
            after={job.key: JobPhase.QUEUED} if job is not None else {},
        ),
    )


def _worked_out_just_now() -> AdmissionLoop:
    loop = AdmissionLoop(cast(Any, None), Store())
    loop._quotas_at = time.monotonic()
    loop._quotas_seen = {q.metadata.name or "": q for q in QUOTAS}
    return loop


def test_every_tenant_is_worked_out_once_the_interval_has_passed() -> None:
    loop = _worked_out_just_now()
    loop._quotas_at -= QUOTA_MIN_INTERVAL
    assert loop._quotas_due(_decision()) is None


def test_within_the_interval_nothing_is_worked_out_and_the_loop_wakes_when_it_is_due() -> None:
    """Whatever the cycle did: a job deleted while it ran moves its tenant's usage without any
    write of the cycle's."""
    loop = _worked_out_just_now()
    assert loop._quotas_due(_decision()) == set()
    assert loop._quota_due is not None
    assert 0 < (loop._quota_due - NOW).total_seconds() <= QUOTA_MIN_INTERVAL


def test_a_job_that_stops_running_has_its_tenant_and_parents_worked_out_at_once() -> None:
    loop = _worked_out_just_now()
    assert loop._quotas_due(_decision(stopped="train")) == {"team", "org"}
    assert loop._quotas_due(_decision(stopped="serve")) == {"other"}


def test_a_changed_tenant_quota_is_worked_out_at_once() -> None:
    loop = _worked_out_just_now()
    loop._quotas_seen["other"] = _quota("other")  # the store holds a newer object
    assert loop._quotas_due(_decision()) == {"other"}


class _Refusing:
    """The API server refusing a TenantQuota status patch (a conflict)."""

    async def patch_quota_status(self, name: str, uid: str, patch: Any) -> Refused:
        return Refused(409, "the object has been modified")


def test_runs_stopped_since_a_metering_that_was_not_written_are_kept_for_the_next() -> None:
    loop = AdmissionLoop(cast(Any, _Refusing()), Store())
    stopped = MeteredJob("team", 8, GpuJobStatus(), GpuJobStatus(), "alice", {})
    loop._quota_busy.add("team")
    asyncio.run(
        loop._write_quota("team", "u", TenantQuotaStatus(), {"gpuSeconds": 1}, unwritten=[stopped])
    )
    assert loop._carried == {"team": [stopped]}
    assert "team" not in loop._quota_busy
