"""GPU health classification: XID policy, ECC, row remapping, throttling, temperature, lost GPUs,
and continuity of ``since`` across cycles and probe restarts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpusched.api.nodegputopology import GpuHealth, GpuHealthState
from gpusched.core.health import (
    APPLICATION_XIDS,
    CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL_SLOWDOWN,
    GpuObservation,
    HealthPolicy,
    classify,
    restore,
    severity,
)

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
UUID = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
SW_POWER_CAP = 0x04


def obs(**fields: object) -> GpuObservation:
    return GpuObservation(index=3, uuid=UUID, **fields)  # type: ignore[arg-type]


def test_an_idle_gpu_is_healthy_since_its_first_judgement() -> None:
    record = classify(obs(ecc_uncorrected=0, throttle_reasons=0, temperature_c=40), None, T0)
    assert (record.state, record.reason, record.since) == (GpuHealthState.HEALTHY, "Healthy", T0)
    assert record.placeable


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_are_ignored_like_the_device_plugin_does(xid: int) -> None:
    assert classify(obs(xids=(xid,)), None, T0).state is GpuHealthState.HEALTHY


@pytest.mark.parametrize(
    ("xid", "words"),
    [(79, "fallen off the bus"), (48, "double-bit ECC"), (63, "row remapping"), (94, "contained")],
)
def test_other_xids_make_the_gpu_unhealthy_with_the_xid_as_reason(xid: int, words: str) -> None:
    record = classify(obs(xids=(xid,)), None, T0)
    assert record.state is GpuHealthState.UNHEALTHY
    assert record.reason == f"Xid{xid}"
    assert words in record.message
    assert not record.placeable


def test_a_fatal_xid_is_sticky_and_keeps_its_since() -> None:
    first = classify(obs(xids=(13, 79)), None, T0)
    later = classify(obs(ecc_uncorrected=0), first, T0 + timedelta(minutes=5))
    assert later.reason == "Xid79"
    assert later.since == T0
    assert later.fatal_xid == 79


def test_xid_policy_is_configurable_and_enabling_wins() -> None:
    policy = HealthPolicy().with_xids(also_ignore={79, 94}, fatal={94})
    assert classify(obs(xids=(79,)), None, T0, policy).state is GpuHealthState.HEALTHY
    assert classify(obs(xids=(94,)), None, T0, policy).reason == "Xid94"
    assert classify(obs(xids=(13,)), None, T0, HealthPolicy().with_xids(fatal={13})).reason == (
        "Xid13"
    )
    counting_only = HealthPolicy(xid_checks=False)
    assert classify(obs(xids=(79,)), None, T0, counting_only).state is GpuHealthState.HEALTHY


def test_uncorrectable_ecc_errors_above_the_limit_make_the_gpu_unhealthy() -> None:
    assert classify(obs(ecc_uncorrected=0), None, T0).state is GpuHealthState.HEALTHY
    record = classify(obs(ecc_uncorrected=2), None, T0)
    assert (record.state, record.reason) == (GpuHealthState.UNHEALTHY, "EccUncorrectable")
    assert "2 uncorrectable" in record.message
    tolerant = HealthPolicy(ecc_uncorrected_limit=2)
    assert classify(obs(ecc_uncorrected=2), None, T0, tolerant).state is GpuHealthState.HEALTHY


def test_pending_row_remap_is_unschedulable_until_reset() -> None:
    record = classify(obs(remapped_rows_pending=True, remapped_rows_failure=False), None, T0)
    assert (record.state, record.reason) == (GpuHealthState.UNSCHEDULABLE, "RowRemapPending")
    assert not record.placeable
    after_reset = classify(obs(remapped_rows_pending=False), record, T0 + timedelta(hours=1))
    assert after_reset.state is GpuHealthState.HEALTHY
    assert after_reset.since == T0 + timedelta(hours=1)


def test_failed_row_remap_is_unhealthy_and_outranks_pending() -> None:
    record = classify(obs(remapped_rows_pending=True, remapped_rows_failure=True), None, T0)
    assert (record.state, record.reason) == (GpuHealthState.UNHEALTHY, "RowRemapFailure")


def test_sustained_hardware_slowdown_degrades_but_a_burst_does_not() -> None:
    policy = HealthPolicy(throttle_sustain_seconds=30)
    burst = classify(obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), None, T0, policy)
    assert burst.state is GpuHealthState.HEALTHY
    assert burst.throttled_since == T0
    still = classify(
        obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), burst, T0 + timedelta(seconds=29), policy
    )
    assert still.state is GpuHealthState.HEALTHY
    sustained = classify(
        obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), still, T0 + timedelta(seconds=30), policy
    )
    assert (sustained.state, sustained.reason) == (GpuHealthState.DEGRADED, "HwSlowdown")
    assert sustained.placeable  # a penalty, not an exclusion
    longer = classify(
        obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), sustained, T0 + timedelta(minutes=9), policy
    )
    assert (longer.since, longer.message) == (sustained.since, sustained.message)
    recovered = classify(obs(throttle_reasons=0), longer, T0 + timedelta(minutes=10), policy)
    assert recovered.state is GpuHealthState.HEALTHY
    assert recovered.throttled_since is None


def test_an_interrupted_slowdown_starts_its_clock_again() -> None:
    policy = HealthPolicy(throttle_sustain_seconds=30)
    first = classify(obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), None, T0, policy)
    gap = classify(obs(throttle_reasons=0), first, T0 + timedelta(seconds=20), policy)
    again = classify(
        obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), gap, T0 + timedelta(seconds=40), policy
    )
    assert again.state is GpuHealthState.HEALTHY
    assert again.throttled_since == T0 + timedelta(seconds=40)


@pytest.mark.parametrize(
    ("bits", "reason"),
    [
        (CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_THERMAL_SLOWDOWN, "HwThermalSlowdown"),
        (CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN, "HwPowerBrakeSlowdown"),
    ],
)
def test_the_slowdown_reason_names_its_cause(bits: int, reason: str) -> None:
    policy = HealthPolicy(throttle_sustain_seconds=0)
    record = classify(obs(throttle_reasons=bits), None, T0, policy)
    assert (record.state, record.reason) == (GpuHealthState.DEGRADED, reason)


def test_software_power_capping_is_normal_operation() -> None:
    policy = HealthPolicy(throttle_sustain_seconds=0)
    assert classify(obs(throttle_reasons=SW_POWER_CAP), None, T0, policy).state is (
        GpuHealthState.HEALTHY
    )


def test_temperature_at_the_slowdown_threshold_degrades() -> None:
    hot = classify(obs(temperature_c=90, slowdown_temperature_c=90), None, T0)
    assert (hot.state, hot.reason) == (GpuHealthState.DEGRADED, "HighTemperature")
    assert classify(obs(temperature_c=89, slowdown_temperature_c=90), None, T0).state is (
        GpuHealthState.HEALTHY
    )
    strict = HealthPolicy(temperature_limit_c=80)
    assert classify(obs(temperature_c=85), None, T0, strict).reason == "HighTemperature"


def test_the_temperature_message_does_not_change_with_every_degree() -> None:
    a = classify(obs(temperature_c=91, slowdown_temperature_c=90), None, T0)
    b = classify(obs(temperature_c=95, slowdown_temperature_c=90), a, T0 + timedelta(seconds=10))
    assert (a.message, a.since) == (b.message, b.since)


def test_a_lost_gpu_is_unhealthy_and_named_before_its_xid() -> None:
    record = classify(obs(lost=True, xids=(79,)), None, T0)
    assert (record.state, record.reason) == (GpuHealthState.UNHEALTHY, "GpuLost")
    assert record.fatal_xid == 79  # kept: it explains the GPU once it answers again
    back = classify(obs(), record, T0 + timedelta(minutes=1))
    assert back.reason == "Xid79"


def test_reset_required_and_nvml_failures_are_unhealthy() -> None:
    assert classify(obs(reset_required=True), None, T0).reason == "ResetRequired"
    unavailable = classify(obs(nvml_unavailable="Driver Not Loaded"), None, T0)
    assert unavailable.reason == "NvmlUnavailable"
    assert "Driver Not Loaded" in unavailable.message
    error = classify(obs(query_error="nvmlDeviceGetUUID failed"), None, T0)
    assert (error.state, error.reason) == (GpuHealthState.UNHEALTHY, "NvmlError")


def test_the_worst_finding_wins() -> None:
    policy = HealthPolicy(throttle_sustain_seconds=0)
    record = classify(
        obs(remapped_rows_pending=True, throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN),
        None,
        T0,
        policy,
    )
    assert record.state is GpuHealthState.UNSCHEDULABLE
    assert (
        severity(GpuHealthState.UNHEALTHY)
        > severity(GpuHealthState.UNSCHEDULABLE)
        > severity(GpuHealthState.DEGRADED)
        > severity(GpuHealthState.HEALTHY)
    )


def test_history_of_another_gpu_at_the_same_index_does_not_apply() -> None:
    broken = classify(obs(xids=(79,)), None, T0)
    replacement = GpuObservation(index=3, uuid="GPU-another")
    assert classify(replacement, broken, T0 + timedelta(days=1)).state is GpuHealthState.HEALTHY


def test_to_api_carries_reason_since_and_telemetry() -> None:
    record = classify(obs(xids=(79,), temperature_c=55, power_w=300.5), None, T0)
    api = record.to_api()
    assert (api.index, api.uuid, api.state, api.reason, api.since) == (
        3,
        UUID,
        GpuHealthState.UNHEALTHY,
        "Xid79",
        T0,
    )
    assert (api.temperature_c, api.power_w) == (55, 300.5)


def _published(state: GpuHealthState, reason: str, since: datetime) -> GpuHealth:
    return GpuHealth(index=3, uuid=UUID, state=state, reason=reason, message="m", since=since)


def test_a_restarted_probe_keeps_a_fatal_xid_of_the_current_boot() -> None:
    boot = T0 - timedelta(hours=2)
    before_restart = classify(obs(xids=(79,)), None, T0)
    record = restore(before_restart.to_api(), boot)
    assert record is not None
    again = classify(obs(), record, T0 + timedelta(minutes=1))
    assert again.to_api() == before_restart.to_api()


@pytest.mark.parametrize(
    "hiding",
    [{"lost": True}, {"reset_required": True}, {"nvml_unavailable": "Driver Not Loaded"}],
    ids=["GpuLost", "ResetRequired", "NvmlUnavailable"],
)
def test_a_fatal_xid_named_behind_a_worse_reason_outlasts_a_probe_restart(
    hiding: dict[str, object],
) -> None:
    boot = T0 - timedelta(hours=2)
    xid = classify(obs(xids=(79,)), None, T0)
    hidden = classify(obs(**hiding), xid, T0 + timedelta(minutes=1))
    assert hidden.reason != "Xid79"
    published = GpuHealth.model_validate(hidden.to_api().to_k8s())
    assert published.fatal_xid == 79
    record = restore(published, boot)
    assert record is not None
    answering = classify(obs(), record, T0 + timedelta(minutes=2))
    assert (answering.state, answering.reason) == (GpuHealthState.UNHEALTHY, "Xid79")


def test_a_fatal_xid_from_before_the_reboot_is_forgotten() -> None:
    boot = T0 + timedelta(hours=1)
    record = restore(_published(GpuHealthState.UNHEALTHY, "Xid79", T0), boot)
    assert record is not None
    assert classify(obs(), record, boot + timedelta(minutes=1)).state is GpuHealthState.HEALTHY


def test_a_restored_xid_the_policy_now_ignores_is_dropped() -> None:
    policy = HealthPolicy().with_xids(also_ignore={79})
    record = restore(_published(GpuHealthState.UNHEALTHY, "Xid79", T0), None, policy)
    assert record is not None
    assert classify(obs(), record, T0, policy).state is GpuHealthState.HEALTHY


def test_a_restored_slowdown_stays_degraded_without_waiting_again() -> None:
    policy = HealthPolicy(throttle_sustain_seconds=30)
    record = restore(_published(GpuHealthState.DEGRADED, "HwSlowdown", T0), None, policy)
    assert record is not None
    again = classify(
        obs(throttle_reasons=CLOCKS_EVENT_HW_SLOWDOWN), record, T0 + timedelta(seconds=5), policy
    )
    assert (again.state, again.since, again.message) == (GpuHealthState.DEGRADED, T0, "m")


def test_a_restored_healthy_state_keeps_its_since() -> None:
    record = restore(_published(GpuHealthState.HEALTHY, "Healthy", T0), None)
    assert record is not None
    again = classify(obs(), record, T0 + timedelta(hours=3))
    assert again.since == T0
    assert restore(GpuHealth(index=3), None) is None


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="ecc_uncorrected_limit"):
        HealthPolicy(ecc_uncorrected_limit=-1)
    with pytest.raises(ValueError, match="throttle_sustain_seconds"):
        HealthPolicy(throttle_sustain_seconds=-5)
