"""Shared helpers of the probe's unit tests: simulated nodes from the real ``topo -m`` fixtures
and the production backend over them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from gpusched.dev.fakenvml import FakeNode
from gpusched.device_probe.nvml_backend import NvmlBackend
from gpusched.device_probe.probe import Probe, ProbeConfig
from gpusched.device_probe.publisher import Publisher
from gpusched.device_probe.sysfs import Sysfs
from gpusched.kubeasync import ApiError, BlockingApi
from gpusched.metrics import ProbeMetrics

H100 = "hgx-h100-sxm-8gpu-8nic"
A100 = "hgx-a100-sxm4-80gb-8gpu-8nic"
BRIDGED = "pcie-8gpu-nvlink-bridge-pairs-2socket"
TREES = "pcie-8gpu-pix-pxb-two-switch-trees"
RTX4090 = "pcie-8x-rtx4090-2socket-allsys-2nic"
WORKSTATION = "workstation-2socket-4x-a100-nvlink-bridge-2nic"
FIXTURES = (H100, A100, BRIDGED, TREES, RTX4090, WORKSTATION)

MakeNode = Callable[..., FakeNode]


def backend_for(fake: FakeNode) -> NvmlBackend:
    """The production backend over a fake node."""
    return NvmlBackend(fake.nvml, Sysfs(fake.sysfs_root), source=fake.topology.source)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class ClusterDouble:
    """An in-memory API server holding one Node and its NodeGpuTopology: GET, server-side
    apply of labels, the object and its status, and the taint merge patch. ``down`` makes
    every request fail as an unreachable server's would."""

    def __init__(self, node: str = "node-a") -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": node, "uid": "uid-1", "resourceVersion": "1", "labels": {}},
            "spec": {},
        }
        self.topology: dict[str, Any] | None = None
        self.writes: list[str] = []
        self.down = False

    def request(self, method: str, path: str, body: Any = None, **_options: Any) -> dict[str, Any]:
        """What the API server would answer (the subset the probe's publisher uses)."""
        if self.down:
            raise ApiError(503, "Service Unavailable", "the API server is unreachable")
        if method == "GET":
            return copy.deepcopy(self._get(path))
        self.writes.append(path)
        if path.startswith("/api/v1/nodes/"):
            self._patch_node(body)
            return copy.deepcopy(self.node)
        if path.endswith("/status"):
            assert self.topology is not None, "status written before the object"
            self.topology["status"] = copy.deepcopy(body["status"])
        else:
            self.topology = {**copy.deepcopy(body), "status": (self.topology or {}).get("status")}
        return copy.deepcopy(self.topology)

    def _get(self, path: str) -> dict[str, Any]:
        if path.startswith("/api/v1/nodes/"):
            return self.node
        if self.topology is None:
            raise ApiError(404, "Not Found", "not found")
        return {k: v for k, v in self.topology.items() if v is not None}

    def _patch_node(self, body: dict[str, Any]) -> None:
        labels = body.get("metadata", {}).get("labels")
        if labels is not None:
            self.node["metadata"]["labels"] = dict(labels)
        taints = body.get("spec", {}).get("taints")
        if taints is not None:
            self.node["spec"]["taints"] = taints
        version = int(self.node["metadata"]["resourceVersion"]) + 1
        self.node["metadata"]["resourceVersion"] = str(version)


def publishing_probe(
    backend: NvmlBackend,
    cluster: ClusterDouble,
    clock: Clock,
    *,
    watch: bool = False,
    boot: datetime | None = None,
    **config: Any,
) -> Probe:
    """A probe publishing to ``cluster`` (events watched only when ``watch``)."""
    metrics = ProbeMetrics()
    return Probe(
        backend,
        ProbeConfig(node_name="node-a", event_timeout_ms=100, **config),
        Publisher(cast(BlockingApi, cluster), "node-a", metrics),
        metrics,
        clock=clock,
        boot=boot,
        watch_events=watch,
    )
