"""Benchmarks behind ``gpusched bench``; their recorded figures live in docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched.dev.localcluster import LocalCluster


@contextmanager
def bench_cluster(cluster_dir: Path | None, workdir: Path) -> Iterator[LocalCluster]:
    """The running local cluster in ``cluster_dir``, or a fresh one in ``workdir`` with the CRDs
    installed, stopped on exit (a cluster given is left running)."""
    from gpusched.dev.localcluster import LocalCluster, ensure_toolchain
    from gpusched.dev.localcluster.binaries import repo_root

    if cluster_dir is not None:
        yield LocalCluster.attach(cluster_dir)
        return
    cluster = LocalCluster(workdir / "cluster", ensure_toolchain(), progress=lambda _m: None)
    cluster.up()
    try:
        cluster.install_crds(repo_root() / "crds")
        yield cluster
    finally:
        cluster.down()
