"""What a scheduling policy is to the replay: told of arrivals and completions, asked what to
start (and whom to preempt) after each batch of events at one instant."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpusched.simulator.model import Cluster, JobSpec, Link


@dataclass(frozen=True, slots=True)
class Placed:
    """GPUs one replica of a job gets on one node (GPU indices, as a device plugin hands out)."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Start:
    """Replicas of one job placed now. A gang policy places all of them at once; per-pod
    policies may place some now and the rest later: the job runs once all are placed, and the
    early ones hold their GPUs meanwhile."""

    job: str
    replicas: tuple[Placed, ...]


@dataclass(frozen=True, slots=True)
class Decisions:
    """What a policy decided at one instant: victims leave first, then the starts land."""

    starts: tuple[Start, ...] = ()
    preempted: tuple[str, ...] = ()
    estimates: tuple[tuple[str, float], ...] = ()
    """Expected starts the policy tells waiting jobs now (job, time); the replay keeps each
    job's first, to compare with when it started."""
    wake_at: float | None = None
    """Decide again at this time even if nothing arrives or ends (a reservation's start, a
    backoff's end)."""


class SimPolicy(Protocol):
    """A scheduler under test. Policies keep their own view of the cluster; the replay keeps
    the ground truth and refuses any decision that would hand out a GPU twice."""

    name: str
    assumptions: tuple[str, ...]

    def submit(self, job: JobSpec, now: float) -> None:
        """A job arrived: what it asks for, never how long it will run."""

    def finished(self, job: str, now: float) -> None:
        """A running job completed and released its GPUs."""

    def schedule(self, now: float) -> Decisions:
        """Decide after all events of ``now`` were told."""

    def reason(self, job: str) -> str | None:
        """Why a job that has not started is waiting (for jobs never started)."""

    def last_wait(self, job: str) -> str | None:
        """Why the job waited in the last decision it waited in; asked when it starts after
        waiting (the reason at the end of that wait). Cheap: asked for every such start."""


@runtime_checkable
class KnowsReplay(Protocol):
    """A policy that must know how the replay runs jobs (an oracle of run times): the replay
    hands it its own cluster (with the network levels) and job-speed model before the first
    event, so the policy's view cannot differ from what the replay charges."""

    def replay_started(
        self,
        cluster: Cluster,
        speed: Callable[[Link, int], float] | None,
        run_times: Mapping[str, float],
    ) -> None:
        """The replay runs on ``cluster`` and slows jobs down by ``speed`` (None: not at all);
        ``run_times`` are the trace's durations by job id, which only an oracle is handed (every
        policy is told jobs as :class:`JobSpec`, without them)."""
