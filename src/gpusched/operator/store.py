"""The operator's picture of the cluster: fed by watches (:mod:`gpusched.kubewatch`) and by what
its own writes are about to make true.

Objects are parsed once, when they arrive, into the lifecycle's facts; a cycle reads a
:class:`World` built from them without a single API call. Writes of the operator are *assumed*
before they are sent: a status being written overlays the job's status, a pod being created is
there already (Pending), a pod being deleted is already terminating. So the next cycle, which may
run while the writes are in flight and before the watch reports them, neither decides them again
nor counts their GPUs twice. When a write returns, the object it returns replaces the assumption;
when it fails, the assumption is dropped and the next cycle decides afresh.

Nothing takes an object back in time: a watch event older (by resourceVersion) than what the
store holds, e.g. the watch catching up after the operator's own write returned, is ignored, and
an object deleted stays deleted (its UID is remembered for a while), even when the answer to a
request the operator made before arrives after the watch reported the deletion.
Everything runs on the operator's event loop; no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gpusched.api.annotations import whole_number
from gpusched.api.gpujob import GpuJobStatus
from gpusched.api.networktopology import DEFAULT_NAME as NETWORK_NAME
from gpusched.api.networktopology import NetworkTopology
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle import JobFacts, PodFacts, Refusal, Unwritten, owns
from gpusched.operator.nodes import NodeView

#: Seconds the UID of a deleted object is remembered.
TOMBSTONE_SECONDS = 300.0

#: The watches a cycle needs before it may decide anything.
KINDS = (
    "gpujobs",
    "jobpods",
    "gpupods",
    "nodes",
    "nodegputopologies",
    "tenantquotas",
    "priorities",
    "networktopologies",
)


@dataclass(frozen=True)
class World:
    """Everything one cycle reads, as of one moment."""

    now: datetime
    jobs: tuple[JobFacts, ...]
    quotas: tuple[TenantQuota, ...]
    nodes: tuple[Mapping[str, Any], ...]
    topologies: Mapping[str, Mapping[str, Any]]
    priorities: Mapping[str, int]
    default_priority: int
    pods: tuple[PodFacts, ...]
    """Every pod that may hold GPUs: the pods of GpuJobs and other live GPU pods on nodes."""
    refusals: Mapping[tuple[str, int], Refusal] = field(default_factory=dict)
    """(job UID, admission) -> the API server's refusal of one of its pods."""
    network: NetworkTopology | None = None
    """The cluster's network levels (the NetworkTopology named ``default``), if any."""

    def job(self, key: str) -> JobFacts | None:
        """The job ``namespace/name``, if the world has it."""
        return next((job for job in self.jobs if job.key == key), None)


def _version(meta: Mapping[str, Any]) -> int:
    return _revision(meta.get("resourceVersion"))


def _revision(value: object) -> int:
    text = str(value or "")
    return whole_number(text) or 0


def _same_but_version(old: PodFacts | None, new: PodFacts) -> bool:
    """Whether a pod update changed nothing a cycle reads (a readiness flip, a restart count, a
    probe's time, a pending container's reason flapping between ``ErrImagePull`` and
    ``ImagePullBackOff``: only a release reads it, from the newer object kept): no cycle is
    woken."""
    return old is not None and replace(old, version=new.version, waiting=new.waiting) == new


def _pod_key(pod: PodFacts) -> tuple[str, str]:
    return pod.namespace, pod.job or ""


