"""Invariants of reservations and backfill over random cluster states (hypothesis), each checked
against truth computed here from the snapshot and the decisions, not from the cycle's profile:

* every GPU of a reservation is held, after the cycle, only by jobs expected to end by the
  reservation's start: running jobs by their expected end (now, if past it), jobs admitted in the
  cycle by now plus their predicted run time or declared limit. So no job admitted after the
  reservation delays it (the overrun rule aside, which acts on later cycles);
* two reservations sharing a GPU do not overlap in time;
* a job admitted onto GPUs reserved before it says so (``backfill_until``, no later than the
  reservation's start) and can be made to leave by then: preemptible and past its minimum run
  time, or with a declared limit that ends it in time; a job a later reservation was planned
  around has a predicted end;
* no tenant holds more reservations than the configuration allows; a reserving job is not
  admitted in the same cycle.

Each check was seen to fail on a bug planted in the core (see docs/development.md).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.admission import (
    Assignment,
    CycleConfig,
    CycleResult,
    Job,
    JobState,
    Snapshot,
    Tenant,
    run_cycle,
)
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node

SIZES = (1, 2, 4, 8)


@st.composite
def states(draw: Any) -> Snapshot:
    now = float(draw(st.integers(0, 100)))
    nodes = [
        node(f"n{i}", draw(st.sampled_from(["nvswitch", "dgx1"])))
        for i in range(draw(st.integers(2, 4)))
    ]
    tenants = [Tenant(f"t{i}", guaranteed=draw(st.sampled_from([8, 16, 24]))) for i in range(3)]
    jobs: list[Job] = []
    for n in nodes:
        free = list(range(8))
        while free and draw(st.booleans()):
            size = draw(st.sampled_from([s for s in SIZES if s <= len(free)]))
            gpus = tuple(sorted(draw(st.permutations(free))[:size]))
            free = [g for g in free if g not in gpus]
            end = draw(st.one_of(st.none(), st.integers(0, 3000).map(float)))
            backfill = draw(st.one_of(st.none(), st.integers(0, 400).map(float)))
            owner = f"t{draw(st.integers(0, 2))}"
            jobs.append(
                job(
                    f"{owner}/r{len(jobs)}",
                    owner,
                    size,
                    running_on=[(n.name, gpus)],
                    started=0.0,
                    expected_end=end,
                    backfill_until=backfill,
                    preemptible=draw(st.booleans()),
                )
            )
    for i in range(draw(st.integers(2, 16))):
        tenant = draw(st.integers(0, 2))
        size = draw(st.sampled_from(SIZES))
        runtime = draw(
            st.one_of(st.none(), st.integers(5, 300).map(float), st.integers(5, 3000).map(float))
        )
        declared = draw(st.one_of(st.none(), st.integers(5, 3000).map(float)))
        if runtime is not None and declared is not None:
            runtime = min(runtime, declared)
        hint: tuple[Assignment, ...] = ()
        hint_start = None
        if draw(st.integers(0, 3)) == 0:
            target = draw(st.sampled_from(nodes))
            gpus = tuple(sorted(draw(st.permutations(range(8)))[:size]))
            hint = (Assignment(target.name, gpus),)
            hint_start = float(draw(st.integers(0, 3000)))
        jobs.append(
            job(
                f"t{tenant}/q{i}",
                f"t{tenant}",
                size,
                replicas=draw(st.sampled_from([1, 1, 1, 2])),
                priority=draw(st.integers(0, 1)),
                submitted=float(i),
                expected_runtime=runtime,
                max_runtime_seconds=declared,
                preemptible=draw(st.booleans()),
                min_runtime_seconds=float(draw(st.sampled_from([0, 0, 100, 1000]))),
                reservation=hint,
                reservation_start=hint_start,
            )
        )
    config = CycleConfig(
        reservations_per_tenant=draw(st.integers(1, 2)),
        reserve_beyond_entitlement=draw(st.booleans()),
    )
    return Snapshot(
        now=now, tenants=tuple(tenants), jobs=tuple(jobs), nodes=tuple(nodes), config=config
    )


def _gpus(node_name: str, gpus: tuple[int, ...]) -> set[tuple[str, int]]:
    return {(node_name, g) for g in gpus}


def _holders(
    snapshot: Snapshot, result: CycleResult
) -> list[tuple[str, set[tuple[str, int]], float]]:
    """(job, GPUs, expected end) of everything holding GPUs after the cycle."""
    now = snapshot.now
    victims = {v.victim for a in result.admissions for v in a.victims}
    jobs = {j.key: j for j in snapshot.jobs}
    out = []
    for j in snapshot.jobs:
        if j.key in victims or j.state is JobState.QUEUED:
            continue
        end = (
            now
            if j.state is JobState.TERMINATING
            else (math.inf if j.expected_end is None else max(now, j.expected_end))
        )
        held = set().union(*(_gpus(a.node, a.gpus) for a in j.placement))
        out.append((j.key, held, end))
    for a in result.admissions:
        j = jobs[a.job]
        runtime = j.expected_runtime if j.expected_runtime is not None else math.inf
        limit = j.max_runtime_seconds if j.max_runtime_seconds is not None else math.inf
        held = set().union(*(_gpus(p.node, p.gpus) for p in a.placement))
        out.append((j.key, held, now + min(runtime, limit)))
    return out


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_reservations_are_never_delayed_by_what_the_cycle_admits(snapshot: Snapshot) -> None:
    result = run_cycle(snapshot)
    holders = _holders(snapshot, result)
    for reservation in result.reservations:
        reserved = set().union(*(_gpus(p.node, p.gpus) for p in reservation.placement))
        for key, held, end in holders:
            if held & reserved:
                assert end <= reservation.start + 1e-6, (
                    f"{key} holds GPUs reserved for {reservation.job} until {end}, "
                    f"after the reservation's start {reservation.start}"
                )


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_reservations_sharing_a_gpu_do_not_overlap_in_time(snapshot: Snapshot) -> None:
    result = run_cycle(snapshot)
    found = result.reservations
    for i, first in enumerate(found):
        mine = set().union(*(_gpus(p.node, p.gpus) for p in first.placement))
        for second in found[i + 1 :]:
            theirs = set().union(*(_gpus(p.node, p.gpus) for p in second.placement))
            if mine & theirs:
                assert first.end <= second.start or second.end <= first.start, (first, second)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_a_job_on_reserved_gpus_can_be_made_to_leave_by_the_reservations_start(
    snapshot: Snapshot,
) -> None:
    result = run_cycle(snapshot)
    jobs = {j.key: j for j in snapshot.jobs}
    now = snapshot.now
    for admission in result.admissions:
        held = set().union(*(_gpus(p.node, p.gpus) for p in admission.placement))
        starts = [
            r.start
            for r in result.reservations
            if held & set().union(*(_gpus(p.node, p.gpus) for p in r.placement))
        ]
        if not starts:
            continue
        j = jobs[admission.job]
        until = admission.backfill_until
        if until is None:
            # Not backfilled: the reservation was planned after it, around its predicted end.
            assert j.expected_runtime is not None or j.max_runtime_seconds is not None, admission
            continue
        # Each reservation on its GPUs starts no earlier than ``until`` (it was backfilled under
        # it), or was planned after it, around its predicted end.
        runtime = min(
            j.expected_runtime if j.expected_runtime is not None else math.inf,
            j.max_runtime_seconds if j.max_runtime_seconds is not None else math.inf,
        )
        for start in starts:
            assert until <= start + 1e-6 or now + runtime <= start + 1e-6, (admission, starts)
        # Backfilled: expected to end (its prediction or its limit) by the start it was
        # backfilled under.
        assert now + runtime <= until + 1e-6, admission
        evictable = j.preemptible and j.min_runtime_seconds <= until - now
        limited = j.max_runtime_seconds is not None and now + j.max_runtime_seconds <= until
        assert evictable or limited, admission


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_reservations_per_tenant_are_bounded_and_reserving_jobs_wait(snapshot: Snapshot) -> None:
    result = run_cycle(snapshot)
    admitted = {a.job for a in result.admissions}
    per_tenant: dict[str, int] = {}
    for reservation in result.reservations:
        assert reservation.job not in admitted
        per_tenant[reservation.tenant] = per_tenant.get(reservation.tenant, 0) + 1
    assert all(n <= snapshot.config.reservations_per_tenant for n in per_tenant.values())
