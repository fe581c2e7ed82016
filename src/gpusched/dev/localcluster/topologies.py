"""Real ``nvidia-smi topo -m`` matrices (``fixtures/topologies``) as NodeGpuTopology objects for
simulated nodes, with stable per-node GPU UUIDs so tests can check assignments by UUID."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

from gpusched.api.nodegputopology import NodeGpuTopologySpec, NodeGpuTopologyStatus
from gpusched.core import NodeTopology, parse_topo_matrix
from gpusched.dev.localcluster.binaries import repo_root
from gpusched.simulator.cluster import GB200_TRAY_MATRIX

#: The six matrices every component is tested on (see fixtures/topologies/README.md).
FIXTURE_NAMES: Final = (
    "hgx-h100-sxm-8gpu-8nic",
    "hgx-a100-sxm4-80gb-8gpu-8nic",
    "pcie-8gpu-nvlink-bridge-pairs-2socket",
    "pcie-8gpu-pix-pxb-two-switch-trees",
    "pcie-8x-rtx4090-2socket-allsys-2nic",
    "workstation-2socket-4x-a100-nvlink-bridge-2nic",
)


def fixtures_dir() -> Path:
    """Directory of the committed matrices."""
    return repo_root() / "fixtures" / "topologies"


def fixture_path(name: str) -> Path:
    """Path of one matrix by name (with or without ``.txt``)."""
    path = fixtures_dir() / (name if name.endswith(".txt") else f"{name}.txt")
    if not path.exists():
        raise FileNotFoundError(f"no topology fixture {name!r}; known: {', '.join(FIXTURE_NAMES)}")
    return path


def gpu_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking UUID for GPU ``index`` of simulated node ``node``."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def fixture_topology(name: str, node: str) -> NodeTopology:
    """The matrix ``name`` as the topology of ``node``, GPUs given UUIDs."""
    text = fixture_path(name).read_text()
    topology = parse_topo_matrix(text, node_name=node, source=f"fake:{name}")
    spec, status = topology.to_api()
    for gpu in spec.gpus:
        gpu.uuid = gpu_uuid(node, gpu.index)
    for health in status.gpus:
        health.uuid = gpu_uuid(node, health.index)
    return NodeTopology.from_api(spec, status)


def fixture_objects(name: str, node: str) -> tuple[NodeGpuTopologySpec, NodeGpuTopologyStatus]:
    """Spec and status of the NodeGpuTopology a probe would publish for ``node``."""
    return fixture_topology(name, node).to_api()


def nvl72_tray_objects(node: str, clique: str) -> tuple[NodeGpuTopologySpec, NodeGpuTopologyStatus]:
    """The NodeGpuTopology of one tray of an NVL72 rack: the GB200 tray wiring, GPUs given
    UUIDs, and the rack's NVLink clique (``<clusterUUID>.<cliqueId>``, as NVML reports it)."""
    topology = parse_topo_matrix(
        GB200_TRAY_MATRIX, node_name=node, gpu_model="GB200", source="fake:gb200-nvl72-tray"
    )
    spec, status = topology.to_api()
    spec.clique = clique
    for gpu in spec.gpus:
        gpu.uuid = gpu_uuid(node, gpu.index)
    for health in status.gpus:
        health.uuid = gpu_uuid(node, health.index)
    return spec, status
