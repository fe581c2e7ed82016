"""One comparison over several seeds: each figure's value per seed, its mean and range, and the
difference of each policy from the first one, seed by seed.

Why: a replay of Philly is a path. A change that touches a handful of decisions sends tens of
thousands of jobs elsewhere, and the figures move as much as most decision changes do
(docs/benchmarks.md, "Protections that end on time, and how far one replay moves"). The seed
draws the workload's synthesised priorities (another workload of the same trace), so the spread
over seeds is the least a decision change must beat to show, and a difference that keeps its
sign in every seed is one a single replay could not tell from the path it happened to take.

Pure functions over :class:`~gpusched.simulator.figures.Figures`; ``gpusched simulate --seeds``
runs the replays and writes ``seeds.md`` and ``seeds.json`` from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpusched.simulator.figures import Figures

_HOUR = 3600.0

Better = Literal["lower", "higher"]


@dataclass(frozen=True, slots=True)
class SeedFigure:
    """One figure compared across seeds: its name (with unit), how it is read from a replay's
    figures, and which way is better."""

    name: str
    value: Callable[[Figures], float | None]
    better: Better
    digits: int


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / _HOUR


def _waited(bucket: str) -> Callable[[Figures], float | None]:
    def read(f: Figures) -> float | None:
        found = next((s for s in f.by_size if s.bucket == bucket), None)
        return None if found is None else _hours(found.queueing.mean)

    return read


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _thrown(f: Figures) -> float | None:
    return 100.0 * f.preempted_gpu_hours / f.gpu_hours if f.gpu_hours else None


def _longest_below(f: Figures) -> float | None:
    return max((t.longest_below_hours for t in f.tenants), default=None)


#: The figures the issues' targets are stated in, in the order of the summary.
FIGURES: tuple[SeedFigure, ...] = (
    SeedFigure("mean JCT (h)", lambda f: _hours(f.jct.mean), "lower", 2),
    SeedFigure("p99 JCT (h)", lambda f: _hours(f.jct.p99), "lower", 1),
    SeedFigure("queueing, 1 GPU (mean h)", _waited("1"), "lower", 2),
    SeedFigure("queueing, 2-4 GPUs (mean h)", _waited("2-4"), "lower", 2),
    SeedFigure("queueing, 5-8 GPUs (mean h)", _waited("5-8"), "lower", 1),
    SeedFigure("queueing, 9-32 GPUs (mean h)", _waited("9-32"), "lower", 1),
    SeedFigure("allocation (%)", lambda f: _pct(f.allocation_mean), "higher", 1),
    SeedFigure("allocation while jobs wait (%)", lambda f: _pct(f.allocation_busy), "higher", 1),
    SeedFigure(
        "avoidable slow placement (GPU-h)", lambda f: f.slow_avoidable_gpu_hours, "lower", 0
    ),
    SeedFigure("GPU-h thrown away by preemption (% of GPU-h run)", _thrown, "lower", 2),
    SeedFigure("preemptions", lambda f: float(f.preemptions), "lower", 0),
    SeedFigure("Jain vs entitlement", lambda f: f.jain, "higher", 3),
    SeedFigure("rho p99", lambda f: f.rho.p99, "lower", 1),
    SeedFigure("longest below guarantee while another borrowed (h)", _longest_below, "lower", 0),
    SeedFigure(
        "expected starts within the band (%)", lambda f: _pct(f.estimates.share), "higher", 1
    ),
    SeedFigure("makespan (h)", lambda f: _hours(f.makespan), "lower", 0),
)


@dataclass(frozen=True, slots=True)
class Spread:
    """One figure of one policy over the seeds."""

    values: tuple[float | None, ...]
    """Per seed, in the order of the seeds (None: not measured in that replay)."""
    mean: float | None
    """Over the seeds it was measured in (None: in none)."""
    low: float | None
    high: float | None


@dataclass(frozen=True, slots=True)
class Difference:
    """One figure of a policy minus the first policy's, seed by seed."""

    values: tuple[float | None, ...]
    mean: float | None
    better: int
    """Seeds where the policy's figure is better than the first policy's."""
    worse: int


