"""The replay's report: ``results.json``, PNG plots and a self-contained ``report.md``.

Plots are drawn with matplotlib's object API on the Agg canvas (no display, no pyplot global
state). Every series is plotted from :class:`~gpusched.simulator.figures.Figures`, whose series
are already thinned to at most ``SERIES_POINTS`` points.
"""

from __future__ import annotations

import csv
import json
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpusched.simulator.figures import (
    ESTIMATE_MIN_WAIT,
    ESTIMATE_PERCENTILES,
    ESTIMATE_SHARE,
    ESTIMATE_SLACK,
    SIZE_BUCKETS,
    Figures,
    Series,
    estimate_accuracy,
    figures,
    replay_end,
    size_bucket,
)
from gpusched.simulator.model import LINK_ORDER, RunResult
from gpusched.simulator.whatif import Change, WhatIf, diff_figures

_HOUR = 3600.0
#: Tenants named in the share plot (the largest by GPU-hours); the rest are drawn summed.
PLOT_TENANTS = 8
#: Jobs listed per policy in "who waited longest".
LONGEST_WAITS = 8
#: File names of the plots, in the order the report shows them.
PLOTS: tuple[tuple[str, str], ...] = (
    ("jct_cdf.png", "Job completion time (CDF)"),
    ("queueing_by_size.png", "Queueing delay by job size"),
    ("allocation.png", "GPU allocation over time"),
    ("queue_length.png", "Queue length over time"),
    ("tenant_share.png", "Tenant share vs entitlement"),
    ("rho_cdf.png", "Finish-time fairness (CDF)"),
    ("estimate_error.png", "Expected start error (CDF)"),
)

