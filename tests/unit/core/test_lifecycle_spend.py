"""Metering spending into a TenantQuota's status: days, budget periods, prices per GPU model,
users, budget conditions and events, recent borrowing. Expected figures are worked out by hand
in each test from the jobs' run times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import GpuJobStatus, JobPhase
from gpusched.api.meta import ConditionStatus
from gpusched.api.tenantquota import BudgetPeriod, TenantQuota
from gpusched.core.admission import TenantUsage
from gpusched.core.lifecycle.spend import Pricing, Run, decayed, meter, period_end, period_start
from gpusched.core.lifecycle.tenants import (
    MeteredJob,
    core_tenant,
    meterable,
    quota_status,
    stopped_runs,
    tree_problems,
)

PRICES = Pricing("USD", 2.0, {"H100": 4.0})
ROOT = Path(__file__).resolve().parents[3]


def quota(status: dict[str, Any] | None = None, **spec: Any) -> TenantQuota:
    return TenantQuota.model_validate(
        {
            "metadata": {"name": "team", "uid": "u1"},
            "spec": {"namespaces": ["team"], "guaranteedGpus": 8, **spec},
            "status": status or {},
        }
    )


def usage(borrowed: int = 0, users: dict[str, tuple[int, int]] | None = None) -> TenantUsage:
    return TenantUsage(
        name="team",
        guaranteed=8,
        borrowing_limit=None,
        weight=1.0,
        used=8 + borrowed,
        borrowed=borrowed,
        used_by_model={},
        fair_share=8.0,
        pending=0,
        running=1,
        demand=8,
        users=users or {},
    )


def running(
    started: datetime, gpus: int, models: dict[str, int], submitter: str = "alice"
) -> MeteredJob:
    status = GpuJobStatus(phase=JobPhase.RUNNING, started_at=started)
    return MeteredJob("team", gpus, status, status, submitter, models)


def test_a_run_across_midnight_is_charged_to_each_day_at_its_models_price() -> None:
    last = datetime(2026, 11, 25, 23, 0, tzinfo=UTC)
    now = datetime(2026, 11, 26, 1, 0, tzinfo=UTC)
    q = quota({"lastMeteredAt": last.isoformat()})
    # 4 H100 GPUs (4.0/h) and 2 GPUs of an unlisted model (2.0/h): 20.0 per hour.
    job = running(last - timedelta(hours=5), 6, {"H100": 4, "A100": 2})
    status = quota_status(q, usage(), [], [job], now, pricing=PRICES).status
    assert [(d.date, d.gpu_hours, d.cost) for d in status.daily] == [
        ("2026-11-25", 6.0, 20.0),
        ("2026-11-26", 6.0, 20.0),
    ]
    assert (status.gpu_hours_7d, status.cost_7d) == (12.0, 40.0)
    # Both hours are in November's budget period.
    assert status.period_start == datetime(2026, 11, 1, tzinfo=UTC)
    assert (status.period_gpu_hours, status.period_cost) == (12.0, 40.0)
    assert status.currency == "USD"
    assert status.gpu_seconds == 12 * 3600


def test_a_new_budget_period_starts_from_zero_and_counts_only_what_ran_after_its_start() -> None:
    last = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    now = datetime(2026, 12, 1, 0, 30, tzinfo=UTC)
    q = quota(
        {
            "lastMeteredAt": last.isoformat(),
            "periodStart": "2026-11-01T00:00:00Z",
            "periodGpuHours": 500.0,
            "periodCost": 1000.0,
            "users": [{"name": "alice", "gpuHours": 500.0, "cost": 1000.0}],
        }
    )
    job = running(last, 2, {"H100": 2})
    status = quota_status(q, usage(users={"alice": (2, 1)}), [], [job], now, pricing=PRICES).status
    assert status.period_start == datetime(2026, 12, 1, tzinfo=UTC)
    assert (status.period_gpu_hours, status.period_cost) == (1.0, 4.0)
    assert [(u.name, u.gpus, u.jobs, u.gpu_hours, u.cost) for u in status.users] == [
        ("alice", 2, 1, 1.0, 4.0)
    ]


def test_a_budget_moved_to_weekly_keeps_what_ran_since_monday() -> None:
    """Monthly until now, weekly from now on (Monday 23 Nov): the week's spending so far is
    what the daily figures hold from the 23rd, worked out by hand: 10 + 20 GPU-hours costing
    20 + 40, plus the hour since the last metering (2 H100s at 4: 2 GPU-hours, 8)."""
    last = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
    now = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    q = quota(
        {
            "lastMeteredAt": last.isoformat(),
            "periodStart": "2026-11-01T00:00:00Z",
            "periodGpuHours": 100.0,
            "periodCost": 300.0,
            "daily": [
                {"date": "2026-11-20", "gpuHours": 70.0, "cost": 240.0},
                {"date": "2026-11-23", "gpuHours": 10.0, "cost": 20.0},
                {"date": "2026-11-25", "gpuHours": 20.0, "cost": 40.0},
            ],
        },
        budget={"period": "Week", "hardCap": 100.0},
    )
    job = running(last, 2, {"H100": 2})
    status = quota_status(q, usage(), [], [job], now, pricing=PRICES).status
    assert status.period_start == datetime(2026, 11, 23, tzinfo=UTC)
    assert (status.period_gpu_hours, status.period_cost) == (32.0, 68.0)


def test_a_budget_moved_to_weekly_on_a_spent_week_stops_new_jobs_before_the_next_metering() -> None:
    """The status still holds November's figures (300 spent, under no weekly cap), but the
    daily figures since Monday 23 Nov add up to 60 against a weekly hard cap of 50: the
    tenant's new jobs wait until Monday 30 Nov from the first cycle on, not after a cycle
    that admits its whole queue."""
    status = {
        "lastMeteredAt": "2026-11-26T09:00:00Z",
        "periodStart": "2026-11-01T00:00:00Z",
        "periodGpuHours": 150.0,
        "periodCost": 300.0,
        "daily": [
            {"date": "2026-11-20", "gpuHours": 70.0, "cost": 240.0},
            {"date": "2026-11-23", "gpuHours": 20.0, "cost": 40.0},
            {"date": "2026-11-25", "gpuHours": 10.0, "cost": 20.0},
        ],
    }
    now = datetime(2026, 11, 26, 9, 0, 5, tzinfo=UTC)
    weekly = quota(status, budget={"period": "Week", "hardCap": 50.0})
    assert core_tenant(weekly, now).budget_exhausted_until == (
        datetime(2026, 11, 30, tzinfo=UTC).timestamp()
    )
    # 60 this week is under a weekly cap of 70, whatever November's figure says.
    roomy = quota(status, budget={"period": "Week", "hardCap": 70.0})
    assert core_tenant(roomy, now).budget_exhausted_until is None


def test_users_are_listed_by_spending_with_what_they_hold_now() -> None:
    last = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    now = last + timedelta(hours=1)
    q = quota({"lastMeteredAt": last.isoformat(), "periodStart": "2026-11-01T00:00:00Z"})
    jobs = [
        running(last, 1, {"H100": 1}, "alice"),
        running(last, 4, {"H100": 4}, "bob"),
        running(last, 2, {}, ""),  # no recorded submitter, model not known: default price
    ]
    holding = {"alice": (1, 1), "bob": (4, 1), "": (2, 1), "carol": (8, 1)}
    status = quota_status(q, usage(users=holding), [], jobs, now, pricing=PRICES).status
    assert [(u.name, u.gpus, u.cost) for u in status.users] == [
        ("bob", 4, 16.0),
        ("", 2, 4.0),  # as much as alice, in more GPU-hours
        ("alice", 1, 4.0),
        ("carol", 8, 0.0),
    ]


def test_the_soft_cap_sets_its_condition_and_one_event_and_the_hard_cap_stops_new_jobs() -> None:
    last = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    now = last + timedelta(hours=1)
    base = {"lastMeteredAt": last.isoformat(), "periodStart": "2026-11-01T00:00:00Z"}
    budget = {"period": "Month", "softCap": 50.0, "hardCap": 100.0}
    # 90 spent before; one H100 hour (4.0) crosses nothing; eight cross the soft cap.
    q = quota({**base, "periodCost": 40.0}, budget=budget)
    first = quota_status(q, usage(), [], [running(last, 4, {"H100": 4})], now, pricing=PRICES)
    soft = {c.type: c for c in first.status.conditions}["BudgetSoftCapReached"]
    assert soft.status is ConditionStatus.TRUE
    assert [e.reason for e in first.events] == ["BudgetSoftCapReached"]
    assert first.urgent
    again = quota_status(
        quota(first.status.to_k8s(), budget=budget), usage(), [], [], now + timedelta(minutes=1)
    )
    assert again.events == ()
    assert (
        core_tenant(quota(first.status.to_k8s(), budget=budget), now).budget_exhausted_until is None
    )
    spent = quota({**base, "periodCost": 100.0}, budget=budget)
    tenant = core_tenant(spent, now)
    assert tenant.budget_exhausted_until == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    # Spending of an earlier period stops nothing.
    assert (
        core_tenant(spent, datetime(2026, 12, 1, 0, 1, tzinfo=UTC)).budget_exhausted_until is None
    )


def test_without_a_budget_no_budget_condition_is_kept() -> None:
    q = quota(
        {
            "lastMeteredAt": "2026-11-26T10:00:00Z",
            "conditions": [
                {
                    "type": "BudgetExhausted",
                    "status": "True",
                    "reason": "BudgetExhausted",
                    "message": "old",
                    "lastTransitionTime": "2026-11-20T00:00:00Z",
                }
            ],
        }
    )
    status = quota_status(q, usage(), [], [], datetime(2026, 11, 26, 11, tzinfo=UTC)).status
    assert "BudgetExhausted" not in {c.type for c in status.conditions}


@pytest.mark.parametrize(
    ("period", "at", "start", "end"),
    [
        (BudgetPeriod.DAY, "2026-11-26T13:00:00", "2026-11-26", "2026-11-27"),
        (BudgetPeriod.WEEK, "2026-11-26T13:00:00", "2026-11-23", "2026-11-30"),
        (BudgetPeriod.MONTH, "2026-12-31T23:59:00", "2026-12-01", "2027-01-01"),
    ],
)
def test_budget_periods_are_utc_calendar_days_weeks_from_monday_and_months(
    period: BudgetPeriod, at: str, start: str, end: str
) -> None:
    began = period_start(period, datetime.fromisoformat(at).replace(tzinfo=UTC))
    assert began == datetime.fromisoformat(start).replace(tzinfo=UTC)
    assert period_end(period, began) == datetime.fromisoformat(end).replace(tzinfo=UTC)


def test_recent_borrowing_halves_every_half_life_and_is_zero_without_one() -> None:
    assert decayed(8.0, 0.0, 3600.0, 3600.0) == 4.0
    assert decayed(0.0, 8.0, 3600.0, 3600.0) == 4.0
    # Two half-lives keep a quarter of the past, half of one 1/sqrt(2) of it.
    assert decayed(8.0, 0.0, 7200.0, 3600.0) == 2.0
    assert decayed(0.0, 8.0, 7200.0, 3600.0) == 6.0
    assert decayed(8.0, 0.0, 1800.0, 3600.0) == pytest.approx(8.0 / 2**0.5)
    assert decayed(8.0, 8.0, 10.0, None) == 0.0
    last = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    q = quota({"lastMeteredAt": last.isoformat(), "recentBorrowedGpus": 2.0})
    status = quota_status(
        q, usage(borrowed=6), [], [], last + timedelta(hours=2), half_life=7200.0
    ).status
    assert status.recent_borrowed_gpus == 4.0
    assert core_tenant(quota(status.to_k8s())).recent_borrowed == 4.0


def test_recent_borrowing_metered_every_few_seconds_moves_as_metered_once() -> None:
    """The operator meters every 15 s; with a week's half-life a day of borrowing 8 GPUs
    leaves 8 (1 - 2^(-1/7)) of recent borrowing, and a day of borrowing none takes 10 down to
    10 * 2^(-1/7), however many meterings the day took."""
    week, day = 7 * 86400.0, 86400.0
    rising, falling = 0.0, 10.0
    for _ in range(int(day // 15)):
        rising = decayed(rising, 8.0, 15.0, week)
        falling = decayed(falling, 0.0, 15.0, week)
    assert rising == pytest.approx(8 * (1 - 2 ** (-1 / 7)), rel=1e-6)
    assert falling == pytest.approx(10 * 2 ** (-1 / 7), rel=1e-6)


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_spending_metered_every_second_adds_up_to_what_ran(gpus: int) -> None:
    """Under load a TenantQuota's status is written about once a second, each time adding
    what ran since the last: an hour of a job of ``gpus`` GPUs at 2.0 an hour is ``gpus``
    GPU-hours and twice that in cost, in the period, the day and the submitter's figures."""
    began = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    start = None
    hours = cost = 0.0
    daily: list[Any] = []
    users: list[Any] = []
    at = began
    for _ in range(3600):
        step = at + timedelta(seconds=1)
        spend = meter(
            budget=None,
            old_period_start=start,
            old_period=(hours, cost),
            old_daily=daily,
            old_users=users,
            runs=[Run("alice", {"": gpus}, at, step)],
            holding={},
            pricing=Pricing("USD", 2.0),
            now=step,
        )
        start, hours, cost = spend.period_start, spend.period_gpu_hours, spend.period_cost
        daily, users, at = spend.daily, spend.users, step
    assert hours == pytest.approx(gpus, rel=1e-5)
    assert cost == pytest.approx(2.0 * gpus, rel=1e-5)
    assert daily[-1].gpu_hours == pytest.approx(gpus, rel=1e-5)
    assert users[0].cost == pytest.approx(2.0 * gpus, rel=1e-5)


