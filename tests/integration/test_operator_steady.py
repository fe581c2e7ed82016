"""At steady state the operator decides from its watch cache: waiting jobs cost no LIST call,
however many cycles pass over them."""

from __future__ import annotations

from tests.integration.operator_harness import OperatorProcess, Scenario, wait_for

WAITING_JOBS = 30
CYCLES = 5


def test_cycles_over_waiting_jobs_make_no_list_calls(
    sc: Scenario, operator: OperatorProcess
) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("frozen", guaranteed=0, borrowingLimit=0)
    names = [sc.submit(ns, f"wait-{i:02d}", 1) for i in range(WAITING_JOBS)]
    for name in names:
        sc.wait_reason(ns, name, "QuotaExceeded")

    before = operator.metrics()
    assert before.cycles > 0
    wait_for(
        lambda: operator.metrics().cycles >= before.cycles + CYCLES,
        120,
        f"{CYCLES} more cycles (resync 1 s)",
    )
    made = operator.metrics().since(before)
    lists = {key: n for key, n in made.items() if key[0] == "LIST"}
    assert not lists, f"LIST calls at steady state: {lists} (all requests: {made})"
    # The jobs are still waiting: the cycles decided over them, from the cache.
    assert all(sc.status(ns, name).get("reason") == "QuotaExceeded" for name in names)
