"""The operator's demo scenario end to end: two tenants with different priorities on simulated
H100 nodes, with the operator, the extender and its kube-scheduler as real processes; what
``kubectl get gpujobs`` shows at each step is what a user would see."""

from __future__ import annotations

import time

from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.components import SchedulerProcesses
from gpusched.dev.operator_demo import cleanup_operator_demo, run_operator_demo


def test_demo_shows_admission_placement_and_a_preemption(
    local_cluster: LocalCluster, gpusched_scheduler: SchedulerProcesses
) -> None:
    prefix = f"opdemo{int(time.time()) % 100000}"
    lines: list[str] = []
    started = run_operator_demo(local_cluster, lines.append, start_extender=False, prefix=prefix)
    try:
        output = "\n".join(lines)
        steps = output.split("\n--- ")
        assert len(steps) == 5, output
        first, second, third, fourth = steps[1:]
        # 1: both scratch jobs admitted on borrowed GPUs and running on NVLink sets.
        rows = [line for line in first.splitlines() if " sweep-" in line]
        assert len(rows) == 2, first
        assert all(" Running " in r and " nvlink " in r and "Borrowing" in r for r in rows), first
        # 2: the research job reclaimed its guarantee: a scratch job is preempted (or, if the
        # grace period is already over, requeued) and research/train admitted or running.
        train = next(line for line in second.splitlines() if " train " in line)
        assert "Admitted" in train or "Running" in train, second
        assert "Preempted" in second or "Queued" in second, second
        # 3: it runs; the victim is back in the queue.
        train = next(line for line in third.splitlines() if " train " in line)
        assert "Running" in train, third
        assert "Queued" in third, third
        # 4: the gang waits, and explain says why.
        pretrain = next(line for line in fourth.splitlines() if " pretrain " in line)
        assert "Queued" in pretrain, fourth
        assert "verdict now: the next cycle leaves it waiting" in fourth
        assert "nodes for one replica" in fourth
    finally:
        cleanup_operator_demo(local_cluster, started, prefix)
