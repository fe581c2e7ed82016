"""Simulated clusters built from the real ``nvidia-smi topo -m`` matrices (``fixtures/topologies``).

A pool is a mix of fixtures and counts, on the command line (``--nodes
hgx-h100-sxm-8gpu-8nic=16,pcie-8x-rtx4090-2socket-allsys-2nic=8``) or in a YAML file
(``nodes: [{fixture: ..., count: ...}]``). Each matrix is parsed once; its nodes share one
prepared wiring, so pools of thousands of nodes cost what one node costs. Nodes get a rack label
(``topology.kubernetes.io/rack``, 20 nodes per rack) as the probe's neighbours would.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import yaml

from gpusched.api.annotations import whole_number
from gpusched.core import parse_topo_matrix, prepare
from gpusched.core.admission import Level
from gpusched.core.bandwidth import find_model_in_text
from gpusched.simulator.model import Cluster, Link, NetworkLevel, SimNode

RACK_LABEL: Final = "topology.kubernetes.io/rack"
NODES_PER_RACK: Final = 20
CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
LEAF_LABEL: Final = "network.gpusched.io/leaf"
AGGREGATION_LABEL: Final = "network.gpusched.io/aggregation"
CORE_LABEL: Final = "network.gpusched.io/core"
#: Pool entry of NVL72 racks (``--nodes gb200-nvl72-rack=2``).
NVL72_RACK: Final = "gb200-nvl72-rack"
TRAYS_PER_NVL72: Final = 18

#: Short node-name prefixes of the committed fixtures.
SHORT_NAMES: Final = {
    "hgx-h100-sxm-8gpu-8nic": "h100",
    "hgx-a100-sxm4-80gb-8gpu-8nic": "a100",
    "pcie-8gpu-nvlink-bridge-pairs-2socket": "bridged",
    "pcie-8gpu-pix-pxb-two-switch-trees": "pcie",
    "pcie-8x-rtx4090-2socket-allsys-2nic": "rtx4090",
    "workstation-2socket-4x-a100-nvlink-bridge-2nic": "ws-a100",
}


#: A GB200 compute tray as ``nvidia-smi topo -m`` would show it: 4 GPUs, every pair NV18 (through
#: the NVLink switch trays of the rack), two NUMA nodes (two Grace CPUs). Synthetic: no tray's
#: matrix is among the recorded fixtures; it is what an NVL72 rack's nodes look like to gpusched.
GB200_TRAY_MATRIX: Final = "\n".join(
    [
        "\t" + "\t".join(f"GPU{i}" for i in range(4)) + "\tCPU Affinity\tNUMA Affinity",
        *(
            f"GPU{i}\t"
            + "\t".join(" X " if i == j else "NV18" for j in range(4))
            + f"\t{0 if i < 2 else 72}-{71 if i < 2 else 143}\t{0 if i < 2 else 1}"
            for i in range(4)
        ),
    ]
)


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
        number = whole_number(count.strip())
        if not sep or number is None or number < 1:
            raise ClusterError(f"node pool entry {part!r}: expected <fixture>=<count>, count >= 1")
        key = name.strip().removesuffix(".txt")
        mix[key] = mix.get(key, 0) + number
    if not mix:
        raise ClusterError("the node pool is empty")
    return mix


def from_mix(
    mix: str | Mapping[str, int], directory: Path | None = None, name: str | None = None
) -> Cluster:
    """A cluster of ``count`` nodes of each fixture (``gb200-nvl72-rack=<n>``: ``n`` NVL72
    racks of 18 GB200 trays, each rack one NVLink clique)."""
    counts = parse_mix(mix) if isinstance(mix, str) else dict(mix)
    directory = directory or fixtures_dir()
    known = sorted(p.stem for p in directory.glob("*.txt")) if directory.is_dir() else []
    nodes: list[SimNode] = []
    levels: tuple[NetworkLevel, ...] = ()
    for fixture, count in counts.items():
        if fixture == NVL72_RACK:
            nodes.extend(_nvl72_racks(count))
            levels = (NetworkLevel(Level(CLIQUE_LABEL, "clique", whole_domains=True), Link.NVLINK),)
            continue
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
    return Cluster(label, tuple(nodes), levels)


def _nvl72_racks(count: int) -> list[SimNode]:
    """``count`` NVL72 racks: 18 GB200 trays of 4 GPUs each, one NVLink clique per rack."""
    tray = parse_topo_matrix(
        GB200_TRAY_MATRIX, node_name="gb200-tray", gpu_model="GB200", source=f"fixture:{NVL72_RACK}"
    )
    out = []
    for rack in range(count):
        for i in range(TRAYS_PER_NVL72):
            name = f"nvl72-{rack}-{i:02d}"
            out.append(
                SimNode(
                    name=name,
                    topology=prepare(replace(tray, node_name=name)),
                    model="GB200",
                    kind=NVL72_RACK,
                    labels={CLIQUE_LABEL: f"nvl72-{rack}", RACK_LABEL: f"nvl72-{rack}"},
                )
            )
    return out


def with_network(cluster: Cluster, path: Path) -> Cluster:
    """The cluster's nodes placed, in order, on the hosts of a three-layer Clos listed as in
    the Alibaba Lingjun topology file (columns ``ip, DSW, PSW, ASW``: core, aggregation and
    leaf switch of each host). A job inside one leaf crosses the network; across leaves of one
    aggregation block, the aggregation layer; across blocks, the core."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        hosts = [(r["ASW"], r["PSW"], r["DSW"]) for r in rows]
    except (OSError, KeyError, csv.Error) as exc:
        raise ClusterError(
            f"{path}: expected a CSV with columns ip, DSW, PSW, ASW ({exc})"
        ) from None
    if len(hosts) < len(cluster.nodes):
        raise ClusterError(
            f"{path} lists {len(hosts)} hosts, fewer than the {len(cluster.nodes)} nodes"
        )
    nodes = tuple(
        replace(
            node,
            # The leaf switch is the rack: the synthetic rack label goes.
            labels={
                **{k: v for k, v in node.labels.items() if k != RACK_LABEL},
                LEAF_LABEL: leaf,
                AGGREGATION_LABEL: block,
                CORE_LABEL: core,
            },
        )
        for node, (leaf, block, core) in zip(cluster.nodes, hosts, strict=False)
    )
    levels = (
        *cluster.levels,
        NetworkLevel(Level(LEAF_LABEL, "leaf"), Link.NETWORK),
        NetworkLevel(Level(AGGREGATION_LABEL, "aggregation"), Link.CROSS_LEAF),
    )
    return replace(
        cluster,
        name=f"{cluster.name} on {path.parent.name}",
        nodes=nodes,
        levels=levels,
        beyond=Link.CROSS_AGGREGATION,
    )


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
