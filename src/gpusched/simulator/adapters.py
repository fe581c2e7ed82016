"""Adapters from the published traces (``../shared/traces``) to a workload and, where the trace
has one, a cluster.

* **Philly** (Microsoft, 2017, as prepared by the Pollux authors): 82,247 jobs with submit time,
  run time and GPU count; virtual clusters are the tenants. See :func:`philly`.
* **openb** (Alibaba, FGD, ATC'23): its GPU node list is the cluster, its pods the workload. See
  :func:`openb` and, for the FGD allocation experiment, :func:`openb_inflated`.
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from gpusched.core import prepare
from gpusched.core.admission import Tenant, count_only_topology
from gpusched.simulator.model import Cluster, Link, SimNode, TraceJob, Workload
from gpusched.simulator.trace import read_trace

#: GPUs a Philly replica holds at most: jobs above it are gangs of 8-GPU replicas.
PHILLY_GPUS_PER_NODE: Final = 8
#: Share of Philly jobs given priority 1 (the rest 0); the trace has no priorities.
PHILLY_HIGH_PRIORITY_SHARE: Final = 0.2
FULL_GPU_MILLI: Final = 1000


class AdapterError(ValueError):
    """A trace file missing or not in the expected shape."""


def traces_dir(given: Path | None = None) -> Path:
    """Where the published traces are: ``given``, ``$GPUSCHED_TRACES``, else the nearest
    ``shared/traces`` beside the source checkout or one of its parents."""
    if given is not None:
        return given
    override = os.environ.get("GPUSCHED_TRACES")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[3]
    for parent in checkout.parents:
        candidate = parent / "shared" / "traces"
        if candidate.is_dir():
            return candidate
    return checkout.parent / "shared" / "traces"


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise AdapterError(f"{path} not found (pass --traces-dir or set GPUSCHED_TRACES)")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _philly_priority(job_id: str, seed: int) -> int:
    return 1 if random.Random(f"{seed}/{job_id}").random() < PHILLY_HIGH_PRIORITY_SHARE else 0


def _utc_seconds(stamp: str) -> float:
    """Seconds since the epoch of a trace timestamp. Philly's are naive wall-clock strings; they
    are read as UTC, never as the machine's local time, so submit times (and the order of jobs
    around a daylight-saving change) are the same on every machine."""
    parsed = datetime.fromisoformat(stamp)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def philly(
    directory: Path | None = None,
    *,
    cluster_gpus: int,
    limit: int | None = None,
    seed: int = 0,
) -> Workload:
    """The Philly trace as a workload for a cluster of ``cluster_gpus`` GPUs.

    * Tenants are the virtual clusters. Each one's guarantee is its share of the published node
      counts per virtual cluster (``philly_vc_nodes.csv``), scaled to ``cluster_gpus`` (largest
      remainders, so the guarantees add up to the cluster); virtual clusters missing from that
      list get no guarantee. Weight 1, no borrowing limit.
    * Priorities are synthesised (the trace has none): each job gets priority 1 with probability
      0.2, drawn from ``random.Random(f"{seed}/{job id}")``, else 0.
    * A job of up to 8 GPUs is one replica; a larger one is a gang of ceil(GPUs / 8) replicas of
      equal size (Philly's nodes had at most 8 GPUs): 12 GPUs run as 2 x 6, 128 as 16 x 8. A size
      that does not divide would be rounded up (counted in the notes; none in Philly).
    * The run time is the trace's, measured on whatever placement Philly gave the job. A job
      above 8 GPUs necessarily ran across Philly's nodes (at most 8 GPUs each): its run time was
      measured over the network (``measured_on``), so a replay that also places it across nodes
      does not charge the network again. Up to 8 GPUs the placement is not recorded; the run
      time is taken as that of a well-wired set.
    * Jobs with a run time of 0 are dropped (counted in the notes); job ids are the row numbers
      of the file, submit times seconds after the first submission, the trace's timestamps read
      as UTC (whatever the machine's time zone).
    """
    root = traces_dir(directory) / "philly-pollux"
    rows = _read_csv(root / "philly.csv")
    vc_nodes = {r["vc"]: int(r["node num"]) for r in _read_csv(root / "philly_vc_nodes.csv")}
    stamped = sorted((_utc_seconds(r["timestamp"]), i, r) for i, r in enumerate(rows))
    if limit is not None:
        stamped = stamped[:limit]
    start = stamped[0][0] if stamped else 0.0
    jobs: list[TraceJob] = []
    dropped = 0
    rounded_up = 0
    for stamp, i, row in stamped:
        duration = float(row["duration"])
        gpus = int(row["num_gpus"])
        if duration <= 0 or gpus < 1:
            dropped += 1
            continue
        # As few replicas as nodes of 8 GPUs need, all of one size: 12 GPUs run as 2 x 6.
        replicas = -(-gpus // PHILLY_GPUS_PER_NODE)
        per = -(-gpus // replicas)
        rounded_up += replicas * per != gpus
        job_id = str(i)
        jobs.append(
            TraceJob(
                id=job_id,
                submit=stamp - start,
                duration=duration,
                replicas=replicas,
                gpus_per_replica=per,
                tenant=row["cluster"],
                priority=_philly_priority(job_id, seed),
                measured_on=Link.NETWORK if replicas > 1 else None,
            )
        )
    used = sorted({j.tenant for j in jobs} | set(vc_nodes))
    guarantees = _scaled({vc: vc_nodes.get(vc, 0) for vc in used}, cluster_gpus)
    tenants = tuple(Tenant(vc, guaranteed=guarantees[vc]) for vc in used)
    high = sum(1 for j in jobs if j.priority)
    notes = (
        f"Philly (Microsoft, 2017; Pollux's preparation): {len(jobs)} jobs"
        + (f" (first {limit} by submit time)" if limit is not None else "")
        + f", {dropped} dropped for a run time of 0",
        "tenants: the virtual clusters; guarantees: their published node counts scaled to the "
        f"cluster's {cluster_gpus} GPUs (no guarantee for "
        f"{sum(1 for vc in used if vc not in vc_nodes)} unlisted ones)",
        f"priorities synthesised: {high} jobs ({high / max(1, len(jobs)):.0%}) priority 1, drawn "
        f"per job id with seed {seed}; the rest 0",
        "jobs above 8 GPUs run as gangs of equal replicas of at most 8 GPUs"
        + (f" ({rounded_up} rounded up)" if rounded_up else ""),
        "run times are the trace's: measured across nodes for the jobs above 8 GPUs (which "
        "Philly's 8-GPU nodes had to spread), taken as the run time on a well-wired set for the "
        "rest (Philly recorded no placement)",
    )
    return Workload("philly", tuple(jobs), tenants, notes)


def _scaled(weights: dict[str, int], total: int) -> dict[str, int]:
    """Integer shares of ``total`` in proportion to ``weights`` (largest remainders)."""
    whole = sum(weights.values())
    if whole == 0:
        return dict.fromkeys(weights, 0)
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: int(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def trace_file(path: Path, *, cluster_gpus: int, limit: int | None = None) -> Workload:
    """A trace in the generic format (:mod:`gpusched.simulator.trace`); without TenantQuotas,
    each of its tenants is guaranteed an equal share of the cluster."""
    jobs = read_trace(path)
    if limit is not None:
        jobs = jobs[:limit]
    names = sorted({j.tenant for j in jobs})
    share = cluster_gpus // max(1, len(names))
    notes = (
        f"{path}: {len(jobs)} jobs; without --quotas each tenant is guaranteed an equal share "
        f"({share} GPUs)",
    )
    return Workload(path.stem, jobs, tuple(Tenant(n, guaranteed=share) for n in names), notes)


def openb_cluster(directory: Path | None = None) -> Cluster:
    """openb's GPU nodes: GPU count and model only (the trace has no wiring), so every node is
    count-only and meets only scope ``node``."""
    rows = _read_csv(traces_dir(directory) / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv")
    nodes = []
    for row in rows:
        gpus = int(row["gpu"])
        if gpus < 1:
            continue
        name, model = row["sn"], row["model"]
        topology = prepare(count_only_topology(name, gpus, model))
        nodes.append(SimNode(name, topology, model, f"count:{gpus}"))
    return Cluster("openb", tuple(nodes))


def _openb_jobs(
    directory: Path | None, pods: str, *, run_times: bool = False
) -> tuple[list[TraceJob], list[dict[str, str]], Counter[str]]:
    """The GPU pods of a pod list as jobs submitted at their creation. With ``run_times`` (a
    replay of the lifetimes) a pod runs from its ``scheduled_time`` to its deletion: the time
    it waited in the trace's own queue is not run time, and a pod deleted while still pending
    (no ``scheduled_time``) never ran, so it is left out (counted in the notes)."""
    path = traces_dir(directory) / "alibaba-gpu-v2023" / f"openb_pod_list_{pods}.csv"
    rows = _read_csv(path)
    counts: Counter[str] = Counter()
    jobs: list[TraceJob] = []
    kept: list[dict[str, str]] = []
    for row in rows:
        gpus = int(row["num_gpu"])
        if gpus < 1:
            counts["cpu-only pods left out"] += 1
            continue
        if gpus == 1 and int(row["gpu_milli"]) < FULL_GPU_MILLI:
            counts["fractional pods given a whole GPU"] += 1
        spec = [m for m in row.get("gpu_spec", "").split("|") if m]
        if len(spec) > 1:
            counts["pods allowed several models, run on any"] += 1
        if "creation_time" not in row:
            # The multigpu lists carry no times: only the FGD experiment (no departures) uses
            # them, in list order.
            created, duration = float(len(jobs)), math.inf
        else:
            created = float(row["creation_time"])
            duration = float(row["deletion_time"]) - created
            if run_times:
                if not row.get("scheduled_time"):
                    counts["pods deleted while pending (never ran) left out"] += 1
                    continue
                duration = float(row["deletion_time"]) - float(row["scheduled_time"])
        if duration <= 0:
            counts["pods without a positive lifetime left out"] += 1
            continue
        jobs.append(
            TraceJob(
                id=row["name"],
                submit=created,
                duration=duration,
                replicas=1,
                gpus_per_replica=gpus,
                tenant="openb",
                gpu_model=spec[0] if len(spec) == 1 else None,
                # Lifetimes of pods on one node of unrecorded wiring, replayed on count-only
                # nodes (every set reads as crossing sockets): no placement is slower or faster
                # than the one they were measured on.
                measured_on=Link.SOCKET if gpus > 1 else None,
            )
        )
        kept.append(row)
    return jobs, kept, counts


def openb(directory: Path | None = None, *, pods: str = "default") -> tuple[Workload, Cluster]:
    """openb's pods in creation order with their run times, on openb's GPU nodes.

    Pods are one-replica jobs of their GPU count, submitted at their creation, running from
    their ``scheduled_time`` to their deletion (the trace's own queueing is not run time); pods
    deleted while pending never ran and are left out. One tenant guaranteed the whole cluster.
    Fractional pods (``gpu_milli`` < 1000) are not shareable in gpusched: each holds a whole GPU.
    A ``gpu_spec`` naming one model pins the pod to it; several models mean any. CPU and memory
    are not modelled (gpusched schedules GPUs; kube-scheduler checks the rest).
    """
    cluster = openb_cluster(directory)
    jobs, _, counts = _openb_jobs(directory, pods, run_times=True)
    if any(math.isinf(j.duration) for j in jobs):
        raise AdapterError(
            f"openb pod list {pods!r} has no creation or deletion times: it serves only the FGD "
            "experiment (--demand)"
        )
    start = min((j.submit for j in jobs), default=0.0)
    shifted = tuple(
        sorted(
            (replace(j, submit=j.submit - start) for j in jobs),
            key=lambda j: (j.submit, j.id),
        )
    )
    notes = (
        f"openb (Alibaba, FGD ATC'23) pod list {pods!r}: {len(shifted)} GPU pods on "
        f"{len(cluster.nodes)} nodes ({cluster.gpus} GPUs)",
        *(f"{n} {what}" for what, n in sorted(counts.items())),
        "CPU and memory requests are not modelled; nodes are count-only (the trace has no wiring)",
    )
    return Workload(f"openb-{pods}", shifted, (Tenant("openb", guaranteed=cluster.gpus),), notes), (
        cluster
    )


def openb_inflated(
    directory: Path | None = None, *, pods: str = "default", demand: float = 1.3, seed: int = 42
) -> tuple[Workload, Cluster]:
    """The FGD allocation experiment: pods arrive one per second and never leave, in creation
    order (in a seeded random order for lists without times), then drawn at random
    (``random.Random(seed)``, with replacement) from the same list once it is used up, until the
    GPUs asked for reach ``demand`` x the cluster's GPUs.

    FGD counts demand in GPU fractions (``gpu_milli``); gpusched gives a fractional pod a whole
    GPU, so demand here is counted the way gpusched holds it (whole GPUs).
    """
    cluster = openb_cluster(directory)
    jobs, _, counts = _openb_jobs(directory, pods)
    jobs.sort(key=lambda j: (j.submit, j.id))
    if not jobs:
        raise AdapterError(f"openb pod list {pods!r} has no GPU pods")
    target = demand * cluster.gpus
    rnd = random.Random(seed)
    timeless = all(math.isinf(j.duration) for j in jobs)
    if timeless:
        # Lists without creation times (the multigpu variants) have no arrival order: shuffle.
        rnd.shuffle(jobs)
    out: list[TraceJob] = []
    asked = 0
    while asked < target:
        source = jobs[len(out)] if len(out) < len(jobs) else rnd.choice(jobs)
        out.append(
            replace(
                source,
                id=f"{source.id}#{len(out)}",
                submit=float(len(out)),
                duration=float("inf"),
            )
        )
        asked += source.gpus
    notes = (
        f"FGD experiment on openb pod list {pods!r}: {len(out)} pods arrive one per second and "
        f"never leave until {demand:.0%} of the cluster's {cluster.gpus} GPUs were asked for "
        f"(creation order, then drawn with seed {seed})",
        *(f"{n} {what} (in the source list)" for what, n in sorted(counts.items())),
        "demand counted in whole GPUs: gpusched does not share a GPU between pods",
    )
    workload = Workload(
        f"openb-{pods}-fgd", tuple(out), (Tenant("openb", guaranteed=cluster.gpus),), notes
    )
    return workload, cluster
