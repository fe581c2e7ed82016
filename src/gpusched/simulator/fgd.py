"""The FGD experiment's figure: GPU allocation ratio as the arrived demand grows (openb pods
arriving one by one, none leaving), per policy, next to the FGD paper's published results.

Allocation here counts GPUs held (a fractional pod holds a whole GPU in gpusched and in these
baselines); FGD's own figures count GPU fractions, so they are shown for reference, not as the
same measurement.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gpusched.simulator.model import RunResult, Workload

#: Arrived demand (% of the cluster's GPUs) at which the curve is read.
LEVELS: Final = tuple(range(0, 131, 10))
#: The FGD result matrix's policies for the openb default pod list.
FGD_POLICIES: Final = ("01-Random", "04-GpuPacking", "05-BestFit", "06-FGD")


def allocation_curve(run: RunResult, workload: Workload) -> dict[int, float]:
    """Allocated GPUs / capacity (%) once the arrived demand reaches each level.

    Pods never leave and every policy here decides them in arrival order, so the pods placed by
    the time pod k arrived are the placed ones among the first k: the curve follows from which
    pods ever started, whether the replay decided them one by one or in one batch.
    """
    started = {j.id for j in run.jobs if j.attempts}
    arrived = 0
    allocated = 0
    out: dict[int, float] = {}
    levels = list(LEVELS)
    for job in sorted(workload.jobs, key=lambda j: (j.submit, j.id)):
        arrived += job.gpus
        allocated += job.gpus if job.id in started else 0
        while levels and arrived * 100 >= levels[0] * run.capacity:
            out[levels.pop(0)] = round(100 * allocated / run.capacity, 2)
    return out


def published(
    results_csv: Path, workload: str = "openb_pod_list_default"
) -> dict[str, dict[int, float]]:
    """Mean allocation ratio (%) over the seeds of FGD's published results, per policy and level."""
    by_policy: dict[str, list[dict[str, str]]] = {}
    with results_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] == workload and row["sc_policy"] in FGD_POLICIES:
                by_policy.setdefault(row["sc_policy"], []).append(row)
    return {
        policy: {
            level: round(statistics.mean(float(r[str(level)]) for r in rows), 2) for level in LEVELS
        }
        for policy, rows in sorted(by_policy.items())
    }


def section(
    curves: dict[str, dict[int, float]], reference: dict[str, dict[int, float]], out_dir: Path
) -> list[str]:
    """Markdown (and ``fgd.png``) for the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        ax.plot(list(curve), list(curve.values()), marker="o", label=name)
    for name, curve in reference.items():
        ax.plot(
            list(curve), list(curve.values()), linestyle="--", alpha=0.6, label=f"FGD paper: {name}"
        )
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel("GPUs allocated (% of cluster)")
    ax.set_title("openb: allocation as demand grows (no departures)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "fgd.png", dpi=110)
    plt.close(fig)
    header = "| policy | " + " | ".join(f"{level} %" for level in LEVELS if level >= 50) + " |"
    rule = "|---|" + "---|" * sum(1 for level in LEVELS if level >= 50)
    rows = [
        f"| {name} | "
        + " | ".join(_cell(curve.get(level)) for level in LEVELS if level >= 50)
        + " |"
        for name, curve in [
            *curves.items(),
            *((f"FGD paper: {n}", c) for n, c in reference.items()),
        ]
    ]
    return [
        "## FGD experiment: allocation as demand grows",
        "",
        "GPUs allocated (% of the cluster) once the arrived demand reaches each level. The FGD "
        "paper's rows count GPU fractions (its pods share GPUs); ours count whole GPUs held.",
        "",
        header,
        rule,
        *rows,
        "",
        "![allocation as demand grows](fgd.png)",
        "",
    ]


def curves_of(runs: Sequence[RunResult], workload: Workload) -> dict[str, dict[int, float]]:
    return {run.policy: allocation_curve(run, workload) for run in runs}


def _cell(value: float | None) -> str:
    """A level the replay never reached (its demand stopped below it) shows as a dash."""
    return "-" if value is None else f"{value:.1f}"
