"""``gpusched bench apiserver-cost``: the API server's CPU for each kind of request a GpuJob and
a plain pod cost, one kind at a time on an otherwise idle local control plane.

On a machine where the control plane shares a few cores, throughput is bounded by the CPU all
processes spend per job; these figures say what each request a GpuJob adds costs the API
server, and so how far the GpuJob rate can come to the plain-pod rate (docs/benchmarks.md).
``--template-schema open`` installs the GpuJob CRD with its pod template left unvalidated
(``x-kubernetes-preserve-unknown-fields``) to size what the embedded PodTemplateSpec schema
costs. Figures to record, never assertions.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import click
import yaml

from gpusched.api import keys
from gpusched.dev.bench.admission_e2e import cpu_seconds, job_manifest
from gpusched.dev.localcluster import LocalCluster, ensure_toolchain
from gpusched.dev.localcluster.binaries import default_progress, repo_root
from gpusched.kube import body

NAMESPACE = "bench"
STAMP = "2026-01-01T00:00:00Z"


def _crds(directory: Path, open_template: bool) -> Path:
    """The committed CRDs, the GpuJob's template schema opened if asked."""
    directory.mkdir()
    for path in (repo_root() / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if open_template and crd["spec"]["names"]["kind"] == "GpuJob":
            for version in crd["spec"]["versions"]:
                spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
                spec["properties"]["template"] = {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                }
        (directory / path.name).write_text(yaml.safe_dump(crd))
    return directory


def _admitted(i: int) -> dict[str, Any]:
    """A status like the operator's admission of a one-GPU job."""
    message = f"admitted: 1 GPU on node-{i % 64:04d} (nvlink)"
    return {
        "phase": "Admitted",
        "tenant": NAMESPACE,
        "admission": 1,
        "admittedAt": STAMP,
        "placement": [
            {
                "replica": 0,
                "node": f"node-{i % 64:04d}",
                "gpuIndices": [i % 8],
                "topologyClass": "nvlink",
                "score": 1.0,
            }
        ],
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": "WithinGuarantee",
                "message": message,
                "lastTransitionTime": STAMP,
            }
            for kind in ("QuotaReserved", "Admitted")
        ],
    }


def _running() -> dict[str, Any]:
    return {
        "phase": "Running",
        "startedAt": STAMP,
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": "Running",
                "message": "all pods running",
                "lastTransitionTime": STAMP,
            }
            for kind in ("QuotaReserved", "Admitted", "PodsReady")
        ],
    }


def _pod(i: int) -> dict[str, Any]:
    # A scheduler nobody runs: the pod stays Pending, only its create is measured.
    return {
        "metadata": {"name": f"pod-{i:05d}", "labels": {"app": "bench"}},
        "spec": {
            "schedulerName": "nobody",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


def _event(i: int) -> dict[str, Any]:
    return {
        "metadata": {"generateName": "bench-"},
        "involvedObject": {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "namespace": NAMESPACE,
            "name": f"job-{i:05d}",
        },
        "reason": "Admitted",
        "message": "admitted",
        "type": "Normal",
        "firstTimestamp": STAMP,
        "lastTimestamp": STAMP,
        "count": 1,
        "source": {"component": "gpusched-operator"},
    }


def _measure(
    cluster: LocalCluster, count: int, workers: int, request: Callable[[int], object]
) -> dict[str, float]:
    before = cpu_seconds(cluster).get("kube-apiserver", 0.0)
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(request, range(count)))
    wall = time.monotonic() - started
    spent = cpu_seconds(cluster).get("kube-apiserver", 0.0) - before
    return {
        "apiserver_cpu_ms": round(1000 * spent / count, 2),
        "per_second": round(count / wall, 1),
    }


def run_cost(count: int, workers: int, open_template: bool) -> dict[str, Any]:
    """See the module docstring."""
    from kubernetes import client

    progress = default_progress
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", ensure_toolchain())
        cluster.up()
        try:
            cluster.install_crds(_crds(Path(tmp) / "crds", open_template))
            api = cluster.api_client()
            core = client.CoreV1Api(api)
            custom = client.CustomObjectsApi(api)
            core.create_namespace(body({"metadata": {"name": NAMESPACE}}))
            group, version = keys.GROUP, keys.VERSION
            uids: dict[int, str] = {}

            def create_job(i: int) -> None:
                made = cast(
                    "dict[str, Any]",
                    custom.create_namespaced_custom_object(
                        group, version, NAMESPACE, "gpujobs", job_manifest(f"job-{i:05d}", 1)
                    ),
                )
                uids[i] = made["metadata"]["uid"]

            def patch(i: int, status: dict[str, Any]) -> None:
                custom.patch_namespaced_custom_object_status(
                    group,
                    version,
                    NAMESPACE,
                    "gpujobs",
                    f"job-{i:05d}",
                    {"metadata": {"uid": uids[i]}, "status": status},
                    field_manager="gpusched-operator",
                )

            steps: list[tuple[str, Callable[[int], object]]] = [
                ("POST gpujobs", create_job),
                ("PATCH gpujobs/status (admission)", lambda i: patch(i, _admitted(i))),
                ("PATCH gpujobs/status (running)", lambda i: patch(i, _running())),
                ("POST pods", lambda i: core.create_namespaced_pod(NAMESPACE, body(_pod(i)))),
                (
                    "POST events",
                    lambda i: core.create_namespaced_event(NAMESPACE, body(_event(i))),
                ),
            ]
            # The first requests to a new CRD build its handlers: not part of the figures.
            for i in range(20):
                custom.create_namespaced_custom_object(
                    group, version, NAMESPACE, "gpujobs", job_manifest(f"warm-{i:02d}", 1)
                )
            requests: dict[str, dict[str, float]] = {}
            for name, request in steps:
                progress(f"[bench] {count} x {name}")
                requests[name] = _measure(cluster, count, workers, request)
            sample = cast(
                "dict[str, Any]",
                custom.get_namespaced_custom_object(
                    group, version, NAMESPACE, "gpujobs", "job-00000"
                ),
            )
            return {
                "count": count,
                "template_schema": "open" if open_template else "full",
                "requests": requests,
                "gpujob_bytes": len(json.dumps(sample)),
                "gpujob_managed_fields_bytes": len(
                    json.dumps(sample["metadata"].get("managedFields"))
                ),
            }
        finally:
            cluster.down()


@click.command("apiserver-cost")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--count", default=1000, show_default=True, help="Requests of each kind.")
@click.option("--workers", default=16, show_default=True, help="Parallel clients.")
@click.option(
    "--template-schema",
    type=click.Choice(["full", "open"]),
    default="full",
    show_default=True,
    help="The GpuJob CRD as committed, or with its pod template unvalidated.",
)
def apiserver_cost(*, as_json: bool, count: int, workers: int, template_schema: str) -> None:
    """The API server's CPU per request, for each request a GpuJob and a plain pod make."""
    result = run_cost(count, workers, template_schema == "open")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for name, figures in result["requests"].items():
        click.echo(
            f"{name:34s} {figures['apiserver_cpu_ms']:6.2f} ms API server CPU each "
            f"({figures['per_second']} /s)"
        )
    click.echo(
        f"a Running GpuJob: {result['gpujob_bytes']} bytes, of which managedFields "
        f"{result['gpujob_managed_fields_bytes']}"
    )
