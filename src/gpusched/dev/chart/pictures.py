"""Pictures of the dashboards drawn from a real Prometheus: each panel's queries are run over the
HTTP API (range queries for time series, instant queries for stats, bar gauges and tables) and
drawn with matplotlib at the panel's place in the dashboard's grid, so a reader of the docs sees
what an admin sees in Grafana."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gpusched.dev.chart.dashboards import Dashboard, Panel, Query, dashboard_json
from gpusched.dev.localprometheus import LocalPrometheus

BACKGROUND = "#111217"
PANEL = "#181b1f"
TEXT = "#d8d9da"
MUTED = "#8e8e8e"
PALETTE = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a")
GRID_UNIT = 0.42  # inches per grid row / column unit


@dataclass(frozen=True)
class Window:
    """The time range drawn, with Grafana's built-in variables for it."""

    start: float
    end: float
    step: float
    rate_interval: str = "1m"

    @property
    def range(self) -> str:
        """``$__range``, in whole seconds."""
        return f"{max(1, round(self.end - self.start))}s"


def grafana_query(expr: str, window: Window, variables: Mapping[str, str]) -> str:
    """The query Grafana would send: built-ins for the window, variables at their values."""
    expr = expr.replace("$__rate_interval", window.rate_interval).replace("$__range", window.range)
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return expr


def legend(template: str, labels: Mapping[str, str]) -> str:
    """``{{label}}`` placeholders filled like Grafana's legend format."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    return text or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def format_value(value: float, unit: str) -> str:
    """A number in the panel's unit, the way Grafana would show it."""
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "s":
        if value >= 3600:
            return f"{value / 3600:.1f} h"
        if value >= 60:
            return f"{value / 60:.1f} min"
        if value >= 1:
            return f"{value:.1f} s"
        return f"{value * 1000:.1f} ms"
    suffix = {"ops": " ops/s", "reqps": " req/s", "celsius": " °C", "watt": " W"}.get(unit, "")
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:.0f}{suffix}"
    return f"{value:.2f}{suffix}"


def _style(ax: Axes, title: str) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_color("#2c3235")
    ax.tick_params(colors=MUTED, labelsize=7)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", pad=4)


def _series(
    prometheus: LocalPrometheus, query: Query, window: Window, variables: Mapping[str, str]
) -> list[tuple[str, list[float], list[float]]]:
    expr = grafana_query(query.expr, window, variables)
    out = []
    for series in prometheus.query_range(expr, window.start, window.end, window.step):
        points = [(t, v) for t, v in series["values"] if math.isfinite(float(v))]
        if not points:
            continue
        times = [
            float(mdates.date2num(datetime.fromtimestamp(float(t), UTC)))  # type: ignore[no-untyped-call]
            for t, _ in points
        ]
        values = [float(v) for _, v in points]
        out.append((legend(query.legend, series["metric"]), times, values))
    return out


def _instant(
    prometheus: LocalPrometheus, query: Query, window: Window, variables: Mapping[str, str]
) -> list[tuple[dict[str, str], float]]:
    expr = grafana_query(query.expr, window, variables)
    return [
        (dict(sample["metric"]), float(sample["value"][1]))
        for sample in prometheus.query(expr, at=window.end)
    ]


def _no_data(ax: Axes) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", va="center", transform=ax.transAxes)


def _aligned(
    lines: list[tuple[str, list[float], list[float]]],
) -> tuple[list[float], list[list[float]]]:
    """Every series on the union of their timestamps, absent points as 0 (for stacking)."""
    grid = sorted({t for _, times, _ in lines for t in times})
    columns = []
    for _, times, values in lines:
        by_time = dict(zip(times, values, strict=True))
        columns.append([by_time.get(t, 0.0) for t in grid])
    return grid, columns


def _draw_timeseries(
    ax: Axes, panel: Panel, prometheus: LocalPrometheus, window: Window, v: Mapping[str, str]
) -> None:
    lines = [s for q in panel.queries for s in _series(prometheus, q, window, v)]
    if not lines:
        _no_data(ax)
        return
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(lines))]
    names = [name for name, _, _ in lines]
    if panel.stacked:
        grid, columns = _aligned(lines)
        ax.stackplot(grid, *columns, labels=names, colors=colors, alpha=0.7)
    else:
        for (name, times, vals), color in zip(lines, colors, strict=True):
            ax.plot(times, vals, label=name, color=color, linewidth=1.2)
    short = window.end - window.start < 1800
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if short else "%H:%M"))  # type: ignore[no-untyped-call]
    ax.yaxis.set_major_formatter(
        matplotlib.ticker.FuncFormatter(lambda y, _p: format_value(y, panel.unit))
    )
    ax.grid(color="#2c3235", linewidth=0.5)
    ax.legend(fontsize=6, loc="upper left", frameon=False, labelcolor=TEXT, ncol=2)


def _draw_stat(
    ax: Axes, panel: Panel, prometheus: LocalPrometheus, window: Window, v: Mapping[str, str]
) -> None:
    samples = _instant(prometheus, panel.queries[0], window, v)
    text = format_value(samples[0][1], panel.unit) if samples else "No data"
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(
        0.5,
        0.42,
        text,
        color="#73bf69",
        fontsize=20,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontweight="bold",
    )


