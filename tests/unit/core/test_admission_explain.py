"""``explain`` gives the cycle's own verdict on a job, with the evidence behind it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.core.admission import AcrossReplicas, CycleConfig, Job, Snapshot, Tenant
from gpusched.core.admission.cycle import Cycle
from gpusched.core.admission.explain import (
    NEVER_PREEMPTS,
    SPENT_PREEMPTS,
    describe,
    explain,
    sooner,
)
from tests.examples import examples
from tests.unit.core.admission_testdata import job, node
from tests.unit.core.test_forecast_play import Case
from tests.unit.core.test_forecast_play import _build as build_forecast_case
from tests.unit.core.test_forecast_play import cases as forecast_cases

NOW = 10_000.0


def test_waiting_job_gets_its_reason_and_what_each_node_says() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    nodes = [node("busy", busy=range(6)), node("other", model="A100")]
    jobs = [job("a/j", "a", 4, gpu_model="H100", submitted=1)]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), tuple(nodes)), "a/j")
    assert e.decision == "waiting"
    assert e.reason == "WaitingForCapacity"
    assert e.queue_position == 1
    assert e.claims_guarantee
    assert e.node_summary == {"NotEnoughFreeGpus": 1, "ModelMismatch": 1}
    assert e.nodes[0].node == "busy"
    assert "2 of 8 placeable GPUs are free" in e.nodes[0].detail
    assert any("no running job qualifies" in line for line in e.preemption)


def test_admission_names_its_placement_and_victims() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    jobs = [
        job("a/low", "a", 8, priority=0, running_on=[("n0", tuple(range(8)))]),
        job("a/high", "a", 8, priority=9, submitted=1),
    ]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),)), "a/high")
    assert e.decision == "admitted"
    assert e.placement[0]["node"] == "n0"
    assert e.victims[0].startswith("a/low (HigherPriority)")


def test_running_job_says_whether_it_is_borrowed_and_protected() -> None:
    tenants = [Tenant("a", guaranteed=0)]
    jobs = [
        job(
            "a/run",
            "a",
            8,
            running_on=[("n0", tuple(range(8)))],
            started=NOW - 10,
            min_runtime_seconds=100,
        )
    ]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),)), "a/run")
    assert e.decision == "running"
    assert e.borrowed
    assert any("minimum runtime for another 90s" in line for line in e.preemption)
    assert any("borrowed GPUs" in line for line in e.preemption)


def test_required_scope_refusals_are_explained_per_node() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    dgx = node("dgx", "dgx1", busy=[1, 2, 3, 4, 5, 7])
    jobs = [job("a/j", "a", 2, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (dgx,)), "a/j")
    assert e.reason == "TopologyUnsatisfiable"
    assert e.nodes[0].reason == "ScopeUnsatisfiable"


def test_unknown_job_is_reported_as_absent() -> None:
    assert not explain(Snapshot(NOW), "x/y").found


def test_node_whose_wiring_never_meets_the_scope_says_the_scope_not_free_gpus() -> None:
    tenants = [Tenant("a", guaranteed=8)]
    # No five GPUs of a DGX-1 are all NVLinked; with four busy, too few are free as well.
    dgx = node("dgx", "dgx1", busy=[0, 1, 2, 3])
    jobs = [job("a/j", "a", 5, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (dgx,)), "a/j")
    assert e.reason == "NoFeasibleNodes"
    verdict = e.nodes[0]
    assert (verdict.reason, verdict.free_gpus) == ("ScopeUnsatisfiable", 4)
    assert "never give 5 GPUs scope nvlink (required)" in verdict.detail


def test_waiting_job_gets_its_expected_start_and_a_change_that_starts_it_sooner() -> None:
    # Node a frees its other 4 GPUs in 2 h; node b is held by a job with no known end.
    tenants = [Tenant("a", guaranteed=16)]
    nodes = [node("a"), node("b")]
    jobs = [
        job("a/r", "a", 4, running_on=[("a", (0, 1, 2, 3))], expected_end=NOW + 7200),
        job("a/forever", "a", 8, running_on=[("b", tuple(range(8)))]),
        job("a/j", "a", 8, submitted=1, expected_runtime=600.0),
    ]
    on = CycleConfig(reservations_per_tenant=1)
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), tuple(nodes), config=on), "a/j")
    assert e.decision == "waiting"
    assert e.expected_start == NOW + 7200
    assert e.reservation is not None
    assert e.reservation["start"] == NOW + 7200
    assert e.reservation["idle_gpus"] == 4
    assert e.counterfactual == "4 GPUs per replica instead of 8: now (2 h earlier)"


def test_no_change_is_offered_when_none_starts_the_job_markedly_sooner() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    nodes = [node("a")]
    jobs = [
        job("a/r", "a", 8, running_on=[("a", tuple(range(8)))], expected_end=NOW + 7200),
        job("a/j", "a", 2, submitted=1, expected_runtime=600.0),
    ]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), tuple(nodes)), "a/j")
    assert e.expected_start == NOW + 7200
    assert e.counterfactual is None


def test_a_scope_looser_than_the_next_one_is_offered_when_only_it_starts_the_job_sooner() -> None:
    # The NVSwitch board frees in 4 h; the idle node has no NodeGpuTopology, so it meets only
    # scope `node`: neither `pcie-switch` nor `numa` starts the 3-GPU job before the board.
    tenants = (Tenant("a", guaranteed=16),)
    running = job("a/r", "a", 8, running_on=[("n0", tuple(range(8)))], expected_end=NOW + 14400)
    waiting = job("a/w", "a", 3, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)
    snapshot = Snapshot(NOW, tenants, (running, waiting), (node("n0"), node("c0", "count")))
    e = explain(snapshot, "a/w")
    assert e.expected_start == NOW + 14400
    assert e.counterfactual == "scope `node` instead of `nvlink`: now (4 h earlier)"
    # The job changed as offered, decided on its own, starts now on the idle node; changed to
    # either scope between, it does not.
    for scope, admitted in (
        (TopologyScope.PCIE_SWITCH, False),
        (TopologyScope.NUMA, False),
        (TopologyScope.NODE, True),
    ):
        changed = replace(waiting, policy=replace(waiting.policy, scope=scope))
        result = Cycle(replace(snapshot, jobs=(running, changed))).run()
        admission = result.admission_of("a/w")
        assert (admission is not None) is admitted, scope
        if admission is not None:
            assert [a.node for a in admission.placement] == ["c0"]


def test_a_gang_whose_segments_no_rack_holds_is_told_preferred_segments_start_it_now() -> None:
    # Four idle nodes, one per rack: segments of 2 replicas per rack can never be placed.
    rack = "topology.kubernetes.io/rack"
    tenants = [Tenant("a", guaranteed=32)]
    nodes = [node(f"n{i}", labels={rack: f"r{i}"}) for i in range(4)]
    gang = job(
        "a/g",
        "a",
        8,
        2,
        across=AcrossReplicas(rack, False, segment_replicas=2, segment_label=rack),
    )
    e = explain(Snapshot(NOW, tuple(tenants), (gang,), tuple(nodes)), "a/g")
    assert e.reason == "NoFeasibleNodes"
    assert e.counterfactual == "`segment.mode: preferred` instead of `required`: now"


def test_a_gang_no_domain_holds_is_told_a_preferred_domain_starts_it_now() -> None:
    rack = "topology.kubernetes.io/rack"
    tenants = [Tenant("a", guaranteed=32)]
    nodes = [node(f"n{i}", labels={rack: f"r{i}"}) for i in range(4)]
    gang = job("a/g", "a", 8, 2, across=AcrossReplicas(rack, True))
    e = explain(Snapshot(NOW, tuple(tenants), (gang,), tuple(nodes)), "a/g")
    assert e.reason == "NoFeasibleNodes"
    assert e.counterfactual == "`acrossReplicas.mode: preferred` instead of `required`: now"


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(forecast_cases())
def test_the_answer_from_a_cycle_already_run_is_that_of_deciding_again(case: Case) -> None:
    """What the operator answers from its last cycle and last forecast (``describe``) is what
    ``explain`` finds deciding afresh, for every job of the snapshot: decision, reason,
    evidence and expected start (the change that would start it sooner is asked apart)."""
    cycle = build_forecast_case(case)
    cycle.forecast()
    result = cycle.result()
    for key in cycle.jobs:
        kept = describe(cycle, result, key, cycle.now).to_dict()
        fresh = explain(cycle.snapshot, key).to_dict()
        for answer in (kept, fresh):
            answer.pop("counterfactual")
        assert kept == fresh, key


def test_a_job_not_forecast_yet_is_offered_no_change_that_starts_it_no_sooner() -> None:
    # The board frees in 3 h; a looser scope starts the 4-GPU job then too. Between forecasts
    # the operator's answer carries no expected start: the job's own start is worked out, and
    # the scope is not offered as a change that starts it sooner.
    tenants = [Tenant("a", guaranteed=8)]
    jobs = [
        job("a/r", "a", 8, running_on=[("n0", tuple(range(8)))], expected_end=NOW + 3 * 3600),
        job("a/w", "a", 4, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED, submitted=1),
    ]
    snapshot = Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),))
    cycle = Cycle(snapshot)
    told = describe(cycle, cycle.run(), "a/w")
    assert (told.expected_start, told.forecast_at) == (None, None)
    assert sooner(snapshot, cycle.jobs["a/w"], told) is None
    # Nor is a job that no forecast can start (GPUs held with no known end) denied the one
    # that starts it: two GPUs are free on another node.
    held = (replace(jobs[0], expected_end=None), jobs[1])
    nodes = (node("n0"), node("n1", busy=range(6)))
    snapshot = replace(snapshot, jobs=held, nodes=nodes)
    cycle = Cycle(snapshot)
    told = describe(cycle, cycle.run(), "a/w")
    assert sooner(snapshot, cycle.jobs["a/w"], told) == "2 GPUs per replica instead of 4: now"


def test_an_expected_start_that_passed_since_the_last_forecast_is_told_as_now() -> None:
    # The forecast of a minute ago expected the job 30 s ago; its GPUs are still held. The
    # status shows the start as now (never in the past), and so does the explanation.
    tenants = [Tenant("a", guaranteed=8)]
    jobs = [
        job("a/r", "a", 8, running_on=[("n0", tuple(range(8)))], expected_end=NOW + 600),
        job("a/w", "a", 8, submitted=1),
    ]
    cycle = Cycle(Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),)))
    result = cycle.run()
    [waiting] = result.waiting
    result = replace(result, waiting=(replace(waiting, expected_start=NOW - 30),))
    told = describe(cycle, result, "a/w", NOW - 60)
    assert told.expected_start == NOW
    assert told.forecast_at == NOW - 60


def test_a_job_that_can_never_start_is_told_so_not_that_it_is_beyond_its_guarantee() -> None:
    # 8 GPUs inside an 8-GPU guarantee on an idle node, but one user may hold at most 4 (or
    # the tenant at most 4 at all): nothing freeing up or evicted would ever start it.
    for tenant in (
        Tenant("a", guaranteed=8, user_max_gpus=4),
        Tenant("a", guaranteed=8, borrowing_limit=4),
    ):
        jobs = [job("a/j", "a", 8, submitter="bob")]
        e = explain(Snapshot(NOW, (tenant,), tuple(jobs), (node("n0"),)), "a/j")
        assert e.reason in ("UserCapExceeded", "QuotaExceeded")
        assert e.never_starts
        assert e.preemption == [NEVER_PREEMPTS]


def test_a_job_that_can_start_once_gpus_free_is_not_told_it_never_starts() -> None:
    tenants = [Tenant("a", guaranteed=8, user_max_gpus=8, borrowing_limit=8)]
    jobs = [
        job("a/r", "a", 8, running_on=[("n0", tuple(range(8)))], expected_end=NOW + 600),
        job("a/j", "a", 8, submitted=1, submitter="bob"),
    ]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),)), "a/j")
    assert e.decision == "waiting"
    assert not e.never_starts
    assert NEVER_PREEMPTS not in e.preemption


def _restarted_borrower(min_runtime_seconds: int = 0) -> Job:
    """Tenant a's 8-GPU job on n0, restarted 60 s ago after one preemption, its reclaim
    protection bounded at 300 s (what the tenant's borrowedProtectionSeconds would set)."""
    return job(
        "a/run",
        "a",
        8,
        running_on=[("n0", tuple(range(8)))],
        started=NOW - 60,
        preemptions=1,
        min_runtime_seconds=min_runtime_seconds,
        reclaim_min_runtime_seconds=300.0,
    )


def test_a_borrowing_job_is_told_its_shorter_protection_against_a_reclaim() -> None:
    # Started 60 s ago after one earlier preemption: 30 min against its own tenant's priorities
    # (1740 s left), but a reclaim waits only min(minRuntime 600, borrowed bound 300): 240 s.
    tenants = [Tenant("a", guaranteed=0), Tenant("b", guaranteed=8)]
    run = _restarted_borrower(min_runtime_seconds=600)
    e = explain(Snapshot(NOW, tuple(tenants), (run,), (node("n0"),)), "a/run")
    assert any("another 1740s" in line and "own tenant's" in line for line in e.preemption)
    assert "against a reclaim it is protected for another 240s" in " ".join(e.preemption)


def test_a_borrowing_job_told_it_is_unprotected_against_a_reclaim_is_reclaimed_now() -> None:
    tenants = [Tenant("a", guaranteed=0), Tenant("b", guaranteed=8)]
    run = _restarted_borrower()
    e = explain(Snapshot(NOW, tuple(tenants), (run,), (node("n0"),)), "a/run")
    assert "against a reclaim it is no longer protected" in " ".join(e.preemption)
    claim = job("b/claim", "b", 8, submitted=NOW - 1)
    e = explain(Snapshot(NOW, tuple(tenants), (run, claim), (node("n0"),)), "b/claim")
    assert e.decision == "admitted"
    assert e.victims[0].startswith("a/run (ReclaimGuarantee)")


def test_a_job_claiming_its_guarantee_is_told_when_the_borrower_it_could_reclaim_is_free() -> None:
    # The borrower restarted 60 s ago after an earlier preemption: its 30 min protection
    # holds against its own tenant only; against this reclaim it has min(600, 300) - 60 =
    # 240 s left. b's own running job of the same priority is no victim of it at all.
    tenants = [Tenant("a", guaranteed=0), Tenant("b", guaranteed=12)]
    borrower = _restarted_borrower(min_runtime_seconds=600)
    own = job(
        "b/own",
        "b",
        4,
        running_on=[("n1", (0, 1, 2, 3))],
        started=NOW - 10,
        min_runtime_seconds=100,
    )
    filler = job("a/fill", "a", 4, running_on=[("n1", (4, 5, 6, 7))], started=NOW - 10)
    claim = job("b/claim", "b", 8, submitted=NOW - 1)
    snapshot = Snapshot(
        NOW, tuple(tenants), (borrower, own, filler, claim), (node("n0"), node("n1"))
    )
    e = explain(snapshot, "b/claim")
    assert e.decision == "waiting"
    [line] = [x for x in e.preemption if "becomes preemptible" in x]
    assert line.startswith("1 running job(s)")
    assert line.endswith("the first (a/run) becomes preemptible in 240s")


def test_a_job_of_a_tenant_that_spent_its_budget_is_not_told_it_is_beyond_its_guarantee() -> None:
    # 4 GPUs inside an 8-GPU guarantee, a lower-priority job of its own tenant on the node:
    # the budget, not the guarantee, keeps it from starting or evicting anyone.
    tenants = [Tenant("a", guaranteed=8, budget_exhausted_until=NOW + 86400)]
    jobs = [
        job("a/low", "a", 8, running_on=[("n0", tuple(range(8)))], started=NOW - 600),
        job("a/j", "a", 4, priority=5, submitted=1),
    ]
    e = explain(Snapshot(NOW, tuple(tenants), tuple(jobs), (node("n0"),)), "a/j")
    assert (e.decision, e.reason) == ("waiting", "BudgetExhausted")
    assert e.preemption == [SPENT_PREEMPTS]


def test_a_replica_larger_than_any_node_is_told_the_field_and_the_largest_node() -> None:
    tenants = [Tenant("a", guaranteed=16)]
    e = explain(Snapshot(NOW, tuple(tenants), (job("a/j", "a", 16),), (node("n0"),)), "a/j")
    assert e.reason == "NoFeasibleNodes"
    assert "spec.gpusPerReplica" in e.message
    assert "(8 at most)" in e.message  # an 8-GPU board


def test_a_scope_no_nodes_wiring_gives_names_the_field_and_the_change_that_fits() -> None:
    # No 8 GPUs of a DGX-1 are all NVLinked; as preferred the same job starts now.
    tenants = [Tenant("a", guaranteed=8)]
    nodes = (node("dgx", "dgx1"),)
    required = job("a/j", "a", 8, scope=TopologyScope.NVLINK, mode=TopologyMode.REQUIRED)
    e = explain(Snapshot(NOW, tuple(tenants), (required,), nodes), "a/j")
    assert e.reason == "NoFeasibleNodes"
    assert "scope nvlink (required)" in e.message
    assert "spec.topology.mode preferred" in e.message
    preferred = replace(required, policy=replace(required.policy, mode=TopologyMode.PREFERRED))
    assert explain(Snapshot(NOW, tuple(tenants), (preferred,), nodes), "a/j").decision == (
        "admitted"
    )
