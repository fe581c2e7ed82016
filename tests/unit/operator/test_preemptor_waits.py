"""A cycle creates a preemptor's pods once nothing it waits for holds its planned GPUs: not
before (a victim whose GpuJob was deleted while its pods terminate still holds them), and not
never (victims that outstayed their deletion are not waited for by a later admission on
other GPUs)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from gpusched.api import keys
from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle import CreatePod, JobFacts, PodFacts, WriteStatus
from gpusched.operator.decide import Decision, OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import World
from tests.unit.core.lifecycle_testdata import NOW, admitted_status, job, pod, stamp, with_pods
from tests.unit.operator.node_testdata import h100_node, h100_topology

CONFIG = OperatorConfig()
TIMEOUT = timedelta(seconds=CONFIG.lifecycle().pods_ready_timeout)
QUOTA = TenantQuota.model_validate(
    {
        "metadata": {"name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"namespaces": ["ns"], "guaranteedGpus": 16},
    }
)


def _world(now: datetime, jobs: tuple[JobFacts, ...], pods: tuple[PodFacts, ...]) -> World:
    """Nodes n0 and n1 of 8 GPUs each, tenant ``t`` owning ``ns`` with 16 guaranteed."""
    return World(
        now=now,
        jobs=jobs,
        quotas=(QUOTA,),
        nodes=(h100_node("n0"), h100_node("n1")),
        topologies={n: h100_topology(n) for n in ("n0", "n1")},
        priorities={},
        default_priority=0,
        pods=pods,
    )


def _victim_pod(victim: JobFacts, due: datetime) -> PodFacts:
    """The victim's pod on all of n0's GPUs, deleted and due gone at ``due``."""
    found = pod(victim, 0, node="n0", deleting=True, due=due)
    planned = {
        keys.ANNOTATION_PLANNED_NODE: "n0",
        keys.ANNOTATION_PLANNED_GPU_INDICES: ",".join(map(str, range(8))),
    }
    return replace(found, gpus=8, annotations={**found.annotations, **planned})


def _victim(due: datetime) -> JobFacts:
    status = {
        "phase": "Preempted",
        "admission": 1,
        "tenant": "t",
        "preemptions": [
            {"time": stamp(NOW - TIMEOUT), "preemptor": "ns/urgent", "reason": "HigherPriority"}
        ],
    }
    victim = job("train", replicas=1, gpus=8, status=status)
    return with_pods(victim, _victim_pod(victim, due))


def _created(decision: Decision) -> list[str]:
    return [
        action.manifest["metadata"]["name"]
        for group in decision.plan.groups
        for action in group.actions()
        if isinstance(action, CreatePod)
    ]


def _written(decision: Decision, key: str) -> GpuJobStatus:
    [status] = [
        action.status
        for group in decision.plan.groups
        for action in group.actions()
        if isinstance(action, WriteStatus) and action.key == key
    ]
    return status


def test_a_preemptor_released_for_stuck_victims_runs_on_free_gpus_while_they_stay() -> None:
    """``ns/urgent`` was released because its victim's pod outstayed its deletion on n0 (due
    gone 10 minutes past the timeout, still there). Its backoff over, it is admitted on n1,
    the only free node, its pod is created at once, and the next cycle keeps it admitted."""
    victim = _victim(NOW - TIMEOUT - timedelta(minutes=10))
    status = {
        "phase": "Queued",
        "tenant": "t",
        "admission": 1,
        "reason": "PodsReadyTimeout",
        "requeueCount": 1,
        "requeueAt": stamp(NOW - timedelta(seconds=1)),
    }
    urgent = job("urgent", replicas=1, gpus=8, status=status)
    first = decide(_world(NOW, (victim, urgent), victim.pods), {}, CONFIG, NodeReader())
    [admitted] = first.plan.admitted
    assert [(p.node, p.gpus) for p in admitted.placement] == [("n1", tuple(range(8)))]
    assert _created(first) == ["urgent-2-0"]

    later = NOW + timedelta(seconds=1)
    admitted_job = replace(urgent, status=_written(first, "ns/urgent"), version=11)
    second = decide(_world(later, (victim, admitted_job), victim.pods), {}, CONFIG, NodeReader())
    settled = second.settled["ns/urgent"]
    assert (settled.status.phase, settled.requeued) == (JobPhase.ADMITTED, None)
    assert _created(second) == ["urgent-2-0"]  # its pod not seen yet: created again


def test_a_preemptor_waits_for_the_pods_of_a_victim_whose_job_was_deleted() -> None:
    """``ns/train`` was deleted while its pod, preempted, terminates on n0 (due gone in 10
    minutes): ``ns/urgent``, admitted there waiting for it, creates no pod until it is gone,
    and is released if it is still there the pods-ready timeout after that."""
    due = NOW + timedelta(minutes=10)
    orphan = _victim(due).pods
    urgent = job(
        "urgent",
        replicas=1,
        gpus=8,
        status=admitted_status(
            nodes=("n0",),
            reason="WaitingForPreemption",
            admitted_at=NOW - timedelta(seconds=5),
            placement=[{"replica": 0, "node": "n0", "gpuIndices": list(range(8))}],
        ),
    )
    waiting = decide(_world(NOW, (urgent,), orphan), {}, CONFIG, NodeReader())
    assert _created(waiting) == []
    assert waiting.contexts["ns/urgent"].leaving_until == due
    assert waiting.settled["ns/urgent"].status.phase is JobPhase.ADMITTED
    late = due + TIMEOUT + timedelta(seconds=1)
    stuck = decide(_world(late, (urgent,), orphan), {}, CONFIG, NodeReader())
    released = stuck.settled["ns/urgent"]
    assert (released.status.phase, released.requeued) == (JobPhase.QUEUED, "PodsReadyTimeout")
    assert _created(stuck) == []
