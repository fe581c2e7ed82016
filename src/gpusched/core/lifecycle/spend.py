"""What a tenant's GPU time costs: per UTC day, per budget period and per submitter.

Runs are charged by the GPU model they hold at the cluster's price per GPU-hour of that model.
The operator keeps the totals in the TenantQuota's status (so they survive restarts and can be
read with ``kubectl``): a bounded list of days for the rolling 7- and 30-day windows, the
current budget period's totals that the budget's caps are compared with, and the same per
submitter. Prometheus holds the long history (``gpusched_tenant_cost``, docs/metrics.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gpusched.api.tenantquota import (
    MAX_DAYS,
    MAX_USERS,
    Budget,
    BudgetPeriod,
    DaySpend,
    UserSpend,
)

#: Unit of cost without a price list: every GPU-hour costs 1.
GPU_HOURS = "GPU-hours"


@dataclass(frozen=True)
class Pricing:
    """Price of one GPU-hour per GPU model (``nvidia.com/gpu.product``), in ``currency``."""

    currency: str = GPU_HOURS
    default: float = 1.0
    """Price of a model not listed (and of GPUs whose model is not known)."""
    by_model: Mapping[str, float] = field(default_factory=dict)

    def price(self, model: str | None) -> float:
        """Price of one GPU-hour of ``model``."""
        return self.by_model.get(model or "", self.default)

    @classmethod
    def parse(cls, text: str) -> Pricing:
        """From the JSON the chart renders: ``{"currency": "USD", "default": 2.0, "byModel":
        {"NVIDIA-H100-80GB-HBM3": 4.5}}``. Refuses negative prices and unknown keys."""
        data: Any = json.loads(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("pricing must be a JSON object")
        unknown = set(data) - {"currency", "default", "byModel"}
        if unknown:
            raise ValueError(f"pricing: unknown keys {sorted(unknown)}")
        by_model = {str(k): float(v) for k, v in (data.get("byModel") or {}).items()}
        default = float(data.get("default", 1.0))
        if default < 0 or any(v < 0 for v in by_model.values()):
            raise ValueError("pricing: prices must not be negative")
        return cls(str(data.get("currency") or GPU_HOURS), default, by_model)


def period_start(period: BudgetPeriod, at: datetime) -> datetime:
    """Start (UTC) of the budget period ``at`` falls in."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period is BudgetPeriod.DAY:
        return day
    if period is BudgetPeriod.WEEK:
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def period_end(period: BudgetPeriod, start: datetime) -> datetime:
    """End of the period that begins at ``start``."""
    if period is BudgetPeriod.DAY:
        return start + timedelta(days=1)
    if period is BudgetPeriod.WEEK:
        return start + timedelta(days=7)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


@dataclass(frozen=True, slots=True)
class Run:
    """GPUs one job held between two times."""

    submitter: str
    gpus_by_model: Mapping[str, int]
    """GPU model -> GPUs held (``""``: model not known)."""
    begin: datetime
    end: datetime

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_model.values())


