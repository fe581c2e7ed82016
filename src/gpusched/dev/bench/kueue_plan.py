"""Kueue's scheduler benchmark scenario (``test/performance/scheduler`` in ``sigs.k8s.io/kueue``)
read into plain values, and the gpusched objects that play the same scenario.

Kueue's generator configuration is a tree: cohort sets (``count`` cohorts each) hold queue sets
(``count`` ClusterQueues each, with a nominal quota, a borrowing limit and preemption policies),
which hold workload sets (``count`` rounds; each round creates one Workload per template after
``creationIntervalMs``, a template being a class name, a run time, a priority and a request).
Kueue's generator turns it into a ResourceFlavor, one ClusterQueue, Namespace and LocalQueue per
queue, and Workloads without pods. This module reads the same file, names everything as Kueue's
generator does (so a queue or a workload can be looked up in both runs), and says what gpusched
creates instead:

- a **parent TenantQuota per cohort** (Kueue's cohort is the pool its queues lend each other):
  guaranteed and capped at the sum of its queues' nominal quotas, so nothing is borrowed across
  cohorts, as in Kueue where a cohort without a parent has nothing to borrow from;
- a **TenantQuota per ClusterQueue** under it, owning a namespace of the queue's name:
  ``guaranteedGpus`` = nominal quota, ``borrowingLimit`` = nominal + Kueue's borrowing limit
  (Kueue's limit is what may be borrowed *beyond* nominal; gpusched's is the ceiling on what is
  held), the preemption policies mapped one to one;
- a **GpuJob per Workload**, the request read as GPUs (a request larger than a node becomes a
  gang of equal replicas that fit nodes evenly), its priority through a PriorityClass, its pods
  ending after the class's run time (kwok, ``sim.gpusched.io/runtime``).

Pure: no I/O, no clock. ``gpusched.dev.bench.kueue_scenario`` does the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.api import keys
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption

#: Labels on the gpusched objects (Kueue's generator uses
#: ``kueue.x-k8s.io/performance-scheduler-*``).
CLASS_LABEL = "bench.gpusched.io/class"
RUNTIME_LABEL = "bench.gpusched.io/runtime-ms"
#: Kueue's ``reclaimWithinCohort`` -> gpusched's ``preemption.reclaimBorrowed``.
RECLAIM = {
    "Any": ReclaimPolicy.ANY,
    "LowerPriority": ReclaimPolicy.LOWER_PRIORITY,
    "Never": ReclaimPolicy.NEVER,
}
#: Kueue's ``withinClusterQueue`` -> gpusched's ``preemption.withinTenant``. gpusched has no
#: "lower, or equal and newer" policy; LowerPriority is the nearest.
WITHIN = {
    "LowerPriority": WithinTenantPreemption.LOWER_PRIORITY,
    "LowerOrNewerEqualPriority": WithinTenantPreemption.LOWER_PRIORITY,
    "Never": WithinTenantPreemption.NEVER,
}


@dataclass(frozen=True)
class WorkloadClass:
    """One workload template: every round of its set creates one of these."""

    name: str
    runtime_ms: int
    priority: int
    #: Kueue's request (CPUs in its benchmark), read as GPUs here.
    request: int


@dataclass(frozen=True)
class WorkloadSet:
    """``count`` rounds, each creating one workload per template after ``interval_ms``."""

    index: int
    count: int
    interval_ms: int
    workloads: tuple[WorkloadClass, ...]

    def names(self) -> Iterator[tuple[str, WorkloadClass]]:
        """Workload names in creation order, as Kueue's generator names them
        (``<class>-<set index>-<round>-<template index>``)."""
        for round_ in range(self.count):
            for i, workload in enumerate(self.workloads):
                yield f"{workload.name}-{self.index}-{round_}-{i}", workload


@dataclass(frozen=True)
class Queue:
    """One Kueue ClusterQueue (and its namespace and LocalQueue, all of the same name)."""

    name: str
    cohort: str
    class_name: str
    nominal: int
    #: What may be borrowed beyond ``nominal`` (Kueue's ``borrowingLimit``); None: no limit.
    borrowing_limit: int | None
    reclaim_within_cohort: str
    within_cluster_queue: str
    workload_sets: tuple[WorkloadSet, ...]

    @property
    def workloads(self) -> int:
        """Workloads this queue receives over the run."""
        return sum(s.count * len(s.workloads) for s in self.workload_sets)


@dataclass(frozen=True)
class Cohort:
    """A Kueue cohort: the queues that lend each other their unused nominal quota."""

    name: str
    class_name: str
    queues: tuple[Queue, ...]

    @property
    def nominal(self) -> int:
        """The cohort's pool: its queues' nominal quotas together."""
        return sum(q.nominal for q in self.queues)


@dataclass(frozen=True)
class Scenario:
    """A whole generator configuration."""

    cohorts: tuple[Cohort, ...]

    @property
    def queues(self) -> tuple[Queue, ...]:
        """Every queue, cohort by cohort."""
        return tuple(q for c in self.cohorts for q in c.queues)

    @property
    def nominal(self) -> int:
        """Sum of every queue's nominal quota: the capacity the scenario shares."""
        return sum(c.nominal for c in self.cohorts)

    @property
    def workloads(self) -> int:
        """Workloads created over the run."""
        return sum(q.workloads for q in self.queues)

    def classes(self) -> dict[str, WorkloadClass]:
        """Workload classes by name (the first template of each name)."""
        found: dict[str, WorkloadClass] = {}
        for queue in self.queues:
            for workload_set in queue.workload_sets:
                for workload in workload_set.workloads:
                    found.setdefault(workload.name, workload)
        return found


