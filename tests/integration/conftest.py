"""Every test under tests/integration runs against the real local control plane.

The operator tests share the fixtures below: the gpusched extender with its kube-scheduler, the
operator as a real process under its ServiceAccount, and a scenario that removes what a test
made."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses, start_scheduler
from tests.integration.operator_harness import OperatorProcess, Scenario, scenario


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def extender(local_cluster: LocalCluster) -> Iterator[SchedulerProcesses]:
    """The gpusched extender and its kube-scheduler, under the scheduler ServiceAccount."""
    processes = start_scheduler(local_cluster)
    yield processes
    processes.stop(local_cluster)


@pytest.fixture(scope="module")
def operator(
    local_cluster: LocalCluster, extender: SchedulerProcesses
) -> Iterator[OperatorProcess]:
    """The operator process under its ServiceAccount, binding through ``extender``."""
    process = OperatorProcess(local_cluster)
    process.start()
    yield process
    process.kill()


@pytest.fixture
def sc(
    kube: Any, gpu_nodes: Callable[..., list[str]], operator: OperatorProcess
) -> Iterator[Scenario]:
    if not operator.running():
        operator.start()
    with scenario(kube, gpu_nodes) as s:
        yield s
