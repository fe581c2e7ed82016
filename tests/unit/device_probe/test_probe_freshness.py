"""The probe exports when its reading was last published, so a stuck or cut-off probe shows up
as a growing age rather than as unchanged health."""

from __future__ import annotations

import time
from typing import Any

from probe_testdata import H100, MakeNode, backend_for

from gpusched.device_probe.probe import Probe, ProbeConfig
from gpusched.kubeasync import ApiError
from gpusched.metrics import ProbeMetrics


class UnreachableApi:
    """A publisher whose every call fails as an unreachable API server's would."""

    def __getattr__(self, name: str) -> Any:
        def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise ApiError(503, "Service Unavailable", "the API server is unreachable")

        return fail


def _last_success(metrics: ProbeMetrics) -> float:
    value = metrics.registry.get_sample_value("gpusched_probe_last_success_timestamp_seconds")
    assert value is not None
    return value


def test_a_published_reading_stamps_the_time_and_a_failed_one_does_not(
    make_node: MakeNode,
) -> None:
    fake = make_node(H100)
    metrics = ProbeMetrics()
    config = ProbeConfig(node_name="node-a", event_timeout_ms=100)
    cut_off = Probe(backend_for(fake), config, UnreachableApi(), metrics, watch_events=False)  # type: ignore[arg-type]
    assert cut_off.cycle().outcome == "api-error"
    assert _last_success(metrics) == 0

    before = time.time()
    probe = Probe(backend_for(fake), config, None, metrics, watch_events=False)
    assert probe.cycle().outcome == "ok"
    assert before <= _last_success(metrics) <= time.time()
