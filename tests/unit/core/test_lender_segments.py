"""Each lender's jobs a reclaim may take are listed once and kept until that lender's running
jobs change (``Cycle._lender_segment``), per node filter, spare GPUs and priority bound. Every
list of victims a cycle hands a search must be the one the rule gives from the cycle's state at
that moment, worked out here job by job without any kept list: over generated histories with
tenant trees (where a sibling's admission or eviction moves what a lender may spare without
changing the lender's own jobs) and flat tenants.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.api.tenantquota import ReclaimPolicy
from gpusched.core.admission import Job, Snapshot, Tenant
from gpusched.core.admission.cycle import Cycle, _Candidates
from gpusched.core.admission.model import PreemptReason
from gpusched.core.admission.pool import Request
from gpusched.core.admission.preemption import may_be_victim
from tests.unit.core.admission_testdata import node, replay, snap
from tests.unit.core.test_admission_properties import workloads
from tests.unit.core.test_admission_tree import trees

NOW = 10_000.0


def _reclaimable_now(cycle: Cycle, job: Job, tenant: Tenant, request: Request) -> list[str]:
    """The other tenants' jobs a reclaim for ``job`` may take, from the cycle's state alone."""
    level = cycle.claim_level(job)
    if tenant.reclaim is ReclaimPolicy.NEVER or level is None:
        return []
    eligible = cycle.pool.eligible_nodes(request).name_set
    out = []
    for name in cycle.tenants:
        if name == tenant.name or cycle.ledgers[name].borrowed() <= 0:
            continue
        path = cycle.tree.lending_path(name, level) if not cycle.tree.flat else (name,)
        if not path:
            continue
        spare = min(cycle.used_at(lv) - cycle._usable(lv) for lv in path)
        for victim in cycle.admitted[name].values():
            if (
                any(a.node in eligible for a in victim.placement)
                and may_be_victim(victim, cycle.now, reclaim=True)
                and victim.total_gpus <= spare
                and not (
                    tenant.reclaim is ReclaimPolicy.LOWER_PRIORITY
                    and victim.priority >= job.priority
                )
            ):
                out.append(victim.key)
    return out


class _Checked(Cycle):
    """A cycle that checks every candidate list it makes against :func:`_reclaimable_now`."""

    checked = 0

    def _find_candidates(
        self, job: Job, tenant: Tenant, request: Request, reserving: bool, level: str | None
    ) -> _Candidates:
        listed = super()._find_candidates(job, tenant, request, reserving, level)
        reclaims = [c.job.key for c in listed.found if c.reason is PreemptReason.RECLAIM_GUARANTEE]
        assert reclaims == _reclaimable_now(self, job, tenant, request), job.key
        assert listed.cross == bool(reclaims)
        type(self).checked += 1
        return listed


def _history(snapshot: Snapshot, late: list[Job]) -> None:
    for i in range(5):
        if i == 2:
            snapshot = snap(snapshot.tenants, [*snapshot.jobs, *late], snapshot.nodes, snapshot.now)
        snapshot = replay(snapshot, _Checked(snapshot).run(), dt=100.0)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.integers(0, 20))
def test_victims_listed_for_a_tree_are_those_its_lenders_may_spare_at_that_moment(
    drawn: tuple[list[Tenant], list[Any]], split: int
) -> None:
    tenants, jobs = drawn
    nodes = [node("n0"), node("n1", "dgx1"), node("n2")]
    _history(snap(tenants, jobs[:split], nodes, NOW), jobs[split:])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_victims_listed_for_flat_tenants_are_those_their_lenders_may_spare_at_that_moment(
    drawn: tuple[list[Any], list[Tenant], list[Job], list[Job]],
) -> None:
    nodes, tenants, early, late = drawn
    _history(snap(tenants, early, nodes, NOW), late)


def test_the_checks_above_see_lists_made_after_admissions_and_evictions() -> None:
    # Guards the properties against checking nothing: a history where reclaims happen.
    before = _Checked.checked
    tenants = [Tenant("owner", guaranteed=8), Tenant("lender", guaranteed=0)]
    running = [
        Job(
            key=f"lender/r{g}",
            tenant="lender",
            replicas=1,
            gpus_per_replica=1,
            submitted_at=0.0,
        )
        for g in range(8)
    ]
    owner = [
        Job(key=f"owner/j{i}", tenant="owner", replicas=1, gpus_per_replica=2, submitted_at=1.0)
        for i in range(4)
    ]
    snapshot = snap(tenants, running, [node("n0")], NOW)
    snapshot = replay(snapshot, _Checked(snapshot).run(), dt=5_000.0)
    _history(snapshot, owner)
    assert _Checked.checked > before
