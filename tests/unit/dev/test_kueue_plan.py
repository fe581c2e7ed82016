"""Reading Kueue's generator configuration into the gpusched objects that play it.

The configuration below is written for these tests in Kueue's format (two cohort sets' worth of
names, two queue sets, two workload templates); every expected value was worked out by hand
from Kueue's naming rules and the mapping in ``kueue_plan``'s docstring."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob
from gpusched.api.tenantquota import TenantQuota
from gpusched.dev.bench.kueue_plan import (
    CLASS_LABEL,
    cohort_quota,
    gang_shape,
    job_manifest,
    nodes_needed,
    parse_generator_config,
    priority_classes,
    queue_quota,
    scale,
)

CONFIG: dict[str, Any] = {
    "cohorts": [
        {
            "className": "team",
            "count": 2,
            "queuesSets": [
                {
                    "className": "q",
                    "count": 3,
                    "nominalQuota": "10",
                    "borrowingLimit": 4,
                    "reclaimWithinCohort": "LowerPriority",
                    "withinClusterQueue": "Never",
                    "workloadsSets": [
                        {
                            "count": 4,
                            "creationIntervalMs": 250,
                            "workloads": [
                                {"className": "a", "runtimeMs": 300, "priority": 7, "request": 2},
                                {"className": "b", "runtimeMs": 900, "priority": 9, "request": 12},
                            ],
                        }
                    ],
                },
                {"className": "r", "count": 1, "nominalQuota": 6},
            ],
        }
    ]
}


def test_names_counts_and_quotas_follow_kueues_generator() -> None:
    scenario = parse_generator_config(CONFIG)
    assert [c.name for c in scenario.cohorts] == ["team-0", "team-1"]
    assert [q.name for q in scenario.cohorts[0].queues] == [
        "q-0-0-team-0",
        "q-0-1-team-0",
        "q-0-2-team-0",
        "r-1-0-team-0",
    ]
    assert scenario.cohorts[1].queues[3].name == "r-1-0-team-1"
    # 3 x 10 + 6 per cohort, two cohorts.
    assert scenario.cohorts[0].nominal == 36
    assert scenario.nominal == 72
    # Per q queue: 4 rounds x 2 templates; r queues have no workloads; 2 cohorts x 3 q queues.
    assert scenario.workloads == 48
    queue = scenario.cohorts[0].queues[0]
    assert (queue.nominal, queue.borrowing_limit, queue.class_name) == (10, 4, "q")
    assert scenario.cohorts[0].queues[3].borrowing_limit is None
    names = [name for name, _ in queue.workload_sets[0].names()]
    assert names[:4] == ["a-0-0-0", "b-0-0-1", "a-0-1-0", "b-0-1-1"]
    assert names[-1] == "b-0-3-1"
    assert sorted(scenario.classes()) == ["a", "b"]


def test_cohort_and_queue_become_a_tenant_tree() -> None:
    scenario = parse_generator_config(CONFIG)
    parent = cohort_quota(scenario.cohorts[0])
    assert parent["metadata"]["name"] == "team-0"
    assert parent["spec"] == {"guaranteedGpus": 36, "borrowingLimit": 36}
    child = queue_quota(scenario.cohorts[0].queues[1])
    assert child["metadata"] == {"name": "q-0-1-team-0", "labels": {CLASS_LABEL: "q"}}
    assert child["spec"] == {
        "parent": "team-0",
        "namespaces": ["q-0-1-team-0"],
        "guaranteedGpus": 10,
        # Kueue's limit is what may be borrowed beyond nominal: 10 + 4.
        "borrowingLimit": 14,
        "preemption": {"withinTenant": "Never", "reclaimBorrowed": "LowerPriority"},
    }
    unlimited = queue_quota(scenario.cohorts[0].queues[3])
    assert "borrowingLimit" not in unlimited["spec"]
    # Kueue's defaults for unset policies are Never.
    assert unlimited["spec"]["preemption"] == {"withinTenant": "Never", "reclaimBorrowed": "Never"}
    for manifest in (parent, child, unlimited):
        TenantQuota.model_validate(manifest)


def test_workload_becomes_a_gpujob_with_its_runtime_and_priority() -> None:
    scenario = parse_generator_config(CONFIG)
    big = scenario.classes()["b"]
    manifest = job_manifest("b-0-2-1", big, gpus_per_node=8)
    spec = manifest["spec"]
    # 12 GPUs on 8-GPU nodes: the largest size dividing 12 and 8 is 4, so 3 x 4.
    assert (spec["replicas"], spec["gpusPerReplica"]) == (3, 4)
    assert spec["priorityClassName"] == "kueue-bench-priority-9"
    assert spec["checkpointGracePeriodSeconds"] == 0
    assert spec["template"]["metadata"]["annotations"] == {keys.SIM_RUNTIME: "900ms"}
    assert manifest["metadata"]["labels"][CLASS_LABEL] == "b"
    GpuJob.model_validate(manifest)
    classes = priority_classes(scenario)
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == [
        ("kueue-bench-priority-7", 7),
        ("kueue-bench-priority-9", 9),
    ]


@pytest.mark.parametrize(
    ("request_gpus", "per_node", "shape"),
    [
        (1, 8, (1, 1)),
        (8, 8, (1, 8)),
        (5, 8, (1, 5)),
        (20, 8, (5, 4)),
        (24, 8, (3, 8)),
        (9, 8, (9, 1)),
        (6, 4, (3, 2)),
        (10, 16, (1, 10)),
    ],
)
def test_gang_shape(request_gpus: int, per_node: int, shape: tuple[int, int]) -> None:
    assert gang_shape(request_gpus, per_node) == shape


def test_nodes_hold_the_nominal_quotas() -> None:
    assert nodes_needed(parse_generator_config(CONFIG), 8) == 9
    assert nodes_needed(parse_generator_config(scale(CONFIG, cohorts=1, queues=1)), 8) == 2


def test_scale_changes_counts_only() -> None:
    scaled = parse_generator_config(scale(CONFIG, cohorts=3, queues=2))
    assert len(scaled.cohorts) == 3
    # Both queue sets get 2 queues: 2 x 10 + 2 x 6 per cohort.
    assert [q.name for q in scaled.cohorts[2].queues] == [
        "q-0-0-team-2",
        "q-0-1-team-2",
        "r-1-0-team-2",
        "r-1-1-team-2",
    ]
    assert scaled.nominal == 3 * 32
    assert scaled.workloads == 3 * 2 * 8
    unchanged = parse_generator_config(scale(CONFIG, cohorts=None, queues=None))
    assert unchanged == parse_generator_config(CONFIG)


@pytest.mark.parametrize(
    "change",
    [
        {"nominalQuota": "500m"},
        {"nominalQuota": -3},
        {"borrowingLimit": "1.5"},
    ],
)
def test_quantities_that_are_not_whole_gpus_are_refused(change: dict[str, Any]) -> None:
    queue_set = {**CONFIG["cohorts"][0]["queuesSets"][0], **change}
    config = {"cohorts": [{**CONFIG["cohorts"][0], "queuesSets": [queue_set]}]}
    with pytest.raises(ValueError, match=r"whole number|negative"):
        parse_generator_config(config)


def test_tas_scenarios_are_refused() -> None:
    with pytest.raises(ValueError, match="TAS"):
        parse_generator_config({**CONFIG, "topology": {"name": "t"}})
