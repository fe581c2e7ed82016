"""Simulated clusters built from the real ``nvidia-smi topo -m`` matrices (``fixtures/topologies``).

A pool is a mix of fixtures and counts, on the command line (``--nodes
hgx-h100-sxm-8gpu-8nic=16,pcie-8x-rtx4090-2socket-allsys-2nic=8``) or in a YAML file
(``nodes: [{fixture: ..., count: ...}]``). Each matrix is parsed once; its nodes share one
prepared wiring, so pools of thousands of nodes cost what one node costs. Nodes get a rack label
(``topology.kubernetes.io/rack``, 20 nodes per rack) as the probe's neighbours would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import yaml

from gpusched.core import parse_topo_matrix, prepare
from gpusched.core.bandwidth import find_model_in_text
from gpusched.simulator.model import Cluster, SimNode

RACK_LABEL: Final = "topology.kubernetes.io/rack"
NODES_PER_RACK: Final = 20

#: Short node-name prefixes of the committed fixtures.
SHORT_NAMES: Final = {
    "hgx-h100-sxm-8gpu-8nic": "h100",
    "hgx-a100-sxm4-80gb-8gpu-8nic": "a100",
    "pcie-8gpu-nvlink-bridge-pairs-2socket": "bridged",
    "pcie-8gpu-pix-pxb-two-switch-trees": "pcie",
    "pcie-8x-rtx4090-2socket-allsys-2nic": "rtx4090",
    "workstation-2socket-4x-a100-nvlink-bridge-2nic": "ws-a100",
}


class ClusterError(ValueError):
    """A node pool that cannot be built."""


def fixtures_dir() -> Path:
    """The committed matrices: ``$GPUSCHED_FIXTURES``, else ``fixtures/topologies`` of the
    source checkout this package runs from."""
    override = os.environ.get("GPUSCHED_FIXTURES")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "fixtures" / "topologies"


def parse_mix(spec: str) -> dict[str, int]:
    """``name=count,name=count`` as a mapping (order kept)."""
    mix: dict[str, int] = {}
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        name, sep, count = part.partition("=")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise ClusterError(f"node pool entry {part!r}: expected <fixture>=<count>, count >= 1")
        key = name.strip().removesuffix(".txt")
        mix[key] = mix.get(key, 0) + int(count)
    if not mix:
        raise ClusterError("the node pool is empty")
    return mix


def from_mix(
    mix: str | Mapping[str, int], directory: Path | None = None, name: str | None = None
) -> Cluster:
    """A cluster of ``count`` nodes of each fixture."""
    counts = parse_mix(mix) if isinstance(mix, str) else dict(mix)
    directory = directory or fixtures_dir()
    known = sorted(p.stem for p in directory.glob("*.txt")) if directory.is_dir() else []
    nodes: list[SimNode] = []
    for fixture, count in counts.items():
        path = directory / f"{fixture}.txt"
        if not path.is_file():
            raise ClusterError(
                f"no topology fixture {fixture!r} in {directory}; known: {', '.join(known)}"
            )
        text = path.read_text()
        topology = parse_topo_matrix(text, node_name=fixture, source=f"fixture:{fixture}")
        model = _model(text, fixture)
        short = SHORT_NAMES.get(fixture, fixture)
        for i in range(count):
            node = f"{short}-{i}"
            rack = f"rack-{len(nodes) // NODES_PER_RACK}"
            nodes.append(
                SimNode(
                    name=node,
                    topology=prepare(replace(topology, node_name=node)),
                    model=model,
                    kind=fixture,
                    labels={RACK_LABEL: rack},
                )
            )
    label = name or ",".join(f"{f}={c}" for f, c in counts.items())
    return Cluster(label, tuple(nodes))


def from_file(path: Path, directory: Path | None = None) -> Cluster:
    """A cluster from YAML: ``nodes: [{fixture: <name>, count: <n>}, ...]``."""
    try:
        data: Any = yaml.safe_load(path.read_text())
        entries = data["nodes"]
        mix = {str(e["fixture"]): int(e["count"]) for e in entries}
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise ClusterError(
            f"{path}: expected 'nodes: [{{fixture: <name>, count: <n>}}, ...]' ({exc})"
        ) from None
    return from_mix(mix, directory, name=path.stem)


def _model(text: str, fixture: str) -> str | None:
    """The GPU model a fixture's header names (else one in its file name)."""
    return find_model_in_text(text) or find_model_in_text(fixture.replace("-", " "))