def _printed_columns(status: dict[str, Any]) -> dict[str, Any]:
    """Name -> value of the committed TenantQuota CRD's number columns read from ``status``,
    wide ones included (``kubectl get tq -o wide`` prints each value as stored)."""
    crd = yaml.safe_load((ROOT / "crds" / "gpusched.io_tenantquotas.yaml").read_text())
    [version] = crd["spec"]["versions"]
    out = {}
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split(".")[1:]
        if column["type"] != "number" or path[0] != "status":
            continue
        value: Any = {"status": status}
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        out[column["name"]] = value
    return out


def test_kubectl_prints_spending_to_the_cent_while_the_period_keeps_what_ran() -> None:
    """One GPU for 1,234 s at 2.37 an hour cost 0.81238333...: ``kubectl get tq`` shows 0.81
    (SPENT, and COST-30D with ``-o wide``); the period's total that the next metering adds to
    and the caps compare with keeps the fraction."""
    last = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    now = last + timedelta(seconds=1234)
    q = quota({"lastMeteredAt": last.isoformat()})
    status = quota_status(
        q, usage(), [], [running(last, 1, {"": 1})], now, pricing=Pricing("USD", 2.37)
    )
    columns = _printed_columns(status.status.to_k8s())
    assert columns == {"Spent": 0.81, "Cost-30d": 0.81}
    assert status.status.period_cost == pytest.approx(2.37 * 1234 / 3600, abs=1e-9)


