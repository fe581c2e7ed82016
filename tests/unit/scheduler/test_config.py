"""The kube-scheduler configuration generator (the chart ships the same, checked in
tests/integration/test_chart.py)."""

from __future__ import annotations

from gpusched.scheduler.config import EXTENDER_WEIGHT, kube_scheduler_config


def test_extender_is_node_cache_capable_binds_and_handles_only_gpu_pods() -> None:
    (extender,) = kube_scheduler_config("http://127.0.0.1:8888")["extenders"]
    assert extender["nodeCacheCapable"] is True
    assert extender["bindVerb"] == "bind"
    assert extender["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert extender["weight"] == EXTENDER_WEIGHT
    assert extender["ignorable"] is False
