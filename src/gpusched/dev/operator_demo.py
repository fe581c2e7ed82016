"""The operator's part of ``gpusched demo``: two tenants, priorities, admission, placement and a
preemption, shown through ``kubectl get gpujobs`` at each step.

:func:`run_operator_demo` needs a running local cluster with the CRDs installed. It starts the
operator (and, unless told otherwise, the gpusched extender with its kube-scheduler) as cluster
processes, adds two simulated 8-GPU H100 nodes with their NodeGpuTopology, and then:

1. tenant ``scratch`` (no guarantee) fills both nodes with two low-priority 8-GPU jobs: admitted
   on borrowed GPUs;
2. tenant ``research`` (16 GPUs guaranteed) submits a high-priority 8-GPU job: it reclaims its
   guarantee, one scratch job is preempted after its checkpoint grace period, the research job
   runs on an NVLink-complete set;
3. research submits a two-node gang that cannot fit yet: it waits with a reason, and
   ``gpusched explain`` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.components import (
    SchedulerProcesses,
    gpusched_command,
    start_scheduler,
)
from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready
from gpusched.dev.localcluster.processes import ProcessRecord
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.kube import body

DEMO_LABEL = "gpusched.io/demo"
H100 = "NVIDIA-H100-80GB-HBM3"


@dataclass
class DemoProcesses:
    """What the demo started (stopped by ``cluster.down()``, or by :meth:`stop`)."""

    operator: ProcessRecord
    scheduler: SchedulerProcesses | None = None
    nodes: list[str] = field(default_factory=list)

    def stop(self, cluster: LocalCluster) -> None:
        cluster.stop_process(self.operator)
        if self.scheduler is not None:
            cluster.stop_process(self.scheduler.kube_scheduler)
            cluster.stop_process(self.scheduler.extender)


def _job(
    name: str, gpus: int, priority: str, *, replicas: int = 1, grace: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "GpuJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "gpusPerReplica": gpus,
            "priorityClassName": priority,
            "topology": {"scope": "nvlink", "mode": "preferred"},
            "checkpointGracePeriodSeconds": grace,
            "template": {
                "metadata": {"annotations": {keys.SIM_RUNTIME: "30m"}},
                "spec": {"containers": [{"name": "trainer", "image": "pytorch"}]},
            },
        },
    }


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def run_operator_demo(
    cluster: LocalCluster,
    echo: Callable[[str], None] = print,
    *,
    start_extender: bool = True,
    prefix: str = "demo",
) -> DemoProcesses:
    """Run the scenario above on ``cluster``; returns the processes it started."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    scheduling = client.SchedulingV1Api(api)

    def get_jobs(title: str) -> None:
        echo(f"\n--- {title}\n$ kubectl get gpujobs -A -o wide")
        echo(cluster.kubectl("get", "gpujobs", "-A", "-o", "wide").stdout.rstrip())

    def phase(namespace: str, name: str) -> str:
        obj: Any = custom.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, "gpujobs", name
        )
        return str((obj.get("status") or {}).get("phase", ""))

    scheduler = start_scheduler(cluster) if start_extender else None
    kubeconfig = identities.kubeconfig(cluster, identities.OPERATOR)
    operator = cluster.spawn(
        f"{prefix}-gpusched-operator",
        [
            *gpusched_command(),
            "operator",
            f"--kubeconfig={kubeconfig}",
            "--metrics-port=0",
            "--health-port=0",
            "--explain-port=0",
            "--resync=1",
            f"--node-selector={DEMO_LABEL}={prefix}",
        ],
    )
    started = DemoProcesses(operator, scheduler)
    nodes = [f"{prefix}-h100-{i}" for i in range(2)]
    for name in nodes:
        spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", name)
        add_gpu_nodes(
            api,
            [name],
            8,
            labels={
                DEMO_LABEL: prefix,
                keys.GFD_PRODUCT: H100,
                "topology.kubernetes.io/rack": "r1",
            },
            topology=spec,
            status=status,
        )
    wait_nodes_ready(api, nodes)
    started.nodes = nodes

    research, scratch = f"{prefix}-research", f"{prefix}-scratch"
    low, high = f"{prefix}-sweep", f"{prefix}-deadline"
    for namespace in (research, scratch):
        core.create_namespace(body({"metadata": {"name": namespace}}))
    scheduling.create_priority_class(body({"metadata": {"name": low}, "value": 100}))
    scheduling.create_priority_class(body({"metadata": {"name": high}, "value": 1000}))
    for name, guaranteed in ((research, 16), (scratch, 0)):
        custom.create_cluster_custom_object(
            keys.GROUP,
            keys.VERSION,
            "tenantquotas",
            {
                "apiVersion": keys.API_VERSION,
                "kind": "TenantQuota",
                "metadata": {"name": name},
                "spec": {"namespaces": [name], "guaranteedGpus": guaranteed},
            },
        )
    echo(
        f"Tenants: {research} (16 GPUs guaranteed), {scratch} (none: borrows idle GPUs).\n"
        f"PriorityClasses: {low} (100), {high} (1000). "
        f"Nodes: {', '.join(nodes)} (8 x H100 on NVSwitch each)."
    )

    for name in ("sweep-1", "sweep-2"):
        custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, scratch, "gpujobs", _job(name, 8, low, grace=5)
        )
    _wait(lambda: all(phase(scratch, n) == "Running" for n in ("sweep-1", "sweep-2")), 60)
    get_jobs(f"1. {scratch} fills the idle cluster (admitted on borrowed GPUs)")

    custom.create_namespaced_custom_object(
        keys.GROUP, keys.VERSION, research, "gpujobs", _job("train", 8, high)
    )
    _wait(lambda: phase(research, "train") in ("Admitted", "Running"), 30)
    _wait(
        lambda: (
            any(phase(scratch, n) == "Preempted" for n in ("sweep-1", "sweep-2"))
            or phase(research, "train") == "Running"
        ),
        30,
    )
    get_jobs(f"2. {research} reclaims its guarantee: a borrowed job is preempted (5 s grace)")
    _wait(lambda: phase(research, "train") == "Running", 60)
    get_jobs(f"3. {research}/train runs on an NVLink-complete set; the victim is queued again")

    custom.create_namespaced_custom_object(
        keys.GROUP, keys.VERSION, research, "gpujobs", _job("pretrain", 8, low, replicas=2)
    )
    _wait(lambda: phase(research, "pretrain") == "Queued", 30)
    time.sleep(2)
    get_jobs(f"4. a 2 x 8-GPU gang of {research} waits: admitted whole or not at all")
    echo(f"\n$ gpusched explain {research}/pretrain")
    from gpusched.operator.decide import OperatorConfig
    from gpusched.operator.explainer import explain_in_cluster, render

    explanation, job_status = explain_in_cluster(
        api.configuration,
        f"{research}/pretrain",
        OperatorConfig(node_selector={DEMO_LABEL: prefix}),
    )
    echo("\n".join(render(explanation, job_status)))
    return started


def cleanup_operator_demo(
    cluster: LocalCluster, started: DemoProcesses, prefix: str = "demo"
) -> None:
    """Stop what :func:`run_operator_demo` started and delete what it created."""
    from kubernetes.client.exceptions import ApiException

    from gpusched.dev.localcluster.nodes import delete_nodes

    started.stop(cluster)
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    scheduling = client.SchedulingV1Api(api)

    def ignore_missing(call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except ApiException as err:
            if err.status != 404:
                raise

    for name in (f"{prefix}-research", f"{prefix}-scratch"):
        ignore_missing(
            custom.delete_cluster_custom_object, keys.GROUP, keys.VERSION, "tenantquotas", name
        )
        ignore_missing(core.delete_namespace, name, grace_period_seconds=0)
    for name in (f"{prefix}-sweep", f"{prefix}-deadline"):
        ignore_missing(scheduling.delete_priority_class, name)
    delete_nodes(api, started.nodes)
