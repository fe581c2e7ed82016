"""The local control plane starts and stops cleanly, again and again, leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

from gpusched.dev.localcluster import LocalCluster, ensure_toolchain
from gpusched.dev.localcluster.processes import ProcessRecord, is_running, port_in_use

COMPONENTS = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}


def _check_serving(cluster: LocalCluster, processes: list[ProcessRecord]) -> None:
    assert {p.name for p in processes} == COMPONENTS
    assert all(is_running(p) for p in processes)
    version = cluster.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.37.1"' in version
    rbac = cluster.kubectl("auth", "can-i", "create", "pods", "--as=nobody", check=False)
    assert rbac.stdout.strip() == "no", "RBAC authorization must be on"


def test_cluster_starts_and_stops_three_times_without_leaking_processes_or_ports(
    tmp_path: Path,
) -> None:
    toolchain = ensure_toolchain()
    for round_ in range(3):
        cluster = LocalCluster(tmp_path / f"round-{round_}", toolchain)
        cluster.up()
        processes = cluster.processes()
        ports = cluster.ports()
        try:
            _check_serving(cluster, processes)
        finally:
            cluster.down()
        leaked = [p.name for p in processes if is_running(p)]
        assert leaked == []
        listening = {name: port for name, port in ports.items() if port_in_use(port)}
        assert listening == {}


def test_down_from_another_handle_stops_a_cluster(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", ensure_toolchain()).up()
    processes = cluster.processes()
    try:
        LocalCluster.attach(tmp_path / "c").down()
        assert [p.name for p in processes if is_running(p)] == []
    finally:
        cluster.down()