def test_gpu_seconds_written_every_second_add_up_to_what_ran() -> None:
    """A one-GPU job metered every 1.04 s for 1,000 meterings ran 1,040 GPU-seconds."""
    began = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    q = quota({"lastMeteredAt": began.isoformat()})
    job = running(began, 1, {})
    at = began
    for _ in range(1000):
        at += timedelta(seconds=1.04)
        q = q.model_copy(update={"status": quota_status(q, usage(), [], [job], at).status})
    assert q.status.gpu_seconds == pytest.approx(1040.0, abs=0.01)


def test_pricing_refuses_negative_prices_and_unknown_keys() -> None:
    assert Pricing.parse('{"currency": "EUR", "byModel": {"H100": 3}}').price("H100") == 3.0
    assert Pricing.parse("").currency == "GPU-hours"
    for bad in ('{"default": -1}', '{"price": 2}', "[1]"):
        with pytest.raises(ValueError, match="pricing"):
            Pricing.parse(bad)


def test_a_parents_spending_is_its_teams_and_a_broken_tree_is_reported() -> None:
    last = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    now = last + timedelta(hours=1)
    parent = TenantQuota.model_validate(
        {
            "metadata": {"name": "org"},
            "spec": {"guaranteedGpus": 4, "namespaces": ["stray"]},
            "status": {"lastMeteredAt": last.isoformat(), "periodStart": "2026-11-01T00:00:00Z"},
        }
    )
    status_a = GpuJobStatus(phase=JobPhase.RUNNING, started_at=last)
    jobs = [
        MeteredJob("a", 2, status_a, status_a, "alice", {"H100": 2}),
        MeteredJob("b", 1, status_a, status_a, "bob", {"H100": 1}),
        MeteredJob("elsewhere", 8, status_a, status_a, "carol", {"H100": 8}),
    ]
    update = quota_status(
        parent,
        usage(),
        [],
        jobs,
        now,
        pricing=PRICES,
        members={"org", "a", "b"},
        tree_problem="its children's guarantees add up to 6 GPUs, more than its own 4",
    )
    assert (update.status.period_gpu_hours, update.status.period_cost) == (3.0, 12.0)
    tree = {c.type: c for c in update.status.conditions}["TreeConflict"]
    assert tree.status is ConditionStatus.TRUE
    quotas = [
        parent,
        quota(),  # "team", no parent
        TenantQuota.model_validate(
            {"metadata": {"name": "a"}, "spec": {"parent": "org", "guaranteedGpus": 6}}
        ),
        TenantQuota.model_validate({"metadata": {"name": "lost"}, "spec": {"parent": "gone"}}),
    ]
    problems = tree_problems(quotas)
    assert set(problems) == {"org", "lost"}
    assert "more than its own 4" in problems["org"]
    assert "namespaces it lists wait" in problems["org"]
    assert "does not exist" in problems["lost"]


