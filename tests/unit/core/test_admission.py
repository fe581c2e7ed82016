"""Scenarios of the admission core: quotas, borrowing, fair share, priorities, gangs, topology,
preemption and its cost model, reservations, reasons and determinism."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.admission import (
    AdmitReason,
    Assignment,
    Cycle,
    CycleConfig,
    JobState,
    PreemptReason,
    Snapshot,
    Taint,
    Tenant,
    Toleration,
    WaitReason,
    run_cycle,
)
from tests.unit.core.admission_testdata import across, job, node, replay

NOW = 10_000.0


def snap(tenants, jobs, nodes, now: float = NOW) -> Snapshot:
    return Snapshot(now=now, tenants=tuple(tenants), jobs=tuple(jobs), nodes=tuple(nodes))


def two_nodes(kind: str = "nvswitch"):
    return [node("n0", kind), node("n1", kind)]


# --- quotas and reasons -------------------------------------------------------------------


def test_job_over_the_borrowing_limit_waits_with_quota_exceeded() -> None:
    tenants = [Tenant("a", guaranteed=4, borrowing_limit=8)]
    jobs = [
        job("a/running", "a", 8, running_on=[("n0", tuple(range(8)))]),
        job("a/next", "a", 4, submitted=1),
    ]
    result = run_cycle(snap(tenants, jobs, two_nodes()))
    waiting = result.waiting_of("a/next")
    assert waiting is not None
    assert waiting.reason is WaitReason.QUOTA_EXCEEDED
    assert "borrowing limit 8" in waiting.message
    assert waiting.queue_position == 1
    assert not result.admissions


def test_job_in_a_namespace_without_tenant_waits_with_a_clear_reason() -> None:
    result = run_cycle(snap([Tenant("a")], [job("orphan/j", None, 1)], two_nodes()))
    waiting = result.waiting_of("orphan/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.NO_TENANT
    assert "namespace orphan is not owned by any TenantQuota" in waiting.message


def test_job_that_no_node_can_ever_hold_says_so() -> None:
    tenants = [Tenant("a", guaranteed=64)]
    jobs = [job("a/huge", "a", 16), job("a/model", "a", 1, gpu_model="B200", submitted=1)]
    result = run_cycle(snap(tenants, jobs, two_nodes()))
    huge = result.waiting_of("a/huge")
    model = result.waiting_of("a/model")
    assert huge is not None
    assert huge.reason is WaitReason.NO_FEASIBLE_NODES
    assert model is not None
    assert model.reason is WaitReason.NO_FEASIBLE_NODES
    assert "B200" in model.message


def test_backoff_keeps_a_released_job_waiting_until_its_time() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    waiting_job = job("a/j", "a", 2, not_before=NOW + 30)
    result = run_cycle(snap(tenants, [waiting_job], two_nodes()))
    waiting = result.waiting_of("a/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.REQUEUE_BACKOFF
    later = run_cycle(snap(tenants, [waiting_job], two_nodes(), now=NOW + 31))
    assert later.admission_of("a/j") is not None


def test_queue_positions_follow_priority_then_submission() -> None:
    tenants = [Tenant("a", guaranteed=0, borrowing_limit=0)]
    jobs = [
        job("a/old-low", "a", 1, priority=0, submitted=1),
        job("a/new-high", "a", 1, priority=5, submitted=3),
        job("a/old-high", "a", 1, priority=5, submitted=2),
    ]
    result = run_cycle(snap(tenants, jobs, two_nodes()))
    positions = {w.job: w.queue_position for w in result.waiting}
    assert positions == {"a/old-high": 1, "a/new-high": 2, "a/old-low": 3}


def test_non_preemptible_job_runs_only_inside_the_guarantee() -> None:
    tenants = [Tenant("a", guaranteed=4)]
    jobs = [
        job("a/small", "a", 4, preemptible=False),
        job("a/big", "a", 4, preemptible=False, submitted=1),
    ]
    result = run_cycle(snap(tenants, jobs, two_nodes()))
    assert result.admission_of("a/small") is not None
    waiting = result.waiting_of("a/big")
    assert waiting is not None
    assert waiting.reason is WaitReason.GUARANTEE_EXCEEDED


def test_a_non_preemptible_job_outside_its_models_guarantee_gets_no_expected_start() -> None:
    """The whole guarantee is promised on H100s and the job names no model: it can never
    start, so nobody can say when it will; one on H100s starts now."""
    tenants = [Tenant("a", guaranteed=8, guaranteed_by_model={"H100": 8})]
    jobs = [
        job("a/any", "a", 1, preemptible=False),
        job("a/h100", "a", 1, preemptible=False, gpu_model="H100", submitted=1),
    ]
    cycle = Cycle(snap(tenants, jobs, [node("n0")]))
    result = cycle.run()
    assert result.wait_reasons["a/any"] is WaitReason.GUARANTEE_EXCEEDED
    assert result.admission_of("a/h100") is not None
    assert cycle.forecast()["a/any"] is None


# --- borrowing, fair share and reclaim -----------------------------------------------------


def test_idle_guarantee_is_lent_and_reclaimed_when_the_owner_returns() -> None:
    tenants = [Tenant("owner", guaranteed=16), Tenant("borrower", guaranteed=0)]
    nodes = two_nodes()
    borrowing = [job(f"borrower/b{i}", "borrower", 8, submitted=i) for i in range(2)]
    first = run_cycle(snap(tenants, borrowing, nodes))
    assert {a.job for a in first.admissions} == {"borrower/b0", "borrower/b1"}
    assert all(a.reason is AdmitReason.BORROWING for a in first.admissions)
    state = replay(snap(tenants, borrowing, nodes), first, dt=600)

    owner_job = job("owner/train", "owner", 8, submitted=100)
    second = run_cycle(replace(state, jobs=(*state.jobs, owner_job)))
    admission = second.admission_of("owner/train")
    assert admission is not None
    assert admission.reason is AdmitReason.WITHIN_GUARANTEE
    assert [v.victim for v in admission.victims] == ["borrower/b1"]  # the later, borrowed one
    assert admission.victims[0].reason is PreemptReason.RECLAIM_GUARANTEE


def test_reclaim_policy_never_waits_for_borrowers() -> None:
    tenants = [
        Tenant("owner", guaranteed=8, reclaim=ReclaimPolicy.NEVER),
        Tenant("borrower", guaranteed=0),
    ]
    jobs = [
        job("borrower/b", "borrower", 8, running_on=[("n0", tuple(range(8)))]),
        job("owner/j", "owner", 8, submitted=1),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0")]))
    waiting = result.waiting_of("owner/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY


def test_reclaim_lower_priority_spares_borrowers_of_equal_priority() -> None:
    tenants = [
        Tenant("owner", guaranteed=8, reclaim=ReclaimPolicy.LOWER_PRIORITY),
        Tenant("borrower", guaranteed=0),
    ]
    jobs = [
        job("borrower/b", "borrower", 8, priority=5, running_on=[("n0", tuple(range(8)))]),
        job("owner/j", "owner", 8, priority=5, submitted=1),
    ]
    assert not run_cycle(snap(tenants, jobs, [node("n0")])).admissions
    jobs[1] = replace(jobs[1], priority=6)
    assert run_cycle(snap(tenants, jobs, [node("n0")])).admission_of("owner/j") is not None


def test_borrower_never_preempts_a_tenant_inside_its_guarantee() -> None:
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    jobs = [
        job("owner/j", "owner", 8, priority=0, running_on=[("n0", tuple(range(8)))]),
        job("borrower/urgent", "borrower", 8, priority=1000, submitted=1),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0")]))
    assert not result.admissions
    waiting = result.waiting_of("borrower/urgent")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY


def test_idle_gpus_are_shared_by_weight() -> None:
    tenants = [Tenant("heavy", weight=2.0), Tenant("light", weight=1.0)]
    nodes = [node(f"n{i}", "count") for i in range(3)]
    jobs = [job(f"heavy/h{i}", "heavy", 1, submitted=i) for i in range(24)]
    jobs += [job(f"light/l{i}", "light", 1, submitted=i) for i in range(24)]
    result = run_cycle(snap(tenants, jobs, nodes))
    admitted = [a.tenant for a in result.admissions]
    assert len(admitted) == 24  # work-conserving: every GPU used
    assert admitted.count("heavy") == 16
    assert admitted.count("light") == 8
    shares = {t.name: t.fair_share for t in result.tenants}
    assert shares == {"heavy": 16.0, "light": 8.0}


def test_guarantee_jobs_go_before_borrowers() -> None:
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", weight=100)]
    jobs = [
        job("borrower/early", "borrower", 8, submitted=0),
        job("owner/late", "owner", 8, submitted=50),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0")]))
    assert [a.job for a in result.admissions] == ["owner/late"]


def test_model_guarantee_covers_only_jobs_asking_for_the_model() -> None:
    tenants = [
        Tenant("t", guaranteed=8, guaranteed_by_model={"H100": 8}),
        Tenant("borrower"),
    ]
    nodes = [node("h", model="H100"), node("a", model="A100")]
    jobs = [
        job("borrower/b", "borrower", 8, running_on=[("h", tuple(range(8)))]),
        job("t/any-model", "t", 8, submitted=1),
        job("t/h100", "t", 8, gpu_model="H100", submitted=2),
    ]
    result = run_cycle(snap(tenants, jobs, nodes))
    # The any-model job borrows the idle A100 node; the H100 job reclaims the H100 node.
    any_model = result.admission_of("t/any-model")
    h100 = result.admission_of("t/h100")
    assert any_model is not None
    assert any_model.reason is AdmitReason.BORROWING
    assert h100 is not None
    assert h100.reason is AdmitReason.WITHIN_GUARANTEE
    assert [v.victim for v in h100.victims] == ["borrower/b"]


# --- priorities, min runtime, checkpoints ----------------------------------------------------


def test_higher_priority_job_preempts_lower_priority_job_of_its_tenant() -> None:
    tenants = [Tenant("a", guaranteed=8, borrowing_limit=8)]
    jobs = [
        job("a/low", "a", 8, priority=1, running_on=[("n0", tuple(range(8)))]),
        job("a/high", "a", 8, priority=10, submitted=1),
        job("a/same", "a", 8, priority=1, submitted=2),
    ]
    result = run_cycle(snap(tenants, jobs, [node("n0")]))
    admission = result.admission_of("a/high")
    assert admission is not None
    assert [(v.victim, v.reason) for v in admission.victims] == [
        ("a/low", PreemptReason.HIGHER_PRIORITY)
    ]
    same = result.waiting_of("a/same")
    assert same is not None
    assert same.reason is WaitReason.QUOTA_EXCEEDED


def test_within_tenant_never_keeps_jobs_waiting_for_each_other() -> None:
    tenants = [Tenant("a", guaranteed=8, within_tenant=WithinTenantPreemption.NEVER)]
    jobs = [
        job("a/low", "a", 8, priority=1, running_on=[("n0", tuple(range(8)))]),
        job("a/high", "a", 8, priority=10, submitted=1),
    ]
    assert not run_cycle(snap(tenants, jobs, [node("n0")])).admissions


def test_min_runtime_protects_a_victim_until_it_has_run_long_enough() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    low = job(
        "a/low",
        "a",
        8,
        priority=1,
        running_on=[("n0", tuple(range(8)))],
        started=NOW - 100,
        min_runtime_seconds=300,
    )
    high = job("a/high", "a", 8, priority=10, submitted=1)
    assert not run_cycle(snap(tenants, [low, high], [node("n0")])).admissions
    later = run_cycle(snap(tenants, [low, high], [node("n0")], now=NOW + 200))
    assert later.admission_of("a/high") is not None


def test_a_borrowed_jobs_minimum_runtime_protects_it_from_reclaim_only_briefly() -> None:
    """On borrowed GPUs a long ``minRuntimeSeconds`` holds back the owner of the guarantee only
    for the borrower's ``borrowedProtectionSeconds`` (``reclaim_min_runtime_seconds``)."""
    tenants = [Tenant("owner", guaranteed=8), Tenant("borrower", guaranteed=0)]
    borrowed = job(
        "borrower/long",
        "borrower",
        8,
        running_on=[("n0", tuple(range(8)))],
        started=NOW - 400,
        min_runtime_seconds=7 * 86400,
        reclaim_min_runtime_seconds=300,
    )
    owner = job("owner/train", "owner", 8, submitted=1)
    admission = run_cycle(snap(tenants, [borrowed, owner], [node("n0")])).admission_of(
        "owner/train"
    )
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["borrower/long"]
    # Inside the protection, or against a same-tenant priority preemption, it still holds.
    young = replace(borrowed, started_at=NOW - 100)
    assert not run_cycle(snap(tenants, [young, owner], [node("n0")])).admissions
    high = job("borrower/high", "borrower", 8, priority=10, submitted=1)
    assert not run_cycle(snap(tenants, [borrowed, high], [node("n0")])).admissions