def days_of(begin: datetime, end: datetime) -> Iterator[tuple[date, float]]:
    """The UTC days ``[begin, end)`` spans, with the seconds of it in each."""
    at = begin.astimezone(UTC)
    end = end.astimezone(UTC)
    while at < end:
        midnight = (at + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        stop = min(midnight, end)
        yield at.date(), (stop - at).total_seconds()
        at = stop


@dataclass(frozen=True)
class Spend:
    """The spending fields of a TenantQuota's status after one metering."""

    period_start: datetime
    period_gpu_hours: float
    period_cost: float
    daily: list[DaySpend]
    users: list[UserSpend]
    gpu_hours_7d: float
    cost_7d: float
    gpu_hours_30d: float
    cost_30d: float


def for_reading(value: float) -> float:
    """A figure for reading, not summed again (a rolling window, the ``Spent`` column): to
    the hundredth, as money is written (a cent; 36 GPU-seconds when cost counts GPU-hours).
    ``kubectl`` prints a number column's value as the status stores it, so a figure rounded
    only for the eye must be stored rounded; the running totals it comes from keep their
    nine places (:func:`_total`)."""
    return round(value, 2)


def _total(value: float) -> float:
    """A running total as the status keeps it. A status written every second or so adds a
    few ten-thousandths of a GPU-hour each time: rounded to 4 places, each sum would charge
    a one-GPU job 8 % more than it ran (0.00028 kept as 0.0003); to 9 places the error stays
    below a millionth."""
    return round(value, 9)


def meter(
    *,
    budget: Budget | None,
    old_period_start: datetime | None,
    old_period: tuple[float, float],
    old_daily: Sequence[DaySpend],
    old_users: Sequence[UserSpend],
    runs: Sequence[Run],
    holding: Mapping[str, tuple[int, int]],
    pricing: Pricing,
    now: datetime,
) -> Spend:
    """Add ``runs`` (the time since the last metering) to the tenant's spending.

    ``old_period`` is (GPU-hours, cost) of the period starting at ``old_period_start``; a new
    period (turned, or another ``spec.budget.period``) counts what ran after its start, from
    the daily figures (per-user figures start over with it). ``holding`` is each
    submitter's (GPUs, jobs) held now."""
    period = budget.period if budget is not None else BudgetPeriod.MONTH
    start = period_start(period, now)
    same = old_period_start is not None and old_period_start == start
    hours, cost = old_period if same else (0.0, 0.0)
    users: dict[str, list[float]] = {}
    if same:
        for u in old_users:
            users[u.name] = [u.gpu_hours, u.cost]
    days: dict[str, list[float]] = {d.date: [d.gpu_hours, d.cost] for d in old_daily}
    for run in runs:
        # Priced GPUs: with every price 1 (no price list) exactly the GPUs, so cost and
        # GPU-hours are the same sums worked out the same way.
        priced = sum(pricing.price(m) * n for m, n in run.gpus_by_model.items())
        for day, seconds in days_of(run.begin, run.end):
            bucket = days.setdefault(day.isoformat(), [0.0, 0.0])
            bucket[0] += run.gpus * seconds / 3600.0
            bucket[1] += priced * seconds / 3600.0
        inside = (run.end - max(run.begin, start)).total_seconds()
        if inside > 0:
            if same:
                hours += run.gpus * inside / 3600.0
                cost += priced * inside / 3600.0
            user = users.setdefault(run.submitter, [0.0, 0.0])
            user[0] += run.gpus * inside / 3600.0
            user[1] += priced * inside / 3600.0
    if not same:
        # A new period (it turned, or spec.budget.period changed): what ran in it so far is
        # in the daily figures, which go back further than any period (periods start at UTC
        # midnight, so its days are whole).
        first = start.date().isoformat()
        hours = sum(h for d, (h, _) in days.items() if d >= first)
        cost = sum(c for d, (_, c) in days.items() if d >= first)
    today = now.astimezone(UTC).date()
    kept = sorted(d for d in days if date.fromisoformat(d) > today - timedelta(days=MAX_DAYS))
    daily = [DaySpend(date=d, gpu_hours=_total(days[d][0]), cost=_total(days[d][1])) for d in kept]

    def window(n: int) -> tuple[float, float]:
        first = (today - timedelta(days=n - 1)).isoformat()
        chosen = [d for d in daily if d.date >= first]
        return for_reading(sum(d.gpu_hours for d in chosen)), for_reading(
            sum(d.cost for d in chosen)
        )

    for name in holding:
        users.setdefault(name, [0.0, 0.0])
    listed = sorted(users.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))[:MAX_USERS]
    week, month = window(7), window(30)
    return Spend(
        period_start=start,
        period_gpu_hours=_total(hours),
        period_cost=_total(cost),
        daily=daily,
        users=[
            UserSpend(
                name=name,
                gpus=holding.get(name, (0, 0))[0],
                jobs=holding.get(name, (0, 0))[1],
                gpu_hours=_total(h),
                cost=_total(c),
            )
            for name, (h, c) in listed
        ],
        gpu_hours_7d=week[0],
        cost_7d=week[1],
        gpu_hours_30d=month[0],
        cost_30d=month[1],
    )


def decayed(old: float, current: float, seconds: float, half_life: float | None) -> float:
    """An average of ``current`` over time that halves the weight of the past every
    ``half_life`` seconds (0 without one): the recent borrowing fair share remembers.

    Not rounded: it is metered every few seconds against a half-life of days, so each step
    moves it by far less than any rounding would keep (rounded to thousandths, a week's
    half-life metered every 15 s never moves for fewer than about 30 GPUs)."""
    if not half_life or seconds <= 0:
        return old if half_life else 0.0
    keep: float = 0.5 ** (seconds / half_life)
    return old * keep + current * (1.0 - keep)


def exhausted_until(
    budget: Budget | None,
    status_period_start: datetime | None,
    period_cost: float,
    now: datetime,
    daily: Sequence[DaySpend] = (),
) -> datetime | None:
    """When the tenant's new jobs may start again, if the budget's hard cap is spent in the
    current period (None: it is not).

    The status's period may not be the budget's current one: the period turned, or
    ``spec.budget.period`` changed, since the last metering. What ran in the current period is
    then in the daily figures (as :func:`meter` counts it), so a budget moved from ``Month`` to
    ``Week`` on a week already spent past its cap stops new jobs from the first cycle on."""
    if budget is None or budget.hard_cap is None:
        return None
    start = period_start(budget.period, now)
    if status_period_start != start:
        first = start.date().isoformat()
        period_cost = sum(d.cost for d in daily if d.date >= first)
    if period_cost < budget.hard_cap:
        return None
    return period_end(budget.period, start)