def _whole(value: Any, what: str) -> int:
    """A quantity that must be a whole number of GPUs (``20``, ``"20"``); Kueue's benchmark
    writes plain integers, and a fraction of a GPU has no meaning here."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a whole number, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise ValueError(f"{what}: expected a whole number of GPUs, got {value!r}")
    if number < 0:
        raise ValueError(f"{what}: must not be negative, got {number}")
    return number


def parse_generator_config(config: Mapping[str, Any]) -> Scenario:
    """Kueue's generator configuration (the YAML document as a mapping) as a :class:`Scenario`.

    Names follow Kueue's generator: cohort ``<class>-<i>``, ClusterQueue
    ``<queue class>-<queue set index>-<i>-<cohort>``. TAS settings (``topology``, ``podCount``,
    ``tasConstraint``) are refused: this benchmark plays the plain scheduler scenarios.
    """
    if config.get("topology") or config.get("resourceFlavor"):
        raise ValueError("TAS scenarios (topology, resourceFlavor) are not supported")
    cohort_sets = config.get("cohorts") or []
    if not cohort_sets:
        raise ValueError("the configuration has no cohorts")
    cohorts: list[Cohort] = []
    for cohort_set in cohort_sets:
        cohort_class = str(cohort_set["className"])
        for cohort_index in range(int(cohort_set["count"])):
            cohort_name = f"{cohort_class}-{cohort_index}"
            queues: list[Queue] = []
            for set_index, queue_set in enumerate(cohort_set.get("queuesSets") or []):
                queue_class = str(queue_set["className"])
                where = f"queue set {queue_class}"
                workload_sets = tuple(
                    _workload_set(i, s, where)
                    for i, s in enumerate(queue_set.get("workloadsSets") or [])
                )
                limit = queue_set.get("borrowingLimit")
                for queue_index in range(int(queue_set["count"])):
                    queues.append(
                        Queue(
                            name=f"{queue_class}-{set_index}-{queue_index}-{cohort_name}",
                            cohort=cohort_name,
                            class_name=queue_class,
                            nominal=_whole(queue_set["nominalQuota"], f"{where}: nominalQuota"),
                            borrowing_limit=(
                                None if limit is None else _whole(limit, f"{where}: borrowingLimit")
                            ),
                            reclaim_within_cohort=str(
                                queue_set.get("reclaimWithinCohort", "Never")
                            ),
                            within_cluster_queue=str(queue_set.get("withinClusterQueue", "Never")),
                            workload_sets=workload_sets,
                        )
                    )
            cohorts.append(Cohort(cohort_name, cohort_class, tuple(queues)))
    return Scenario(tuple(cohorts))


def _workload_set(index: int, raw: Mapping[str, Any], where: str) -> WorkloadSet:
    templates = []
    for template in raw.get("workloads") or []:
        if template.get("tasLevel") or int(template.get("podCount") or 1) != 1:
            raise ValueError(f"{where}: TAS workloads (tasLevel, podCount) are not supported")
        name = str(template["className"])
        templates.append(
            WorkloadClass(
                name=name,
                runtime_ms=int(template.get("runtimeMs", 0)),
                priority=int(template.get("priority", 0)),
                request=_whole(template["request"], f"{where}: workload {name}: request"),
            )
        )
    return WorkloadSet(
        index=index,
        count=int(raw["count"]),
        interval_ms=int(raw.get("creationIntervalMs", 0)),
        workloads=tuple(templates),
    )


def scale(
    scenario_config: Mapping[str, Any], *, cohorts: int | None, queues: int | None
) -> dict[str, Any]:
    """The configuration with every cohort set's ``count`` set to ``cohorts`` and every queue
    set's ``count`` to ``queues`` (None: unchanged); the workloads per queue stay as they are.
    Written out again for Kueue's runner, so both runs play the same scaled scenario."""
    scaled: dict[str, Any] = {**scenario_config, "cohorts": []}
    for cohort_set in scenario_config.get("cohorts") or []:
        new_set = {**cohort_set, "queuesSets": []}
        if cohorts is not None:
            new_set["count"] = cohorts
        for queue_set in cohort_set.get("queuesSets") or []:
            new_set["queuesSets"].append(
                {**queue_set, **({"count": queues} if queues is not None else {})}
            )
        scaled["cohorts"].append(new_set)
    return scaled