def test_victim_with_recent_checkpoint_is_cheaper() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    jobs = [
        job("a/no-ckpt", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 3600),
        job(
            "a/ckpt",
            "a",
            8,
            running_on=[("n1", tuple(range(8)))],
            started=NOW - 3600,
            last_checkpoint_at=NOW - 60,
        ),
        job("a/high", "a", 8, priority=10, submitted=1),
    ]
    result = run_cycle(snap(tenants, jobs, two_nodes()))
    admission = result.admission_of("a/high")
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["a/ckpt"]
    assert admission.victims[0].gpu_seconds_lost == 8 * 60
    assert admission.placement[0].node == "n1"


def test_lowest_priority_victim_goes_first() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    jobs = [
        job("a/p1", "a", 8, priority=1, running_on=[("n0", tuple(range(8)))], started=NOW - 10),
        job("a/p0", "a", 8, priority=0, running_on=[("n1", tuple(range(8)))], started=NOW - 9e4),
        job("a/high", "a", 8, priority=10, submitted=1),
    ]
    admission = run_cycle(snap(tenants, jobs, two_nodes())).admission_of("a/high")
    assert admission is not None
    assert [v.victim for v in admission.victims] == ["a/p0"]


def test_victim_set_is_minimal() -> None:
    """Cheap 2-GPU jobs spread over two nodes: only those on one node are evicted."""
    tenants = [Tenant("a", guaranteed=16)]
    jobs = []
    for n in ("n0", "n1"):
        for i in range(4):
            jobs.append(
                job(
                    f"a/{n}-{i}",
                    "a",
                    2,
                    running_on=[(n, (2 * i, 2 * i + 1))],
                    started=NOW - 100 * (i + 1) - (50 if n == "n1" else 0),
                )
            )
    jobs.append(job("a/high", "a", 4, priority=10, submitted=1))
    admission = run_cycle(snap(tenants, jobs, two_nodes())).admission_of("a/high")
    assert admission is not None
    assert len(admission.victims) == 2
    assert len({v.victim.split("-")[0] for v in admission.victims}) == 1


