"""``gpusched topo``: read a node's wiring and ask the placement engine about it, by hand.

FILE is either ``nvidia-smi topo -m`` output (as pasted, comments and legend included) or a
NodeGpuTopology object in YAML, so an admin can check what the scheduler would do on a machine
before it joins the cluster, or on a node exactly as the probe published it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError

from gpusched.api.annotations import whole_number
from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.nodegputopology import GpuHealthState, NodeGpuTopology
from gpusched.core import (
    NodeTopology,
    Placement,
    PlacementResult,
    Policy,
    PreparedNode,
    TopologyError,
    TopologyParseError,
    build_graph,
    generation_for,
    nic_groups,
    numa_groups,
    nvlink_islands,
    parse_topo_matrix,
    place,
    prepare,
    switch_trees,
)
from gpusched.core.topology import indices_to_text

#: Request sizes ``topo show`` evaluates.
SHOW_SIZES = (2, 4, 8)


#: Largest FILE read: a ``topo -m`` matrix is a few KiB, a NodeGpuTopology of a big node some
#: hundred KiB.
MAX_TOPOLOGY_BYTES = 4 * 1024 * 1024


def read_text_file(path: Path, limit: int = MAX_TOPOLOGY_BYTES) -> str:
    """A small UTF-8 text file, or a ClickException naming the file and what is wrong with it
    (missing, too big, binary, not UTF-8 with the line and column of the first bad byte)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise click.ClickException(
            f"{path}: larger than {limit // (1024 * 1024)} MiB; not a topology"
        )
    if b"\0" in data:
        raise click.ClickException(
            f"{path}: a binary file, not a topology (topo -m output or YAML)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise click.ClickException(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None


def load_topology(path: Path, gpu_model: str | None = None) -> NodeTopology:
    """Read FILE as a NodeGpuTopology YAML object or, failing that, as a ``topo -m`` matrix."""
    text = read_text_file(path)
    document: Any = None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        document = None  # tabs and pipes of a matrix are not YAML; read it as one below
    if isinstance(document, dict) and document.get("kind") == "NodeGpuTopology":
        try:
            topology = NodeTopology.from_api_object(NodeGpuTopology.model_validate(document))
        except (ValidationError, TopologyError) as exc:
            raise click.ClickException(f"{path}: not a valid NodeGpuTopology: {exc}") from exc
        if gpu_model is not None:
            raise click.UsageError("--gpu-model applies to topo -m matrices, not to YAML objects")
        return topology
    try:
        return parse_topo_matrix(text, node_name=path.stem, gpu_model=gpu_model, source=str(path))
    except (TopologyParseError, TopologyError) as exc:
        raise click.ClickException(f"{path}: {exc}") from exc


def _indices(value: str | None, param: str, node: PreparedNode) -> list[int]:
    if not value:
        return []
    out = []
    for raw in value.split(","):
        part = raw.strip()
        if not part:
            continue
        index = whole_number(part)
        if index is None:
            raise click.BadParameter(f"{part!r} is not a GPU index", param_hint=param)
        if index not in node.topology.gpu_indices:
            raise click.BadParameter(
                f"node has no GPU {index} (GPUs: {indices_to_text(node.topology.gpu_indices)})",
                param_hint=param,
            )
        out.append(index)
    return out


def _model_option(func: Any) -> Any:
    return click.option(
        "--gpu-model",
        default=None,
        help="GPU model for a matrix that does not name it (e.g. 'NVIDIA H100 80GB HBM3'); "
        "sets the NVLink and PCIe generation of the bandwidth model.",
    )(func)


@click.group()
def topo() -> None:
    """Inspect a node's GPU wiring and the placements gpusched would choose on it."""


def _show_data(node: PreparedNode) -> dict[str, Any]:
    topology = node.topology
    graph = build_graph(topology)
    models = sorted({g.model or "unknown" for g in topology.gpus})
    gens = sorted({generation_for(g.model, g.compute_capability).name for g in topology.gpus})
    best: dict[str, Any] = {}
    for k in SHOW_SIZES:
        if k <= len(topology.gpus):
            best[str(k)] = place(node, k).to_dict()
    return {
        "node": topology.node_name,
        "gpus": len(topology.gpus),
        "models": models,
        "generations": gens,
        "nvswitch": topology.nvswitch,
        "wiring_hash": topology.wiring_hash,
        "nvlink_islands": [sorted(i) for i in nvlink_islands(graph)],
        "pcie_switch_trees": [sorted(t) for t in switch_trees(graph)],
        "numa_nodes": {str(k): sorted(v) for k, v in numa_groups(graph).items()},
        "nics": [
            {
                "index": nic.index,
                "name": nic.name,
                "numa_node": nic.numa_node,
                "local_gpus": sorted(nic_groups(graph).get(nic.index, frozenset())),
            }
            for nic in topology.nics
        ],
        "health": {
            str(g.index): g.health.value for g in topology.gpus if g.health.value != "Healthy"
        },
        "best_sets": best,
    }


@topo.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_model_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(file: Path, gpu_model: str | None, as_json: bool) -> None:
    """Islands, switch trees, NUMA and NIC grouping, and the best sets for 2, 4 and 8 GPUs."""
    node = prepare(load_topology(file, gpu_model))
    data = _show_data(node)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    echo = click.echo
    echo(
        f"node {data['node']}: {data['gpus']} GPUs, model {', '.join(data['models'])} "
        f"(bandwidth model: {', '.join(data['generations'])})"
        + (", NVSwitch" if data["nvswitch"] else "")
    )
    echo(f"wiring hash {data['wiring_hash']}")
    echo(
        "NVLink islands:    "
        + "  ".join("{" + indices_to_text(i) + "}" for i in data["nvlink_islands"])
    )
    echo(
        "switch groups:     "
        + "  ".join("{" + indices_to_text(t) + "}" for t in data["pcie_switch_trees"])
    )
    if data["numa_nodes"]:
        echo(
            "NUMA nodes:        "
            + "  ".join(f"{n}: {{{indices_to_text(g)}}}" for n, g in data["numa_nodes"].items())
        )
    else:
        echo("NUMA nodes:        not reported")
    for nic in data["nics"]:
        local = indices_to_text(nic["local_gpus"]) or "none"
        numa = "?" if nic["numa_node"] is None else nic["numa_node"]
        echo(f"NIC{nic['index']} {nic['name']}: NUMA {numa}, PIX/PXB GPUs: {local}")
    for index, state in data["health"].items():
        echo(f"GPU {index}: {state}")
    echo("best sets (all GPUs free, scope node):")
    for k, result in data["best_sets"].items():
        if result["ok"]:
            bottleneck = (
                "-"
                if result["bottleneck_gbps"] is None
                else f"{result['bottleneck_link']} {result['bottleneck_gbps']:.1f} GB/s"
            )
            echo(
                f"  k={k}: GPUs {indices_to_text(result['gpus'])}  class "
                f"{result['topology_class']}  slowest pair {bottleneck}  "
                f"score {result['score']:.1f}"
            )
        else:
            echo(f"  k={k}: none ({result['reason']})")


def _print_result(result: PlacementResult) -> None:
    if isinstance(result, Placement):
        click.echo(
            f"GPUs {indices_to_text(result.gpus)}  class {result.topology_class.value}  "
            f"score {result.score:.2f}"
        )
    else:
        click.echo(f"cannot place: {result.reason.value}")
    for reason in result.reasons:
        click.echo(f"  - {reason}")


@topo.command("place")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--gpus", "k", type=int, required=True, help="Number of GPUs requested.")
@click.option("--busy", default=None, help="GPU indices already in use, e.g. 0,3.")
@click.option("--unhealthy", default=None, help="GPU indices to treat as Unhealthy.")
@click.option("--degraded", default=None, help="GPU indices to treat as Degraded.")
@click.option(
    "--scope",
    type=click.Choice([s.value for s in TopologyScope]),
    default=TopologyScope.NODE.value,
    show_default=True,
    help="How tightly the set must be wired.",
)
@click.option("--required", is_flag=True, help="Refuse rather than place outside the scope.")
@click.option("--multi-node", is_flag=True, help="The job spans nodes: prefer NIC-local GPUs.")
@_model_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def place_command(
    *,
    file: Path,
    k: int,
    busy: str | None,
    unhealthy: str | None,
    degraded: str | None,
    scope: str,
    required: bool,
    multi_node: bool,
    gpu_model: str | None,
    as_json: bool,
) -> None:
    """Choose the GPU set for a request of --gpus K and say why.

    Exits 1 when the request cannot be placed (the reason is printed, in JSON too).
    """
    topology = load_topology(file, gpu_model)
    node = prepare(topology)
    states = dict.fromkeys(_indices(unhealthy, "--unhealthy", node), GpuHealthState.UNHEALTHY)
    states.update(dict.fromkeys(_indices(degraded, "--degraded", node), GpuHealthState.DEGRADED))
    if states:
        node = prepare(topology.with_health(states))
    policy = Policy(
        scope=TopologyScope(scope),
        mode=TopologyMode.REQUIRED if required else TopologyMode.PREFERRED,
        multi_node=multi_node,
    )
    result = place(node, k, policy, busy=_indices(busy, "--busy", node))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)
    if not result.ok:
        raise SystemExit(1)
