"""Admissions, preemptions and requeues are counted once each: a decision planned again
because its writes were refused (a victim's status moved, the Lease lapsed), or a release
settled again while its status write was in flight, is the same admission or release."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from prometheus_client import Counter

from gpusched.dev.bench.admission import Workload, build_snapshot
from gpusched.dev.bench.operator_cycle import NOW, load_store
from gpusched.metrics import OperatorMetrics
from gpusched.operator.decide import OperatorConfig, decide
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.nodes import NodeReader
from gpusched.operator.store import Store
from tests.unit.operator.test_stuck_victims import _world


def _total(counter: Counter) -> float:
    return sum(
        s.value for family in counter.collect() for s in family.samples if s.name.endswith("_total")
    )


def _loop() -> AdmissionLoop:
    return AdmissionLoop(cast(Any, None), Store(), OperatorConfig(), OperatorMetrics())


def test_an_admission_planned_again_is_counted_once() -> None:
    snapshot = build_snapshot(Workload(nodes=8, tenants=3, queued=24, fill=0.5), 3)
    kinds = {n.name: "count" if n.count_only else "nvswitch" for n in snapshot.nodes}
    store = load_store(snapshot, kinds)
    decision = decide(store.world(NOW), {}, OperatorConfig(), NodeReader())
    planned = len(decision.plan.admitted)
    victims = sum(len(a.victims) for a in decision.plan.admitted)
    assert planned > 0
    loop = _loop()
    for _ in range(2):  # the same admissions planned again: nothing was written
        loop._count(decision)
    assert _total(loop.metrics.admissions) == planned
    assert _total(loop.metrics.preemptions) == victims


def test_a_release_settled_again_is_counted_once() -> None:
    config = OperatorConfig()
    timeout = timedelta(seconds=config.lifecycle().pods_ready_timeout)
    decision = decide(_world(timeout + timedelta(seconds=10)), {}, config, NodeReader())
    assert decision.settled["ns/urgent"].requeued == "PodsReadyTimeout"
    loop = _loop()
    loop._count(decision)
    loop.counts = type(loop.counts)()  # settled afresh, as after its write was refused
    loop._count(decision)
    assert _total(loop.metrics.requeues) == 1
