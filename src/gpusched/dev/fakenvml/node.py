"""A simulated GPU node: a topology file turned into a fake NVML and a fake sysfs tree.

The input is what a user has at hand: a ``nvidia-smi topo -m`` matrix (``.txt``) or a
NodeGpuTopology object or spec (``.yaml`` / ``.json``, e.g. one a probe published from real
hardware). The node name is the probe's, so one file can simulate many nodes, each with its own
GPU UUIDs.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from gpusched.api.nodegputopology import NodeGpuTopology, NodeGpuTopologySpec
from gpusched.core import NodeTopology, TopologyParseError, parse_topo_matrix
from gpusched.dev.fakenvml.faults import FaultFeed
from gpusched.dev.fakenvml.nvml import FakeNvml
from gpusched.dev.fakenvml.pcie_plan import plan_pcie
from gpusched.dev.fakenvml.sysfs_tree import write_sysfs

_FULL_NAME: Final = re.compile(r"\d+\s*x\s+(NVIDIA [A-Za-z0-9][A-Za-z0-9 ._-]*?)\s*(?:\(|,|;|$)")
_DRIVER: Final = re.compile(r"\bdriver\s+(\d+\.\d+(?:\.\d+)?)\b")


class FakeSourceError(ValueError):
    """The file given to ``--fake`` cannot be turned into a simulated node."""


def _comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))


def load_topology(path: Path, node_name: str) -> NodeTopology:
    """The topology a fake node simulates, from a matrix or a NodeGpuTopology file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise FakeSourceError(f"{path}: {err.strerror or err}") from err
    source = f"fake:{path.name}"
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        return _from_object(path, text, node_name, source)
    try:
        topology = parse_topo_matrix(text, node_name=node_name, source=source)
    except TopologyParseError as err:
        raise FakeSourceError(f"{path}: {err}") from err
    comments = _comments(text)
    full = _FULL_NAME.search(comments)
    driver = _DRIVER.search(comments)
    gpus = topology.gpus
    if full is not None:
        name = full.group(1).strip()
        gpus = tuple(
            replace(g, model=name) if g.model is None or g.model in name else g for g in gpus
        )
    return replace(
        topology, gpus=gpus, driver_version=driver.group(1) if driver else topology.driver_version
    )


def _from_object(path: Path, text: str, node_name: str, source: str) -> NodeTopology:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise FakeSourceError(f"{path}: not YAML: {err}") from err
    if not isinstance(data, dict):
        raise FakeSourceError(f"{path}: expected a NodeGpuTopology object or its spec")
    try:
        if data.get("kind") == "NodeGpuTopology":
            spec = NodeGpuTopology.model_validate(data).spec
        else:
            spec = NodeGpuTopologySpec.model_validate({"nodeName": node_name, **data})
    except ValidationError as err:
        raise FakeSourceError(f"{path}: {err}") from err
    topology = NodeTopology.from_api(spec)  # health is the probe's to judge, not the file's
    return replace(topology, node_name=node_name, source=source, topology_hash=None)


@dataclass
class FakeNode:
    """Everything a probe needs to run against a simulated node."""

    topology: NodeTopology
    nvml: FakeNvml
    sysfs_root: Path
    _owned_dir: Path | None = None

    def close(self) -> None:
        """Remove the generated sysfs tree when this object created it."""
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None


def fake_node(
    source: Path | NodeTopology,
    node_name: str,
    *,
    sysfs_root: Path | None = None,
    faults_path: Path | None = None,
    init_error: str | None = None,
) -> FakeNode:
    """Build the fake NVML and write the fake sysfs tree (in a temporary directory unless
    ``sysfs_root`` is given) for a topology file or object."""
    topology = source if isinstance(source, NodeTopology) else load_topology(source, node_name)
    if isinstance(source, NodeTopology) and topology.node_name != node_name:
        topology = replace(topology, node_name=node_name)
    plan = plan_pcie(topology)
    owned = None
    if sysfs_root is None:
        owned = Path(tempfile.mkdtemp(prefix=f"gpusched-fake-sysfs-{node_name}-"))
        sysfs_root = owned
    write_sysfs(plan, topology, sysfs_root)
    nvml = FakeNvml(
        topology,
        plan,
        faults=FaultFeed(faults_path) if faults_path is not None else None,
        init_error=init_error,
    )
    return FakeNode(topology, nvml, sysfs_root, owned)
