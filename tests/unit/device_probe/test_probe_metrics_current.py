"""The probe's per-GPU gauges describe the latest reading only: a temperature or power the
reading could not get, or a GPU index gone from the node, has no series (a kept value would
be drawn as a live reading)."""

from __future__ import annotations

from probe_testdata import H100, WORKSTATION, Clock, MakeNode, backend_for

from gpusched.dev.fakenvml import Fault
from gpusched.device_probe.probe import Probe, ProbeConfig

TEMPERATURE = "gpusched_probe_gpu_temperature_celsius"
POWER = "gpusched_probe_gpu_power_watts"
HEALTH = "gpusched_probe_gpu_health"


def _gpus(probe: Probe, name: str) -> dict[str, float]:
    """GPU label -> value of one metric (the Healthy state for the health gauge)."""
    return {
        s.labels["gpu"]: s.value
        for family in probe.metrics.registry.collect()
        for s in family.samples
        if s.name == name and s.labels.get("state", "Healthy") == "Healthy"
    }


def test_a_temperature_and_power_the_reading_lacks_are_not_exported_from_before(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    probe = Probe(backend_for(fake), ProbeConfig(node_name="node-a"), clock=Clock())
    fake.nvml.inject(Fault(gpu=3, temperature_c=71, power_w=450.0))
    probe.cycle()
    assert _gpus(probe, TEMPERATURE)["3"] == 71
    assert _gpus(probe, POWER)["3"] == 450.0
    # The next reading of every GPU fails for temperature (both calls) and power.
    for call in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
        fake.nvml.fail_next(call, times=8)
    fake.nvml.fail_next("nvmlDeviceGetPowerUsage", times=8)
    probe.cycle()
    assert _gpus(probe, TEMPERATURE) == {}
    assert _gpus(probe, POWER) == {}
    assert len(_gpus(probe, HEALTH)) == 8
    # Readable again: back with the current value.
    fake.nvml.inject(Fault(gpu=3, temperature_c=65))
    probe.cycle()
    assert _gpus(probe, TEMPERATURE)["3"] == 65
    assert len(_gpus(probe, POWER)) == 8


def test_a_gpu_index_gone_from_the_node_loses_its_series(make_node: MakeNode) -> None:
    eight, four = make_node(H100), make_node(WORKSTATION)
    probe = Probe(backend_for(eight), ProbeConfig(node_name="node-a"), clock=Clock())
    probe.cycle()
    every = {str(i) for i in range(8)}
    assert set(_gpus(probe, HEALTH)) == set(_gpus(probe, TEMPERATURE)) == every
    probe.backend = backend_for(four)  # the node now shows 4 GPUs
    probe.cycle()
    left = {"0", "1", "2", "3"}
    for name in (HEALTH, TEMPERATURE, POWER):
        assert set(_gpus(probe, name)) == left, name


def test_without_nvml_no_temperature_or_power_is_exported(make_node: MakeNode) -> None:
    fake = make_node(H100)
    probe = Probe(backend_for(fake), ProbeConfig(node_name="node-a"), clock=Clock())
    probe.cycle()
    fake.nvml.inject(Fault(nvml_init="fail", error="LibRmVersionMismatch"))
    probe.backend.shutdown()  # the driver was reloaded under the probe
    assert probe.cycle().outcome == "nvml-unavailable"
    assert _gpus(probe, TEMPERATURE) == {}
    assert _gpus(probe, POWER) == {}
    assert len(_gpus(probe, HEALTH)) == 8  # the known GPUs, reported unhealthy