def test_non_preemptible_jobs_are_never_victims() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    jobs = [
        job("a/pinned", "a", 8, preemptible=False, running_on=[("n0", tuple(range(8)))]),
        job("a/high", "a", 8, priority=100, submitted=1),
    ]
    assert not run_cycle(snap(tenants, jobs, [node("n0")])).admissions


# --- gangs and topology -------------------------------------------------------------------


def test_gang_is_admitted_all_or_nothing() -> None:
    tenants = [Tenant("a", guaranteed=32)]
    nodes = [node(f"n{i}") for i in range(4)]
    gang = job("a/gang", "a", 8, replicas=4)
    result = run_cycle(snap(tenants, [gang], nodes))
    admission = result.admission_of("a/gang")
    assert admission is not None
    assert sorted(p.node for p in admission.placement) == ["n0", "n1", "n2", "n3"]
    assert [p.replica for p in admission.placement] == [0, 1, 2, 3]

    busy_node = [*nodes[:3], node("n3", busy=[0])]
    blocked = run_cycle(snap(tenants, [gang], busy_node))
    assert not blocked.admissions
    waiting = blocked.waiting_of("a/gang")
    assert waiting is not None
    assert waiting.reason is WaitReason.WAITING_FOR_CAPACITY


def test_replicas_sharing_a_node_get_distinct_gpus() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    result = run_cycle(snap(tenants, [job("a/g", "a", 4, replicas=2)], [node("n0")]))
    admission = result.admission_of("a/g")
    assert admission is not None
    gpus = [g for p in admission.placement for g in p.gpus]
    assert sorted(gpus) == list(range(8))


