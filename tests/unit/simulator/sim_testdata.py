"""Tiny hand-built replays whose figures are worked out by hand in the tests."""

from __future__ import annotations

from gpusched.core.admission import Tenant
from gpusched.simulator.model import Attempt, JobRecord, Link, RunResult, Sample

CAPACITY = 8
TENANTS = (Tenant("A", guaranteed=4, weight=1.0), Tenant("B", guaranteed=0, weight=3.0))


def job(
    id: str,
    tenant: str,
    gpus: int,
    submit: float,
    *attempts: Attempt,
    finished: bool = False,
    reason: str | None = None,
) -> JobRecord:
    return JobRecord(
        id=id,
        tenant=tenant,
        gpus=gpus,
        submit=submit,
        duration=100.0,
        attempts=attempts,
        finished=finished,
        reason=reason,
    )


def attempt(
    start: float,
    end: float,
    link: Link = Link.NVLINK,
    slowdown: float = 1.0,
    *,
    preempted: bool = False,
    best: float = 1.0,
    floor: float = 1.0,
) -> Attempt:
    """An attempt whose speed factor is its slowdown (durations measured well wired), the best
    set free at its start ``best`` and the empty cluster's ``floor``."""
    return Attempt(start, end, ("n1",), link, slowdown, preempted, slowdown, best, floor)


def sample(
    time: float,
    held: tuple[int, int],
    queued: tuple[int, int],
    queued_jobs: int,
    stranded: int = 0,
) -> Sample:
    (a, b), (qa, qb) = held, queued
    by_tenant = {k: v for k, v in (("A", a), ("B", b)) if v}
    queued_by_tenant = {k: v for k, v in (("A", qa), ("B", qb)) if v}
    return Sample(
        time=time,
        allocated=a + b,
        queued_jobs=queued_jobs,
        queued_gpus=qa + qb,
        by_tenant=by_tenant,
        stranded=stranded,
        queued_by_tenant=queued_by_tenant,
    )


JOBS = (
    # 1 GPU, ran 0..100 on NVLink: JCT 100, delay 0.
    job("j1", "A", 1, 0.0, attempt(0, 100), finished=True),
    # 4 GPUs, 10..210 through a PCIe switch at half speed: JCT 210, delay 10. Work 4*200/2 =
    # 400 GPU-s at full speed; a set at 1.25x was free at its start, the empty cluster had one at
    # 1.0: lost 400 * (2 - 1) = 400, of it contention 400 * 0.25, avoidable 400 * 0.75.
    job(
        "j2",
        "A",
        4,
        0.0,
        attempt(10, 210, Link.PCIE_SWITCH, 2.0, best=1.25),
        finished=True,
    ),
    # 4 GPUs, preempted after 100..150, then 210..510 across the network at 1.5x, no better set
    # in the empty cluster (a gang larger than its nodes): JCT 460, delay 50; work 4*300/1.5 =
    # 800, lost 800 * 0.5 = 400, all unavoidable; thrown away 4*50.
    job(
        "j3",
        "B",
        4,
        50.0,
        attempt(100, 150, preempted=True),
        attempt(210, 510, Link.NETWORK, 1.5, best=1.5, floor=1.5),
        finished=True,
    ),
    job("j4", "B", 8, 60.0, reason="waiting for quota"),
    job("j5", "B", 40, 70.0, reason="waiting for quota"),
    job("j6", "A", 16, 80.0),
    # Started at 500 (delay 0), still running when the replay stopped at 600.
    job("j7", "A", 2, 500.0, attempt(500, 600)),
)

# Hand-built (not derived from JOBS): time, (A held, B held), (A queued, B queued), queued jobs.
SAMPLES = (
    sample(0, (1, 0), (4, 0), 1),
    sample(10, (5, 0), (0, 0), 0),
    sample(50, (5, 0), (0, 4), 1, stranded=3),
    sample(100, (4, 4), (16, 48), 3),
    sample(150, (2, 6), (16, 48), 3),
    sample(200, (0, 0), (0, 0), 0),
)


def run(
    policy: str = "gpusched",
    jobs: tuple[JobRecord, ...] = JOBS,
    samples: tuple[Sample, ...] = SAMPLES,
    preemptions: int = 1,
) -> RunResult:
    return RunResult(
        policy=policy,
        assumptions=(f"{policy} assumes nothing in particular",),
        workload="tiny",
        cluster="one-node",
        capacity=CAPACITY,
        tenants=TENANTS,
        jobs=jobs,
        samples=samples,
        preemptions=preemptions,
        cpu_seconds=0.5,
    )
