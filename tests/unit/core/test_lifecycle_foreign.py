"""GPU pods no accounted job explains (:func:`foreign_pods`) hold their GPUs for the admission
core: bound pods where they run, and a GpuJob's pod not bound yet (its Binding in flight)
where it was planned, so no other job is planned onto those GPUs meanwhile."""

from __future__ import annotations

from dataclasses import replace

from gpusched.api import keys
from gpusched.core.lifecycle import (
    JobContext,
    PodFacts,
    Verdict,
    foreign_busy,
    foreign_pods,
    settle,
)
from tests.unit.core.lifecycle_testdata import CONFIG, NOW, job, pod

OK = JobContext(tenant="t", verdict=Verdict())


def _planned(facts: PodFacts, *, gpus: str = "0,1,2,3") -> PodFacts:
    """The pod with the plan the operator writes on it: n0, ``gpus``."""
    planned = {keys.ANNOTATION_PLANNED_NODE: "n0", keys.ANNOTATION_PLANNED_GPU_INDICES: gpus}
    return replace(facts, annotations={**facts.annotations, **planned})


def test_an_unbound_pod_of_a_gone_job_or_admission_holds_its_planned_gpus() -> None:
    """Pods of ``ns/gone`` (deleted) and of ``ns/released``'s earlier admission, created with
    their plan on n0 and not bound yet, hold n0 GPUs 0-3 and 4-7; deleting, or without a
    planned GPU set, they hold nothing (the API server removes an unbound pod at once)."""
    gone = pod(job("gone"), 0, phase="Pending", node=None)
    released = job("released", status={"phase": "Queued", "tenant": "t", "admission": 2})
    earlier = _planned(pod(released, 0, phase="Pending", node=None), gpus="4,5,6,7")
    pods = [_planned(gone), earlier]
    settled = {released.key: settle(released, OK, NOW, CONFIG)}
    assert foreign_busy(foreign_pods(pods, [released], settled)) == {
        "n0": ({0, 1, 2, 3, 4, 5, 6, 7}, 0)
    }
    deleting = _planned(pod(job("gone"), 0, phase="Pending", node=None, deleting=True))
    assert foreign_pods([deleting, gone], [released], settled) == []
