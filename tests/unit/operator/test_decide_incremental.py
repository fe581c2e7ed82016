"""A cycle's stages around the admission core (settling, the snapshot's tables, the forecast's
starts, the plan) and the queue gauges after it look again only at the jobs whose objects
changed: over generated histories played through the operator's store, every decision made with
the memo kept from cycle to cycle is the decision a memo that starts empty makes of the same
world, and the gauges kept per job are those counted over every job."""

from __future__ import annotations

import copy
import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpusched.api import keys
from gpusched.api.gpujob import JobPhase
from gpusched.core.lifecycle import (
    CreatePod,
    DeletePod,
    Plan,
    QuietJob,
    Refresh,
    Refusal,
    Verdict,
    WriteStatus,
    leaving_victims,
    plan,
)
from gpusched.core.lifecycle.settle import needs_validation
from gpusched.core.runtime import RuntimeHistory
from gpusched.dev.bench.admission import Workload, build_snapshot
from gpusched.dev.bench.operator_cycle import NOW, _job_object, load_store
from gpusched.operator.counts import JobCounts, queued_since
from gpusched.operator.decide import Decision, Memo, OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store, World

#: Cycles kept for up to five minutes while nothing but time and arrivals changes (the
#: longest ``--arrivals-on-top``): the plan's quiet jobs then meet the clock. Reservations
#: on: their starts are shown too.
CONFIG = OperatorConfig(max_preemption_searches=8, arrivals_on_top=300.0, reservations_per_tenant=1)

#: Tenants of the generated worlds (``build_snapshot`` names them so).
TENANTS = ("tenant-00", "tenant-01", "tenant-02")


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _store(seed: int) -> Store:
    """A small busy cluster, every job with a declared run time (so that running jobs have
    expected ends and waiting jobs expected starts)."""
    snapshot = build_snapshot(Workload(nodes=8, tenants=3, queued=24, fill=0.7), seed)
    kinds = {
        n.name: ("count" if n.count_only else "nvswitch" if n.model == "H100" else "dgx1")
        for n in snapshot.nodes
    }
    store = load_store(snapshot, kinds)
    rng = random.Random(seed)
    raws = [_job_object(job, i) for i, job in enumerate(snapshot.jobs)]
    for raw in raws:
        raw["spec"]["maxRuntimeSeconds"] = rng.choice([600, 3_600, 40_000])
    store.replace_jobs(raws)
    return store


def _arrival(rng: random.Random, index: int, now: datetime) -> dict[str, Any]:
    tenant = rng.choice(TENANTS)
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {
            "name": f"new-{index}",
            "namespace": tenant,
            "uid": f"new-uid-{index}",
            "generation": 1,
            "resourceVersion": str(10**8 + index),
            "creationTimestamp": _stamp(now),
        },
        "spec": {
            "replicas": 1,
            "gpusPerReplica": rng.choice([1, 2, 4, 8]),
            "topology": {"scope": rng.choice(["node", "nvlink"]), "mode": "preferred"},
            "priorityClassName": f"p{rng.randrange(4)}",
            "maxRuntimeSeconds": rng.choice([300, 3_600]),
            "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
        },
    }


def _running(manifest: dict[str, Any], uid: str, version: int) -> dict[str, Any]:
    """The pod as the watch reports it once bound and running on its planned GPUs."""
    raw = copy.deepcopy(manifest)
    annotations = raw["metadata"].setdefault("annotations", {})
    raw["metadata"].update(uid=uid, resourceVersion=str(version), creationTimestamp=_stamp(NOW))
    annotations[keys.ANNOTATION_GPU_INDICES] = annotations.get(
        keys.ANNOTATION_PLANNED_GPU_INDICES, ""
    )
    raw["spec"]["nodeName"] = annotations.get(keys.ANNOTATION_PLANNED_NODE)
    raw["status"] = {"phase": "Running"}
    return raw


