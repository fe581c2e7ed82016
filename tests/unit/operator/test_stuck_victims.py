"""A victim's pods stuck Terminating (a finalizer, a node that does not answer) do not hold
their preemptor Admitted for ever: once the pods-ready timeout has passed after they were due
gone, the cycle releases the preemptor, and their GPUs, still held, are no longer kept for it."""

from __future__ import annotations

from datetime import timedelta

from gpusched.api.gpujob import JobPhase
from gpusched.api.tenantquota import TenantQuota
from gpusched.operator.decide import OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import World
from tests.unit.core.lifecycle_testdata import NOW, admitted_status, job, pod, stamp, with_pods

QUOTA = TenantQuota.model_validate(
    {
        "metadata": {"name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"namespaces": ["ns"], "guaranteedGpus": 16},
    }
)


def _world(victims_due: timedelta) -> World:
    """``ns/urgent`` admitted on the GPUs of ``ns/train``, whose pods were due gone
    ``victims_due`` ago."""
    preemptor = job("urgent", status=admitted_status())
    evicted = {
        "phase": "Preempted",
        "admission": 1,
        "tenant": "t",
        "preemptions": [{"time": stamp(NOW), "preemptor": "ns/urgent", "reason": "HigherPriority"}],
    }
    victim = job("train", status=evicted)
    due = NOW - victims_due
    victim = with_pods(
        victim, pod(victim, 0, deleting=True, due=due), pod(victim, 1, deleting=True, due=due)
    )
    return World(
        now=NOW,
        jobs=(preemptor, victim),
        quotas=(QUOTA,),
        nodes=(),
        topologies={},
        priorities={},
        default_priority=0,
        pods=victim.pods,
    )


def test_a_preemptor_waits_for_its_victims_until_the_timeout_after_they_were_due_gone() -> None:
    config = OperatorConfig()
    timeout = timedelta(seconds=config.lifecycle().pods_ready_timeout)
    waiting = decide(_world(timeout - timedelta(seconds=10)), {}, config, NodeReader())
    assert waiting.settled["ns/urgent"].status.phase is JobPhase.ADMITTED
    assert waiting.settled["ns/train"].reserved_for == "ns/urgent"
    stuck = decide(_world(timeout + timedelta(seconds=10)), {}, config, NodeReader())
    released = stuck.settled["ns/urgent"].status
    assert (released.phase, released.reason) == (JobPhase.QUEUED, "PodsReadyTimeout")
    assert stuck.settled["ns/train"].reserved_for is None
