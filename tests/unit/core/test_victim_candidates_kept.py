"""Who may be evicted is worked out once per kind of preemptor and kept until a job is admitted
or evicted (``Cycle.candidates``). Jobs asked about one after another in the same cycle must each
get the victims that fit them: truth here is worked out from the test's own cluster (which
node each borrower runs on, and which job of the tenant claims its guarantee), never from a
cycle's answer."""

from __future__ import annotations

from gpusched.core.admission.cycle import Cycle
from gpusched.core.admission.model import Job, PreemptReason, Tenant
from gpusched.core.admission.pool import Request
from tests.unit.core.admission_testdata import job, node, snap

NOW = 100_000.0
NODES = [node("h1", model="H100"), node("h2", model="H100"), node("a1", model="A100")]
#: The lender runs one one-GPU job on every GPU of every node: all of it borrowed.
BORROWED = {f"lender/{n.name}-{g}": n.name for n in NODES for g in range(8)}


def _cycle(guaranteed: int, *queued: Job) -> Cycle:
    """The lender's borrowed jobs running, the owner's ``queued`` waiting."""
    running = [
        job(key, "lender", 1, running_on=[(where, (int(key.rsplit("-", 1)[1]),))], started=0.0)
        for key, where in BORROWED.items()
    ]
    tenants = [Tenant("owner", guaranteed=guaranteed), Tenant("lender", guaranteed=0)]
    return Cycle(snap(tenants, [*running, *queued], NODES, NOW))


def _reclaimable(cycle: Cycle, preemptor: Job) -> tuple[set[str], bool]:
    found, cross, _ = cycle.candidates(preemptor, cycle.tenants["owner"], Request.of(preemptor))
    return {c.job.key for c in found if c.reason is PreemptReason.RECLAIM_GUARANTEE}, cross


def test_a_job_for_other_nodes_gets_the_victims_on_those_nodes() -> None:
    h100 = job("owner/h", "owner", 8, submitted=1.0, gpu_model="H100")
    a100 = job("owner/a", "owner", 8, submitted=2.0, gpu_model="A100")
    cycle = _cycle(16, h100, a100)  # both inside the owner's guarantee
    assert _reclaimable(cycle, h100)[0] == {k for k, at in BORROWED.items() if at != "a1"}
    assert _reclaimable(cycle, a100)[0] == {k for k, at in BORROWED.items() if at == "a1"}


def test_a_job_beyond_its_tenants_guarantee_reclaims_nothing_after_one_within_it() -> None:
    # The owner's queue: an 8-GPU job inside its guarantee of 8, then one beyond it.
    first = job("owner/first", "owner", 8, submitted=1.0)
    second = job("owner/second", "owner", 8, submitted=2.0)
    cycle = _cycle(8, first, second)
    assert _reclaimable(cycle, first) == (set(BORROWED), True)
    assert _reclaimable(cycle, second) == (set(), False)


def test_a_lenders_job_evicted_for_one_job_is_not_offered_again_to_the_next() -> None:
    # Every GPU held by the lender's two-GPU jobs; two one-GPU jobs inside the owner's
    # guarantee. The first eviction leaves one GPU of its victim held while it terminates;
    # the second job must evict another job, not the one already going.
    pairs = [
        job(f"lender/{n.name}-{g}", "lender", 2, running_on=[(n.name, (g, g + 1))], started=0.0)
        for n in NODES
        for g in range(0, 8, 2)
    ]
    first = job("owner/first", "owner", 1, submitted=1.0)
    second = job("owner/second", "owner", 1, submitted=2.0)
    tenants = [Tenant("owner", guaranteed=2), Tenant("lender", guaranteed=0)]
    result = Cycle(snap(tenants, [*pairs, first, second], NODES, NOW)).run()
    victims = [p.victim for p in result.preemptions]
    assert {p.preemptor for p in result.preemptions} == {"owner/first", "owner/second"}
    assert len(victims) == len(set(victims)) == 2
