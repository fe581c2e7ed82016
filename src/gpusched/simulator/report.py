"""The replay's report: ``results.json``, PNG plots and a self-contained ``report.md``.

Plots are drawn with matplotlib's object API on the Agg canvas (no display, no pyplot global
state). Every series is plotted from :class:`~gpusched.simulator.figures.Figures`, whose series
are already thinned to at most ``SERIES_POINTS`` points.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpusched.simulator.figures import SIZE_BUCKETS, Figures, Series, figures
from gpusched.simulator.model import LINK_ORDER, RunResult
from gpusched.simulator.whatif import Change, WhatIf, diff_figures

_HOUR = 3600.0
#: Tenants drawn per policy in the share plot (the largest by GPU-hours).
PLOT_TENANTS = 6
#: File names of the plots, in the order the report shows them.
PLOTS: tuple[tuple[str, str], ...] = (
    ("jct_cdf.png", "Job completion time (CDF)"),
    ("queueing_by_size.png", "Queueing delay by job size"),
    ("allocation.png", "GPU allocation over time"),
    ("queue_length.png", "Queue length over time"),
    ("tenant_share.png", "Tenant share vs weighted fair share"),
)

DEFINITIONS = (
    "JCT (job completion time) = completion - submission, over finished jobs.",
    "Queueing delay = first start - submission, over jobs that started at least once; jobs "
    "that never started are counted apart, with their reasons.",
    "Percentiles are nearest-rank: the p-th of n sorted values is the one at rank "
    "ceil(p * n / 100); always an observed value.",
    "Time-weighted means treat the samples as a step function (each holds until the next).",
    "Allocation = GPUs held by running jobs / GPUs in the cluster.",
    "GPU-hours lost to slow placement = sum over attempts of GPUs * run time * "
    "(1 - 1 / slowdown): the part of the held time the job ran slower than on a well-wired set.",
    "Stranded = free GPUs no waiting job can use (fragmentation), % of capacity.",
    "Fair share = weighted water-filling of the whole capacity over tenants' demands (GPUs held "
    "+ GPUs asked by queued jobs), computed by the report, not by any policy.",
    "Jain = Jain's index of (share / fair share) over tenants with demand, time-weighted "
    "(1 = every tenant in proportion to its fair share).",
    "Below guarantee = time a tenant held fewer GPUs than min(guarantee, demand) while another "
    "tenant held more than its own guarantee.",
    "GPU-hours lost to preemption = GPUs * run time of the attempts preemption ended (no "
    "checkpoints: their work is redone).",
    "Makespan = last completion - first submission.",
)


def _num(v: float | None, digits: int = 2, scale: float = 1.0) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    return f"{v / scale:,.{digits}f}"


def _hours(v: float | None, digits: int = 2) -> str:
    return _num(v, digits, _HOUR)


def _pct(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{100 * v:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# --- plots ------------------------------------------------------------------------------------


def _plot(path: Path, draw: Callable[[Any], None], figsize: tuple[float, float] = (9, 5)) -> Path:
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=figsize, layout="constrained")
    draw(fig)
    fig.savefig(path, dpi=110)
    return path


def _step(ax: Any, s: Series, scale: float = 1.0, **kw: Any) -> None:
    ax.step([t / _HOUR for t in s.times], [v * scale for v in s.values], where="post", **kw)


def _jct_cdf(figs: Sequence[Figures], path: Path) -> Path | None:
    if not any(f.jct_cdf.times for f in figs):
        return None

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        for f in figs:
            pts = [(t / _HOUR, v) for t, v in zip(f.jct_cdf.times, f.jct_cdf.values, strict=True)]
            pts = [(t, v) for t, v in pts if t > 0]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.step(xs, ys, where="post", label=f.policy)
        ax.set_xscale("log")
        ax.set_xlabel("job completion time (hours, log scale)")
        ax.set_ylabel("fraction of finished jobs")
        ax.set_ylim(0, 1.02)
        ax.set_title("Job completion time, CDF per policy")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _over_time(
    figs: Sequence[Figures],
    path: Path,
    series: Callable[[Figures], Series],
    *,
    scale: float,
    ylabel: str,
    title: str,
) -> Path | None:
    if not any(series(f).times for f in figs):
        return None

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        for f in figs:
            _step(ax, series(f), scale, label=f.policy)
        ax.set_xlabel("virtual time (hours since the first submission)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _queueing_by_size(figs: Sequence[Figures], path: Path) -> Path | None:
    if not any(s.queueing.count for f in figs for s in f.by_size):
        return None
    labels = [b[0] for b in SIZE_BUCKETS]

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        width = 0.8 / len(figs)
        for i, f in enumerate(figs):
            heights = [
                s.queueing.mean / _HOUR if s.queueing.mean is not None else math.nan
                for s in f.by_size
            ]
            xs = [k + (i - (len(figs) - 1) / 2) * width for k in range(len(labels))]
            ax.bar(xs, heights, width, label=f.policy)
        ax.set_xticks(range(len(labels)), [f"{b} GPU" if b == "1" else f"{b} GPUs" for b in labels])
        ax.set_xlabel("job size")
        ax.set_ylabel("mean queueing delay (hours)")
        ax.set_title("Mean queueing delay by job size (jobs that started)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _tenant_share(figs: Sequence[Figures], path: Path) -> Path | None:
    if not any(t.share.times for f in figs for t in f.tenants):
        return None
    cols = min(3, len(figs))
    rows = math.ceil(len(figs) / cols)

    def draw(fig: Any) -> None:
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
        names = _plotted_tenants(figs)
        palette = [f"C{i}" for i in range(10)]
        color = {n: palette[i % len(palette)] for i, n in enumerate(names)}
        for k, ax in enumerate(axes.flat):
            if k >= len(figs):
                ax.set_visible(False)
                continue
            f = figs[k]
            for t in f.tenants:
                if t.name not in color:
                    continue
                _step(ax, t.share, 100, color=color[t.name], label=f"{t.name} share")
                _step(
                    ax,
                    t.fair_share,
                    100,
                    color=color[t.name],
                    linestyle="--",
                    alpha=0.7,
                    label=f"{t.name} fair share",
                )
            ax.set_title(f.policy)
            ax.grid(True, alpha=0.3)
            if k % cols == 0:
                ax.set_ylabel("% of cluster GPUs")
            if k >= len(figs) - cols:
                ax.set_xlabel("virtual time (hours)")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels) or 1))
        fig.suptitle("Tenant share (solid) vs weighted fair share (dashed)")

    return _plot(path, draw, figsize=(5 * cols, 3.6 * rows + 1))


def _plotted_tenants(figs: Sequence[Figures]) -> list[str]:
    """The tenants with most GPU-hours over all policies (at most PLOT_TENANTS)."""
    total: dict[str, float] = {}
    for f in figs:
        for t in f.tenants:
            total[t.name] = total.get(t.name, 0.0) + t.gpu_hours
    return sorted(total, key=lambda n: -total[n])[:PLOT_TENANTS]


def plot(figs: Sequence[Figures], out_dir: Path) -> dict[str, Path]:
    """Draw every plot there is data for; file name -> path."""
    made: dict[str, Path | None] = {
        "jct_cdf.png": _jct_cdf(figs, out_dir / "jct_cdf.png"),
        "queueing_by_size.png": _queueing_by_size(figs, out_dir / "queueing_by_size.png"),
        "allocation.png": _over_time(
            figs,
            out_dir / "allocation.png",
            lambda f: f.allocation,
            scale=100,
            ylabel="GPUs allocated (% of capacity)",
            title="GPU allocation over time",
        ),
        "queue_length.png": _over_time(
            figs,
            out_dir / "queue_length.png",
            lambda f: f.queue_length,
            scale=1,
            ylabel="jobs waiting",
            title="Queue length over time",
        ),
        "tenant_share.png": _tenant_share(figs, out_dir / "tenant_share.png"),
    }
    return {k: v for k, v in made.items() if v is not None}


# --- markdown ---------------------------------------------------------------------------------


def _summary(figs: Sequence[Figures]) -> list[str]:
    header = (
        "policy",
        "mean JCT (h)",
        "p50 JCT (h)",
        "p99 JCT (h)",
        "mean queueing (h)",
        "allocation %",
        "GPU-h lost to slow placement",
        "stranded %",
        "Jain",
        "preemptions",
        "makespan (h)",
        "finished / never started",
    )
    rows = [
        (
            f.policy,
            _hours(f.jct.mean),
            _hours(f.jct.p50),
            _hours(f.jct.p99),
            _hours(f.queueing.mean),
            _pct(f.allocation_mean),
            _num(f.slow_gpu_hours, 1),
            _num(f.stranded_pct, 1),
            _num(f.jain, 3),
            str(f.preemptions),
            _hours(f.makespan),
            f"{f.jobs.finished} / {f.jobs.never_started}",
        )
        for f in figs
    ]
    return _table(header, rows)


def _details(figs: Sequence[Figures]) -> list[str]:
    out = ["## Jobs", ""]
    out += _table(
        ("policy", "jobs", "finished", "running at the end", "never started", "top reasons"),
        [
            (
                f.policy,
                str(f.jobs.total),
                str(f.jobs.finished),
                str(f.jobs.unfinished),
                str(f.jobs.never_started),
                "; ".join(f"{r} ({n})" for r, n in f.jobs.top_reasons.items()) or "-",
            )
            for f in figs
        ],
    )
    out += ["", "## Queueing delay and JCT by job size (hours: mean / p50 / p99)", ""]
    for f in figs:
        out += [f"**{f.policy}**", ""]
        out += _table(
            ("GPUs", "jobs", "queueing delay", "JCT"),
            [
                (
                    s.bucket,
                    str(s.jobs),
                    " / ".join(
                        _hours(v) for v in (s.queueing.mean, s.queueing.p50, s.queueing.p99)
                    ),
                    " / ".join(_hours(v) for v in (s.jct.mean, s.jct.p50, s.jct.p99)),
                )
                for s in f.by_size
            ],
        )
        out.append("")
    out += ["## GPU-hours by worst link, and losses", ""]
    out += _table(
        (
            "policy",
            "GPU-hours",
            *(f"{link.value} %" for link in LINK_ORDER),
            "lost to slow placement",
            "preempted attempts",
            "GPU-h lost to preemption",
        ),
        [
            (
                f.policy,
                _num(f.gpu_hours, 1),
                *(_pct(f.link_share.get(link.value, 0.0)) for link in LINK_ORDER),
                _num(f.slow_gpu_hours, 1),
                str(f.preempted_attempts),
                _num(f.preempted_gpu_hours, 1),
            )
            for f in figs
        ],
    )
    out += ["", "## Tenants", ""]
    for f in figs:
        out += [f"**{f.policy}** (Jain {_num(f.jain, 3)})", ""]
        if not f.demand_known:
            out += [
                "The samples did not record each tenant's queued GPUs: demand is taken as what "
                "it holds, so the fair share below only echoes the allocation.",
                "",
            ]
        out += _table(
            (
                "tenant",
                "weight",
                "guarantee",
                "jobs",
                "GPU-hours",
                "mean share %",
                "mean fair share %",
                "below guarantee (h)",
                "mean queueing (h)",
            ),
            [
                (
                    t.name,
                    _num(t.weight, 2),
                    str(t.guaranteed),
                    str(t.jobs),
                    _num(t.gpu_hours, 1),
                    _pct(t.mean_share),
                    _pct(t.mean_fair_share),
                    _num(t.below_guarantee_hours, 2),
                    _hours(t.queueing.mean),
                )
                for t in f.tenants
            ],
        )
        out.append("")
    return out


def _change(c: Change, digits: int = 2, scale: float = 1.0) -> str:
    if c.delta is None:
        return f"{_num(c.base, digits, scale)} -> {_num(c.changed, digits, scale)}"
    pct = "" if c.pct is None else f" ({c.pct:+.1f}%)"
    return (
        f"{_num(c.base, digits, scale)} -> {_num(c.changed, digits, scale)}: "
        f"{c.delta / scale:+,.{digits}f}{pct}"
    )


#: Digits shown of the what-if figures that are not shown with 2.
_WHAT_IF_DIGITS = {"preemptions": 0, "jobs finished": 0, "jobs never started": 0, "Jain's index": 3}


def _what_if(w: WhatIf) -> list[str]:
    out = [
        "## What-if: change from the baseline",
        "",
        "Each cell: baseline -> this run: absolute change (% of the baseline). Times in hours.",
        "",
    ]
    for p in w.policies:
        out += [f"**{p.policy}**", ""]
        out += _table(
            ("figure", "change"),
            [
                (
                    c.figure.replace("(s)", "(h)"),
                    _change(
                        c,
                        _WHAT_IF_DIGITS.get(c.figure, 2),
                        _HOUR if c.figure.endswith("(s)") else 1.0,
                    ),
                )
                for c in p.figures
            ],
        )
        out.append("")
        if p.tenants:
            out += _table(
                ("tenant", "mean share (%)", "mean queueing delay (h)"),
                [
                    (t.tenant, _change(t.share, 2, 0.01), _change(t.queueing, 2, _HOUR))
                    for t in p.tenants
                ],
            )
            out.append("")
    if w.only_base:
        out += [f"Only in the baseline: {', '.join(w.only_base)}.", ""]
    if w.only_changed:
        out += [f"Only in this run: {', '.join(w.only_changed)}.", ""]
    return out


def _parameters(results: Sequence[RunResult], notes: Sequence[str]) -> dict[str, Any]:
    first = results[0] if results else None
    return {
        "workload": sorted({r.workload for r in results}),
        "cluster": sorted({r.cluster for r in results}),
        "capacity": sorted({r.capacity for r in results}),
        "jobs": len(first.jobs) if first else 0,
        "policies": [r.policy for r in results],
        "tenants": [
            {
                "name": t.name,
                "guaranteed": t.guaranteed,
                "weight": t.weight,
                "borrowing_limit": t.borrowing_limit,
            }
            for t in (first.tenants if first else ())
        ],
        "assumptions": {r.policy: list(r.assumptions) for r in results},
        "cpu_seconds": {r.policy: r.cpu_seconds for r in results},
        "notes": list(notes),
    }


def write_report(
    results: Sequence[RunResult],
    out_dir: Path,
    *,
    command: str,
    title: str,
    baseline: Sequence[RunResult] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write ``results.json``, the PNG plots and ``report.md`` into ``out_dir``; return the
    path of ``report.md``.

    ``notes`` are the workload's notes (how it was derived; ``Workload.notes``), which a
    RunResult does not carry. With ``baseline``, a what-if section compares each policy with
    the baseline's run of the same policy.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = [figures(r) for r in results]
    base_figs = [figures(r) for r in baseline] if baseline is not None else None
    what_if = diff_figures(base_figs, figs) if base_figs is not None else None
    params = _parameters(results, notes)

    data: dict[str, Any] = {
        "title": title,
        "command": command,
        "parameters": params,
        "figures": [f.to_json() for f in figs],
    }
    if base_figs is not None and what_if is not None and baseline is not None:
        data["baseline"] = {
            "parameters": _parameters(baseline, ()),
            "figures": [f.to_json() for f in base_figs],
        }
        data["what_if"] = what_if.to_json()
    (out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")

    plots = plot(figs, out_dir)

    md = [f"# {title}", ""]
    if results:
        r = results[0]
        md += [
            f"Workload **{', '.join(params['workload'])}** ({len(r.jobs)} jobs, "
            f"{len(r.tenants)} tenants) replayed on cluster **{', '.join(params['cluster'])}** "
            f"({', '.join(str(c) for c in params['capacity'])} GPUs) under "
            f"{len(results)} policies.",
            "",
        ]
    md += ["## Summary", ""]
    md += _summary(figs)
    md += ["", "Times in hours. Definitions at the end of the report.", ""]
    if plots:
        md += ["## Plots", ""]
        for name, caption in PLOTS:
            if name in plots:
                md += [f"### {caption}", "", f"![{caption}]({name})", ""]
    md += _details(figs)
    if what_if is not None:
        md += _what_if(what_if)
    md += ["## Assumptions of each policy", ""]
    for r in results:
        md += [f"**{r.policy}**", ""]
        md += [f"- {a}" for a in r.assumptions] or ["- (none stated)"]
        md.append("")
    md += ["## Workload notes", ""]
    md += [f"- {n}" for n in notes] or ["- (none)"]
    md += ["", "## How the figures are computed", ""]
    md += [f"- {d}" for d in DEFINITIONS]
    md += ["", "## Reproduce", "", "```sh", command, "```", ""]
    md += [
        "Every figure above, with the plotted series, is in `results.json`; "
        "CPU time of each replay: "
        + ", ".join(f"{r.policy} {r.cpu_seconds:.1f}s" for r in results)
        + ".",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path
