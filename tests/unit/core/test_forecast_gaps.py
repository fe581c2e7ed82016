"""Expected starts plan short jobs into the gaps later-planned jobs leave (conservative
backfill, docs/quotas.md "When will my job start"), checked against an independent model of
each GPU's busy time."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core import Policy
from gpusched.core.admission import Assignment, Cycle, CycleConfig, Job, Snapshot, Tenant
from gpusched.core.admission.pool import Pool, Request
from gpusched.core.admission.profile import NEVER, Profile, duration_class
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node

ALL = tuple(range(8))
MINUTE = 60.0


def running(key: str, node_name: str, gpus: tuple[int, ...], end: float) -> Job:
    return job(key, "t", len(gpus), running_on=[(node_name, gpus)], expected_end=end)


def queued(key: str, gpus: int, runtime: float | None, submitted: float) -> Job:
    return job(key, "t", gpus, expected_runtime=runtime, submitted=submitted)


def _forecast(*jobs: Job, reservations: int = 1) -> dict[str, float | None]:
    cycle = Cycle(
        Snapshot(
            now=0.0,
            tenants=(Tenant("t", guaranteed=8),),
            jobs=jobs,
            nodes=(node("a"),),
            config=CycleConfig(reservations_per_tenant=reservations),
        )
    )
    cycle.run()
    return cycle.forecast()


def _behind_a_whole_node_job(
    *later: Job, rest_free_at: float = 100 * MINUTE
) -> dict[str, float | None]:
    """Node a: GPUs 6-7 come free at 40 min, the rest at ``rest_free_at``; the 8-GPU job A
    (50 min) is planned then and leaves 6-7 idle from 40 min until it starts. ``later`` queue
    behind A."""
    return _forecast(
        running("t/r1", "a", (0, 1, 2, 3, 4, 5), end=rest_free_at),
        running("t/r2", "a", (6, 7), end=40 * MINUTE),
        queued("t/A", 8, 50 * MINUTE, submitted=1.0),
        *later,
    )


def test_a_short_job_is_told_it_starts_in_the_gap_before_a_gang_planned_later() -> None:
    # GPUs 6-7 come free at 40 min, the rest at 100 min: the 8-GPU job A is planned at 100 min
    # and leaves 6-7 idle from 40 to 100. B (2 GPUs, 30 min) fits there; C (2 GPUs, 100 min)
    # does not and waits for A.
    expected = _behind_a_whole_node_job(
        queued("t/B", 2, 30 * MINUTE, submitted=2.0),
        queued("t/C", 2, 100 * MINUTE, submitted=3.0),
    )
    assert expected == {"t/A": 100 * MINUTE, "t/B": 40 * MINUTE, "t/C": 150 * MINUTE}


def test_a_job_of_unknown_run_time_is_never_told_a_gap() -> None:
    expected = _behind_a_whole_node_job(queued("t/B", 2, None, submitted=2.0))
    assert expected == {"t/A": 100 * MINUTE, "t/B": 150 * MINUTE}


def test_a_job_planned_in_a_gap_leaves_only_the_rest_of_the_gap_to_the_next() -> None:
    # The gap on GPUs 6-7 runs from 40 to 100 min: B takes 40-70, which leaves 70-100.
    expected = _behind_a_whole_node_job(
        queued("t/B", 2, 30 * MINUTE, submitted=2.0),
        queued("t/D", 2, 30 * MINUTE, submitted=3.0),
        queued("t/E", 2, 30 * MINUTE, submitted=4.0),
    )
    # Run times round up to their duration class (30 min -> 32 min): D's 32 min from 70 end
    # past 100, so it waits for A; E likewise.
    assert duration_class(30 * MINUTE) > 30 * MINUTE
    assert expected["t/B"] == 40 * MINUTE
    assert expected["t/D"] == 150 * MINUTE
    assert expected["t/E"] == 150 * MINUTE


def test_a_job_fits_a_gap_exactly_as_long_as_its_run_time() -> None:
    # 32 minutes is a duration class: B's run fills the gap on GPUs 6-7 from 40 to 72 minutes.
    assert duration_class(32 * MINUTE) == 32 * MINUTE
    expected = _behind_a_whole_node_job(
        queued("t/B", 2, 32 * MINUTE, submitted=2.0), rest_free_at=72 * MINUTE
    )
    assert expected == {"t/A": 72 * MINUTE, "t/B": 40 * MINUTE}


def test_duration_classes_round_up_by_at_most_a_fifth() -> None:
    for seconds in (1.0, 59.0, 60.0, 61.0, 3600.0, 86_400.0, 1e7):
        rounded = duration_class(seconds)
        assert rounded >= seconds
        assert rounded <= max(MINUTE, seconds * 2**0.25) + 1e-6
    assert duration_class(None) == NEVER
    assert duration_class(float("inf")) == NEVER


# --- the profile against an independent model ---------------------------------------------


@dataclass(frozen=True)
class Taken:
    node: int
    gpus: tuple[int, ...]
    start: int
    """Minutes from now."""
    length: int


@dataclass(frozen=True)
class Case:
    nodes: int
    held: tuple[tuple[int, int, int], ...]
    """(node, GPU, minutes until it comes free) for GPUs running a job now."""
    taken: tuple[Taken, ...]
    claims: tuple[Taken, ...]
    """Reservations: they hold their GPUs from now (their ``start`` is unused)."""
    gpus: int
    floor: int
    runtime: int | None
    """Minutes; one of the duration classes, so that rounding adds nothing."""


CLASSES = (1, 2, 4, 8, 16)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    nodes = draw(st.integers(1, 3))
    held = tuple(
        (n, p, draw(st.integers(1, 30)))
        for n in range(nodes)
        for p in range(8)
        if draw(st.booleans())
    )
    taken = tuple(
        Taken(
            draw(st.integers(0, nodes - 1)),
            tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=8)))),
            draw(st.integers(0, 40)),
            draw(st.integers(1, 20)),
        )
        for _ in range(draw(st.integers(0, 8)))
    )
    claims = tuple(
        Taken(
            draw(st.integers(0, nodes - 1)),
            tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=8)))),
            0,
            draw(st.integers(1, 50)),
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    return Case(
        nodes,
        held,
        taken,
        claims,
        draw(st.integers(1, 8)),
        draw(st.integers(0, 30)),
        draw(st.one_of(st.none(), st.sampled_from(CLASSES))),
    )


def _busy(case: Case, taken: int | None = None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Per (node, GPU): the minutes it is busy, as half-open intervals (with the first
    ``taken`` plans; all by default)."""
    busy: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for n, p, until in case.held:
        busy.setdefault((n, p), []).append((0, until))
    for t in case.taken[:taken]:
        for p in t.gpus:
            busy.setdefault((t.node, p), []).append((t.start, t.start + t.length))
    for c in case.claims:
        for p in c.gpus:
            busy.setdefault((c.node, p), []).append((0, c.length))
    return busy