def gang_shape(request: int, gpus_per_node: int) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a request of ``request`` GPUs on nodes of
    ``gpus_per_node``: one replica when it fits a node; otherwise equal replicas of the largest
    size that divides both the request and the node (20 GPUs on 8-GPU nodes: 5 x 4, two per
    node, no GPU left idle by the shape)."""
    if request < 1 or gpus_per_node < 1:
        raise ValueError("request and gpus_per_node must be at least 1")
    if request <= gpus_per_node:
        return 1, request
    size = max(
        d for d in range(1, gpus_per_node + 1) if request % d == 0 and gpus_per_node % d == 0
    )
    return request // size, size


def nodes_needed(scenario: Scenario, gpus_per_node: int) -> int:
    """Nodes whose GPUs add up to the scenario's nominal quotas (rounded up to whole nodes)."""
    return max(1, math.ceil(scenario.nominal / gpus_per_node))


def priority_class_name(priority: int) -> str:
    """The PriorityClass standing for Kueue's workload priority ``priority``."""
    return f"kueue-bench-priority-{priority}" if priority >= 0 else f"kueue-bench-minus-{-priority}"


def priority_classes(scenario: Scenario) -> list[dict[str, Any]]:
    """One PriorityClass per priority the workloads use. ``preemptionPolicy: Never`` keeps
    kube-scheduler from preempting pods on its own: the operator decides preemptions."""
    values = sorted({w.priority for w in scenario.classes().values()})
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(value)},
            "value": value,
            "preemptionPolicy": "Never",
            "description": "gpusched bench kueue-scenario: a Kueue workload priority",
        }
        for value in values
    ]


def cohort_quota(cohort: Cohort) -> dict[str, Any]:
    """The parent TenantQuota of a cohort: guaranteed and capped at the cohort's pool."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "TenantQuota",
        "metadata": {"name": cohort.name, "labels": {CLASS_LABEL: cohort.class_name}},
        "spec": {"guaranteedGpus": cohort.nominal, "borrowingLimit": cohort.nominal},
    }


def queue_quota(queue: Queue) -> dict[str, Any]:
    """The TenantQuota standing for one ClusterQueue, under its cohort's."""
    spec: dict[str, Any] = {
        "parent": queue.cohort,
        "namespaces": [queue.name],
        "guaranteedGpus": queue.nominal,
        "preemption": {
            "withinTenant": WITHIN[queue.within_cluster_queue].value,
            "reclaimBorrowed": RECLAIM[queue.reclaim_within_cohort].value,
        },
    }
    if queue.borrowing_limit is not None:
        spec["borrowingLimit"] = queue.nominal + queue.borrowing_limit
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "TenantQuota",
        "metadata": {"name": queue.name, "labels": {CLASS_LABEL: queue.class_name}},
        "spec": spec,
    }


def job_manifest(name: str, workload: WorkloadClass, gpus_per_node: int) -> dict[str, Any]:
    """The GpuJob standing for one Workload. Its pods end after the class's run time (kwok);
    a preempted job's pods go at once (no checkpoint grace), as Kueue's runner completes an
    eviction at once."""
    replicas, per_replica = gang_shape(workload.request, gpus_per_node)
    spec: dict[str, Any] = {
        "replicas": replicas,
        "gpusPerReplica": per_replica,
        "priorityClassName": priority_class_name(workload.priority),
        "checkpointGracePeriodSeconds": 0,
        "template": {
            "metadata": {"annotations": {keys.SIM_RUNTIME: f"{workload.runtime_ms}ms"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    }
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {
            "name": name,
            "labels": {CLASS_LABEL: workload.name, RUNTIME_LABEL: str(workload.runtime_ms)},
        },
        "spec": spec,
    }
