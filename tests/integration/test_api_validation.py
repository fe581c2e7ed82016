"""The real API server refuses bad GpuJob and TenantQuota manifests with a message naming the
field, accepts the documented examples, and serves the field documentation."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.dev.bench import admission_e2e, kueue_plan
from gpusched.dev.localcluster import LocalCluster
from tests.cases.documented import documented_yaml
from tests.cases.manifests import INVALID, Invalid, gpujob, large_template, template_entries

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"
_serial = itertools.count()


@pytest.mark.parametrize("case", INVALID, ids=[case.id for case in INVALID])
def test_api_server_refuses_invalid_manifest_naming_the_field(
    local_cluster: LocalCluster, case: Invalid
) -> None:
    manifest = case.named(f"{case.id}-{next(_serial)}")
    result = local_cluster.kubectl(
        "apply", "-n", "default", "-f", "-", input=json.dumps(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert case.field in result.stderr, result.stderr
    if manifest["kind"] == "NetworkTopology":
        return  # one object, ``default``, that another test may hold: the refusal is the check
    listed = local_cluster.kubectl("get", case.plural, "-A", "-o", "name").stdout
    assert manifest["metadata"]["name"] not in listed


def test_documented_examples_are_accepted(local_cluster: LocalCluster) -> None:
    # Namespaces and PriorityClasses for real; the tenants and jobs by server-side dry run, which
    # validates and defaults them exactly like a real apply but leaves nothing behind for an
    # operator started by a later test to admit.
    for prerequisite in ("namespaces.yaml", "priorityclasses.yaml"):
        local_cluster.kubectl("apply", "-f", str(EXAMPLES / prerequisite))
    stored: list[dict[str, Any]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if path.name in ("namespaces.yaml", "priorityclasses.yaml"):
            continue
        out = local_cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", str(path))
        body = json.loads(out.stdout)
        stored.extend(body["items"] if body.get("kind") == "List" else [body])
    examples = [
        doc
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] in ("GpuJob", "TenantQuota")
    ]
    assert sorted(o["metadata"]["name"] for o in stored) == sorted(
        e["metadata"]["name"] for e in examples
    )
    sweep = next(o for o in stored if o["metadata"]["name"] == "sweep-lr-0001")
    # Defaults come from the CRD schema, so the API server fills them in.
    assert sweep["spec"]["replicas"] == 1
    assert sweep["spec"]["topology"] == {"scope": "numa", "mode": "preferred"}
    assert sweep["spec"]["minRuntimeSeconds"] == 0


def test_every_manifest_the_docs_show_is_accepted(local_cluster: LocalCluster) -> None:
    # Beyond docs/examples: the simulator's quota files (docs/benchmarks/simulator), which a
    # user may apply as they are, and the manifests shown in README.md and docs/*.md. Each is
    # applied as kubectl reads it (go-yaml, not PyYAML), by server-side dry run.
    local_cluster.kubectl("apply", "-f", str(EXAMPLES / "namespaces.yaml"))
    refused = []
    for where, text in documented_yaml():
        if where.startswith("docs/examples/"):
            continue  # applied for real above, with their PriorityClasses
        result = local_cluster.kubectl(
            "apply", "--dry-run=server", "-n", "nlp", "-f", "-", input=text, check=False
        )
        if result.returncode != 0:
            refused.append(f"{where}: {result.stderr.strip()}")
    assert not refused, "\n".join(refused)


def test_the_benchmarks_gpujobs_are_accepted(local_cluster: LocalCluster) -> None:
    # A benchmark whose jobs the API server refuses measures nothing: the GpuJobs of
    # ``gpusched bench admission-e2e`` / ``apiserver-cost`` and of ``kueue-scenario`` (a gang
    # and a single-replica job of Kueue's generator classes), by server-side dry run.
    scenario = kueue_plan.parse_generator_config(
        {
            "cohorts": [
                {
                    "className": "c",
                    "count": 1,
                    "queuesSets": [
                        {
                            "className": "q",
                            "count": 1,
                            "nominalQuota": "20",
                            "borrowingLimit": 0,
                            "reclaimWithinCohort": "Any",
                            "withinClusterQueue": "LowerPriority",
                            "workloadsSets": [
                                {
                                    "count": 1,
                                    "creationIntervalMs": 100,
                                    "workloads": [
                                        {
                                            "className": "large",
                                            "runtimeMs": 200,
                                            "priority": 200,
                                            "request": "20",
                                        },
                                        {
                                            "className": "small",
                                            "runtimeMs": 200,
                                            "priority": 50,
                                            "request": "1",
                                        },
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    )
    manifests = [admission_e2e.job_manifest("bench-e2e", 1)] + [
        kueue_plan.job_manifest(f"bench-kueue-{name}", workload, gpus_per_node=8)
        for name, workload in scenario.classes().items()
    ]
    for manifest in manifests:
        result = _dry_run(local_cluster, manifest)
        assert result.returncode == 0, (manifest["metadata"]["name"], result.stderr)


def test_kubectl_explain_shows_the_topology_documentation(local_cluster: LocalCluster) -> None:
    explained = local_cluster.kubectl("explain", "gpujob.spec.topology").stdout
    assert "nvlink" in explained
    assert "TopologyUnsatisfiable" in explained
    assert "acrossReplicas" in explained
    scope = local_cluster.kubectl("explain", "gpujob.spec.topology.scope").stdout
    assert "pcie-switch" in scope


def test_sizing_fields_are_immutable_once_the_job_exists(local_cluster: LocalCluster) -> None:
    name = f"immutable-{next(_serial)}"
    local_cluster.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps(gpujob(name)))
    result = local_cluster.kubectl(
        "patch",
        "gpujob",
        name,
        "-n",
        "default",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"gpusPerReplica": 8}}),
        check=False,
    )
    assert result.returncode != 0
    assert "spec.gpusPerReplica" in result.stderr
    assert "immutable" in result.stderr
    suspended = local_cluster.kubectl(
        "patch",
        "gpujob",
        name,
        "-n",
        "default",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"suspend": True}}),
    )
    assert "patched" in suspended.stdout
    local_cluster.kubectl("delete", "gpujob", name, "-n", "default", "--wait=false")


def _patch(cluster: LocalCluster, name: str, spec: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "patch",
        "gpujob",
        name,
        "-n",
        "default",
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
        check=False,
    )


@pytest.mark.parametrize(
    ("created", "more_protection", "less_protection"),
    [
        ({}, {"preemptible": False}, None),
        ({"preemptible": False}, None, {"preemptible": True}),
        ({"minRuntimeSeconds": 600}, {"minRuntimeSeconds": 601}, {"minRuntimeSeconds": 0}),
        ({"maxRuntimeSeconds": 3600}, {"maxRuntimeSeconds": 3601}, {"maxRuntimeSeconds": 60}),
        ({"maxRuntimeSeconds": 3600}, {"maxRuntimeSeconds": None}, None),
        ({}, None, {"maxRuntimeSeconds": 3600}),
        ({"gpuModel": "NVIDIA-H100-80GB-HBM3"}, {"gpuModel": None}, None),
        ({}, {"gpuModel": "NVIDIA-H100-80GB-HBM3"}, None),
    ],
    ids=[
        "preemptible-off",
        "preemptible-on",
        "min-runtime",
        "max-runtime",
        "max-runtime-removed",
        "max-runtime-added",
        "gpu-model-removed",
        "gpu-model-added",
    ],
)
def test_a_job_may_not_protect_itself_further_or_change_its_model_once_it_exists(
    local_cluster: LocalCluster,
    created: dict[str, Any],
    more_protection: dict[str, Any] | None,
    less_protection: dict[str, Any] | None,
) -> None:
    # Admission took the job as it was: backfilled onto reserved GPUs because it could be
    # evicted (or would end) in time, lent GPUs because it could be made to leave.
    name = f"protection-{next(_serial)}"
    local_cluster.kubectl(
        "apply", "-n", "default", "-f", "-", input=json.dumps(gpujob(name, **created))
    )
    try:
        if more_protection is not None:
            refused = _patch(local_cluster, name, more_protection)
            assert refused.returncode != 0, refused.stdout
            assert f"spec.{next(iter(more_protection))}" in refused.stderr, refused.stderr
        if less_protection is not None:
            accepted = _patch(local_cluster, name, less_protection)
            assert accepted.returncode == 0, accepted.stderr
    finally:
        local_cluster.kubectl("delete", "gpujob", name, "-n", "default", "--wait=false")


def _dry_run(cluster: LocalCluster, manifest: dict[str, Any]) -> Any:
    # create, not a client-side apply: that copies the object into an annotation, which
    # Kubernetes limits to 256 KiB (a limit server-side apply and create do not have).
    return cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        "-",
        input=json.dumps(manifest),
        check=False,
    )


def test_a_large_real_pod_template_is_accepted(local_cluster: LocalCluster) -> None:
    # 10 containers with 200 env entries and 50 volume mounts each, 50 volumes: as large as
    # real pods get, well inside what the CRD bounds.
    template = large_template()
    assert template_entries(template) == 10 * (200 + 50 + 4) + 50 + 4
    result = _dry_run(local_cluster, gpujob(f"large-{next(_serial)}", template=template))
    assert result.returncode == 0, result.stderr