def test_a_gang_seen_only_once_it_ran_is_charged_its_whole_run_to_its_tenant() -> None:
    """Its pods started and ended between two cycles; the tenant was metered meanwhile, while
    the job's status still said Admitted. The cycle that sees it done charges the tenant the
    whole run, once: 8 GPUs x 565 s (started 10 min before, ended 35 s before)."""
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    admitted = GpuJobStatus(phase=JobPhase.ADMITTED)
    done = GpuJobStatus(
        phase=JobPhase.SUCCEEDED,
        started_at=now - timedelta(minutes=10),
        finished_at=now - timedelta(seconds=35),  # before the tenant's last metering
    )
    last = now - timedelta(seconds=30)
    q = quota({"lastMeteredAt": last.isoformat(), "periodStart": "2026-11-01T00:00:00Z"})
    job = MeteredJob("team", 8, admitted, done, "alice", {})
    assert meterable(admitted, last, done)
    first = quota_status(q, usage(), [], [job], now, pricing=PRICES)
    assert first.status.gpu_seconds == 8 * 565
    assert first.urgent  # written now: from the next cycle on, only its finished status says it
    # Later meterings read the finished status: nothing is charged twice.
    again = q.model_copy(update={"status": first.status})
    kept = MeteredJob("team", 8, done, done, "alice", {})
    later = quota_status(again, usage(), [], [kept], now + timedelta(minutes=5), pricing=PRICES)
    assert later.status.gpu_seconds == 8 * 565


