"""Leader election over a coordination.k8s.io Lease, so that of several operator replicas exactly
one runs admission cycles (the others keep watching and take over when its lease lapses).

The holder renews the lease every ``renew`` seconds; a lease not renewed for ``duration`` seconds
may be taken by another replica. Every write is conditional on the lease's resourceVersion, so two
replicas never both believe they hold it after the same read.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched.kube import body as kube_body

log = logging.getLogger(__name__)

LEASE_NAME = "gpusched-operator"


def default_identity() -> str:
    """``<hostname>-<pid>`` (the pod name in a cluster)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


class LeaderElector:
    """Holds or watches one Lease."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        identity: str | None = None,
        *,
        name: str = LEASE_NAME,
        duration: float = 15.0,
    ) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.name = name
        self.duration = duration
        self.leading = False
        self._observed: tuple[object, object] | None = None
        self._observed_at = 0.0

    def ensure(self) -> bool:
        """Acquire or renew the lease; True while this replica leads. Any failure to reach the
        API server means not leading (never an exception: the loop must survive an API server
        restart)."""
        try:
            return self._ensure()
        except Exception as err:  # connection refused, timeouts, TLS errors, API errors
            log.warning("lease %s/%s unreachable: %s", self.namespace, self.name, err)
            return self._lost()

    def _expired(self, holder: object, renew_time: object, duration: float) -> bool:
        """Whether the holder stopped renewing, judged on this process's own clock: the time
        since this replica last saw the lease change, never the holder's timestamps (clocks of
        two machines disagree)."""
        record = (holder, renew_time)
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at > duration

    def _ensure(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                log.warning("lease %s/%s unreadable: %s", self.namespace, self.name, err.reason)
                return self._lost()
            return self._create(now)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        duration = float(spec.lease_duration_seconds or self.duration)
        expired = self._expired(holder, spec.renew_time or spec.acquire_time, duration)
        if holder != self.identity and not expired:
            return self._lost()
        transitions = int(spec.lease_transitions or 0)
        acquired = _parse(spec.acquire_time) if holder == self.identity else None
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": _micro(now),
            "acquireTime": _micro(acquired or now),
            "leaseTransitions": transitions if holder == self.identity else transitions + 1,
        }
        version = lease.metadata.resource_version if lease.metadata else None
        patch = {"metadata": {"resourceVersion": version}, "spec": new_spec}
        try:
            self.coordination.patch_namespaced_lease(self.name, self.namespace, patch)
        except ApiException as err:
            log.info("lease %s/%s not renewed: %s", self.namespace, self.name, err.reason)
            return self._lost()
        if not self.leading:
            log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading = True
        return True

    def _create(self, now: datetime) -> bool:
        body = {
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
            self.coordination.create_namespaced_lease(self.namespace, kube_body(body))
        except ApiException as err:
            log.info("lease %s/%s not created: %s", self.namespace, self.name, err.reason)
            return self._lost()
        log.info("leading as %s (new lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading = True
        return True

    def _lost(self) -> bool:
        if self.leading:
            log.warning("lost the lease %s/%s", self.namespace, self.name)
        self.leading = False
        return False
