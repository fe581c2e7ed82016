"""Fixtures of the end-to-end tests: gpusched components running against the local cluster.

Every test under e2e/ is marked ``e2e``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses, start_scheduler

_namespaces = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def gpusched_scheduler(local_cluster: LocalCluster) -> Iterator[SchedulerProcesses]:
    """The extender and a kube-scheduler serving the gpusched profile, running as the scheduler
    ServiceAccounts the chart gives them (two identities). One module's, stopped after it: two
    kube-schedulers serving the gpusched profile would race for the same pods, and a module
    that starts its own (the observability scenario, whose extender Prometheus scrapes) would
    see some of its pods bound through the other one's extender."""
    processes = start_scheduler(local_cluster)
    yield processes
    processes.stop(local_cluster)


@pytest.fixture
def namespace(kube: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"e2e-{next(_namespaces)}-{int(time.time()) % 100000}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, grace_period_seconds=0)
