"""``gpusched simulate``: replay a job trace through gpusched's own admission and placement code
and through the baselines, side by side, and write a report (docs/simulator.md)."""

from __future__ import annotations

import json
import math
import os
import shlex
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import click
from click.core import ParameterSource

from gpusched.simulator import adapters, fgd
from gpusched.simulator import seeds as seed_summary
from gpusched.simulator.cluster import from_file, from_mix, with_network
from gpusched.simulator.compare import run_policies
from gpusched.simulator.figures import Figures
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


def _command(ctx: click.Context, *, drop: tuple[str, ...] = (), extra: str = "") -> str:
    """The invocation that reproduces this run (every option not left at its default, but
    those named in ``drop``, then ``extra``)."""
    words = ["gpusched", "simulate"]
    for param in ctx.command.params:
        name = param.name
        if (
            name is None
            or name in drop
            or ctx.get_parameter_source(name) is ParameterSource.DEFAULT
        ):
            continue
        value = ctx.params[name]
        flag = param.opts[0]
        if isinstance(param, click.Option) and param.is_flag:
            if value:
                words.append(flag)
            continue
        words += [flag, shlex.quote(str(value))]
    return " ".join([*words, extra] if extra else words)


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
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Draws what the trace leaves open (Philly's synthesised priorities, random choices).",
)
@click.option(
    "--seeds",
    default=None,
    help="Comma-separated seeds (e.g. 0,1,2): replay every policy under each, each seed's "
    "report in <out>/seed-<seed>/, and every figure per seed, its mean and range, and each "
    "policy against the first seed by seed in <out>/seeds.md.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="With --seeds: seeds replayed at once, a process each (default: one per CPU, at "
    "most one per seed).",
)
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
    seeds: str | None,
    workers: int | None,
    speed_model: str,
    what_if_quotas: Path | None,
    what_if_nodes: str | None,
    out: Path,
) -> None:
    """Replay a job trace through gpusched and the baselines; write a report."""
    ctx = click.get_current_context()
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
    run = _Run(
        trace=trace,
        traces_dir=traces_dir,
        nodes=nodes,
        nodes_file=nodes_file,
        network=network,
        quotas=quotas,
        policies=tuple(names),
        limit=limit,
        demand=demand,
        openb_pods=openb_pods,
        speed_model=speed_model,
        what_if_quotas=what_if_quotas,
        what_if_nodes=what_if_nodes,
    )
    if seeds is None:
        if workers is not None:
            raise click.UsageError("--workers runs seeds at once: use it with --seeds")
        report = _replay(run, seed, out, _command(ctx), tty=None, of_seeds=False)
        click.echo(f"report: {report}")
        return
    chosen = _seed_list(seeds)
    if ctx.get_parameter_source("seed") is not ParameterSource.DEFAULT:
        raise click.UsageError("give --seed or --seeds, not both")
    if what_if_quotas is not None or what_if_nodes is not None:
        raise click.UsageError(
            "--seeds compares policies, not what-ifs: run the what-if once per --seed"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot make the directory: {exc}") from None
    count = min(workers or os.cpu_count() or 1, len(chosen))
    jobs = [
        (
            s,
            out / f"seed-{s}",
            _command(
                ctx,
                drop=("seeds", "workers", "out"),
                extra=f"--seed {s} --out " + shlex.quote(str(out / f"seed-{s}")),
            ),
        )
        for s in chosen
    ]
    click.echo(f"replaying seeds {', '.join(map(str, chosen))}, {count} at once", err=True)
    if count == 1:
        reports = [_replay(run, s, where, command, tty=None) for s, where, command in jobs]
    else:
        with ProcessPoolExecutor(max_workers=count) as pool:
            futures = [
                pool.submit(_replay, run, s, where, command, tty=False)
                for s, where, command in jobs
            ]
            for done in as_completed(futures):
                if done.exception() is not None:
                    # Said at once, not after every other seed's replay: those not started
                    # are not, those running end first (a process cannot be stopped midway).
                    for f in futures:
                        f.cancel()
                    done.result()
            reports = [f.result() for f in futures]
    runs = {s: _figures_of(report.parent) for s, report in zip(chosen, reports, strict=True)}
    summary = seed_summary.summarise(runs)
    try:
        (out / "seeds.md").write_text(seed_summary.render(summary) + "\n")
        (out / "seeds.json").write_text(json.dumps(seed_summary.to_json(summary), indent=1) + "\n")
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot write the summary: {exc}") from None
    click.echo(f"report: {out / 'seeds.md'}")


def _seed_list(text: str) -> list[int]:
    """The seeds of ``--seeds``: whole numbers, each once."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise click.UsageError(
            f"--seeds {text!r}: give whole numbers separated by commas, e.g. 0,1,2"
        ) from None
    if not values:
        raise click.UsageError("--seeds: give at least one seed, e.g. 0,1,2")
    if len(set(values)) != len(values):
        raise click.UsageError(f"--seeds {text!r}: each seed once")
    return values


@dataclass(frozen=True)
class _Run:
    """What one invocation replays, but for the seed and where the report goes (sent whole to
    the processes that replay seeds at once)."""

    trace: str
    traces_dir: Path | None
    nodes: str | None
    nodes_file: Path | None
    network: Path | None
    quotas: Path | None
    policies: tuple[str, ...]
    limit: int | None
    demand: float | None
    openb_pods: str
    speed_model: str
    what_if_quotas: Path | None
    what_if_nodes: str | None


def _figures_of(directory: Path) -> list[Figures]:
    """The figures of each policy of the replay whose results.json is in ``directory``."""
    data = json.loads((directory / "results.json").read_text())
    return [Figures.from_json(f) for f in data["figures"]]


def _replay(
    run: _Run, seed: int, out: Path, command: str, *, tty: bool | None, of_seeds: bool = True
) -> Path:
    """Replay every policy of ``run`` under ``seed`` (and the what-if, if any) and write the
    report into ``out``; the report's path. ``tty``: how progress is drawn (None: as stderr
    is; False: plain lines, as when several replays share one stderr); ``of_seeds``: one of
    several seeds (its lines on stderr name it)."""
    tag = f" (seed {seed})" if of_seeds else ""
    kind = run.trace if run.trace in ("philly", "openb") else "file"
    try:
        workload, cluster = _inputs(
            trace=run.trace,
            traces_dir=run.traces_dir,
            nodes=run.nodes,
            nodes_file=run.nodes_file,
            network=run.network,
            quotas=run.quotas,
            limit=run.limit,
            demand=run.demand,
            openb_pods=run.openb_pods,
            seed=seed,
        )
        # The what-if inputs and the output directory are checked before any replay: a bad file
        # or an unwritable --out would otherwise be reported only after the base run. The changed
        # run is built from the trace as the base run is, with only the what-if inputs swapped:
        # its TenantQuotas own the trace's namespaces (not the base quotas' tenants), derived
        # guarantees are shares of its own node pool, and --network places its nodes too.
        changed = None
        if run.what_if_quotas is not None or run.what_if_nodes is not None:
            changed = _inputs(
                trace=run.trace,
                traces_dir=run.traces_dir,
                nodes=run.what_if_nodes or run.nodes,
                nodes_file=None if run.what_if_nodes else run.nodes_file,
                network=run.network,
                quotas=run.what_if_quotas or run.quotas,
                limit=run.limit,
                demand=run.demand,
                openb_pods=run.openb_pods,
                seed=seed,
            )
    except (ValueError, OSError) as exc:  # QuotaError and ClusterError are ValueErrors
        raise click.ClickException(str(exc)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot make the directory: {exc}") from None
    speed = DEFAULT_SPEED.slowdown if run.speed_model == "measured" and kind != "openb" else None
    # The FGD experiment's pods never leave and are decided in arrival order: one cycle over all
    # of them places exactly what one cycle per arrival would (a test checks it), far faster.
    interval = math.inf if run.demand is not None else 0.0
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
        f"({cluster.gpus} GPUs) under {', '.join(run.policies)}"
        + (f", seed {seed}" if of_seeds else ""),
        err=True,
    )

    def progress(policy: str) -> Progress:
        return Progress(f"{policy}{tag}", tty=tty)

    def replay_all(w: Workload, c: Cluster) -> list[RunResult]:
        return run_policies(
            w, c, run.policies, seed=seed, speed=speed, progress=progress, cycle_interval=interval
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
                    f"TenantQuotas from {run.what_if_quotas}" if run.what_if_quotas else "",
                    f"node pool {run.what_if_nodes}" if run.what_if_nodes else "",
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
        if run.demand is not None:
            curves = fgd.curves_of(results, workload)
            reference_csv = (
                adapters.traces_dir(run.traces_dir)
                / "alibaba-gpu-v2023"
                / "fgd-expected-results"
                / "analysis_allo_discrete.csv"
            )
            reference = (
                fgd.published(reference_csv, f"openb_pod_list_{run.openb_pods}")
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
        click.echo(f"{r.policy}{tag}: replayed in {r.cpu_seconds:.0f} CPU-s", err=True)
    return report
