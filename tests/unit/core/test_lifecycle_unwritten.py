"""An admission without victims creates its pods first and is written with the job's next status
change: one status write per started job. Checked transition by transition against statuses
written out by hand."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from gpusched.api.gpujob import JobPhase
from gpusched.core.admission import (
    Admission,
    CycleResult,
    Preemption,
    PreemptReason,
)
from gpusched.core.lifecycle import (
    CreatePod,
    DeletePod,
    JobContext,
    JobFacts,
    Plan,
    Settled,
    Stage,
    Unwritten,
    Verdict,
    WriteStatus,
    plan,
    settle,
)
from tests.unit.core.lifecycle_testdata import (
    CONFIG,
    NOW,
    admission,
    admitted_status,
    job,
    pod,
    with_pods,
)

OK = JobContext(tenant="t", verdict=Verdict())
DELAY = 5.0
QUEUED = {"phase": "Queued", "tenant": "t"}


def _plan(
    *facts: JobFacts, admissions: tuple[Admission, ...] = ()
) -> tuple[dict[str, Settled], Plan]:
    by_key = {f.key: f for f in facts}
    config = replace(CONFIG, record_delay=DELAY)
    settled = {k: settle(f, OK, NOW, config) for k, f in by_key.items()}
    result = CycleResult(admissions=admissions, waiting=(), tenants=())
    return settled, plan(by_key, settled, result, NOW, defer=True)


def _writes(planned: Plan) -> list[WriteStatus]:
    return [a for g in planned.groups for a in g.actions() if isinstance(a, WriteStatus)]


def _unwritten(seconds_ago: float, *pod_phases: str) -> JobFacts:
    """A job the server has Queued (version 42) whose admission the operator carried out
    ``seconds_ago`` and has not written; its pods in ``pod_phases``."""
    server = job(status=QUEUED, version=42)
    admitted = job(
        status=admitted_status(admitted_at=NOW - timedelta(seconds=seconds_ago)), version=42
    )
    facts = replace(admitted, unwritten=Unwritten(status=server.status, resource_version="42"))
    pods = [pod(facts, r, phase=phase, node=f"n{r}") for r, phase in enumerate(pod_phases)]
    return with_pods(facts, *pods)


def test_an_admission_without_victims_creates_its_pods_and_leaves_its_status_for_later() -> None:
    _, planned = _plan(job(status=QUEUED, version=42), admissions=(admission(),))
    [group] = planned.groups
    assert [s.stage for s in group.steps] == [Stage.ADMIT, Stage.CREATE_PODS, Stage.PODS]
    [record] = group.steps[0].actions
    assert isinstance(record, WriteStatus)
    assert record.deferred
    assert record.resource_version == "42"  # the write that comes later is conditional on it
    assert record.status.phase is JobPhase.ADMITTED
    assert record.status.admission == 1
    creates = [a.name for a in group.steps[1].actions if isinstance(a, CreatePod)]
    assert creates == ["train-1-0", "train-1-1"]


def test_an_admission_that_waits_for_victims_is_written_before_anything_else() -> None:
    victim = Preemption("ns/low", "t", "ns/train", PreemptReason.HIGHER_PRIORITY, "why", 8, 1.0)
    low = job("low", status=admitted_status(), version=7)
    low = with_pods(low, pod(low, 0), pod(low, 1, node="n1"))
    _, planned = _plan(
        job(status=QUEUED, version=42), low, admissions=(admission(victims=(victim,)),)
    )
    [group] = planned.groups
    admit = next(s for s in group.steps if s.stage is Stage.ADMIT)
    [write] = admit.actions
    assert isinstance(write, WriteStatus)
    assert not write.deferred
    assert Stage.CREATE_PODS not in [s.stage for s in group.steps]


def test_without_a_delay_the_admission_is_written_before_its_pods() -> None:
    facts = job(status=QUEUED, version=42)
    settled = {facts.key: settle(facts, OK, NOW, CONFIG)}
    result = CycleResult(admissions=(admission(),), waiting=(), tenants=())
    [group] = plan({facts.key: facts}, settled, result, NOW).groups
    [write] = group.steps[0].actions
    assert isinstance(write, WriteStatus)
    assert not write.deferred


def test_an_unwritten_admission_is_written_once_when_its_pods_run() -> None:
    _, planned = _plan(_unwritten(1.0, "Running", "Running"))
    [write] = _writes(planned)
    assert not write.deferred
    assert write.resource_version == "42"
    # One patch from what the server has (Queued) to Running: the admission rides along.
    assert write.patch["phase"] == "Running"
    assert write.patch["admission"] == 1
    assert [p["node"] for p in write.patch["placement"]] == ["n0", "n1"]
    assert write.patch["startedAt"]
    assert {c["type"] for c in write.patch["conditions"]} >= {"Admitted", "PodsReady"}


def test_an_unwritten_admission_waits_while_its_pods_start() -> None:
    settled, planned = _plan(_unwritten(1.0, "Pending", "Running"))
    assert _writes(planned) == []
    # A cycle comes back when the delay ends, whatever else happens.
    assert settled["ns/train"].wake_at == NOW + timedelta(seconds=DELAY - 1.0)


def test_an_unwritten_admission_is_written_when_the_delay_ends_though_its_pods_wait() -> None:
    _, planned = _plan(_unwritten(DELAY, "Pending", "Pending"))
    [write] = _writes(planned)
    assert write.patch["phase"] == "Admitted"
    assert write.patch["admission"] == 1
    assert write.resource_version == "42"


def test_a_job_that_changes_otherwise_writes_its_admission_at_once() -> None:
    # A pod failed within the delay: the job's failure is written, with its admission.
    _, planned = _plan(_unwritten(1.0, "Failed", "Running"))
    [write] = _writes(planned)
    assert write.patch["phase"] == "Failed"
    assert write.patch["admission"] == 1
    assert write.resource_version == "42"


def test_pods_of_an_admission_never_written_go_and_the_next_admission_takes_a_new_number() -> None:
    # The operator stopped after creating the pods of admission 1, before writing it.
    server = job(status=QUEUED, version=42)
    orphan = pod(server, 0, admission=1, phase="Running")
    facts = with_pods(server, orphan)
    settled, planned = _plan(facts, admissions=(admission(),))
    assert DeletePod(orphan.namespace, orphan.name, orphan.uid, 0) in settled["ns/train"].actions
    [group] = planned.groups
    [record] = group.steps[0].actions
    assert isinstance(record, WriteStatus)
    assert record.status.admission == 2
    creates = [a.name for a in group.steps[1].actions if isinstance(a, CreatePod)]
    assert creates == ["train-2-0", "train-2-1"]