@dataclass(frozen=True, slots=True)
class SeedSummary:
    """Every policy's figures over every seed, and each policy against the first."""

    seeds: tuple[int, ...]
    policies: tuple[str, ...]
    spreads: Mapping[str, Mapping[str, Spread]]
    """policy -> figure name -> its spread."""
    differences: Mapping[str, Mapping[str, Difference]]
    """policy (all but the first) -> figure name -> it minus the first policy's."""


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summarise(
    runs: Mapping[int, Sequence[Figures]], figures: Sequence[SeedFigure] = FIGURES
) -> SeedSummary:
    """The summary of the replays ``runs`` (seed -> the figures of each policy, the same
    policies in the same order for every seed)."""
    seeds = tuple(runs)
    if not seeds:
        raise ValueError("no seeds to summarise")
    policies = tuple(f.policy for f in runs[seeds[0]])
    for seed in seeds:
        found = tuple(f.policy for f in runs[seed])
        if found != policies:
            raise ValueError(f"seed {seed} replayed {found}, seed {seeds[0]} {policies}")
    values = {
        policy: {fig.name: tuple(fig.value(runs[seed][i]) for seed in seeds) for fig in figures}
        for i, policy in enumerate(policies)
    }
    spreads = {
        policy: {
            name: Spread(
                vs,
                _mean(vs),
                min((v for v in vs if v is not None), default=None),
                max((v for v in vs if v is not None), default=None),
            )
            for name, vs in by_name.items()
        }
        for policy, by_name in values.items()
    }
    differences: dict[str, dict[str, Difference]] = {}
    first = policies[0]
    for policy in policies[1:]:
        differences[policy] = {}
        for fig in figures:
            deltas = tuple(
                None if a is None or b is None else b - a
                for a, b in zip(values[first][fig.name], values[policy][fig.name], strict=True)
            )
            sign = -1.0 if fig.better == "lower" else 1.0
            differences[policy][fig.name] = Difference(
                deltas,
                _mean(deltas),
                sum(1 for d in deltas if d is not None and sign * d > 0),
                sum(1 for d in deltas if d is not None and sign * d < 0),
            )
    return SeedSummary(seeds, policies, spreads, differences)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _signed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:+,.{digits}f}"


def render(summary: SeedSummary, figures: Sequence[SeedFigure] = FIGURES) -> str:
    """``seeds.md``: a table per policy (each seed, the mean and the range), then each policy
    against the first, seed by seed."""
    seeds = summary.seeds
    lines = [
        f"# The same replay under seeds {', '.join(map(str, seeds))}",
        "",
        "Each seed draws anew what the trace leaves open (on Philly, the synthesised "
        "priorities: another workload of the same trace; for every trace, the random "
        "baseline's choices): the range of a figure over the seeds is the least a change of "
        "decisions must beat to show on it. Each seed's whole report is in `seed-<seed>/`.",
        "",
    ]
    head = ["figure", *(f"seed {s}" for s in seeds), "mean", "range"]
    for policy in summary.policies:
        lines += [f"## {policy}", "", _row(head), _row(["---"] * len(head))]
        for fig in figures:
            spread = summary.spreads[policy][fig.name]
            lines.append(
                _row(
                    [
                        fig.name,
                        *(_num(v, fig.digits) for v in spread.values),
                        _num(spread.mean, fig.digits),
                        f"{_num(spread.low, fig.digits)} - {_num(spread.high, fig.digits)}",
                    ]
                )
            )
        lines.append("")
    if summary.differences:
        first = summary.policies[0]
        lines += [
            f"## Against {first}, seed by seed",
            "",
            f"Each policy's figure minus {first}'s in the same seed; *better* and *worse* "
            "count the seeds where it is better or worse by that figure's sense (lower or "
            "higher). A difference that does not keep its sign over the seeds is not one the "
            "replays can tell.",
            "",
        ]
        dhead = ["policy", "figure", *(f"seed {s}" for s in seeds), "mean", "better / worse"]
        lines += [_row(dhead), _row(["---"] * len(dhead))]
        for policy, by_name in summary.differences.items():
            for fig in figures:
                d = by_name[fig.name]
                lines.append(
                    _row(
                        [
                            policy,
                            f"{fig.name} ({fig.better} is better)",
                            *(_signed(v, fig.digits) for v in d.values),
                            _signed(d.mean, fig.digits),
                            f"{d.better} / {d.worse}",
                        ]
                    )
                )
        lines.append("")
    return "\n".join(lines)


def to_json(summary: SeedSummary) -> dict[str, object]:
    """``seeds.json``: the summary as plain JSON types."""
    return {
        "seeds": list(summary.seeds),
        "policies": list(summary.policies),
        "figures": {
            policy: {
                name: {
                    "values": list(s.values),
                    "mean": s.mean,
                    "low": s.low,
                    "high": s.high,
                }
                for name, s in by_name.items()
            }
            for policy, by_name in summary.spreads.items()
        },
        "differences": {
            policy: {
                name: {
                    "values": list(d.values),
                    "mean": d.mean,
                    "better": d.better,
                    "worse": d.worse,
                }
                for name, d in by_name.items()
            }
            for policy, by_name in summary.differences.items()
        },
    }


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
