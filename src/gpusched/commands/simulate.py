"""``gpusched simulate``: replay a job trace through gpusched's own admission and placement code
and through the baselines, side by side, and write a report (docs/simulator.md)."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from gpusched.simulator import adapters, fgd
from gpusched.simulator.cluster import from_file, from_mix, with_network
from gpusched.simulator.compare import run_policies
from gpusched.simulator.model import Cluster, RunResult, Workload
from gpusched.simulator.policies import POLICIES
from gpusched.simulator.progress import Progress
from gpusched.simulator.quotas import load_tenant_quotas, with_quotas
from gpusched.simulator.report import write_report
from gpusched.simulator.speed import DEFAULT as DEFAULT_SPEED

#: Philly's default pool: three wirings of 8-GPU nodes, 576 GPUs in all (the trace asks for 374
#: GPUs on average, so about 65 % load with bursts well above the cluster).
PHILLY_NODES = (
    "hgx-a100-sxm4-80gb-8gpu-8nic=24,pcie-8gpu-pix-pxb-two-switch-trees=24,"
    "pcie-8x-rtx4090-2socket-allsys-2nic=24"
)
DEFAULT_POLICIES = {
    "philly": "gpusched,kube-default,kueue-like,best-fit,easy-backfill",
    "openb": "gpusched,best-fit,first-fit,random,kube-default",
    "file": "gpusched,kube-default,kueue-like,best-fit",
}


def _cluster(nodes: str | None, nodes_file: Path | None, default: str | None) -> Cluster:
    if nodes_file is not None:
        return from_file(nodes_file)
    spec = nodes or default
    if spec is None:
        raise click.UsageError("this trace has no node list: give --nodes or --nodes-file")
    return from_mix(spec)


def _inputs(
    *,
    trace: str,
    traces_dir: Path | None,
    nodes: str | None,
    nodes_file: Path | None,
    quotas: Path | None,
    limit: int | None,
    demand: float | None,
    openb_pods: str,
    seed: int,
    network: Path | None = None,
) -> tuple[Workload, Cluster]:
    if trace == "philly":
        cluster = _cluster(nodes, nodes_file, PHILLY_NODES)
        workload = adapters.philly(traces_dir, cluster_gpus=cluster.gpus, limit=limit, seed=seed)
    elif trace == "openb":
        if demand is not None:
            workload, cluster = adapters.openb_inflated(
                traces_dir, pods=openb_pods, demand=demand, seed=seed + 42
            )
        else:
            workload, cluster = adapters.openb(traces_dir, pods=openb_pods)
            if limit is not None:
                workload = replace(
                    workload,
                    jobs=workload.jobs[:limit],
                    notes=(*workload.notes, f"--limit: the first {limit} pods only"),
                )
        if nodes or nodes_file:
            cluster = _cluster(nodes, nodes_file, None)
    else:
        path = Path(trace)
        cluster = _cluster(nodes, nodes_file, None)
        workload = adapters.trace_file(path, cluster_gpus=cluster.gpus, limit=limit)
    if network is not None:
        cluster = with_network(cluster, network)
    if quotas is not None:
        workload = with_quotas(workload, load_tenant_quotas(quotas))
    return workload, cluster


def _command(ctx: click.Context) -> str:
    """The invocation that reproduces this run (every option not left at its default)."""
    words = ["gpusched", "simulate"]
    for param in ctx.command.params:
        name = param.name
        if name is None or ctx.get_parameter_source(name) is ParameterSource.DEFAULT:
            continue
        value = ctx.params[name]
        flag = param.opts[0]
        if isinstance(param, click.Option) and param.is_flag:
            if value:
                words.append(flag)
            continue
        words += [flag, shlex.quote(str(value))]
    return " ".join(words)


@click.command()
@click.option(
    "--trace",
    required=True,
    help="philly, openb, or a trace file in the generic format (.jsonl / .csv).",
)
@click.option(
    "--traces-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the published traces are (default: $GPUSCHED_TRACES, else the nearest "
    "shared/traces beside the checkout).",
)
@click.option(
    "--nodes", default=None, help="Node pool: <fixture>=<count>,... (fixtures/topologies)."
)
@click.option(
    "--nodes-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Node pool as YAML: nodes: [{fixture: ..., count: ...}].",
)
@click.option(
    "--network",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Place the nodes, in order, on the hosts of a three-layer Clos (the Alibaba Lingjun "
    "topology CSV: ip, DSW, PSW, ASW): leaf and aggregation become network levels gpusched "
    "places gangs in, and jobs crossing them slow down (docs/simulator-speed-model.md).",
)
@click.option(
    "--quotas",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="TenantQuota manifests (YAML) instead of the trace's derived tenants.",
)
@click.option("--policies", default=None, help=f"Comma-separated, from: {', '.join(POLICIES)}.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Replay only the first N jobs (not with --demand, which sets how many pods arrive).",
)
@click.option(
    "--demand",
    type=float,
    default=None,
    help="openb only: the FGD experiment, pods arrive and never leave until this share of the "
    "cluster's GPUs was asked for (e.g. 1.3).",
)
@click.option(
    "--openb-pods",
    default="default",
    show_default=True,
    help="openb only: which pod list (default, multigpu20..50, gpuspec33, gpushare100).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--speed-model",
    type=click.Choice(["measured", "none"]),
    default="measured",
    show_default=True,
    help="Slow jobs down by the worst link their GPUs cross (docs/simulator.md), or not.",
)
@click.option(
    "--what-if-quotas",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Replay again with these TenantQuotas and report the difference.",
)
@click.option("--what-if-nodes", default=None, help="Replay again on this node pool and diff.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("simulation"),
    show_default=True,
    help="Directory for report.md, results.json and the plots.",
)
def simulate(
    *,
    trace: str,
    traces_dir: Path | None,
    nodes: str | None,
    nodes_file: Path | None,
    network: Path | None,
    quotas: Path | None,
    policies: str | None,
    limit: int | None,
    demand: float | None,
    openb_pods: str,
    seed: int,
    speed_model: str,
    what_if_quotas: Path | None,
    what_if_nodes: str | None,
    out: Path,
) -> None:
    """Replay a job trace through gpusched and the baselines; write a report."""
    command = _command(click.get_current_context())
    kind = trace if trace in ("philly", "openb") else "file"
    if demand is not None and kind != "openb":
        raise click.UsageError("--demand is the FGD experiment on openb: use it with --trace openb")
    if demand is not None and limit is not None:
        raise click.UsageError(
            "--limit does not apply to the FGD experiment: --demand sets how many pods arrive"
        )
    names = [p.strip() for p in (policies or DEFAULT_POLICIES[kind]).split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise click.UsageError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    try:
        workload, cluster = _inputs(
            trace=trace,
            traces_dir=traces_dir,
            nodes=nodes,
            nodes_file=nodes_file,
            network=network,
            quotas=quotas,
            limit=limit,
            demand=demand,
            openb_pods=openb_pods,
            seed=seed,
        )
        # The what-if inputs and the output directory are checked before any replay: a bad file
        # or an unwritable --out would otherwise be reported only after the base run. The changed
        # run is built from the trace as the base run is, with only the what-if inputs swapped:
        # its TenantQuotas own the trace's namespaces (not the base quotas' tenants), derived
        # guarantees are shares of its own node pool, and --network places its nodes too.
        changed = None
        if what_if_quotas is not None or what_if_nodes is not None:
            changed = _inputs(
                trace=trace,
                traces_dir=traces_dir,
                nodes=what_if_nodes or nodes,
                nodes_file=None if what_if_nodes else nodes_file,
                network=network,
                quotas=what_if_quotas or quotas,
                limit=limit,
                demand=demand,
                openb_pods=openb_pods,
                seed=seed,
            )
    except (ValueError, OSError) as exc:  # QuotaError and ClusterError are ValueErrors
        raise click.ClickException(str(exc)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot make the directory: {exc}") from None
    speed = DEFAULT_SPEED.slowdown if speed_model == "measured" and kind != "openb" else None
    # The FGD experiment's pods never leave and are decided in arrival order: one cycle over all
    # of them places exactly what one cycle per arrival would (a test checks it), far faster.
    interval = math.inf if demand is not None else 0.0
    notes = list(workload.notes)
    notes.append(
        "job-speed model: "
        + (
            ", ".join(f"{link.value} x{v}" for link, v in DEFAULT_SPEED.factors.items())
            if speed
            else "none"
        )
    )
    click.echo(
        f"replaying {len(workload.jobs)} jobs of {workload.name} on {len(cluster.nodes)} nodes "
        f"({cluster.gpus} GPUs) under {', '.join(names)}",
        err=True,
    )

    def replay_all(w: Workload, c: Cluster) -> list[RunResult]:
        return run_policies(
            w, c, names, seed=seed, speed=speed, progress=Progress, cycle_interval=interval
        )

    results = replay_all(workload, cluster)
    baseline = None
    if changed is not None:
        changed_workload, changed_cluster = changed
        notes.append(
            "what-if: "
            + "; ".join(
                part
                for part in (
                    f"TenantQuotas from {what_if_quotas}" if what_if_quotas else "",
                    f"node pool {what_if_nodes}" if what_if_nodes else "",
                )
                if part
            )
            + " (the tables above are the changed run; the what-if section diffs it with the base)"
        )
        baseline, results = results, replay_all(changed_workload, changed_cluster)
    title = f"gpusched simulate: {workload.name} on {cluster.name}"
    try:
        report = write_report(
            results, out, command=command, title=title, baseline=baseline, notes=notes
        )
        if demand is not None:
            curves = fgd.curves_of(results, workload)
            reference_csv = (
                adapters.traces_dir(traces_dir)
                / "alibaba-gpu-v2023"
                / "fgd-expected-results"
                / "analysis_allo_discrete.csv"
            )
            reference = (
                fgd.published(reference_csv, f"openb_pod_list_{openb_pods}")
                if reference_csv.is_file()
                else {}
            )
            with report.open("a") as f:
                f.write("\n".join(fgd.section(curves, reference, out)) + "\n")
            (out / "fgd.json").write_text(
                json.dumps({"curves": curves, "published": reference}, indent=1) + "\n"
            )
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot write the report: {exc}") from None
    for r in results:
        click.echo(f"{r.policy}: replayed in {r.cpu_seconds:.0f} CPU-s", err=True)
    click.echo(f"report: {report}")
