"""Jobs told an expected start, each judged by hand (figures.estimate_accuracy)."""

from __future__ import annotations

from gpusched.simulator.model import JobRecord
from tests.unit.simulator.sim_testdata import attempt


def told(
    id: str,
    submit: float,
    start: float | None,
    estimated_at: float | None = None,
    estimate: float | None = None,
) -> JobRecord:
    """A 1-GPU job that started at ``start`` (None: never) and ran 100 s."""
    return JobRecord(
        id=id,
        tenant="A",
        gpus=1,
        submit=submit,
        duration=100.0,
        attempts=() if start is None else (attempt(start, start + 100),),
        finished=start is not None,
        estimated_at=estimated_at,
        estimate=estimate,
    )


# Tolerance: max(3600, 0.25 x (start - estimated_at)); error: start - estimate.
ESTIMATED = (
    # Waited 9000 s; error +1800 <= max(3600, 2250): within.
    told("e1", 0, 9000, estimated_at=0, estimate=7200),
    # Waited 40000 s; error +20000 > max(3600, 0.25 x 39000 = 9750): not within.
    told("e2", 0, 40000, estimated_at=1000, estimate=20000),
    # Started earlier than told: error -6000, |-6000| <= 0.25 x 40000 = 10000: within.
    told("e3", 0, 44000, estimated_at=4000, estimate=50000),
    # Told late: 12000 s remained, error -8000 > max(3600, 3000): not within (a quarter of the
    # whole wait, 8000, would have let it pass: the rule counts from when it was told).
    told("e4", 0, 32000, estimated_at=20000, estimate=40000),
    # Waited exactly an hour: not a long wait, not judged.
    told("e5", 0, 3600, estimated_at=0, estimate=100),
    # A long wait with no expected start: counts as a long wait only.
    told("e6", 0, 7201),
    # Told, never started: counts as told only.
    told("e7", 0, None, estimated_at=0, estimate=500),
    # Error +3600 on the edge of max(3600, 0.25 x 13600 = 3400): within.
    told("e8", 0, 13600, estimated_at=0, estimate=10000),
)