def test_required_scope_waits_with_topology_unsatisfiable() -> None:
    # DGX-1 mesh: GPUs 0 and 5 share no NVLink; with only them and two others free on
    # opposite sockets, no free 2-set is NVLinked.
    tenants = [Tenant("a", guaranteed=8)]
    free = {0, 6}
    dgx = node("n0", "dgx1", busy=[g for g in range(8) if g not in free])
    jobs = [job("a/j", "a", 2, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)]
    result = run_cycle(snap(tenants, jobs, [dgx]))
    waiting = result.waiting_of("a/j")
    assert waiting is not None
    assert waiting.reason is WaitReason.TOPOLOGY_UNSATISFIABLE
    preferred = [replace(jobs[0], policy=replace(jobs[0].policy, mode=TopologyMode.PREFERRED))]
    admission = run_cycle(snap(tenants, preferred, [dgx])).admission_of("a/j")
    assert admission is not None
    assert admission.placement[0].gpus == (0, 6)


def test_scope_decides_the_node() -> None:
    """A 2-GPU NVLink job goes to the node whose free GPUs are NVLinked, even if it has more
    free GPUs."""
    tenants = [Tenant("a", guaranteed=16)]
    fragmented = node("frag", "dgx1", busy=[1, 2, 3, 4, 5, 7])  # 0 and 6: no NVLink
    roomy = node("roomy", "nvswitch", busy=[0, 1, 2, 3])
    jobs = [job("a/j", "a", 2, scope=TopologyScope.NVLINK, mode=TopologyMode.PREFERRED)]
    admission = run_cycle(snap(tenants, jobs, [fragmented, roomy])).admission_of("a/j")
    assert admission is not None
    assert admission.placement[0].node == "roomy"
    assert admission.placement[0].topology_class is TopologyScope.NVLINK


