"""``gpusched demo``: the whole product on one machine, without GPUs.

A local control plane with simulated GPU nodes wired like real machines; the device probe
publishing each node's wiring and health; the scheduler extender placing pods on well-wired GPU
sets and saying why when it cannot; a GPU failure taking a GPU out of placement; a real kubelet
handing a container exactly the GPUs the extender chose, through gpusched's device plugin; and the
operator admitting GpuJobs of two tenants with different priorities, placing a gang and
preempting a borrower. It stays up until interrupted (or exits after the walk-through with
``--no-wait``) and always tears the cluster down.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, default_state_dir, ensure_toolchain
from gpusched.dev.localcluster.binaries import repo_root

#: Simulated nodes whose wiring the device probe publishes: name -> fixture.
PROBED_NODES = {
    "a100-0": "hgx-a100-sxm4-80gb-8gpu-8nic",
    "pcie-0": "pcie-8gpu-nvlink-bridge-pairs-2socket",
}


def _section(title: str) -> None:
    click.echo(f"\n=== {title}")


def _wait(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    return None


def _pod(name: str, node: str, gpus: int, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


def _show_pod(cluster: LocalCluster, name: str) -> None:
    pod = json.loads(cluster.kubectl("get", "pod", name, "-o", "json").stdout)
    annotations = pod["metadata"].get("annotations", {})
    node = pod["spec"].get("nodeName")
    if node:
        click.echo(
            f"pod/{name}: node {node}, GPUs {annotations.get(keys.ANNOTATION_GPU_INDICES)} "
            f"({annotations.get(keys.ANNOTATION_TOPOLOGY_CLASS)}), "
            f"{keys.ANNOTATION_GPUS}={annotations.get(keys.ANNOTATION_GPUS, '')[:40]}..."
        )
        return
    events = cluster.kubectl(
        "get",
        "events",
        "--field-selector",
        f"involvedObject.name={name},reason=FailedScheduling",
        "-o",
        "jsonpath={.items[-1:].message}",
    ).stdout
    click.echo(f"pod/{name}: Pending. kubectl describe pod says: {events}")


def _probes_and_scheduling(cluster: LocalCluster) -> None:
    from gpusched.dev.localcluster.components import start_scheduler
    from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready
    from gpusched.dev.localcluster.topologies import fixture_path
    from gpusched.dev.localprobes import start_fake_probe

    api = cluster.api_client()
    _section("Simulated GPU nodes, each with a device probe reading its (fake) NVML")
    add_gpu_nodes(api, list(PROBED_NODES), 8)
    wait_nodes_ready(api, list(PROBED_NODES))
    probes = {
        node: start_fake_probe(cluster, node, fixture_path(fixture))
        for node, fixture in PROBED_NODES.items()
    }
    _wait(lambda: len(cluster.kubectl("get", "ngt", "-o", "name").stdout.split()) >= 2)
    click.echo("$ kubectl get nodegputopologies")
    click.echo(cluster.kubectl("get", "nodegputopologies").stdout)
    click.echo(
        "$ kubectl get nodes -L gpusched.io/nvlink.islands,gpusched.io/nvlink.largest-island,"
        "gpusched.io/nvswitch,nvidia.com/gpu.product"
    )
    click.echo(
        cluster.kubectl(
            "get",
            "nodes",
            *PROBED_NODES,
            "-L",
            "gpusched.io/nvlink.islands,gpusched.io/nvlink.largest-island,gpusched.io/nvswitch,"
            "nvidia.com/gpu.product",
        ).stdout
    )

    _section("The scheduler extender places pods on well-wired GPU sets")
    start_scheduler(cluster)
    requests = [
        ("pair", "pcie-0", 2, {}),
        (
            "quad-nvlink",
            "pcie-0",
            4,
            {keys.ANNOTATION_TOPOLOGY_SCOPE: "nvlink", keys.ANNOTATION_TOPOLOGY_MODE: "required"},
        ),
        ("quad", "a100-0", 4, {}),
    ]
    for name, node, gpus, wanted in requests:
        click.echo(f"- {name}: {gpus} GPUs on {node} {wanted or ''}")
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, node, gpus, **wanted)))
    _wait(
        lambda: (
            "pair"
            in cluster.kubectl(
                "get", "pods", "--field-selector", "spec.nodeName!=", "-o", "name"
            ).stdout
        )
    )
    time.sleep(2)
    for name, *_ in requests:
        _show_pod(cluster, name)
    click.echo("(on pcie-0 only GPU pairs 0-2, 1-3, 4-5, 6-7 are NVLink-bridged)")

    _section("A GPU fails: XID 79 on a100-0 GPU 5 takes it out of placement within seconds")
    probes["a100-0"].inject(gpu=5, xid=79)
    _wait(lambda: "Xid79" in cluster.kubectl("get", "ngt", "a100-0", "-o", "yaml").stdout, 30)
    status = json.loads(cluster.kubectl("get", "ngt", "a100-0", "-o", "json").stdout)["status"]
    for gpu in status["gpus"]:
        if gpu["state"] != "Healthy":
            click.echo(f"GPU {gpu['index']}: {gpu['state']} ({gpu['reason']}: {gpu['message']})")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod("rest", "a100-0", 3)))
    _wait(lambda: cluster.kubectl("get", "pod", "rest", "-o", "jsonpath={.spec.nodeName}").stdout)
    time.sleep(1)
    _show_pod(cluster, "rest")
    click.echo("(GPUs 4-7 were free; the new pod gets the three healthy ones)")


@click.command()
@click.option("--name", default="demo", show_default=True, help="Cluster name.")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Stay up until Ctrl-C (--no-wait: walk through, then tear down).",
)
def demo(name: str, wait: bool) -> None:
    """Run the demo: probes, scheduler and operator on a local cluster with simulated GPUs."""
    from gpusched.dev.node_agent_demo import run_node_agent_demo
    from gpusched.dev.operator_demo import run_operator_demo

    cluster = LocalCluster(default_state_dir(name), ensure_toolchain())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        _section("Starting a local control plane (etcd, kube-apiserver, controllers, kwok)")
        cluster.up()
        cluster.install_crds(repo_root() / "crds")
        _probes_and_scheduling(cluster)

        _section("On a real kubelet: the container gets exactly the GPUs written on its pod")
        run_node_agent_demo(cluster, click.echo)

        _section("Tenants, priorities, gangs and preemption: the GpuJob operator")
        run_operator_demo(cluster, click.echo, start_extender=False)

        _section("Try it")
        click.echo(f"export KUBECONFIG={cluster.kubeconfig}")
        click.echo(f"alias kubectl={cluster.binary('kubectl')}")
        click.echo("kubectl get gpujobs -A; kubectl get tenantquotas; kubectl get ngt")
        click.echo("gpusched explain demo-research/pretrain")
        click.echo(f"kubectl apply -f {repo_root() / 'docs' / 'examples'}   # more jobs")
        if wait:
            click.echo("\nThe cluster stays up until you press Ctrl-C.")
            while not stop.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        _section("Tearing the cluster down")
        cluster.down()