DEFINITIONS = (
    "JCT (job completion time) = completion - submission, over finished jobs.",
    "Queueing delay = first start - submission, over jobs that started at least once; jobs "
    "that never started are counted apart, with their reasons, and in 'queueing incl. never "
    "started' up to the replay's end (a lower bound for them).",
    "Percentiles are nearest-rank: the p-th of n sorted values is the one at rank "
    "ceil(p * n / 100); always an observed value.",
    "Time-weighted means treat the samples as a step function (each holds until the next).",
    "Allocation = GPUs held by running jobs / GPUs in the cluster; 'while jobs wait' averages "
    "it over the instants some job is queued only (a drain tail is not idle capacity).",
    "GPU-hours lost to slow placement = the held time a job ran slower than on a well-wired "
    "set, split into unavoidable (the empty cluster has no better set: a gang larger than a "
    "node), contention (the better sets were busy at its start) and avoidable (a better-wired "
    "set was free at its start: the node and GPU choice). A duration the trace measured across "
    "nodes is not stretched again for crossing nodes.",
    "Stranded = free GPUs no waiting job can use (fragmentation), % of capacity.",
    "Entitlement = a tenant's guarantee (up to its offered demand) plus its weighted share of "
    "what others leave idle, capped by demand and borrowing limit (the admission core's rule), "
    "from the trace's offered demand (jobs submitted and not done had each started at once): "
    "the same for every policy. Jobs of a namespace no TenantQuota lists are entitled to nothing.",
    "Jain = Jain's index of (share / entitlement) over tenants with an entitlement, "
    "time-weighted (1 = every tenant in proportion to its entitlement) over the time some "
    "entitled tenant holds GPUs (with none holding any it is undefined, not 0).",
    "rho (Themis' finish-time fairness) = JCT / the run time the job would have alone on its "
    "equal part of its tenant's entitlement at submission; above 1 it did worse than that (a JCT "
    "equal to that run time up to the clock's floating-point rounding is 1).",
    "Below guarantee = time a tenant held fewer GPUs than min(guarantee, demand) while another "
    "tenant held more than its own guarantee; longest = the longest such stretch; unmet = the "
    "GPU-hours of guarantee missing over those stretches. With a job that fits it waiting = the "
    "same, counted only while one of the tenant's waiting jobs fits in what is left of its "
    "guarantee (what reclaim can act on; a larger job borrows and waits its turn). A tenant none "
    "of whose jobs started is flagged, not shown as 0.",
    "GPU-hours lost to preemption = GPUs * run time of the attempts preemption ended (no "
    "checkpoints: their work is redone); also as % of all GPU-hours run.",
    "Makespan = last completion - first submission.",
    "A replay that decided every job in one cycle (the FGD experiment) measures no waits: its "
    "queueing delays and expected-start accuracy are n/a.",
    "Expected starts: of the jobs that started after waiting more than "
    f"{ESTIMATE_MIN_WAIT / _HOUR:g} h and were told an expected start before, the share that "
    f"started within max({ESTIMATE_SLACK / _HOUR:g} h, {100 * ESTIMATE_SHARE:g} % of the wait "
    "remaining when told) of the first one they were told; signed error = first start - that "
    "expected start (positive: later than told). Only policies that tell expected starts are "
    "judged; 'of long waits' counts the long waiters told nothing as misses.",
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


def _panels(
    figs: Sequence[Figures],
    path: Path,
    series: Callable[[Figures], Series],
    *,
    scale: float,
    ylabel: str,
    title: str,
    log: bool = False,
) -> Path | None:
    """One panel per policy on a shared axis: lines that overlap in one band stay readable."""
    if not any(series(f).times for f in figs):
        return None
    cols = min(3, len(figs))
    rows = math.ceil(len(figs) / cols)

    def draw(fig: Any) -> None:
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
        for k, ax in enumerate(axes.flat):
            if k >= len(figs):
                ax.set_visible(False)
                continue
            f = figs[k]
            _step(ax, series(f), scale, color=f"C{k}")
            ax.set_title(f.policy)
            if log:
                ax.set_yscale("symlog", linthresh=1)
            else:
                ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if k % cols == 0:
                ax.set_ylabel(ylabel)
            if k >= len(figs) - cols:
                ax.set_xlabel("virtual time (hours)")
        fig.suptitle(title)

    return _plot(path, draw, figsize=(5 * cols, 3 * rows + 0.8))


def _queueing_by_size(figs: Sequence[Figures], path: Path) -> Path | None:
    # A log scale needs a positive bar: none when every job that started did so at once.
    if not any(s.queueing.count and s.queueing.mean for f in figs for s in f.by_size):
        return None
    labels = [b[0] for b in SIZE_BUCKETS]

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        width = 0.8 / len(figs)
        for i, f in enumerate(figs):
            heights = [s.queueing.mean / _HOUR if s.queueing.mean else math.nan for s in f.by_size]
            xs = [k + (i - (len(figs) - 1) / 2) * width for k in range(len(labels))]
            ax.bar(xs, heights, width, label=f.policy)
        ax.set_xticks(range(len(labels)), [f"{b} GPU" if b == "1" else f"{b} GPUs" for b in labels])
        ax.set_yscale("log")
        ax.set_xlabel("job size")
        ax.set_ylabel("mean queueing delay (hours, log scale)")
        ax.set_title("Mean queueing delay by job size (jobs that started)")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _tenant_share(figs: Sequence[Figures], path: Path) -> Path | None:
    """One panel per tenant (the largest by GPU-hours, the rest summed in one): each policy's
    share as a line of its colour, and the tenant's entitlement, which is the same for every
    policy, as one thick dashed line."""
    if not any(t.share.times for f in figs for t in f.tenants):
        return None
    names = _plotted_tenants(figs)
    every = {t.name for f in figs for t in f.tenants}
    rest = sorted(every - set(names))
    groups: list[tuple[str, list[str]]] = [(n, [n]) for n in names]
    if rest:
        groups.append((f"{len(rest)} other tenants, summed", rest))
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)

    def draw(fig: Any) -> None:
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
        for k, ax in enumerate(axes.flat):
            if k >= len(groups):
                ax.set_visible(False)
                continue
            title, members = groups[k]
            entitled: Series | None = None
            for i, f in enumerate(figs):
                found = [t for t in f.tenants if t.name in members]
                if not found:
                    continue
                _step(
                    ax,
                    _sum_series([t.share for t in found]),
                    100,
                    color=f"C{i}",
                    linewidth=1.0,
                    label=f.policy,
                )
                if entitled is None:
                    entitled = _sum_series([t.entitlement for t in found])
            if entitled is not None:
                _step(
                    ax,
                    entitled,
                    100,
                    color="black",
                    linestyle=(0, (4, 2)),
                    linewidth=1.6,
                    zorder=3,
                    label="entitlement",
                )
            ax.set_title(title)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if k % cols == 0:
                ax.set_ylabel("% of cluster GPUs")
            if k >= len(groups) - cols:
                ax.set_xlabel("virtual time (hours)")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(6, len(labels) or 1))
        fig.suptitle(
            "Tenant share under each policy (solid) vs its entitlement (black dashed, the same "
            f"for every policy): the {len(names)} largest tenants by GPU-hours"
            + (f", the other {len(rest)} summed" if rest else "")
        )

    return _plot(path, draw, figsize=(5.5 * cols, 3.2 * rows + 1.4))