def test_best_fit_prefers_the_fullest_node_that_fits() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    nodes = [node("empty"), node("half", busy=[0, 1, 2, 3])]
    admission = run_cycle(snap(tenants, [job("a/j", "a", 4)], nodes)).admission_of("a/j")
    assert admission is not None
    assert admission.placement[0].node == "half"


def test_gang_goes_to_the_tightest_domain_that_holds_it() -> None:
    tenants = [Tenant("a", guaranteed=64)]
    label = "topology.kubernetes.io/rack"
    nodes = [node(f"big{i}", labels={label: "big"}) for i in range(3)]
    nodes += [node(f"small{i}", labels={label: "small"}) for i in range(2)]
    gang = job("a/g", "a", 8, replicas=2, across=across(label))
    admission = run_cycle(snap(tenants, [gang], nodes)).admission_of("a/g")
    assert admission is not None
    assert {p.node for p in admission.placement} == {"small0", "small1"}


def test_required_domain_gang_waits_when_no_domain_fits() -> None:
    tenants = [Tenant("a", guaranteed=64)]
    label = "rack"
    nodes = [node("r1a", labels={label: "r1"}), node("r1b", labels={label: "r1"}, busy=[0])]
    nodes += [node("r2a", labels={label: "r2"})]
    gang = job("a/g", "a", 8, replicas=2, across=across(label))
    result = run_cycle(snap(tenants, [gang], nodes))
    waiting = result.waiting_of("a/g")
    assert waiting is not None
    assert waiting.reason is WaitReason.TOPOLOGY_UNSATISFIABLE
    preferred = replace(gang, across=across(label, required=False))
    assert run_cycle(snap(tenants, [preferred], nodes)).admission_of("a/g") is not None


