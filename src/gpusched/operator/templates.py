"""Dry runs of GpuJob pods: the API server's verdict on a job's template before it is queued.

The pod dry-run is the whole pod the job would create (namespace, labels, annotations, spec), so
admission webhooks, policies, LimitRanges and field validation all have their say, and a verdict
is reused only for the same pod (see :func:`template_key`). Verdicts are remembered for a
minute. The cycle waits for the dry runs of new jobs (they go out together), so a job is decided
in the first cycle that sees it, as it would be without the check.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob
from gpusched.core.lifecycle import Verdict
from gpusched.core.lifecycle.pods import pod_manifest
from gpusched.operator.api import OperatorApi

log = logging.getLogger(__name__)

#: Seconds a verdict is reused.
VERDICT_TTL = 60.0


def dry_run_manifest(job: GpuJob, tenant: str | None) -> dict[str, Any]:
    """The pod whose dry run decides the job's template."""
    return pod_manifest(
        job, tenant=tenant or "", admission=0, replica=0, placement=None, dry_run=True
    )


#: Label values gpusched derives from the GpuJob's own name and UID: valid by construction (the
#: CRD bounds job names to valid label values), different for every job.
IDENTITY_LABELS = (keys.LABEL_JOB_NAME, keys.LABEL_JOB_UID)


def template_key(manifest: Mapping[str, Any]) -> str:
    """Verdicts are shared only by pods that are the same in everything the job's author
    controls: namespace, labels, annotations and spec. Only the values gpusched derives from
    each job's name and UID are left out (the job's own identity, valid by construction), so the
    jobs of one template, e.g. a sweep of 500, cost one dry run; an admission policy that judges
    pods by their job's name still has its say when the pods are created (a refusal there fails
    the job and drops the verdict)."""
    meta = dict(manifest["metadata"])
    meta.pop("generateName", None)
    meta["labels"] = {
        k: v for k, v in (meta.get("labels") or {}).items() if k not in IDENTITY_LABELS
    }
    shared = {**manifest, "metadata": meta}
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()


class TemplateChecker:
    """Verdicts by template key."""

    def __init__(
        self,
        api: OperatorApi,
        *,
        concurrency: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.clock = clock
        self._verdicts: dict[str, tuple[float, Verdict]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        #: Per job: the object and tenant its template key was worked out for, and the key.
        #: A burst leaves thousands of new jobs to check in every cycle until their first
        #: status is written; their keys are worked out once.
        self._keys: dict[str, tuple[GpuJob, str | None, str]] = {}

    async def verdicts(
        self, jobs: Iterable[tuple[str, GpuJob, str | None]]
    ) -> dict[str, Verdict | None]:
        """Verdicts on the pods of (key, job, tenant); dry runs for those not known, together.
        A dry run that fails gives None (that job waits for the next cycle)."""
        now = self.clock()
        self._prune(now)
        out: dict[str, Verdict | None] = {}
        todo: dict[str, tuple[Mapping[str, Any], list[str]]] = {}
        seen: dict[str, tuple[GpuJob, str | None, str]] = {}
        for key, job, tenant in jobs:
            manifest: Mapping[str, Any] | None = None
            known = self._keys.get(key)
            if known is not None and known[0] is job and known[1] == tenant:
                digest = known[2]
            else:
                manifest = dry_run_manifest(job, tenant)
                digest = template_key(manifest)
            seen[key] = (job, tenant, digest)
            found = self._verdicts.get(digest)
            if found is not None:
                out[key] = found[1]
            elif digest in todo:
                todo[digest][1].append(key)
            else:
                todo[digest] = (manifest or dry_run_manifest(job, tenant), [key])
        self._keys = seen
        answers = await asyncio.gather(*(self._dry_run(m) for m, _ in todo.values()))
        for (digest, (_, waiting)), verdict in zip(todo.items(), answers, strict=True):
            if verdict is not None:
                self._verdicts[digest] = (self.clock(), verdict)
            for key in waiting:
                out[key] = verdict
        return out

    def forget(self, job: GpuJob, tenant: str | None) -> None:
        """Check this pod again next time (its creation was refused)."""
        self._verdicts.pop(template_key(dry_run_manifest(job, tenant)), None)

    async def _dry_run(self, manifest: Mapping[str, Any]) -> Verdict | None:
        try:
            async with self._slots:
                return Verdict(await self.api.dry_run_pod(manifest))
        except Exception as err:  # the next cycle asks again
            log.warning("dry run of a pod in %s failed: %s", manifest["metadata"]["namespace"], err)
            return None

    def _prune(self, now: float) -> None:
        stale = [k for k, (at, _) in self._verdicts.items() if now - at >= VERDICT_TTL]
        for key in stale:
            del self._verdicts[key]