def _sum_series(parts: Sequence[Series]) -> Series:
    """The sum of step functions (over the union of their breakpoints)."""
    if len(parts) == 1:
        return parts[0]
    times = sorted({t for p in parts for t in p.times})
    values = []
    for t in times:
        total = 0.0
        for p in parts:
            i = bisect_right(p.times, t) - 1
            if i >= 0:
                total += p.values[i]
        values.append(total)
    return Series(tuple(times), tuple(values))


def _rho_cdf(figs: Sequence[Figures], path: Path) -> Path | None:
    if not any(f.rho.cdf.times for f in figs):
        return None

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        for f in figs:
            pts = [(t, v) for t, v in zip(f.rho.cdf.times, f.rho.cdf.values, strict=True) if t > 0]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.step(xs, ys, where="post", label=f.policy)
        ax.axvline(1.0, color="0.3", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("rho = JCT / run time alone on its fair slice (log scale; 1 = fair)")
        ax.set_ylabel("fraction of finished jobs")
        ax.set_ylim(0, 1.02)
        ax.set_title("Finish-time fairness per policy")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _estimate_error(figs: Sequence[Figures], path: Path) -> Path | None:
    """The signed error of the first expected start, CDF per policy that told any (x in
    hours on a symmetric log scale: minutes and weeks on one axis, early and late apart)."""
    told = [(k, f) for k, f in enumerate(figs) if f.estimates.error_cdf.times]
    if not told:
        return None

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        for k, f in told:
            s = f.estimates.error_cdf
            ax.step(
                [t / _HOUR for t in s.times],
                s.values,
                where="post",
                color=f"C{k}",
                label=f"{f.policy} ({f.estimates.judged} jobs)",
            )
        ax.axvline(0.0, color="0.3", linestyle=":", linewidth=1)
        for edge in (-ESTIMATE_SLACK / _HOUR, ESTIMATE_SLACK / _HOUR):
            ax.axvline(edge, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel(
            "first start - first expected start (hours, symmetric log; < 0 earlier than told)"
        )
        ax.set_ylabel("fraction of judged jobs")
        ax.set_ylim(0, 1.02)
        ax.set_title(
            f"Expected start error of jobs that waited > {ESTIMATE_MIN_WAIT / _HOUR:g} h "
            f"(dotted: 0 and +/-{ESTIMATE_SLACK / _HOUR:g} h)"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()

    return _plot(path, draw)


def _plotted_tenants(figs: Sequence[Figures]) -> list[str]:
    """The tenants with most GPU-hours over all policies (at most PLOT_TENANTS)."""
    total: dict[str, float] = {}
    for f in figs:
        for t in f.tenants:
            total[t.name] = total.get(t.name, 0.0) + t.gpu_hours
    return sorted(total, key=lambda n: (-total[n], n))[:PLOT_TENANTS]


def plot(figs: Sequence[Figures], out_dir: Path) -> dict[str, Path]:
    """Draw every plot there is data for; file name -> path."""
    made: dict[str, Path | None] = {
        "jct_cdf.png": _jct_cdf(figs, out_dir / "jct_cdf.png"),
        "queueing_by_size.png": _queueing_by_size(figs, out_dir / "queueing_by_size.png"),
        "allocation.png": _panels(
            figs,
            out_dir / "allocation.png",
            lambda f: f.allocation,
            scale=100,
            ylabel="GPUs allocated (%)",
            title="GPU allocation over time, one panel per policy",
        ),
        "queue_length.png": _panels(
            figs,
            out_dir / "queue_length.png",
            lambda f: f.queue_length,
            scale=1,
            ylabel="jobs waiting (log)",
            title="Queue length over time, one panel per policy (log scale)",
            log=True,
        ),
        "tenant_share.png": _tenant_share(figs, out_dir / "tenant_share.png"),
        "rho_cdf.png": _rho_cdf(figs, out_dir / "rho_cdf.png"),
        "estimate_error.png": _estimate_error(figs, out_dir / "estimate_error.png"),
    }
    return {k: v for k, v in made.items() if v is not None}


# --- markdown ---------------------------------------------------------------------------------


def _preempted_share(f: Figures) -> float | None:
    return f.preempted_gpu_hours / f.gpu_hours if f.gpu_hours else None


def _summary(figs: Sequence[Figures]) -> list[str]:
    header = (
        "policy",
        "mean JCT (h)",
        "p99 JCT (h)",
        "mean queueing (h)",
        "queueing incl. never started (h)",
        "allocation % (while jobs wait)",
        "GPU-h lost to avoidable slow placement",
        "stranded %",
        "Jain (share / entitlement)",
        "rho p99",
        "preemptions (% of GPU-h thrown away)",
        "makespan (h)",
        "finished / never started",
    )
    rows = [
        (
            f.policy,
            _hours(f.jct.mean),
            _hours(f.jct.p99),
            _hours(f.queueing.mean),
            _hours(f.queueing_all.mean),
            f"{_pct(f.allocation_mean)} ({_pct(f.allocation_busy)})",
            _num(f.slow_avoidable_gpu_hours, 1),
            _num(f.stranded_pct, 1),
            _num(f.jain, 3),
            _num(f.rho.p99, 2),
            f"{f.preemptions} ({_pct(_preempted_share(f))})",
            _hours(f.makespan),
            f"{f.jobs.finished} / {f.jobs.never_started}",
        )
        for f in figs
    ]
    return _table(header, rows)


def _bucket(f: Figures, label: str) -> float | None:
    found = next((b for b in f.by_size if b.bucket == label), None)
    return found.queueing.mean if found is not None else None


def takeaways(figs: Sequence[Figures]) -> list[str]:
    """Five sentences that say what the replay shows, from its figures (no opinion added)."""
    if not figs:
        return []
    known = [f for f in figs if f.jct.mean is not None]
    out: list[str] = []
    if known:
        best = min(known, key=lambda f: f.jct.mean or math.inf)
        ranked = ", ".join(f"{f.policy} {_hours(f.jct.mean, 1)} h" for f in known)
        out.append(f"Mean JCT: {ranked}; lowest under **{best.policy}**.")
    big = [(f, _bucket(f, "5-8"), _bucket(f, "9-32")) for f in figs]
    out.append(
        "Large jobs queue (mean, 5-8 / 9-32 GPUs): "
        + "; ".join(f"{f.policy} {_hours(a, 1)} / {_hours(b, 1)} h" for f, a, b in big)
        + "."
    )
    unavoidable = max((f.slow_unavoidable_gpu_hours for f in figs), default=0.0)
    out.append(
        "GPU-hours lost to slow placement that the node and GPU choice decided (avoidable): "
        + "; ".join(f"{f.policy} {_num(f.slow_avoidable_gpu_hours, 0)}" for f in figs)
        + f" (beside at most {_num(unavoidable, 0)} unavoidable: gangs larger than a node)."
    )
    out.append(
        "Work thrown away by preemption: "
        + "; ".join(
            f"{f.policy} {_num(f.preempted_gpu_hours, 0)} GPU-h ({_pct(_preempted_share(f))} %)"
            for f in figs
        )
        + "."
    )
    worst = [(f, max(f.tenants, key=lambda t: t.longest_below_hours, default=None)) for f in figs]
    fit = [
        (f, max(f.tenants, key=lambda t: t.longest_below_fitting_hours, default=None)) for f in figs
    ]
    out.append(
        "Fairness (Jain of share / entitlement; longest stretch a tenant spent below its "
        "guarantee while another borrowed; the same with a job that fits its guarantee "
        "waiting): "
        + "; ".join(
            f"{f.policy} {_num(f.jain, 3)}"
            + (
                f", {t.name} {_num(t.longest_below_hours, 0)} h"
                if t is not None and t.longest_below_hours > 0
                else ", none below"
            )
            + (
                f", {u.name} {_num(u.longest_below_fitting_hours, 0)} h"
                if u is not None and u.longest_below_fitting_hours > 0
                else ", none"
            )
            for (f, t), (_, u) in zip(worst, fit, strict=True)
        )
        + "."
    )
    return out


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
            ("GPUs", "jobs", "never started", "queueing delay", "JCT"),
            [
                (
                    s.bucket,
                    str(s.jobs),
                    str(s.never_started),
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
            "lost to slow placement: unavoidable / contention / avoidable",
            "preempted attempts",
            "GPU-h lost to preemption (% of GPU-h)",
        ),
        [
            (
                f.policy,
                _num(f.gpu_hours, 1),
                *(_pct(f.link_share.get(link.value, 0.0)) for link in LINK_ORDER),
                " / ".join(
                    _num(v, 1)
                    for v in (
                        f.slow_unavoidable_gpu_hours,
                        f.slow_contention_gpu_hours,
                        f.slow_avoidable_gpu_hours,
                    )
                ),
                str(f.preempted_attempts),
                f"{_num(f.preempted_gpu_hours, 1)} ({_pct(_preempted_share(f))})",
            )
            for f in figs
        ],
    )
    out += ["", "## Fairness", ""]
    out += _table(
        ("policy", "Jain", "rho mean", "rho p50", "rho p90", "rho p99", "rho max", "rho > 1 %"),
        [
            (
                f.policy,
                _num(f.jain, 3),
                *(_num(v, 2) for v in (f.rho.mean, f.rho.p50, f.rho.p90, f.rho.p99, f.rho.max)),
                _pct(f.rho.above_one),
            )
            for f in figs
        ],
    )
    out += ["", *_expected_starts(figs)]
    out += ["", "## Tenants", ""]
    for f in figs:
        out += [f"**{f.policy}** (Jain {_num(f.jain, 3)})", ""]
        out += _table(
            (
                "tenant",
                "weight",
                "guarantee",
                "jobs",
                "GPU-hours",
                "mean share %",
                "mean entitlement %",
                "below guarantee (h): total / longest",
                "... with a job that fits it waiting (h): total / longest",
                "unmet guarantee (GPU-h)",
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
                    _pct(t.mean_entitlement),
                    "**no job ever started**"
                    if t.never_started
                    else f"{_num(t.below_guarantee_hours, 1)} / {_num(t.longest_below_hours, 1)}",
                    f"{_num(t.below_fitting_hours, 1)} / {_num(t.longest_below_fitting_hours, 1)}",
                    _num(t.unmet_guarantee_gpu_hours, 1),
                    _hours(t.queueing.mean),
                )
                for t in f.tenants
            ],
        )
        out.append("")
    return out


def _expected_starts(figs: Sequence[Figures]) -> list[str]:
    """The accuracy of the expected starts, for each policy that told any."""
    out = ["## Expected starts", ""]
    told = [f for f in figs if f.estimates.estimated]
    silent = [f.policy for f in figs if not f.estimates.estimated]
    if not told:
        return [*out, "No policy told jobs an expected start."]
    slack = f"{ESTIMATE_SLACK / _HOUR:g} h"
    out += [
        f"Jobs that waited more than {ESTIMATE_MIN_WAIT / _HOUR:g} h: did they start within "
        f"max({slack}, {100 * ESTIMATE_SHARE:g} % of the wait remaining when told) of the first "
        "expected start they were told? Signed error = first start - that expected start "
        "(hours; positive: later than told).",
        "",
    ]
    percentiles = " / ".join(f"p{p}" for p in ESTIMATE_PERCENTILES)
    out += _table(
        (
            "policy",
            "jobs told",
            f"waited > {ESTIMATE_MIN_WAIT / _HOUR:g} h",
            "of them told",
            "within (% of told; % of long waits)",
            f"signed error {percentiles} (h)",
        ),
        [
            (
                f.policy,
                str(e.estimated),
                str(e.long_waits),
                str(e.judged),
                f"{e.within} ({_pct(e.share)}; {_pct(e.share_of_long_waits)})",
                " / ".join(_hours(e.error(p)) for p in ESTIMATE_PERCENTILES),
            )
            for f in told
            for e in (f.estimates,)
        ],
    )
    if silent:
        out += ["", f"No expected starts from: {', '.join(silent)}."]
    return out


def _longest_waits(results: Sequence[RunResult]) -> list[str]:
    out = ["## Who waited longest", ""]
    out += [
        "Per policy, the jobs with the longest single wait before a start (a job that never "
        "started counts its wait up to the end of the replay), with the policy's reason at the "
        "end of that wait.",
        "",
    ]
    for r in results:
        if not r.has_waits:
            out += [
                f"**{r.policy}**",
                "",
                "Not measured: the replay decided every job in one cycle (its starts are that "
                "cycle's time, not when a job could have started).",
                "",
            ]
            continue
        end = replay_end(r)
        waits = sorted(
            (
                (j.longest_wait if j.attempts else end - j.submit, j)
                for j in r.jobs
                if j.attempts or j.submit <= end
            ),
            key=lambda x: (-x[0], x[1].id),
        )[:LONGEST_WAITS]
        out += [f"**{r.policy}**", ""]
        out += _table(
            ("job", "tenant", "GPUs", "longest wait (h)", "started", "reason"),
            [
                (
                    j.id,
                    j.tenant,
                    str(j.gpus),
                    _hours(w, 1),
                    "yes" if j.attempts else "**never**",
                    (j.wait_reason if j.attempts else j.reason) or "-",
                )
                for w, j in waits
            ],
        )
        out.append("")
    return out


def _expected_starts_by_size(results: Sequence[RunResult]) -> list[str]:
    """The accuracy of the expected starts per job size, for each policy that told any: where
    the error is, not only how much."""
    out: list[str] = []
    for r in results:
        if not r.has_waits:
            continue
        by_size = {
            label: estimate_accuracy(j for j in r.jobs if size_bucket(j.gpus) == label)
            for label, _, _ in SIZE_BUCKETS
        }
        if not any(e.estimated for e in by_size.values()):
            continue
        if not out:
            out += [
                "## Expected starts by job size",
                "",
                'The figures of "Expected starts" for the jobs of each size (GPUs of the '
                "whole job).",
                "",
            ]
        out += [f"**{r.policy}**", ""]
        out += _table(
            (
                "GPUs",
                f"waited > {ESTIMATE_MIN_WAIT / _HOUR:g} h and told",
                "within (%)",
                "signed error p10 / p50 / p90 (h)",
            ),
            [
                (
                    label,
                    str(e.judged),
                    _pct(e.share),
                    " / ".join(_hours(e.error(p)) for p in (10, 50, 90)),
                )
                for label, e in by_size.items()
                if e.judged
            ],
        )
        out.append("")
    return out


JOB_FIELDS = (
    "id",
    "tenant",
    "gpus",
    "submit_s",
    "first_start_s",
    "end_s",
    "attempts",
    "preemptions",
    "node_types",
    "link",
    "slowdown",
    "longest_wait_s",
    "wait_reason",
    "told_at_s",
    "first_expected_start_s",
)


def write_jobs(result: RunResult, path: Path) -> Path:
    """One row per job of one replay: when it was submitted, started and ended, how often it
    ran and was preempted, on what kind of nodes and link, why it waited longest, and when it
    was first told an expected start and which (empty for policies that tell none)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(JOB_FIELDS)
        for j in result.jobs:
            last = j.attempts[-1] if j.attempts else None
            kinds = sorted({result.node_kinds.get(n, n) for a in j.attempts for n in a.nodes})
            writer.writerow(
                (
                    j.id,
                    j.tenant,
                    j.gpus,
                    f"{j.submit:.1f}",
                    "" if j.first_start is None else f"{j.first_start:.1f}",
                    "" if j.end is None else f"{j.end:.1f}",
                    len(j.attempts),
                    sum(1 for a in j.attempts if a.preempted),
                    "+".join(kinds),
                    "" if last is None else last.link.value,
                    "" if last is None else f"{last.slowdown:.4f}",
                    f"{j.longest_wait:.1f}",
                    (j.wait_reason if j.attempts else j.reason) or "",
                    "" if j.estimated_at is None else f"{j.estimated_at:.1f}",
                    "" if j.estimate is None else f"{j.estimate:.1f}",
                )
            )
    return path


def _change(c: Change, digits: int = 2, scale: float = 1.0) -> str:
    if c.delta is None:
        return f"{_num(c.base, digits, scale)} -> {_num(c.changed, digits, scale)}"
    pct = "" if c.pct is None else f" ({c.pct:+.1f}%)"
    return (
        f"{_num(c.base, digits, scale)} -> {_num(c.changed, digits, scale)}: "
        f"{c.delta / scale:+,.{digits}f}{pct}"
    )


#: Digits shown of the what-if figures that are not shown with 2.
_WHAT_IF_DIGITS = {
    "preemptions": 0,
    "jobs finished": 0,
    "jobs never started": 0,
    "Jain's index (share / entitlement)": 3,
}


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

    for r in results:
        write_jobs(r, out_dir / f"jobs-{r.policy}.csv")

    md = [f"# {title}", "", "```sh", command, "```", ""]
    if results:
        r = results[0]
        md += [
            f"Workload **{', '.join(params['workload'])}** ({len(r.jobs)} jobs, "
            f"{len(r.tenants)} tenants) replayed on cluster **{', '.join(params['cluster'])}** "
            f"({', '.join(str(c) for c in params['capacity'])} GPUs) under "
            f"{len(results)} policies.",
            "",
        ]
    md += ["## What this replay says", ""]
    md += [f"{i}. {line}" for i, line in enumerate(takeaways(figs), 1)]
    md += ["", "## Summary", ""]
    md += _summary(figs)
    md += ["", "Times in hours. Definitions at the end of the report.", ""]
    if plots:
        md += ["## Plots", ""]
        for name, caption in PLOTS:
            if name in plots:
                md += [f"### {caption}", "", f"![{caption}]({name})", ""]
    md += _details(figs)
    md += _longest_waits(results)
    md += _expected_starts_by_size(results)
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
        "Every figure above, with the plotted series, is in `results.json`; one row per job "
        "and policy in `jobs-<policy>.csv`. CPU time of each replay: "
        + ", ".join(f"{r.policy} {r.cpu_seconds:.1f}s" for r in results)
        + ".",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path
