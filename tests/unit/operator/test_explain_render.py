"""What ``gpusched explain`` prints about when a waiting job starts, and who decided."""

from __future__ import annotations

from gpusched.core.admission.explain import Explanation
from gpusched.operator.explainer import render, sooner_line

NOW = 1_800_000_000.0


def _waiting(**fields: object) -> Explanation:
    e = Explanation("ns/j", found=True, decision="waiting", reason="WaitingForCapacity", now=NOW)
    for name, value in fields.items():
        setattr(e, name, value)
    return e


def test_the_answer_says_who_decided_it_under_the_heading() -> None:
    lines = render(_waiting(), {"phase": "Queued"}, "answered by the operator (op-0)")
    assert lines[:2] == ["GpuJob ns/j: Queued", "  answered by the operator (op-0)"]


def test_an_expected_start_says_how_old_its_forecast_is() -> None:
    e = _waiting(expected_start=NOW + 7200, forecast_at=NOW - 300)
    [line] = [x for x in render(e, {}) if "expected start" in x]
    assert line.endswith("(in about 2.0 h) (forecast 5 min before this cycle)")


def test_a_job_no_forecast_covered_yet_is_told_so_not_that_nobody_knows() -> None:
    [line] = [x for x in render(_waiting(), {}) if "expected start" in x]
    assert "not forecast yet" in line
    [line] = [x for x in render(_waiting(forecast_at=NOW), {}) if "expected start" in x]
    assert "unknown" in line


def test_a_job_that_can_never_start_is_told_never_not_that_nobody_knows() -> None:
    e = _waiting(reason="UserCapExceeded", never_starts=True, forecast_at=NOW)
    [line] = [x for x in render(e, {}) if "expected start" in x]
    assert "never" in line
    assert "unknown" not in line


def test_a_job_of_a_namespace_no_tenant_owns_is_told_what_it_waits_for() -> None:
    e = _waiting(reason="NoTenant", forecast_at=NOW)
    [line] = [x for x in render(e, {}) if "expected start" in x]
    assert "no TenantQuota owns its namespace" in line


def test_a_job_waiting_on_its_quota_is_not_told_that_no_change_would_start_it_sooner() -> None:
    # Its message says what would start it (fewer GPUs than the cap): no change was tried, so
    # claiming none helps would contradict it.
    for reason in ("UserCapExceeded", "QuotaExceeded", "NoTenant", "BudgetExhausted"):
        assert sooner_line(_waiting(reason=reason)) is None


def test_a_job_waiting_for_gpus_with_no_change_found_is_told_what_was_tried() -> None:
    line = sooner_line(_waiting())
    assert line is not None
    assert "none of the changes tried" in line
    assert sooner_line(_waiting(counterfactual="scope `node` instead of `nvlink`: now")) == (
        "  sooner: scope `node` instead of `nvlink`: now"
    )