def test_count_only_nodes_serve_scope_node_only() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    nodes = [node("plain", "count")]
    required = job("a/req", "a", 2, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)
    preferred = job("a/pref", "a", 2, scope=TopologyScope.NVLINK, submitted=1)
    result = run_cycle(snap(tenants, [required, preferred], nodes))
    waiting = result.waiting_of("a/req")
    assert waiting is not None
    assert waiting.reason is WaitReason.NO_FEASIBLE_NODES
    admission = result.admission_of("a/pref")
    assert admission is not None
    assert admission.placement[0].count_only
    assert admission.placement[0].topology_class is TopologyScope.NODE


def test_gpus_of_pods_outside_gpujobs_are_not_given_out() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    nodes = [node("n0", busy=[0, 1]), node("c0", "count", busy_count=6)]
    jobs = [job("a/j", "a", 6), job("a/k", "a", 2, submitted=1)]
    result = run_cycle(snap(tenants, jobs, nodes))
    j = result.admission_of("a/j")
    k = result.admission_of("a/k")
    assert j is not None
    assert j.placement[0].node == "n0"
    assert set(j.placement[0].gpus) == set(range(2, 8))
    assert k is not None
    assert k.placement[0].node == "c0"


def test_node_selector_and_taints_filter_nodes() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    tainted = replace(node("tainted"), taints=(Taint("gpu", "yes", "NoSchedule"),))
    plain = node("plain", labels={"pool": "x"})
    selected = job("a/sel", "a", 8, node_selector=(("pool", "y"),))
    intolerant = [job(f"a/plain{i}", "a", 8, submitted=1 + i) for i in range(2)]
    tolerant = job(
        "a/tol",
        "a",
        8,
        tolerations=(Toleration("gpu", "Equal", "yes", "NoSchedule"),),
        submitted=5,
    )
    result = run_cycle(snap(tenants, [selected, *intolerant, tolerant], [tainted, plain]))
    waiting = result.waiting_of("a/sel")
    assert waiting is not None
    assert waiting.reason is WaitReason.NO_FEASIBLE_NODES
    first = result.admission_of("a/plain0")
    assert first is not None
    assert first.placement[0].node == "plain"
    second = result.waiting_of("a/plain1")
    assert second is not None
    assert second.reason is WaitReason.WAITING_FOR_CAPACITY
    admission = result.admission_of("a/tol")
    assert admission is not None
    assert admission.placement[0].node == "tainted"


# --- reservations and determinism -------------------------------------------------------------


def test_gpus_of_terminating_victims_are_kept_for_their_preemptor() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    victim = replace(
        job("a/victim", "a", 8, running_on=[("n0", tuple(range(8)))]),
        state=JobState.TERMINATING,
        reserved_for="a/preemptor",
    )
    other = job("a/other", "a", 8, priority=50, submitted=0)
    preemptor = job("a/preemptor", "a", 8, priority=10, submitted=1)
    result = run_cycle(snap(tenants, [victim, other, preemptor], [node("n0")]))
    admission = result.admission_of("a/preemptor")
    assert admission is not None
    assert not admission.victims
    assert result.admission_of("a/other") is None


