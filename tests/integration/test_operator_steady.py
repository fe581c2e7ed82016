"""At steady state the operator decides from its watch cache: waiting jobs cost no LIST call,
however many cycles pass over them. (kopf's own LISTs are not counted by the operator's metrics;
kopf lists only when its watch expires, and each of its lists is followed by one reconcile LIST
of the operator's, which is counted.)"""

from __future__ import annotations

import time

from tests.integration.operator_harness import OperatorProcess, Scenario, wait_for

WAITING_JOBS = 30
CYCLES = 5
QUIET_SECONDS = 5.0


def _lists(operator: OperatorProcess) -> dict[tuple[str, str], int]:
    return {k: n for k, n in operator.metrics().requests.items() if k[0] == "LIST"}


def _wait_no_lists_for(operator: OperatorProcess, seconds: float, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last, since = _lists(operator), time.monotonic()
    while time.monotonic() - since < seconds:
        assert time.monotonic() < deadline, f"the operator kept listing: {_lists(operator)}"
        time.sleep(0.5)
        now = _lists(operator)
        if now != last:
            last, since = now, time.monotonic()


def test_cycles_over_waiting_jobs_make_no_list_calls(
    sc: Scenario, operator: OperatorProcess
) -> None:
    sc.nodes(1)
    _, ns = sc.tenant("frozen", guaranteed=0, borrowingLimit=0)
    names = [sc.submit(ns, f"wait-{i:02d}", 1) for i in range(WAITING_JOBS)]
    for name in names:
        sc.wait_reason(ns, name, "QuotaExceeded")

    # Start-up is over: the anchor LISTs, and the reconcile LISTs that follow kopf's own first
    # list of each kind, are behind (no LIST for a while).
    _wait_no_lists_for(operator, QUIET_SECONDS)
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
