"""Node and NodeGpuTopology objects as the API server returns them, for operator tests that
decide over a cluster of 8-GPU H100 boards."""

from __future__ import annotations

from typing import Any

from gpusched.api import keys
from gpusched.dev.localcluster.topologies import fixture_objects


def h100_node(name: str) -> dict[str, Any]:
    """A Ready node with 8 allocatable GPUs, labelled H100."""
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {keys.GFD_PRODUCT: "H100"}},
        "spec": {},
        "status": {
            "allocatable": {keys.GPU_RESOURCE: "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def h100_topology(name: str) -> dict[str, Any]:
    """Its NodeGpuTopology: an HGX H100 board (NVSwitch)."""
    spec, status = fixture_objects("hgx-h100-sxm-8gpu-8nic", name)
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": spec.to_k8s(),
        "status": status.to_k8s(),
    }