class _History:
    """Plays a decision's writes into the store, then changes the world at random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.store = _store(seed)
        self.now = NOW
        self.version = 10**9
        self.created: list[dict[str, Any]] = []
        self.arrivals = 0
        self.verdicts: dict[str, Verdict | None] = {}

    def land(self, decision: Decision) -> None:
        store = self.store
        for group in decision.plan.groups:
            for action in group.actions():
                if isinstance(action, WriteStatus):
                    if action.deferred:
                        store.defer_status(action.key, action.status, action.resource_version or "")
                    else:
                        store.assume_status(action.key, action.status)
                elif isinstance(action, CreatePod):
                    store.assume_pod(action.manifest, self.now)
                    self.created.append(dict(action.manifest))
                elif isinstance(action, DeletePod) and self.rng.random() < 0.7:
                    store.assume_deleting(action.namespace, _job_of(store, action), action.name)

    def change(self) -> None:
        rng, store = self.rng, self.store
        self.now += timedelta(seconds=rng.choice([0, 1, 3, 5, 8, 20, 70, 400]))
        if rng.random() < 0.4:
            return  # only time passes
        for _ in range(rng.choice([0, 0, 1, 3])):
            store.upsert_job(_arrival(rng, self.arrivals, self.now))
            self.arrivals += 1
        # Pods created run, on the GPUs planned for them.
        while self.created and rng.random() < 0.6:
            manifest = self.created.pop(rng.randrange(len(self.created)))
            self.version += 1
            store.upsert_job_pod(_running(manifest, f"pod-{self.version}", self.version))
        pods = [p for by_name in store.job_pods.values() for p in by_name.values()]
        for pod in pods:
            if pod.deleting and rng.random() < 0.5:
                # A victim's pod ends its grace period: its preemptor's GPUs are free.
                store.delete_job_pod(
                    {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}
                )
        pods = [p for by_name in store.job_pods.values() for p in by_name.values()]
        for pod in rng.sample(pods, min(len(pods), rng.choice([0, 0, 1, 2]))):
            self.version += 1
            if pod.deleting or rng.random() < 0.5:
                store.delete_job_pod(
                    {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}
                )
            else:
                # A job's pod finishes.
                store.upsert_job_pod(
                    {
                        "metadata": {
                            "name": pod.name,
                            "namespace": pod.namespace,
                            "uid": pod.uid,
                            "resourceVersion": str(self.version),
                            "labels": {
                                keys.LABEL_JOB_NAME: pod.job or "",
                                keys.LABEL_JOB_UID: pod.job_uid or "",
                                keys.LABEL_ADMISSION: str(pod.admission or 0),
                                keys.LABEL_REPLICA_INDEX: str(pod.replica or 0),
                            },
                        },
                        "spec": {"nodeName": pod.node},
                        "status": {"phase": "Succeeded"},
                    }
                )
        if rng.random() < 0.05 and store.jobs:
            gone = store.jobs[rng.choice(sorted(store.jobs))]
            store.delete_job(
                {"metadata": {"name": gone.name, "namespace": gone.namespace, "uid": gone.uid}}
            )
        if rng.random() < 0.05 and store.jobs:
            refused = store.jobs[rng.choice(sorted(store.jobs))]
            admission = refused.status.admission
            store.record_refusal(refused.uid, admission, Refusal(admission, 403, "exceeded quota"))

    def inputs(self) -> tuple[World, dict[str, Verdict | None], frozenset[str], Refresh]:
        """The world as the loop reads it, with dry-run verdicts for the jobs that need one
        (mostly accepted, now and then refused or not known), jobs with writes in flight and
        what the refresh allows."""
        rng = self.rng
        world = self.store.world(self.now)
        verdicts: dict[str, Verdict | None] = {}
        for job in world.jobs:
            if job.job is None or not needs_validation(job):
                continue
            if job.key not in self.verdicts or rng.random() < 0.1:
                self.verdicts[job.key] = rng.choice(
                    [Verdict(), Verdict(), Verdict(), None, Verdict(error="denied by policy")]
                )
            verdicts[job.key] = self.verdicts[job.key]
        keys_now = [job.key for job in world.jobs]
        busy = frozenset(rng.sample(keys_now, min(len(keys_now), rng.choice([0, 0, 0, 2]))))
        recent = rng.sample(keys_now, min(len(keys_now), rng.choice([0, 0, 5])))
        refresh = Refresh(recent, rng.choice([0, 3, 100]), reports=rng.choice([None, None, 2]))
        return world, verdicts, busy, refresh


def _job_of(store: Store, action: DeletePod) -> str:
    for (namespace, job), by_name in store.job_pods.items():
        if namespace == action.namespace and action.name in by_name:
            return job
    return ""


def _fresh(memo: Memo, world: World) -> Memo:
    """An empty memo with what the design carries beyond a cycle's inputs: the last forecast,
    the first answer for a new job whose first status is not written yet, and the admission
    core's pools (its cycles on a kept pool are checked against cycles from scratch in
    ``tests/unit/core``; here the kept cycle answers both, as of its own time)."""
    unwritten = {job.key for job in world.jobs if job.status.phase is None}
    fresh = Memo(
        forecast_at=memo.forecast_at,
        forecast=dict(memo.forecast),
        arrivals=memo.arrivals,
        pools=memo.pools,
        turn=memo.turn,
    )
    fresh.settled.update((k, v) for k, v in memo.settled.items() if k in unwritten)
    return fresh


def _same(kept: Decision, fresh: Decision, where: str) -> None:
    assert kept.plan == fresh.plan, f"{where}: plan"
    assert kept.result == fresh.result, f"{where}: result"
    assert kept.settled == fresh.settled, f"{where}: settled"
    assert list(kept.settled) == list(fresh.settled), f"{where}: order"
    assert kept.contexts == fresh.contexts, f"{where}: contexts"
    assert kept.snapshot == fresh.snapshot, f"{where}: snapshot"
    assert kept.wake_at == fresh.wake_at, f"{where}: wake"


def _plans_later_alike(
    decision: Decision,
    quiet: dict[str, QuietJob],
    busy: frozenset[str],
    refresh: Refresh,
    where: str,
) -> None:
    """The same decision planned again later (the clock alone moved: expected starts shown
    pass, tolerances narrow), with the quiet jobs the plan kept and without any."""
    world = decision.world
    by_key = {job.key: job for job in world.jobs}
    for seconds in (30, 90, 600, 4_000):
        later = world.now + timedelta(seconds=seconds)

        def planned(kept: dict[str, QuietJob] | None, at: datetime = later) -> Plan:
            return plan(
                by_key,
                decision.settled,
                decision.result,
                at,
                leaving=leaving_victims(world.jobs),
                busy=busy,
                refresh=refresh,
                defer=CONFIG.record_delay > 0,
                protections={k: c.protection for k, c in decision.contexts.items()},
                quiet=kept,
            )

        assert planned(dict(quiet)) == planned(None), f"{where}, +{seconds} s"


def _counted_alike(counts: JobCounts, decision: Decision, where: str) -> None:
    """The queue gauges kept per job against the same counted over every job."""
    requeued = counts.update(decision)
    phases: Counter[tuple[str, str]] = Counter()
    pending: dict[str, float] = {u.name: 0.0 for u in decision.result.tenants}
    oldest = dict(pending)
    truth_requeued = []
    for job in decision.world.jobs:
        status = decision.final_status(job.key)
        tenant = decision.contexts[job.key].tenant or ""
        phases[(tenant, status.phase.value if status.phase else "New")] += 1
        done = decision.settled[job.key]
        if done.requeued is not None:
            truth_requeued.append((tenant, done.requeued))
        if status.phase is not JobPhase.QUEUED:
            continue
        pending[tenant] = pending.get(tenant, 0.0) + job.gpus
        since = queued_since(status)
        waited = max(0.0, (decision.world.now - since).total_seconds()) if since else 0.0
        oldest[tenant] = max(oldest.get(tenant, 0.0), waited)
    named = [u.name for u in decision.result.tenants]
    assert counts.phases == phases, f"{where}: phases"
    assert counts.pending(named) == pending, f"{where}: pending"
    assert counts.oldest_wait(named, decision.world.now) == pytest.approx(oldest), where
    assert sorted((r.tenant, r.reason) for r in requeued) == sorted(truth_requeued), where


def _history(seed: int, steps: int = 40) -> None:
    history = _History(seed)
    memo = Memo()
    runtimes = RuntimeHistory()
    reader = NodeReader()
    counts = JobCounts()
    for step in range(steps):
        world, verdicts, busy, refresh = history.inputs()
        forecast = step == 0 or history.rng.random() < 0.15
        fresh_memo = _fresh(memo, world)
        kept = decide(
            world,
            verdicts,
            CONFIG,
            reader,
            busy=busy,
            memo=memo,
            refresh=refresh,
            history=runtimes,
            forecast=forecast,
        )
        fresh_memo.turn = kept.pool
        fresh = decide(
            world,
            verdicts,
            CONFIG,
            NodeReader(),
            busy=busy,
            memo=fresh_memo,
            refresh=refresh,
            history=runtimes,
            forecast=forecast,
        )
        _same(kept, fresh, f"seed {seed}, step {step}")
        _plans_later_alike(kept, memo.quiet[kept.pool], busy, refresh, f"seed {seed}, step {step}")
        _counted_alike(counts, kept, f"seed {seed}, step {step}")
        history.land(kept)
        history.change()


def test_kept_stages_decide_as_a_memo_that_starts_empty_over_generated_histories() -> None:
    for seed in range(12):
        _history(seed)


def test_a_quiet_cycle_looks_again_at_no_job() -> None:
    """The property above only means something if its cycles take the short ways: a cycle
    after one that changed nothing finds every job quiet, its pods and nodes as they were."""
    history = _History(3)
    memo = Memo()
    for _ in range(4):
        world, _, _, _ = history.inputs()
        history.land(decide(world, {}, CONFIG, NodeReader(), memo=memo))
    world = history.store.world(history.now)
    reader = NodeReader()
    for _ in range(2):  # each of the memo's two pools once
        decide(world, {}, CONFIG, reader, memo=memo)
    quiet_before = [dict(q) for q in memo.quiet]
    foreign, nodes = memo.foreign, memo.nodes
    for _ in range(2):
        again = decide(world, {}, CONFIG, reader, memo=memo)
        assert not again.plan.groups
    assert memo.foreign is foreign
    assert memo.nodes is nodes
    at = history.now.timestamp()
    for before, after in zip(quiet_before, memo.quiet, strict=True):
        # (A job whose expected start has passed is shown one that follows the clock.)
        current = {k: v for k, v in before.items() if at < v.until}
        assert current
        assert all(after[k] is v for k, v in current.items())
