"""Finished jobs' run times, for predictions that survive operator restarts.

The admission core predicts run times from the :class:`~gpusched.core.runtime.RuntimeHistory`
(reservations, backfill, expected starts). The operator records every job that succeeds (its
pods' run time, from ``status.startedAt`` to ``status.finishedAt``) and keeps the history in one
ConfigMap in its own namespace, written at most once per ``save_interval`` when it changed, with
the ConfigMap's resourceVersion as precondition (only the leader writes; a write that loses a
race is retried from a fresh read). A restarted or newly elected operator loads it before its
first cycle. Failed jobs are not recorded: a crash after a minute says nothing about how long
the next run takes, and jobs stopped at their ``maxRuntimeSeconds`` say only that the limit was
too short.

A ConfigMap holds at most 1 MiB: the history keeps at most 4,096 keys (about 100 bytes each in
JSON), so it fits with room to spare.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Final

from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.core.runtime import JobKind, RuntimeHistory
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.operator.decide import Decision, job_kind

log = logging.getLogger(__name__)

#: The ConfigMap key holding the history's JSON.
DATA_KEY: Final = "history.json"
#: Default ConfigMap name: the one the chart names and grants (``<release>-operator-runtime-
#: history``) for its default release ``gpusched``, so an operator run outside the chart under
#: the chart's identity can read and write its history.
DEFAULT_NAME: Final = "gpusched-operator-runtime-history"
#: How long after a refused read of the history it is read again.
READ_RETRY_SECONDS: Final = 30.0
#: Runs kept for a history not read yet (the oldest go first: a Role that never lets the
#: history be read would otherwise grow them without end).
MAX_UNSAVED: Final = 10_000


def run_seconds(before: GpuJobStatus, after: GpuJobStatus) -> float | None:
    """The run time of a job whose status goes from ``before`` to ``after`` when that step is
    its success (None otherwise)."""
    if after.phase is not JobPhase.SUCCEEDED or before.phase is JobPhase.SUCCEEDED:
        return None
    start, end = after.started_at, after.finished_at
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


class RuntimeBook:
    """The operator's run-time history and its ConfigMap."""

    def __init__(
        self,
        api: AsyncApi,
        namespace: str,
        name: str | None = DEFAULT_NAME,
        *,
        save_interval: float = 60.0,
        read_retry: float = READ_RETRY_SECONDS,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        """The ConfigMap's name; None: the history is kept in memory only."""
        self.save_interval = save_interval
        self.read_retry = read_retry
        """Seconds after a refused read of the history before it is read again."""
        self.history = RuntimeHistory()
        self.loaded = False
        self._version: str | None = None
        self._dirty = False
        self._saved_at = 0.0
        self._recorded: dict[str, None] = {}
        """Uids of the runs recorded (bounded): a status read twice is counted once."""
        self._unsaved: list[tuple[JobKind, float]] = []
        """Runs recorded since the last write: added again on top of a history read later (a
        read refused at first, or a new leadership reading what another leader wrote)."""
        self._read_again_at = 0.0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    async def load(self) -> None:
        """Read the persisted history (an empty one when there is none).

        When the API server refuses the read (a busy server's 5xx or 429, a 403 while the
        chart's Role is still being applied), the cycles go on predicting from what this
        replica recorded itself, and the read is tried again after ``read_retry`` seconds:
        until it succeeds nothing is written, since a write would replace the persisted
        history with this replica's few runs. Runs recorded before the read are added on top
        of the history it returns."""
        if self.name is None:
            self.loaded = True
            return
        if time.monotonic() < self._read_again_at:
            return
        try:
            found = await self.api.request("GET", self.path)
        except ApiError as err:
            if err.status != 404:
                log.warning(
                    "run-time history not read (%s); predicting without it, reading again in "
                    "%.0f s",
                    err,
                    self.read_retry,
                )
                self._read_again_at = time.monotonic() + self.read_retry
                return
            found = {}
        self._version = (found.get("metadata") or {}).get("resourceVersion")
        raw = (found.get("data") or {}).get(DATA_KEY) or "{}"
        try:
            data = json.loads(raw)
        except ValueError:
            log.warning("run-time history in ConfigMap %s is not JSON; starting over", self.name)
            data = {}
        history = RuntimeHistory.from_json(data)
        for kind, seconds in self._unsaved:
            history.record(kind, seconds)
        self.history = history
        self._read_again_at = 0.0
        self.loaded = True
        log.info("run-time history: %d kinds of job loaded", len(self.history))

    def observe(self, decision: Decision) -> int:
        """Record the jobs this cycle finds succeeded; returns how many."""
        recorded = 0
        for job in decision.world.jobs:
            seconds = run_seconds(job.status, decision.final_status(job.key))
            if seconds is None or job.uid in self._recorded:
                continue
            self.record(job.uid, job_kind(job, decision.contexts[job.key].tenant), seconds)
            recorded += 1
        return recorded

    def record(self, uid: str, kind: JobKind, seconds: float) -> None:
        """One finished run (once per ``uid``)."""
        if uid in self._recorded:
            return
        self.history.record(kind, seconds)
        if self.name is not None:
            self._unsaved.append((kind, seconds))
            del self._unsaved[:-MAX_UNSAVED]
        self._remember(uid)
        self._dirty = True

    def _remember(self, uid: str) -> None:
        self._recorded[uid] = None
        while len(self._recorded) > 100_000:
            self._recorded.pop(next(iter(self._recorded)))

    def due(self) -> bool:
        return (
            self.name is not None
            and self._dirty
            and time.monotonic() - self._saved_at >= self.save_interval
        )

    async def save(self) -> bool:
        """Write the history if it changed; True when written. Conditional on the version
        read or last written; on a conflict the next save starts from a fresh read of the
        version (this history wins: only the leader records)."""
        if not self._dirty or self.name is None or not self.loaded:
            return False
        written = len(self._unsaved)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/component": "operator"},
                **({"resourceVersion": self._version} if self._version else {}),
            },
            "data": {DATA_KEY: json.dumps(self.history.to_json(), separators=(",", ":"))},
        }
        try:
            if self._version is None:
                answer = await self.api.request(
                    "POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body
                )
            else:
                answer = await self.api.request("PUT", self.path, body)
        except ApiError as err:
            if err.status in (404, 409):
                await self._refresh_version()
            log.warning("run-time history not written (%s); retrying later", err)
            self._saved_at = time.monotonic()
            return False
        self._version = (answer.get("metadata") or {}).get("resourceVersion")
        # Runs recorded while the write was in flight are written next time.
        del self._unsaved[:written]
        self._dirty = bool(self._unsaved)
        self._saved_at = time.monotonic()
        return True

    async def _refresh_version(self) -> None:
        try:
            found = await self.api.request("GET", self.path)
        except ApiError as err:
            if err.status != 404:
                # The ConfigMap exists but cannot be read (a Role naming another ConfigMap):
                # every later write would fail the same way, so say why once per attempt.
                log.warning(
                    "run-time history ConfigMap %s/%s not readable (%s): the operator needs "
                    "get and update on it (--runtime-history names it)",
                    self.namespace,
                    self.name,
                    err,
                )
            self._version = None
            return
        self._version = (found.get("metadata") or {}).get("resourceVersion")
