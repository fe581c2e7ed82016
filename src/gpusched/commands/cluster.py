"""``gpusched cluster``: a local control plane with simulated GPU nodes, for development."""

from __future__ import annotations

import json
import sys

import click

from gpusched.dev.localcluster import (
    ClusterError,
    LocalCluster,
    default_state_dir,
    ensure_toolchain,
)
from gpusched.dev.localcluster.binaries import repo_root

_name = click.option(
    "--name",
    default="dev",
    show_default=True,
    help="Cluster name; its files live in ~/.cache/gpusched/clusters/NAME.",
)


@click.group()
def cluster() -> None:
    """Run a real Kubernetes control plane on loopback (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler, kwok), built from pinned upstream sources."""


@cluster.command()
def build() -> None:
    """Build (or find cached) the control-plane binaries and print where they are."""
    toolchain = ensure_toolchain()
    for binary in sorted(toolchain.directory):
        click.echo(f"{binary}: {toolchain.path(binary)}")


@cluster.command()
@_name
@click.option("--nodes", default=0, show_default=True, help="Simulated GPU nodes to add.")
@click.option("--gpus", default=8, show_default=True, help="GPUs per simulated node.")
@click.option(
    "--crds/--no-crds", default=True, show_default=True, help="Install the gpusched CRDs."
)
def up(name: str, nodes: int, gpus: int, crds: bool) -> None:
    """Start the cluster (replacing one of the same name) and leave it running."""
    try:
        local = LocalCluster(default_state_dir(name), ensure_toolchain()).up()
        if crds:
            local.install_crds(repo_root() / "crds")
        if nodes:
            from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready

            api = local.api_client()
            names = add_gpu_nodes(api, [f"gpu-node-{i}" for i in range(nodes)], gpus)
            wait_nodes_ready(api, names)
    except ClusterError as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"export KUBECONFIG={local.kubeconfig}")


@cluster.command()
@_name
def down(name: str) -> None:
    """Stop every process of the cluster."""
    try:
        LocalCluster.attach(default_state_dir(name)).down()
    except ClusterError as err:
        raise click.ClickException(str(err)) from err


@cluster.command()
@_name
def status(name: str) -> None:
    """Print the cluster's processes, ports and kubeconfig as JSON; exit 1 if any process died."""
    try:
        local = LocalCluster.attach(default_state_dir(name))
    except ClusterError as err:
        raise click.ClickException(str(err)) from err
    running = local.status()
    click.echo(
        json.dumps(
            {"kubeconfig": str(local.kubeconfig), "ports": local.ports(), "processes": running},
            indent=2,
        )
    )
    if not running or not all(running.values()):
        sys.exit(1)


@cluster.command()
@_name
def kubeconfig(name: str) -> None:
    """Print the path of the cluster's admin kubeconfig."""
    click.echo(default_state_dir(name) / "kubeconfig")
