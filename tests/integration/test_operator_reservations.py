"""Reservations on the local cluster: a large gang behind a stream of small jobs gets GPUs
reserved where they free soonest (status, Expected-Start column, events), small jobs keep
running on the GPUs nobody reserved, a small job that would delay the gang does not take its
GPUs, and the gang starts on them when they are free."""

from __future__ import annotations

import time

from tests.integration.operator_harness import Scenario, wait_for

HOUR = 3600


def _node_of(sc: Scenario, ns: str, name: str) -> str:
    return str(sc.status(ns, name)["placement"][0]["node"])


def test_a_gang_behind_small_jobs_gets_a_reservation_and_starts_when_its_gpus_free(
    sc: Scenario,
) -> None:
    first, second = sc.nodes(2)
    _, ns = sc.tenant("resv", guaranteed=16)
    small = [sc.submit(ns, f"small-{i}", 1, maxRuntimeSeconds=HOUR) for i in range(16)]
    for name in small:
        sc.wait_phase(ns, name, "Running", timeout=120)
    sc.submit(ns, "gang", 8, maxRuntimeSeconds=HOUR)

    status = wait_for(
        lambda: s if (s := sc.status(ns, "gang")).get("reservation") else None,
        60,
        "the gang's reservation",
    )
    assert status["phase"] == "Queued"
    assert status["expectedStart"] == status["reservation"]["start"]
    reserved = {p["node"] for p in status["reservation"]["placement"]}
    assert len(reserved) == 1
    [target] = reserved
    other = second if target == first else first
    assert any(reason == "Reserved" for reason, _ in sc.events(ns, "gang"))
    printed = sc.custom.get_namespaced_custom_object(
        "gpusched.io", "v1alpha1", ns, "gpujobs", "gang"
    )
    assert printed["status"]["expectedStart"]

    on = {name: _node_of(sc, ns, name) for name in small}
    # GPUs nobody reserved stay free for anyone: small jobs keep running on the other node.
    freed_elsewhere = [n for n in small if on[n] == other][:2]
    for name in freed_elsewhere:
        sc.finish(ns, name)
    for name in freed_elsewhere:
        sc.wait_phase(ns, name, "Succeeded")
    late = [sc.submit(ns, f"late-{i}", 1, maxRuntimeSeconds=HOUR) for i in range(2)]
    for name in late:
        sc.wait_phase(ns, name, "Running", timeout=60)
        assert _node_of(sc, ns, name) == other

    # A reserved GPU that comes free stays idle for the gang: a job that cannot be made to
    # leave by the reservation's start (not preemptible, no declared limit) does not take it.
    # (A preemptible one predicted to end in time would: the small jobs' run times, seconds
    # here, are recorded as they finish.)
    on_target = [n for n in small if on[n] == target]
    sc.finish(ns, on_target[0])
    sc.wait_phase(ns, on_target[0], "Succeeded")
    sc.submit(ns, "late-blocked", 1, preemptible=False)
    sc.wait_reason(ns, "late-blocked", "WaitingForCapacity")
    time.sleep(3)  # a few cycles
    assert sc.status(ns, "late-blocked")["phase"] == "Queued"
    assert sc.status(ns, "gang")["reservation"]["idleGpus"] >= 1

    # The rest of the reserved node's jobs end: the gang starts there.
    for name in on_target[1:]:
        sc.finish(ns, name)
    running = sc.wait_phase(ns, "gang", "Running", timeout=180)
    assert {p["node"] for p in running["placement"]} == {target}
    assert "reservation" not in running or running["reservation"] is None
    assert sc.status(ns, "late-blocked")["phase"] == "Queued"
