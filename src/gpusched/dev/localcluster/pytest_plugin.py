"""pytest fixtures that give tests a real local control plane.

``local_cluster`` is session-scoped: the first test that needs it builds (or reuses) the binaries
and starts the cluster with the gpusched CRDs installed; the session tears it down. Set
``GPUSCHED_TEST_CLUSTER`` to the state directory of a cluster started with ``gpusched cluster up``
to reuse it instead (faster iteration; it is left running).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.dev.localcluster import LocalCluster, ensure_toolchain
from gpusched.dev.localcluster.binaries import repo_root
from gpusched.dev.localcluster.nodes import add_gpu_nodes, wait_nodes_ready

_names = itertools.count()


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A running control plane with the gpusched CRDs installed."""
    reuse = os.environ.get("GPUSCHED_TEST_CLUSTER")
    if reuse:
        cluster = LocalCluster.attach(Path(reuse))
        cluster.install_crds(repo_root() / "crds")
        yield cluster
        return
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), ensure_toolchain())
    cluster.up()
    try:
        cluster.install_crds(repo_root() / "crds")
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` logged in as cluster admin."""
    api = local_cluster.api_client()
    yield api
    api.close()


@pytest.fixture
def gpu_nodes(kube: Any) -> Iterator[Callable[..., list[str]]]:
    """Factory adding Ready kwok GPU nodes with unique names; they are deleted after the test.

    ``gpu_nodes(3, gpus=8, labels={...}, topology=spec, status=status)`` returns the names;
    ``names=[...]`` gives them explicitly.
    """
    created: list[str] = []

    def make(
        count: int, gpus: int = 8, *, names: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        prefix = kwargs.pop("prefix", "gpu-node")
        names = names or [f"{prefix}-{next(_names)}" for _ in range(count)]
        add_gpu_nodes(kube, names, gpus, **kwargs)
        created.extend(names)
        wait_nodes_ready(kube, names)
        return names

    yield make
    from gpusched.dev.localcluster.nodes import delete_nodes

    delete_nodes(kube, created)
