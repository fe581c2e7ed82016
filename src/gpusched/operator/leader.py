"""Leader election over a coordination.k8s.io Lease, so that of several operator replicas exactly
one decides and writes (the others keep their watch caches warm and take over when its lease
lapses).

Renewal is a task of its own, every ``duration / 5`` seconds, independent of how long an admission
cycle takes. A replica leads only while its last successful renewal is younger than
``renew_deadline`` (two thirds of the lease), judged on its own monotonic clock: it stops writing
before any other replica may take the lease over, even if the API server became unreachable
meanwhile. Every renewal is conditional on the Lease's resourceVersion, so two replicas never both
believe they hold it after the same read; another replica takes over only after seeing the lease
unchanged for its whole duration on its own clock (clocks of two machines disagree).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpusched.kubeasync import MERGE_PATCH, ApiError, AsyncApi

log = logging.getLogger(__name__)

LEASE_NAME = "gpusched-operator"


def default_identity() -> str:
    """``<hostname>-<pid>`` (the pod name in a cluster)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds or watches one Lease."""

    def __init__(
        self,
        api: AsyncApi,
        namespace: str,
        identity: str | None = None,
        *,
        name: str = LEASE_NAME,
        duration: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.name = name
        self.duration = duration
        self.renew_deadline = duration * 2 / 3
        self.retry = duration / 5
        self.clock = clock
        self._renewed_at: float | None = None
        self._observed: tuple[object, object] | None = None
        self._observed_at = 0.0
        self.changed = asyncio.Event()
        """Set when leadership is gained or lost."""
        self.holder: str | None = None
        """The Lease's holder when last read (this replica's identity while it leads)."""

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def leading(self) -> bool:
        """Whether this replica may write now."""
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline
        )

    async def run(self) -> None:
        """Acquire and renew until cancelled."""
        while True:
            was = self.leading
            await self.ensure()
            if self.leading != was:
                self.changed.set()
            await asyncio.sleep(self.retry)

    async def ensure(self) -> bool:
        """One attempt to acquire or renew; True while this replica leads. Any failure to
        reach the API server counts as not renewed (never an exception: the operator must
        survive an API server restart)."""
        started = self.clock()
        was = self.leading
        try:
            renewed: bool | None = await asyncio.wait_for(self._ensure(), self.renew_deadline)
        except Exception as err:  # connection refused, timeouts, TLS and API errors
            # Not renewed: leadership lapses on its own when the renew deadline passes.
            log.warning("lease %s/%s not renewed: %s", self.namespace, self.name, err)
            renewed = None
        if renewed:
            # The lease counts from when the request went out, not when it came back.
            self._renewed_at = started
            if not was:
                log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
        elif renewed is False:
            self._renewed_at = None  # another replica holds it
        if was and not self.leading:
            log.warning("lost the lease %s/%s", self.namespace, self.name)
        return self.leading

    def _expired(self, holder: object, renew_time: object, duration: float) -> bool:
        """Whether the holder stopped renewing, judged on this process's own clock: the time
        since this replica last saw the lease change, never the holder's timestamps."""
        record = (holder, renew_time)
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at > duration

    async def _ensure(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease = await self.api.request("GET", self.path)
        except ApiError as err:
            if err.status != 404:
                raise
            return await self._create(now)
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        self.holder = str(holder) if holder else None
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        if holder != self.identity and not self._expired(holder, renewed, duration):
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        ours = holder == self.identity
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "renewTime": _micro(now),
                "acquireTime": spec.get("acquireTime") if ours else _micro(now),
                "leaseTransitions": transitions if ours else transitions + 1,
            },
        }
        try:
            await self.api.request("PATCH", self.path, patch, content_type=MERGE_PATCH)
        except ApiError as err:
            if err.status == 409:
                log.info("lease %s/%s changed meanwhile", self.namespace, self.name)
                return False
            raise
        self.holder = self.identity
        return True

    async def _create(self, now: datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
                "leaseTransitions": 0,
            },
        }
        try:
            await self.api.request(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                body,
            )
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        self.holder = self.identity
        return True
