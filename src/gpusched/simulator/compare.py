"""Several policies over one workload and cluster, one after the other, each from a fresh start
(same jobs, same nodes, same seed), so their figures compare like for like."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpusched.simulator.engine import ProgressHook, SpeedModel, replay
from gpusched.simulator.model import Cluster, RunResult, Workload
from gpusched.simulator.policies import build


def run_policies(
    workload: Workload,
    cluster: Cluster,
    policies: Sequence[str],
    *,
    seed: int = 0,
    speed: SpeedModel | None = None,
    progress: Callable[[str], ProgressHook | None] | None = None,
    cycle_interval: float = 0.0,
) -> list[RunResult]:
    """Replay ``workload`` on ``cluster`` under each named policy."""
    results = []
    for name in policies:
        levels = tuple(level.level for level in cluster.levels)
        policy = build(name, cluster.nodes, workload.tenants, seed, levels)
        hook = progress(name) if progress is not None else None
        results.append(
            replay(
                workload,
                cluster,
                policy,
                speed=speed,
                progress=hook,
                cycle_interval=cycle_interval,
            )
        )
    return results
