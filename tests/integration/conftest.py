"""Every test under tests/integration runs against the real local control plane."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses, start_scheduler
from tests.integration.operator_harness import OperatorProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def extender(local_cluster: LocalCluster) -> Iterator[SchedulerProcesses]:
    """The gpusched extender and its kube-scheduler, under the scheduler ServiceAccount."""
    processes = start_scheduler(local_cluster)
    yield processes
    local_cluster.stop_process(processes.kube_scheduler)
    local_cluster.stop_process(processes.extender)


@pytest.fixture(scope="module")
def operator(
    local_cluster: LocalCluster, extender: SchedulerProcesses
) -> Iterator[OperatorProcess]:
    """The operator process under its ServiceAccount, binding through ``extender``."""
    process = OperatorProcess(local_cluster)
    process.start()
    yield process
    process.kill()