def _free(busy: list[tuple[int, int]], start: int, length: float) -> bool:
    return all(end <= start or begin >= start + length for begin, end in busy)


def _truth(case: Case, busy: dict[tuple[int, int], list[tuple[int, int]]]) -> int | None:
    """The first minute from the floor at which some node has the GPUs free for the whole run
    (for good when the run time is unknown), by trying every minute."""
    horizon = 2 + max([40 + 20, 50] + [t.start + t.length for t in case.taken])
    length = NEVER if case.runtime is None else case.runtime
    for minute in range(case.floor, horizon + 1):
        for n in range(case.nodes):
            free = sum(_free(busy.get((n, p), []), minute, length) for p in range(8))
            if free >= case.gpus:
                return minute
    return None


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_the_earliest_start_is_the_first_time_a_node_has_the_gpus_free_for_the_whole_run(
    case: Case,
) -> None:
    nodes = [node(f"n{i}") for i in range(case.nodes)]
    pool = Pool(nodes, [])
    ends: dict[str, float | None] = {}
    held: dict[tuple[int, int], int] = {(n, p): until for n, p, until in case.held}
    for (n, p), until in held.items():
        key = f"held-{n}-{p}"
        pool.hold(key, f"n{n}", (p,))
        ends[key] = until * MINUTE
    profile = Profile(pool, 0.0, ends)
    for i, c in enumerate(case.claims):
        profile.claim(f"claim-{i}", [Assignment(f"n{c.node}", c.gpus)], c.length * MINUTE)
    request = Request.of(
        Job(
            key="ns/q",
            tenant="t",
            replicas=1,
            gpus_per_replica=case.gpus,
            policy=Policy(TopologyScope.NODE, TopologyMode.PREFERRED),
        )
    )
    runtime = None if case.runtime is None else case.runtime * MINUTE
    length = NEVER if case.runtime is None else case.runtime
    # Asked after each plan, so that what the profile keeps between questions is checked too.
    for i in range(len(case.taken) + 1):
        if i:
            t = case.taken[i - 1]
            profile.take(
                [Assignment(f"n{t.node}", t.gpus)], (t.start + t.length) * MINUTE, t.start * MINUTE
            )
        busy = _busy(case, i)
        truth = _truth(case, busy)
        found = profile.earliest(request, case.floor * MINUTE, runtime)
        assert truth is not None  # every GPU is free for good within the horizon
        assert found is not None
        assert found.start == truth * MINUTE
        (plan,) = found.plans
        n = int(plan.node[1:])
        assert all(_free(busy.get((n, p), []), truth, length) for p in plan.gpus)
