"""``gpusched demo``: a local cluster with simulated GPU nodes and the example workloads.

It shows, on one machine and without GPUs, what gpusched does: simulated GPU nodes, the CRDs,
two tenants with quotas, example GpuJobs, and what each one's status says. It stays up until
interrupted (or exits at once with ``--no-wait``) and always tears the cluster down.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import click

from gpusched.localcluster import LocalCluster, default_state_dir, ensure_toolchain
from gpusched.localcluster.binaries import repo_root

#: Simulated nodes: name prefix, count, GPU product label, rack label.
DEMO_NODES = (
    ("h100", 2, "NVIDIA-H100-80GB-HBM3", "rack-a"),
    ("a100", 2, "NVIDIA-A100-SXM4-80GB", "rack-b"),
)
#: Apply order: what other manifests refer to comes first.
EXAMPLE_ORDER = ("namespaces.yaml", "priorityclasses.yaml", "tenantquotas.yaml")


def _section(title: str) -> None:
    click.echo(f"\n=== {title}")


def _examples(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.yaml"))
    rank = {name: i for i, name in enumerate(EXAMPLE_ORDER)}
    return sorted(files, key=lambda path: (rank.get(path.name, len(rank)), path.name))


@click.command()
@click.option("--name", default="demo", show_default=True, help="Cluster name.")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Stay up until Ctrl-C (--no-wait: show everything, then tear down).",
)
def demo(name: str, wait: bool) -> None:
    """Start a local cluster with simulated GPU nodes and run the example workloads."""
    from gpusched.localcluster.nodes import add_gpu_nodes, wait_nodes_ready

    root = repo_root()
    cluster = LocalCluster(default_state_dir(name), ensure_toolchain())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        _section("Starting a local control plane (etcd, kube-apiserver, controllers, kwok)")
        cluster.up()
        cluster.install_crds(root / "crds")
        api = cluster.api_client()

        _section("Adding simulated GPU nodes")
        for prefix, count, product, rack in DEMO_NODES:
            names = add_gpu_nodes(
                api,
                [f"{prefix}-{i}" for i in range(count)],
                8,
                labels={"nvidia.com/gpu.product": product, "topology.kubernetes.io/rack": rack},
            )
            wait_nodes_ready(api, names)
        click.echo(
            cluster.kubectl(
                "get", "nodes", "-L", "nvidia.com/gpu.product,topology.kubernetes.io/rack"
            ).stdout
        )

        _section("Applying the examples in docs/examples")
        for path in _examples(root / "docs" / "examples"):
            click.echo(cluster.kubectl("apply", "-f", str(path)).stdout.rstrip())

        time.sleep(1)
        _section("kubectl get tenantquotas")
        click.echo(cluster.kubectl("get", "tenantquotas").stdout)
        _section("kubectl get gpujobs -A")
        click.echo(cluster.kubectl("get", "gpujobs", "-A", "-o", "wide").stdout)

        _section("Try it")
        click.echo(f"export KUBECONFIG={cluster.kubeconfig}")
        click.echo(f"{cluster.binary('kubectl')} get gpujobs -A")
        click.echo(f"{cluster.binary('kubectl')} explain gpujob.spec.topology")
        if wait:
            click.echo("\nThe cluster stays up until you press Ctrl-C.")
            while not stop.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        _section("Tearing the cluster down")
        cluster.down()