def test_decisions_do_not_depend_on_input_order() -> None:
    tenants = [Tenant(f"t{i}", guaranteed=8 * i, weight=1 + i) for i in range(3)]
    nodes = [node(f"n{i}", ("nvswitch", "dgx1", "count")[i % 3]) for i in range(6)]
    rng = random.Random(7)
    jobs = [
        job(
            f"t{rng.randrange(3)}/j{i}".replace("/", f"-{i}/", 0),
            f"t{i % 3}",
            rng.choice([1, 2, 4, 8]),
            rng.choice([1, 1, 2]),
            priority=rng.randrange(3),
            submitted=float(i),
        )
        for i in range(30)
    ]
    jobs = [replace(j, key=f"t{j.tenant}/j{i}", tenant=j.tenant) for i, j in enumerate(jobs)]
    base = run_cycle(snap(tenants, jobs, nodes))
    for seed in range(3):
        shuffled = list(jobs)
        random.Random(seed).shuffle(shuffled)
        nodes_shuffled = list(nodes)
        random.Random(seed).shuffle(nodes_shuffled)
        again = run_cycle(snap(list(reversed(tenants)), shuffled, nodes_shuffled))
        assert again.admissions == base.admissions
        assert again.waiting == base.waiting


@pytest.mark.parametrize("kind", ["nvswitch", "count"])
def test_tenant_usage_reports_used_and_borrowed(kind: str) -> None:
    tenants = [Tenant("a", guaranteed=4), Tenant("b", guaranteed=4)]
    jobs = [job("a/j", "a", 8), job("b/j", "b", 8, submitted=1)]
    result = run_cycle(snap(tenants, jobs, [node("n0", kind), node("n1", kind)]))
    usage = {t.name: t for t in result.tenants}
    assert usage["a"].used == 8
    assert usage["a"].borrowed == 4
    assert usage["a"].used_by_model == {"H100": 8}
    assert usage["a"].admitted == 1
    assert usage["a"].running == 0  # admitted now: no pod runs yet
    assert usage["a"].pending == 0


def test_replayed_admission_holds_the_same_gpus() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    snapshot = snap(tenants, [job("a/j", "a", 4)], [node("n0")])
    first = run_cycle(snapshot)
    nxt = replay(snapshot, first, dt=1)
    admitted = {j.key: j for j in nxt.jobs}["a/j"]
    assert admitted.state is JobState.ADMITTED
    assert admitted.placement == (Assignment("n0", first.admissions[0].placement[0].gpus),)
    second = run_cycle(replace(nxt, jobs=(*nxt.jobs, job("a/k", "a", 4, submitted=1))))
    k = second.admission_of("a/k")
    assert k is not None
    assert set(k.placement[0].gpus).isdisjoint(first.admissions[0].placement[0].gpus)


def test_a_lender_with_a_model_guarantee_keeps_what_its_buckets_cover() -> None:
    """quotas.md, "Guarantee buckets": tenant l is guaranteed 8, 4 of them on H100. Its H100
    job (4) fills the H100 bucket and one of its two other jobs (4 each) the rest: 8 covered,
    4 borrowed. Only one of the two others may go. c's 8-GPU job would need the H100 job
    (the H100 bucket would cover nothing) or both others (then only 4 covered): it waits."""
    tenants = [
        Tenant("l", guaranteed=8, guaranteed_by_model={"H100": 4}),
        Tenant("c", guaranteed=8),
    ]
    jobs = [
        job("l/a", "l", 4, gpu_model="H100", running_on=[("n1", (0, 1, 2, 3))]),
        job("l/b", "l", 4, running_on=[("n2", (0, 1, 2, 3))], submitted=1.0),
        job("l/c", "l", 4, running_on=[("n2", (4, 5, 6, 7))], submitted=2.0),
        job("c/p", "c", 8, submitted=5.0),
    ]
    result = run_cycle(
        Snapshot(
            now=1000.0,
            tenants=tuple(tenants),
            jobs=tuple(jobs),
            nodes=(node("n1"), node("n2")),
            config=CycleConfig(lending_hold_seconds=0),
        )
    )
    assert not result.admissions