def _draw_bargauge(
    ax: Axes, panel: Panel, prometheus: LocalPrometheus, window: Window, v: Mapping[str, str]
) -> None:
    rows = sorted(
        (legend(q.legend, labels), value)
        for q in panel.queries
        for labels, value in _instant(prometheus, q, window, v)
    )
    ax.set_xticks([])
    ax.set_yticks([])
    if not rows:
        _no_data(ax)
        return
    top = max(value for _, value in rows) or 1.0
    for i, (name, value) in enumerate(rows):
        ax.barh(i, value, color=PALETTE[i % len(PALETTE)], height=0.6)
        ax.text(top * 0.01, i - 0.38, name, color=TEXT, va="bottom", fontsize=7)
        ax.text(
            value, i, " " + format_value(value, panel.unit), color=TEXT, va="center", fontsize=8
        )
    ax.set_xlim(0, top * 1.15)
    ax.set_ylim(len(rows) - 0.4, -0.8)


def _draw_table(
    ax: Axes, panel: Panel, prometheus: LocalPrometheus, window: Window, v: Mapping[str, str]
) -> None:
    merged: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    columns: list[str] = []
    value_columns: list[str] = []
    for query in panel.queries:
        column = query.legend or "value"
        value_columns.append(column)
        for labels, value in _instant(prometheus, query, window, v):
            key = tuple(sorted((k, val) for k, val in labels.items() if k not in ("__name__",)))
            for label, _ in key:
                if label not in columns:
                    columns.append(label)
            row = merged.setdefault(key, dict(key))
            row[column] = format_value(value, panel.unit)
    if len(panel.queries) > 1:
        # Queries of one table share their identifying labels (Grafana's merge).
        merged = _merge_rows(merged, value_columns)
        columns = [c for c in columns if any(c in r for r in merged.values())]
    header = columns + [c for c in value_columns if c not in columns]
    cells = [[row.get(c, "") for c in header] for row in sorted(merged.values(), key=str)[:14]]
    ax.set_xticks([])
    ax.set_yticks([])
    if not cells:
        _no_data(ax)
        return
    table = ax.table(cellText=cells, colLabels=header, loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for (row_index, _col), cell in table.get_celld().items():
        cell.set_edgecolor("#2c3235")
        cell.set_facecolor("#22252b" if row_index == 0 else PANEL)
        cell.get_text().set_color(TEXT)
    table.scale(1, 1.1)


def _merge_rows(
    rows: dict[tuple[tuple[str, str], ...], dict[str, str]], value_columns: list[str]
) -> dict[tuple[tuple[str, str], ...], dict[str, str]]:
    by_node: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for key, row in rows.items():
        ident = tuple((k, val) for k, val in key if k == "node") or key
        merged = by_node.setdefault(ident, {})
        merged.update(row)
    return by_node


DRAW = {
    "timeseries": _draw_timeseries,
    "stat": _draw_stat,
    "bargauge": _draw_bargauge,
    "table": _draw_table,
}


def draw(
    dashboard: Dashboard,
    prometheus: LocalPrometheus,
    window: Window,
    path: Path,
    variables: Mapping[str, str] | None = None,
) -> Path:
    """Draw ``dashboard`` over ``window`` into a PNG at ``path``."""
    model: dict[str, Any] = dashboard_json(dashboard)
    values = {v.name: ".*" for v in dashboard.variables} | dict(variables or {})
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in model["panels"])
    width_in, height_in = 24 * GRID_UNIT * 1.6, (bottom + 2) * GRID_UNIT
    figure: Figure = plt.figure(figsize=(width_in, height_in), facecolor=BACKGROUND)
    figure.text(
        0.01,
        1 - 0.9 / (bottom + 2),
        dashboard.title,
        color=TEXT,
        fontsize=13,
        fontweight="bold",
        va="center",
    )
    panels = iter(dashboard.panels())
    for entry in model["panels"]:
        grid = entry["gridPos"]
        left = grid["x"] / 24
        top = 1 - (grid["y"] + 1.5) / (bottom + 2)
        height = grid["h"] / (bottom + 2)
        if entry["type"] == "row":
            figure.text(
                left + 0.005,
                top - height / 2,
                entry["title"],
                color=MUTED,
                fontsize=10,
                va="center",
            )
            continue
        panel = next(panels)
        pad_x, pad_y = 0.006, 0.35 / (bottom + 2)
        rect = (
            left + pad_x + 0.02 * (panel.kind == "timeseries"),
            top - height + pad_y + 0.5 / (bottom + 2),
            grid["w"] / 24 - 2 * pad_x - 0.02 * (panel.kind == "timeseries"),
            height - 2 * pad_y - 0.5 / (bottom + 2),
        )
        ax = figure.add_axes(rect)
        _style(ax, panel.title)
        DRAW[panel.kind](ax, panel, prometheus, window, values)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, facecolor=BACKGROUND)
    plt.close(figure)
    return path