def test_a_run_that_stopped_while_its_tenant_was_busy_is_charged_at_its_next_metering() -> None:
    """Preempted at 12:00 while its tenant's status was being written (metered at 11:50):
    kept as a run that ended then, the next metering at 12:01, whose statuses no longer say
    it ran, charges its 10 minutes (8 GPUs x 600 s), not a minute more."""
    stop = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    running_then = GpuJobStatus(phase=JobPhase.RUNNING, started_at=stop - timedelta(hours=1))
    preempted = GpuJobStatus(phase=JobPhase.PREEMPTED)
    [kept] = stopped_runs(
        [
            MeteredJob("team", 8, running_then, preempted, "alice", {}),
            MeteredJob("team", 2, running_then, running_then, "bob", {}),
        ],
        stop,
    )
    last = stop - timedelta(minutes=10)
    q = quota({"lastMeteredAt": last.isoformat(), "periodStart": "2026-11-01T00:00:00Z"})
    later = quota_status(q, usage(), [], [kept], stop + timedelta(minutes=1), pricing=PRICES)
    assert later.status.gpu_seconds == 8 * 600


BASE = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
_hours = st.integers(min_value=-48, max_value=48).map(lambda h: BASE + timedelta(hours=h / 2))


@st.composite
def metered_job(draw: st.DrawFn) -> MeteredJob:
    started = draw(st.none() | _hours)
    finished = draw(st.none() | _hours)
    phase = draw(st.sampled_from(list(JobPhase)))
    before = GpuJobStatus(phase=phase, started_at=started, finished_at=finished)
    after = draw(
        st.sampled_from(
            [
                before,
                GpuJobStatus(phase=JobPhase.QUEUED),
                GpuJobStatus(
                    phase=JobPhase.SUCCEEDED, started_at=started, finished_at=BASE + timedelta(1)
                ),
                # Started, or even run to its end, before this cycle saw it.
                GpuJobStatus(phase=JobPhase.RUNNING, started_at=draw(_hours)),
                GpuJobStatus(
                    phase=JobPhase.SUCCEEDED,
                    started_at=BASE - timedelta(hours=30),
                    finished_at=draw(_hours),
                ),
            ]
        )
    )
    tenant = draw(st.sampled_from(["team", "other", None]))
    gpus = draw(st.integers(min_value=1, max_value=8))
    submitter = draw(st.sampled_from(["alice", "bob", ""]))
    return MeteredJob(tenant, gpus, before, after, submitter, {"H100": gpus})


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(metered_job(), max_size=12),
    last=st.none() | _hours,
    earlier=st.integers(min_value=0, max_value=20),
    unmetered_elsewhere=st.booleans(),
    after=st.integers(min_value=0, max_value=10),
)
def test_a_tenants_status_from_its_meterable_jobs_alone_is_its_status_from_every_job(
    jobs: list[MeteredJob],
    last: datetime | None,
    earlier: int,
    unmetered_elsewhere: bool,
    after: int,
) -> None:
    """The operator hands each TenantQuota only its own jobs that are running or finished
    after the earliest time any tenant was last metered: the status must be the one worked
    out from every job of the store."""
    status = {"lastMeteredAt": last.isoformat()} if last is not None else {}
    q = quota({**status, "periodStart": "2026-11-01T00:00:00Z"})
    now = (last or BASE) + timedelta(hours=after)
    # The earliest last metering of all tenants: this one's or another's before it.
    oldest = (
        None if last is None and unmetered_elsewhere else (last or BASE) - timedelta(hours=earlier)
    )
    mine = [j for j in jobs if j.tenant == "team" and meterable(j.before, oldest, j.after)]
    truth = quota_status(q, usage(), [], jobs, now, pricing=PRICES)
    kept = quota_status(q, usage(), [], mine, now, pricing=PRICES)
    assert kept.status == truth.status
    assert kept.events == truth.events