class Store:
    """Watch-fed facts plus the operator's assumptions (see the module docstring)."""

    def __init__(
        self,
        on_job_deleted: Callable[[JobFacts], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jobs: dict[str, JobFacts] = {}
        self.job_pods: dict[tuple[str, str], dict[str, PodFacts]] = {}
        """(namespace, job name) -> pod name -> pod (every phase)."""
        self.gpu_pods: dict[str, PodFacts] = {}
        """Live pods on nodes that hold GPUs and belong to no GpuJob."""
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.topologies: dict[str, Mapping[str, Any]] = {}
        self.quotas: dict[str, TenantQuota] = {}
        self.priorities: dict[str, tuple[int, bool]] = {}
        self.network: NetworkTopology | None = None
        self.assumed: dict[str, GpuJobStatus] = {}
        """Job key -> the status a write in flight gives it."""
        self.unwritten: dict[str, tuple[GpuJobStatus, str]] = {}
        """Job key -> an admission carried out but not written yet, and the job's
        resourceVersion it was decided on (see :class:`~gpusched.core.lifecycle.Unwritten`)."""
        self.refusals: dict[tuple[str, int], Refusal] = {}
        self.synced: set[str] = set()
        self.changed = asyncio.Event()
        """Set by every change; the admission loop waits on it."""
        self.changes = 0
        self.on_job_deleted = on_job_deleted
        self._assembled: dict[str, JobFacts] = {}
        self._clock = clock
        self._gone: dict[str, float] = {}
        """UID -> when the watch reported the object deleted."""

    # --- reading -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every watch has delivered its first list."""
        return set(KINDS) <= self.synced

    def world(self, now: datetime) -> World:
        """What a cycle decides over, as of now."""
        priorities = {name: value for name, (value, _) in self.priorities.items()}
        default = next((v for v, is_default in self.priorities.values() if is_default), 0)
        pods = [p for by_name in self.job_pods.values() for p in by_name.values()]
        pods.extend(self.gpu_pods.values())
        return World(
            now=now,
            jobs=tuple(self.job(key) for key in self.jobs),
            quotas=tuple(self.quotas.values()),
            nodes=tuple(self.nodes.values()),
            topologies=dict(self.topologies),
            priorities=priorities,
            default_priority=default,
            pods=tuple(pods),
            refusals=dict(self.refusals),
            network=self.network,
        )

    def job(self, key: str) -> JobFacts:
        """The job with its pods and any status being written."""
        assembled = self._assembled.get(key)
        if assembled is None:
            facts = self.jobs[key]
            by_name = self.job_pods.get((facts.namespace, facts.name), {})
            pods = tuple(p for p in by_name.values() if owns(facts, p))
            pending = self.unwritten.get(key)
            status = self.assumed.get(key, pending[0] if pending else facts.status)
            unwritten = Unwritten(facts.status, pending[1]) if pending else None
            assembled = replace(facts, pods=pods, status=status, unwritten=unwritten)
            self._assembled[key] = assembled
        return assembled

    def pod(self, namespace: str, job: str, name: str) -> PodFacts | None:
        return self.job_pods.get((namespace, job), {}).get(name)

    # --- deleted objects ------------------------------------------------------------------

    def _bury(self, uid: str) -> None:
        if not uid:
            return
        now = self._clock()
        self._gone[uid] = now
        if len(self._gone) > 1024:
            for old in [u for u, at in self._gone.items() if now - at > TOMBSTONE_SECONDS]:
                del self._gone[old]

    def _buried(self, uid: str) -> bool:
        return bool(uid) and uid in self._gone

    # --- change notification ------------------------------------------------------------

    def _touch(self, key: str | None = None) -> None:
        if key is not None:
            self._assembled.pop(key, None)
        self.changes += 1
        self.changed.set()

    def _touch_pods_of(self, namespace: str, job: str) -> None:
        self._touch(f"{namespace}/{job}")

    # --- GpuJobs -------------------------------------------------------------------------

    def upsert_job(self, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if self._buried(uid):
            return  # an answer to an earlier request, after the job was deleted
        old = self.jobs.get(f"{meta.get('namespace')}/{meta.get('name')}")
        if old is not None and old.uid == uid and old.version >= _version(meta):
            # The watch echoing the operator's own write (already in from its answer), or an
            # older event: nothing new, not even worth parsing.
            return
        facts = JobFacts.from_api(raw)
        if old is not None and old.uid != uid:
            # The job under this name was deleted and created again while the watch was away:
            # nothing decided for the old one (an unwritten admission, a write in flight, a
            # refusal) is the new one's.
            self._bury(old.uid)
            self._forget(old)
        elif old is not None:
            self._carry_unwritten(old, facts)
        self.jobs[facts.key] = facts
        self._touch(facts.key)

    def _carry_unwritten(self, old: JobFacts, new: JobFacts) -> None:
        """Keep an unwritten admission's write valid across a change of the job's metadata
        alone (a workload's checkpoint annotation, a label): its precondition moves to the new
        version. A change of spec (the generation), of status (another writer), or a deletion
        or a new object under the name still refuses the write, which drops the admission."""
        pending = self.unwritten.get(old.key)
        if (
            pending is not None
            and pending[1] == old.resource_version
            and new.uid == old.uid
            and new.generation == old.generation
            and not new.deleting
            and new.status == old.status
        ):
            self.unwritten[old.key] = (pending[0], new.resource_version)

    def delete_job(self, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._bury(str(meta.get("uid") or ""))
        old = self.jobs.get(key)
        if old is None or old.uid != meta.get("uid"):
            return
        del self.jobs[key]
        self._forget(old)
        self._touch(key)

    def _forget(self, old: JobFacts) -> None:
        """What the store keeps for a job besides its object, for a job that is gone."""
        self.assumed.pop(old.key, None)
        self.unwritten.pop(old.key, None)
        for refusal in [r for r in self.refusals if r[0] == old.uid]:
            del self.refusals[refusal]
        if self.on_job_deleted is not None:
            self.on_job_deleted(old)

    def replace_jobs(self, items: Iterable[Mapping[str, Any]]) -> None:
        old = self.jobs
        self.jobs = {}
        for raw in items:
            facts = JobFacts.from_api(raw)
            previous = old.get(facts.key)
            if previous is not None and previous.uid == facts.uid:
                if previous.version > facts.version:
                    facts = previous
                else:
                    self._carry_unwritten(previous, facts)
            elif previous is not None:
                self._bury(previous.uid)
                self._forget(previous)
            self.jobs[facts.key] = facts
        for key in set(old) - set(self.jobs):
            self._forget(old[key])
        self._assembled.clear()
        self.synced.add("gpujobs")
        self._touch()

    # --- pods of GpuJobs -----------------------------------------------------------------

    def upsert_job_pod(self, raw: Mapping[str, Any]) -> None:
        pod = PodFacts.from_api(raw)
        if self._buried(pod.uid):
            return
        by_name = self.job_pods.setdefault(_pod_key(pod), {})
        old = by_name.get(pod.name)
        if old is not None and old.uid == pod.uid and old.version >= pod.version:
            return
        by_name[pod.name] = pod
        if not _same_but_version(old, pod):
            self._touch_pods_of(pod.namespace, pod.job or "")

    def delete_job_pod(self, raw: Mapping[str, Any]) -> None:
        pod = PodFacts.from_api(raw)
        self._bury(pod.uid)
        by_name = self.job_pods.get(_pod_key(pod), {})
        old = by_name.get(pod.name)
        if old is None or (old.uid and pod.uid and old.uid != pod.uid):
            return
        del by_name[pod.name]
        if not by_name:
            self.job_pods.pop(_pod_key(pod), None)
        self._touch_pods_of(pod.namespace, pod.job or "")

    def replace_job_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        old = self.job_pods
        self.job_pods = {}
        for raw in items:
            pod = PodFacts.from_api(raw)
            previous = old.get(_pod_key(pod), {}).get(pod.name)
            if previous is not None and previous.uid == pod.uid and previous.version > pod.version:
                pod = previous
            self.job_pods.setdefault(_pod_key(pod), {})[pod.name] = pod
        # Pods being created keep their assumption until their create returns.
        for key, by_name in old.items():
            for name, pod in by_name.items():
                if pod.version == 0:
                    self.job_pods.setdefault(key, {}).setdefault(name, pod)
        self._assembled.clear()
        self.synced.add("jobpods")
        self._touch()

    # --- other GPU pods ------------------------------------------------------------------

    def upsert_gpu_pod(self, raw: Mapping[str, Any]) -> None:
        pod = PodFacts.from_api(raw)
        if pod.gpus > 0 and pod.node and pod.live:
            old = self.gpu_pods.get(pod.key)
            if old is not None and old.uid == pod.uid and old.version > pod.version:
                return
            self.gpu_pods[pod.key] = pod
            if not _same_but_version(old, pod):
                self._touch()
        elif self.gpu_pods.pop(pod.key, None) is not None:
            self._touch()

    def delete_gpu_pod(self, raw: Mapping[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        if self.gpu_pods.pop(f"{meta.get('namespace')}/{meta.get('name')}", None) is not None:
            self._touch()

    def replace_gpu_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.gpu_pods = {}
        for raw in items:
            pod = PodFacts.from_api(raw)
            if pod.gpus > 0 and pod.node and pod.live:
                self.gpu_pods[pod.key] = pod
        self.synced.add("gpupods")
        self._touch()

    # --- cluster objects -----------------------------------------------------------------

    def upsert_node(self, raw: Mapping[str, Any]) -> None:
        """Kept whatever changed; a cycle is woken only when what admission reads of it did
        (:class:`~gpusched.operator.nodes.NodeView`), not for a kubelet's periodic status."""
        name = raw["metadata"]["name"]
        old = self.nodes.get(name)
        self.nodes[name] = raw
        if old is None or NodeView.of(old) != NodeView.of(raw):
            self._touch()

    def delete_node(self, raw: Mapping[str, Any]) -> None:
        self.nodes.pop(raw["metadata"]["name"], None)
        self._touch()

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.nodes = {raw["metadata"]["name"]: raw for raw in items}
        self.synced.add("nodes")
        self._touch()

    def upsert_topology(self, raw: Mapping[str, Any]) -> None:
        self.topologies[raw["metadata"]["name"]] = raw
        self._touch()

    def delete_topology(self, raw: Mapping[str, Any]) -> None:
        self.topologies.pop(raw["metadata"]["name"], None)
        self._touch()

    def replace_topologies(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.topologies = {raw["metadata"]["name"]: raw for raw in items}
        self.synced.add("nodegputopologies")
        self._touch()

    def upsert_quota(self, raw: Mapping[str, Any]) -> None:
        meta = raw["metadata"]
        name = meta["name"]
        old = self.quotas.get(name)
        if (
            old is not None
            and old.metadata.uid == meta.get("uid")
            and _revision(old.metadata.resource_version) >= _version(meta)
        ):
            # The watch echoing the operator's own status write (already in from its answer),
            # or an older event: the same object, no cycle to wake.
            return
        try:
            self.quotas[name] = TenantQuota.model_validate(raw)
        except ValidationError:
            self.quotas.pop(name, None)
        self._touch()

    def delete_quota(self, raw: Mapping[str, Any]) -> None:
        self.quotas.pop(raw["metadata"]["name"], None)
        self._touch()

    def replace_quotas(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.quotas = {}
        for raw in items:
            self.upsert_quota(raw)
        self.synced.add("tenantquotas")
        self._touch()

    def upsert_network(self, raw: Mapping[str, Any]) -> None:
        if (raw.get("metadata") or {}).get("name") != NETWORK_NAME:
            return
        try:
            self.network = NetworkTopology.model_validate(raw)
        except ValidationError:
            self.network = None
        self._touch()

    def delete_network(self, raw: Mapping[str, Any]) -> None:
        if (raw.get("metadata") or {}).get("name") == NETWORK_NAME:
            self.network = None
            self._touch()

    def replace_network(self, items: Iterable[Mapping[str, Any]]) -> None:
        """The NetworkTopology list (empty too when its CRD is not installed: no levels)."""
        self.network = None
        for raw in items:
            self.upsert_network(raw)
        self.synced.add("networktopologies")
        self._touch()

    def upsert_priority(self, raw: Mapping[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name")
        if name:
            self.priorities[name] = (int(raw.get("value") or 0), bool(raw.get("globalDefault")))
            self._touch()

    def delete_priority(self, raw: Mapping[str, Any]) -> None:
        self.priorities.pop((raw.get("metadata") or {}).get("name", ""), None)
        self._touch()

    def replace_priorities(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.priorities = {}
        for raw in items:
            self.upsert_priority(raw)
        self.synced.add("priorities")
        self._touch()

    # --- the operator's own writes -------------------------------------------------------

    def assume_status(self, key: str, status: GpuJobStatus) -> None:
        """A status write is on its way."""
        self.assumed[key] = status
        self._touch(key)

    def defer_status(self, key: str, status: GpuJobStatus, resource_version: str) -> None:
        """An admission is carried out and written later (with the job's next status write)."""
        self.unwritten[key] = (status, resource_version)
        self._touch(key)

    def settle_status(
        self,
        key: str,
        status: GpuJobStatus,
        answer: Mapping[str, Any] | None,
        *,
        refused: bool = False,
    ) -> None:
        """The status write returned: the job as the server now has it (None: it failed).
        A write that landed carried any unwritten admission with it; one the API server
        refused (the job changed since the admission) drops it: the next cycle finds the
        admission's pods unrecorded, deletes them and decides the job again."""
        if self.assumed.get(key) is status:
            del self.assumed[key]
        if answer is not None or refused:
            self.unwritten.pop(key, None)
        if answer is not None and answer.get("metadata"):
            self.upsert_job(answer)
        self._touch(key)

    def assume_pod(self, manifest: Mapping[str, Any], now: datetime) -> PodFacts:
        """A pod is being created: it exists (Pending, not yet read back) from now on."""
        pod = replace(PodFacts.from_api(manifest), created=now, version=0)
        self.job_pods.setdefault(_pod_key(pod), {}).setdefault(pod.name, pod)
        self._touch_pods_of(pod.namespace, pod.job or "")
        return pod

    def settle_pod(self, assumed: PodFacts, answer: Mapping[str, Any] | None) -> None:
        """A pod create or delete returned: the pod as it is now (None: not there, or the
        request failed and the assumption goes).

        Only the assumption (never read back, version 0) is replaced: when the watch already
        delivered the pod, what it said is as new as the answer or newer (a pod that ran for a
        second can be reported succeeded before its create's answer is handled), and the
        answer counts only if its version is newer."""
        by_name = self.job_pods.get(_pod_key(assumed), {})
        if assumed.version == 0 and by_name.get(assumed.name) is assumed:
            del by_name[assumed.name]
            self._touch_pods_of(assumed.namespace, assumed.job or "")
        if answer is not None and (answer.get("metadata") or {}).get("name"):
            self.upsert_job_pod(answer)

    def assume_deleting(self, namespace: str, job: str, name: str) -> PodFacts | None:
        """A pod is being deleted: it is terminating from now on."""
        by_name = self.job_pods.get((namespace, job), {})
        pod = by_name.get(name)
        if pod is None:
            return None
        deleting = pod.with_deletion()
        by_name[name] = deleting
        self._touch_pods_of(namespace, job)
        return deleting

    def undo_deleting(self, deleting: PodFacts) -> None:
        by_name = self.job_pods.get(_pod_key(deleting), {})
        if by_name.get(deleting.name) is deleting:
            by_name[deleting.name] = replace(deleting, deleting=False)
            self._touch_pods_of(deleting.namespace, deleting.job or "")

    def forget_pod(self, namespace: str, job: str, name: str) -> None:
        """The pod is gone (a delete answered 404)."""
        by_name = self.job_pods.get((namespace, job), {})
        if by_name.pop(name, None) is not None:
            self._touch_pods_of(namespace, job)

    def record_refusal(self, job_uid: str, admission: int, refusal: Refusal) -> None:
        self.refusals[(job_uid, admission)] = refusal
        self._touch()

    def wake(self) -> None:
        """Ask for a cycle without a change (a write finished)."""
        self._touch()
