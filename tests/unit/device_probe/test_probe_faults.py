"""Injected faults reach the probe's published health with the documented state and reason, and
neither a lost GPU nor an NVML failure stops the probe."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pynvml
import pytest
from probe_testdata import H100, Clock, MakeNode, backend_for

from gpusched.api import keys
from gpusched.api.nodegputopology import GpuHealthState
from gpusched.core.health import HealthPolicy
from gpusched.dev.fakenvml import FakeNode, FakeNvml, Fault
from gpusched.dev.fakenvml.nvml import FakeHandle
from gpusched.device_probe.events import GpuEvent, handle_key
from gpusched.device_probe.nvml_backend import NvmlBackend
from gpusched.device_probe.probe import CycleResult, Probe, ProbeConfig
from gpusched.device_probe.sysfs import Sysfs

HEALTHY, DEGRADED = GpuHealthState.HEALTHY, GpuHealthState.DEGRADED
UNSCHEDULABLE, UNHEALTHY = GpuHealthState.UNSCHEDULABLE, GpuHealthState.UNHEALTHY


def _probe(fake: FakeNode, clock: Clock, *, watch: bool = False, **config: object) -> Probe:
    return Probe(
        backend_for(fake),
        ProbeConfig(node_name="node-a", event_timeout_ms=100, **config),  # type: ignore[arg-type]
        clock=clock,
        watch_events=watch,
    )


def _state(result: CycleResult, gpu: int) -> tuple[GpuHealthState, str]:
    entry = result.status.gpus[gpu]
    return entry.state, entry.reason


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


FAULTS = [
    (Fault(gpu=3, xid=79), UNHEALTHY, "Xid79"),
    (Fault(gpu=3, xid=48), UNHEALTHY, "Xid48"),
    (Fault(gpu=3, xid=63), UNHEALTHY, "Xid63"),
    (Fault(gpu=3, xid=94), UNHEALTHY, "Xid94"),
    (Fault(gpu=3, xid=13), HEALTHY, "Healthy"),
    (Fault(gpu=3, ecc="double-bit"), UNHEALTHY, "EccUncorrectable"),
    (Fault(gpu=3, remapped_rows="pending"), UNSCHEDULABLE, "RowRemapPending"),
    (Fault(gpu=3, remapped_rows="failure"), UNHEALTHY, "RowRemapFailure"),
    (Fault(gpu=3, throttle="hw-thermal"), DEGRADED, "HwThermalSlowdown"),
    (Fault(gpu=3, throttle="hw-power-brake"), DEGRADED, "HwPowerBrakeSlowdown"),
    (Fault(gpu=3, throttle="hw-slowdown"), DEGRADED, "HwSlowdown"),
    (Fault(gpu=3, throttle="sw-power-cap"), HEALTHY, "Healthy"),
    (Fault(gpu=3, temperature_c=95), DEGRADED, "HighTemperature"),
    (Fault(gpu=3, lost=True), UNHEALTHY, "GpuLost"),
]


@pytest.mark.parametrize(
    ("fault", "state", "reason"), FAULTS, ids=[f"{f[2]}-{i}" for i, f in enumerate(FAULTS)]
)
def test_each_injected_fault_gives_its_documented_health(
    make_node: MakeNode, fault: Fault, state: GpuHealthState, reason: str
) -> None:
    fake = make_node(H100)
    clock = Clock()
    probe = _probe(fake, clock, watch=True, policy=HealthPolicy(throttle_sustain_seconds=30))
    try:
        first = probe.cycle()
        assert {_state(first, i) for i in range(8)} == {(HEALTHY, "Healthy")}
        fake.nvml.inject(fault)
        if fault.xid is not None or fault.ecc is not None:  # delivered as events
            _wait_for(lambda: probe.pending_events > 0, "the event")
        probe.cycle()
        clock.advance(30)  # a slowdown has to last before it counts
        result = probe.cycle()
    finally:
        probe.close()
    assert _state(result, 3) == (state, reason)
    assert result.status.gpus[3].message or state is HEALTHY
    assert {_state(result, i) for i in range(8) if i != 3} == {(HEALTHY, "Healthy")}
    placeable = 7 if state in (UNHEALTHY, UNSCHEDULABLE) else 8
    assert result.status.healthy_gpus == placeable
    assert result.labels[keys.LABEL_GPU_HEALTHY] == str(placeable)
    assert result.topology.gpu(3).health is state


def test_a_state_change_carries_its_time_and_keeps_it(make_node: MakeNode) -> None:
    fake = make_node(H100)
    clock = Clock()
    started = clock.now
    probe = _probe(fake, clock)
    assert probe.cycle().status.gpus[2].since == started
    clock.advance(120)
    fake.nvml.inject(Fault(gpu=2, remapped_rows="pending"))
    changed = probe.cycle().status.gpus[2]
    clock.advance(60)
    again = probe.cycle().status.gpus[2]
    assert changed.since == again.since == started + timedelta(seconds=120)
    assert again.message == changed.message


def test_a_gpu_lost_mid_run_keeps_its_identity_and_wiring(make_node: MakeNode) -> None:
    fake = make_node(H100)
    probe = _probe(fake, Clock())
    before = probe.cycle()
    fake.nvml.inject(Fault(gpu=5, lost=True))
    during = probe.cycle()
    assert during.outcome == "ok"
    assert _state(during, 5) == (UNHEALTHY, "GpuLost")
    gpu = during.topology.gpu(5)
    assert gpu.uuid == before.topology.gpu(5).uuid
    assert during.status.gpus[5].uuid == gpu.uuid
    assert during.topology.link(5, 6) == before.topology.link(5, 6)
    assert during.labels[keys.LABEL_TOPOLOGY_HASH] == before.labels[keys.LABEL_TOPOLOGY_HASH]
    assert during.labels[keys.LABEL_GPU_COUNT] == "8"
    assert during.labels[keys.LABEL_GPU_HEALTHY] == "7"
    fake.nvml.inject(Fault(gpu=5, lost=False))
    after = probe.cycle()
    assert _state(after, 5) == (HEALTHY, "Healthy")


def test_nvml_init_failure_publishes_a_node_that_says_so_then_recovers(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100, init_error="DriverNotLoaded")
    probe = _probe(fake, Clock())
    down = probe.cycle()
    assert down.outcome == "nvml-unavailable"
    assert down.topology.gpus == ()
    assert down.labels[keys.LABEL_GPU_COUNT] == "0"
    assert down.labels[keys.LABEL_PROBED] == "true"
    condition = down.status.conditions[0]
    assert (condition.type, condition.status, condition.reason) == (
        "NvmlReady",
        "False",
        "InitFailed",
    )
    assert "Driver Not Loaded" in condition.message
    fake.nvml.inject(Fault(nvml_init="ok"))
    up = probe.cycle()
    assert up.outcome == "ok"
    assert up.status.healthy_gpus == 8
    assert up.status.conditions[0].status == "True"


def test_losing_nvml_after_start_marks_the_known_gpus_unhealthy(make_node: MakeNode) -> None:
    fake = make_node(H100)
    probe = _probe(fake, Clock())
    probe.cycle()
    fake.nvml.inject(Fault(nvml_init="fail", error="LibRmVersionMismatch"))
    probe.backend.shutdown()  # e.g. the driver was reloaded under the probe
    result = probe.cycle()
    assert result.outcome == "nvml-unavailable"
    assert len(result.topology.gpus) == 8
    assert {_state(result, i) for i in range(8)} == {(UNHEALTHY, "NvmlUnavailable")}
    assert result.labels[keys.LABEL_GPU_HEALTHY] == "0"


def test_an_xid_event_wakes_a_running_probe(make_node: MakeNode, tmp_path: Path) -> None:
    faults = tmp_path / "faults.jsonl"
    fake = make_node(H100, faults_path=faults)
    probe = _probe(fake, Clock(), watch=True, interval=3600.0)
    runner = threading.Thread(target=probe.run, daemon=True)
    runner.start()
    try:
        _wait_for(lambda: probe.last is not None, "the first cycle")
        faults.write_text('{"gpu": 4, "xid": 79}\n')
        _wait_for(
            lambda: probe.last is not None and _state(probe.last, 4) == (UNHEALTHY, "Xid79"),
            "GPU 4 unhealthy (the probe sleeps an hour unless the event wakes it)",
        )
    finally:
        probe.stop()
        runner.join(timeout=10)
    assert not runner.is_alive()


def test_xid_events_are_counted_by_code_and_action(make_node: MakeNode) -> None:
    fake = make_node(H100)
    probe = _probe(fake, Clock(), watch=True)
    try:
        probe.cycle()
        fake.nvml.inject(Fault(gpu=1, xid=13))
        fake.nvml.inject(Fault(gpu=2, xid=79))
        _wait_for(lambda: probe.pending_events == 2, "two events")
        probe.cycle()
    finally:
        probe.close()
    registry = probe.metrics.registry
    ignored = registry.get_sample_value(
        "gpusched_probe_xid_events_total", {"gpu": "1", "xid": "13", "action": "ignored"}
    )
    fatal = registry.get_sample_value(
        "gpusched_probe_xid_events_total", {"gpu": "2", "xid": "79", "action": "unhealthy"}
    )
    assert (ignored, fatal) == (1.0, 1.0)
    assert (
        registry.get_sample_value("gpusched_probe_gpu_health", {"gpu": "2", "state": "Unhealthy"})
        == 1.0
    )
    assert (
        registry.get_sample_value("gpusched_probe_gpu_health", {"gpu": "2", "state": "Healthy"})
        == 0.0
    )


def test_a_probe_without_a_cluster_makes_no_writes(make_node: MakeNode) -> None:
    probe = _probe(make_node(H100), Clock())
    assert probe.cycle().writes == 0


def test_a_failed_event_wait_rereads_the_node_and_keeps_listening(make_node: MakeNode) -> None:
    fake = make_node(H100)
    nvml = FakeNvml(fake.topology, fake.nvml.plan)
    nvml.fail_next("nvmlEventSetWait")
    probe = Probe(
        NvmlBackend(nvml, Sysfs(fake.sysfs_root)),
        ProbeConfig(node_name="node-a", event_timeout_ms=100),
        clock=Clock(),
    )
    try:
        probe.cycle()
        _wait_for(lambda: probe.pending_events > 0, "the wait error")
        reads = nvml.calls["nvmlDeviceGetNvLinkState"]
        assert probe.cycle().outcome == "ok"
        assert nvml.calls["nvmlDeviceGetNvLinkState"] > reads  # inventory read again
        nvml.inject(Fault(gpu=6, xid=79))
        _wait_for(lambda: probe.pending_events > 0, "the XID after the failure")
        assert _state(probe.cycle(), 6) == (UNHEALTHY, "Xid79")
    finally:
        probe.close()


def test_xid_events_are_watched_from_the_next_cycle_when_the_event_set_could_not_be_made(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = FakeNvml(fake.topology, fake.nvml.plan)
    nvml.fail_next("nvmlEventSetCreate", code=pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    probe = _probe_over(nvml, fake, watch=True)
    try:
        assert probe.cycle().outcome == "ok"  # health polled; no events yet
        assert nvml.calls["nvmlEventSetCreate"] == 1
        probe.cycle()
        nvml.inject(Fault(gpu=2, xid=79))
        _wait_for(lambda: probe.pending_events > 0, "the XID")
        assert _state(probe.cycle(), 2) == (UNHEALTHY, "Xid79")
    finally:
        probe.close()


def test_a_fatal_xid_seen_while_nvml_is_down_is_applied_once_it_answers(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = FakeNvml(fake.topology, fake.nvml.plan)
    probe = Probe(
        NvmlBackend(nvml, Sysfs(fake.sysfs_root)),
        ProbeConfig(node_name="node-a", event_timeout_ms=100),
        clock=Clock(),
    )
    try:
        probe.cycle()
        nvml.inject(Fault(gpu=4, xid=94))
        _wait_for(lambda: probe.pending_events > 0, "the XID")
        nvml.fail_next("nvmlDeviceGetCount")
        down = probe.cycle()
        assert down.outcome == "nvml-unavailable"
        assert _state(down, 4) == (UNHEALTHY, "NvmlUnavailable")
        up = probe.cycle()
    finally:
        probe.close()
    assert up.outcome == "ok"
    assert _state(up, 4) == (UNHEALTHY, "Xid94")
    assert {_state(up, i) for i in range(8) if i != 4} == {(HEALTHY, "Healthy")}


class _UuidFails(FakeNvml):
    """A driver whose UUID query fails for one GPU as many times as told to."""

    failing_gpu = 3
    failures = 0

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802 - pynvml's name
        if handle.index == self.failing_gpu and self.failures > 0:
            self.failures -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetUUID(handle)


def _probe_over(nvml: FakeNvml, fake: FakeNode, *, watch: bool) -> Probe:
    return Probe(
        NvmlBackend(nvml, Sysfs(fake.sysfs_root)),
        ProbeConfig(node_name="node-a", event_timeout_ms=100),
        clock=Clock(),
        watch_events=watch,
    )


def test_a_fatal_xid_from_a_gpu_whose_uuid_cannot_be_read_is_applied_to_that_gpu(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _UuidFails(fake.topology, fake.nvml.plan)
    probe = _probe_over(nvml, fake, watch=True)
    try:
        probe.cycle()
        nvml.failures = 1  # the event thread's UUID read of the XID's GPU fails
        nvml.inject(Fault(gpu=3, xid=119))
        _wait_for(lambda: probe.pending_events > 0, "the XID")
        result = probe.cycle()
    finally:
        probe.close()
    assert _state(result, 3) == (UNHEALTHY, "Xid119")
    assert {_state(result, i) for i in range(8) if i != 3} == {(HEALTHY, "Healthy")}


def test_a_fatal_xid_from_a_gpu_that_cannot_be_identified_makes_every_gpu_unhealthy(
    make_node: MakeNode,
) -> None:
    probe = _probe(make_node(H100), Clock())
    probe.cycle()
    probe.on_event(GpuEvent("xid", uuid=None, xid=79))
    result = probe.cycle()
    assert {_state(result, i) for i in range(8)} == {(UNHEALTHY, "Xid79")}
    assert result.status.healthy_gpus == 0


def test_one_failed_uuid_read_is_read_again_at_the_next_cycle(make_node: MakeNode) -> None:
    fake = make_node(H100)
    nvml = _UuidFails(fake.topology, fake.nvml.plan)
    nvml.failing_gpu, nvml.failures = 2, 1
    probe = _probe_over(nvml, fake, watch=False)
    assert _state(probe.cycle(), 2) == (UNHEALTHY, "NvmlError")
    result = probe.cycle()
    assert _state(result, 2) == (HEALTHY, "Healthy")
    assert result.topology.gpu(2).uuid == nvml.nvmlDeviceGetUUID(FakeHandle(2))


def test_an_xid_is_applied_by_a_uuid_known_from_before_when_this_reading_lacks_it(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    nvml = _UuidFails(fake.topology, fake.nvml.plan)
    nvml.failing_gpu = 2
    probe = _probe_over(nvml, fake, watch=False)
    uuid = probe.cycle().topology.gpu(2).uuid
    nvml.failures = 1
    probe.request_inventory()
    probe.on_event(GpuEvent("xid", uuid=uuid, xid=48))
    result = probe.cycle()
    assert _state(result, 2) == (UNHEALTHY, "Xid48")
    assert {_state(result, i) for i in range(8) if i != 2} == {(HEALTHY, "Healthy")}


def test_a_pynvml_handle_is_recognised_by_the_device_it_points_at() -> None:
    device = pynvml.struct_c_nvmlDevice_t()
    registered = ctypes.pointer(device)
    in_event = ctypes.cast(ctypes.addressof(device), pynvml.c_nvmlDevice_t)
    assert registered is not in_event
    assert handle_key(registered) == handle_key(in_event)
    assert handle_key(FakeHandle(3)) == handle_key(FakeHandle(3)) != handle_key(FakeHandle(4))
