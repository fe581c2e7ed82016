"""What one admission cycle reads (a snapshot) and what it returns (decisions).

Everything here is plain, immutable data: the operator builds a :class:`Snapshot` from the API
server, ``gpusched explain`` and the benchmarks build the same thing, and :func:`run_cycle`
turns it into a :class:`CycleResult`. Times are seconds since the epoch (floats) so the core
never reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final, Literal

from gpusched.api.gpujob import TopologyScope
from gpusched.api.tenantquota import ReclaimPolicy, WithinTenantPreemption
from gpusched.core.placement import Policy
from gpusched.core.prepared import PreparedNode

#: Taint effects that keep new pods off a node (PreferNoSchedule does not).
BLOCKING_TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


class JobState(StrEnum):
    """Where a job stands for the admission cycle."""

    QUEUED = "Queued"
    """Waiting for admission (new, requeued after preemption or a gang timeout)."""
    ADMITTED = "Admitted"
    """Holds its planned GPUs: pods being created, pending, running, or waiting for the victims
    of its preemption to leave. Counts against its tenant's quota."""
    TERMINATING = "Terminating"
    """Preempted or released; its pods are still on their GPUs (grace period). Holds the GPUs
    physically, not against quota; ``reserved_for`` names the job they are kept for."""


class WaitReason(StrEnum):
    """Why a queued job was not admitted in this cycle (machine reasons, CamelCase)."""

    NO_TENANT = "NoTenant"
    """The job's namespace is not owned by any TenantQuota."""
    REQUEUE_BACKOFF = "RequeueBackoff"
    """The job was released after a gang timeout and waits out its backoff."""
    QUOTA_EXCEEDED = "QuotaExceeded"
    """Admitting it would take the tenant (or a parent) above its borrowing limit; also for a
    job larger than that limit, which can never start under it (its message says so)."""
    GUARANTEE_EXCEEDED = "GuaranteeExceeded"
    """A non-preemptible job runs only within its tenant's guarantee, which is in use."""
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    """Not enough free GPUs, and nothing may be preempted for it."""
    TOPOLOGY_UNSATISFIABLE = "TopologyUnsatisfiable"
    """Enough free GPUs, but no set of them meets the job's required topology."""
    DOMAIN_DEGRADED = "DomainDegraded"
    """The only domains of the required level that would hold the gang have nodes or GPUs
    down (an NVLink clique with trays down): it waits for them rather than be half-bound."""
    NO_FEASIBLE_NODES = "NoFeasibleNodes"
    """No node could host it even if the cluster were empty (model, size, selector, taints)."""
    USER_CAP_EXCEEDED = "UserCapExceeded"
    """Admitting it would take its submitter above the GPUs or jobs its tenant allows one user
    (a job larger than the GPU cap can never start under it; its message says so)."""
    HELD_FOR_LENDERS = "HeldForLenders"
    """It would borrow, and the idle GPUs are kept for tenants that asked for GPUs within
    their guarantee moments ago (``CycleConfig.lending_hold_seconds``): lent again when they
    use them or stay quiet."""
    BUDGET_EXHAUSTED = "BudgetExhausted"
    """The tenant has spent its budget's hard cap for the period: no new job starts before the
    next period (running jobs go on)."""


class AdmitReason(StrEnum):
    """On what capacity a job was admitted."""

    WITHIN_GUARANTEE = "WithinGuarantee"
    """Inside the tenant's guaranteed GPUs."""
    BORROWING = "Borrowing"
    """On idle GPUs lent by other tenants (may be reclaimed)."""


class PreemptReason(StrEnum):
    """Why a running job was chosen as a victim."""

    HIGHER_PRIORITY = "HigherPriority"
    """A higher-priority job of the same tenant needed the GPUs."""
    RECLAIM_GUARANTEE = "ReclaimGuarantee"
    """Another tenant took back guaranteed GPUs this job had borrowed."""
    BACKFILL_OVERRUN = "BackfillOverrun"
    """The job was started on GPUs reserved for another job, expected to end before that job's
    reservation starts, and ran past it."""


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint (only its effect on new pods matters here)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration, matched the way the kube-scheduler matches it."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration covers ``taint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


def tolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> bool:
    """Whether every scheduling-blocking taint is covered by some toleration."""
    return all(
        any(t.tolerates(taint) for t in tolerations)
        for taint in taints
        if taint.effect in BLOCKING_TAINT_EFFECTS
    )


@dataclass(frozen=True, slots=True)
class Node:
    """A schedulable GPU node as the cycle sees it.

    ``busy`` lists GPU indices held by pods that belong to no GpuJob (e.g. pods bound by the
    extender directly); ``busy_count`` counts further GPUs held by pods whose indices are not
    known (no extender annotation): the cycle marks that many of the lowest free GPUs busy.
    """

    name: str
    topology: PreparedNode
    model: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    busy: frozenset[int] = frozenset()
    busy_count: int = 0
    count_only: bool = False
    """No NodeGpuTopology: only the GPU count is known, so only scope ``node`` can be met."""
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True, slots=True)
class Assignment:
    """GPUs one replica holds (or is planned to hold) on one node.

    ``gpus`` are GPU indices; empty when not known (count-only nodes), then ``count`` GPUs are
    accounted without identity.
    """

    node: str
    gpus: tuple[int, ...] = ()
    count: int = 0

    @property
    def size(self) -> int:
        """GPUs held."""
        return len(self.gpus) if self.gpus else self.count


@dataclass(frozen=True, slots=True)
class AcrossReplicas:
    """Placement of a gang's replicas relative to each other (a node-label domain), and of its
    segments: consecutive runs of ``segment_replicas`` replicas, each inside one domain of
    ``segment_label``, always (``segment_required``) or when some placement allows it."""

    node_label: str
    required: bool
    segment_replicas: int | None = None
    segment_label: str | None = None
    segment_required: bool = True

    @property
    def segments_preferred(self) -> bool:
        """Segments to keep when possible: the gang may also go unsegmented."""
        return self.segment_label is not None and not self.segment_required

    def with_segments_required(self) -> AcrossReplicas:
        """The same gang with its segments a constraint."""
        return replace(self, segment_required=True)

    def without_segments(self) -> AcrossReplicas:
        """The same gang with no segments."""
        return replace(self, segment_replicas=None, segment_label=None, segment_required=True)


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the cluster's network."""

    node_label: str
    """Node label whose value names the domain (e.g. ``nvidia.com/gpu.clique``)."""
    name: str = ""
    """What people call it (``clique``, ``rack``); the label when empty."""
    whole_domains: bool = False
    """A gang placed in one domain of this level uses only domains whose every node and GPU is
    up: an NVLink clique with trays down is not a clique (its gangs would be half-bound or lose
    the links of the missing trays). Other jobs still use the healthy part."""

    @property
    def title(self) -> str:
        return self.name or self.node_label


@dataclass(frozen=True, slots=True)
class Job:
    """A GpuJob reduced to what admission needs."""

    key: str
    """``namespace/name``."""
    tenant: str | None
    replicas: int
    gpus_per_replica: int
    policy: Policy = field(default_factory=Policy)
    gpu_model: str | None = None
    across: AcrossReplicas | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    preemptible: bool = True
    min_runtime_seconds: float = 0.0
    """Seconds after its start during which it is no victim."""
    reclaim_min_runtime_seconds: float | None = None
    """The same against a tenant reclaiming its guarantee (the job runs on borrowed GPUs);
    None: ``min_runtime_seconds``."""
    submitted_at: float = 0.0
    """First submission; FIFO order and the tie-break of every ordering."""
    state: JobState = JobState.QUEUED
    placement: tuple[Assignment, ...] = ()
    """ADMITTED/TERMINATING: the GPUs the job holds."""
    started_at: float | None = None
    """When all replicas of the current admission were last seen running."""
    last_checkpoint_at: float | None = None
    """Latest checkpoint the job reported; work before it is not lost on preemption."""
    not_before: float | None = None
    """QUEUED after a gang timeout: not admitted again before this time."""
    reserved_for: str | None = None
    """TERMINATING victims: key of the preemptor their GPUs are kept for."""
    expected_runtime: float | None = None
    """Predicted run time in seconds (:mod:`gpusched.core.runtime`, capped by
    ``max_runtime_seconds``); None: nothing is known."""
    expected_end: float | None = None
    """ADMITTED: when the job is expected to end (None: never, as far as anyone knows)."""
    max_runtime_seconds: float | None = None
    """Declared and enforced run-time limit (the job fails at it)."""
    backfill_until: float | None = None
    """ADMITTED on GPUs reserved for another job: the reservation's start it was expected to
    end by. Past it the job may be evicted for that reservation (``BackfillOverrun``)."""
    reservation: tuple[Assignment, ...] = ()
    """QUEUED: the GPUs the previous cycle reserved for the job (kept when still as early)."""
    reservation_start: float | None = None
    """QUEUED: the start the previous cycle expected for that reservation."""
    submitter: str = ""
    """Who created the job, as the API server authenticated them (the chart's admission policy
    records it); empty: not recorded. Per-user caps count a tenant's unrecorded jobs as one
    user's."""
    preemptions: int = 0
    """How many times the job was preempted (``status.preemptionCount``): a job preempted
    before is protected longer against priority preemption (no thrash)."""
    request_memo: object = field(default=None, init=False, repr=False, compare=False)
    """The cycle's request of this job, built on first use: a snapshot reuses its job objects
    from cycle to cycle, so the request is computed once per job, not once per cycle."""
    order_memo: tuple[int, float, str] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """:attr:`order`, built on first use (every cycle sorts and merges by it)."""

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole gang."""
        return self.replicas * self.gpus_per_replica

    @property
    def order(self) -> tuple[int, float, str]:
        """Queue order inside a tenant: priority first, then FIFO, then name."""
        found = self.order_memo
        if found is None:
            found = (-self.priority, self.submitted_at, self.key)
            object.__setattr__(self, "order_memo", found)
        return found

    @property
    def namespace(self) -> str:
        """Namespace part of the key."""
        return self.key.partition("/")[0]


@dataclass(frozen=True, slots=True)
class Tenant:
    """A TenantQuota reduced to what admission needs."""

    name: str
    guaranteed: int = 0
    guaranteed_by_model: Mapping[str, int] = field(default_factory=dict)
    borrowing_limit: int | None = None
    """Most GPUs held at once (guarantee included); None: no limit."""
    weight: float = 1.0
    within_tenant: WithinTenantPreemption = WithinTenantPreemption.LOWER_PRIORITY
    reclaim: ReclaimPolicy = ReclaimPolicy.ANY
    user_max_gpus: int | None = None
    """Most GPUs one submitter's admitted jobs may hold at once (None: no cap)."""
    user_max_jobs: int | None = None
    """Most admitted jobs one submitter may have at once (None: no cap)."""
    budget_exhausted_until: float | None = None
    """The tenant spent its budget's hard cap: no new admission before this time (the end of
    the budget period). None: within budget."""
    parent: str | None = None
    """The tenant this one is part of (:mod:`gpusched.core.admission.tree`); None: a root."""
    recent_borrowed: float = 0.0
    """Borrowed GPUs in the recent past (an average decayed with the cluster's usage half-life;
    0 when fair share has no memory): added to what a tenant borrows now when ranking
    borrowers, so a tenant that borrowed much lately lends way to one that did not."""

    @property
    def caps_users(self) -> bool:
        """Whether any one submitter's usage is capped."""
        return self.user_max_gpus is not None or self.user_max_jobs is not None

    def budget_exhausted(self, now: float) -> bool:
        """Whether new jobs wait for the next budget period."""
        until = self.budget_exhausted_until
        return until is not None and until > now


GuaranteeRounding = Literal["down", "up"]
"""How guarantees are honoured in whole jobs (:attr:`CycleConfig.guarantee_rounding`)."""


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """Knobs of the cycle (bounds on work, not policy)."""

    max_preemption_searches: int = 32
    """Victim searches per cycle; further blocked jobs wait for the next cycle."""
    decisions_only: bool = False
    """Return the admissions only: no waiting records, no tenant usage. Decisions are the same;
    a replay that asks thousands of cycles over long queues only needs what starts."""
    reservations_per_tenant: int = 0
    """Blocked jobs per tenant that get a reservation: the first in the tenant's queue order
    that only GPUs stand in the way of (0: no reservations, no backfill rule). Off by default:
    on the Philly replay reservations with predicted run times lengthen large jobs' waits
    (docs/benchmarks.md); 1 is the setting they are built and tested for."""
    max_reservations: int = 64
    """Reservations in the whole cluster at once (bounds the GPUs held idle and the cycle's
    work on clusters with many tenants)."""
    restart_penalty_seconds: float = 300.0
    """What restarting an evicted job costs besides its lost work, per GPU (rescheduling,
    image pulls, loading its checkpoint): part of every victim's cost, so evicting more GPUs
    than needed costs more even when they lost little work."""
    reserve_beyond_entitlement: bool = False
    """Also reserve for jobs that would take their tenant past its entitlement (guarantee plus
    weighted share of what others leave idle). Off: a tenant borrowing beyond its fair share
    gets idle GPUs, never GPUs held idle for it."""
    guarantee_rounding: GuaranteeRounding = "down"
    """How a tenant's guarantee is honoured in whole jobs (tenants without guarantees by GPU
    model; a parent's is always rounded down). "down": the jobs that fit inside it, in queue
    order; a job larger than what is left of it borrows and waits its turn (a tenant
    guaranteed 26 GPUs whose jobs ask 8 each claims 24). "up": the guarantee is rounded up to
    the next whole job: when the jobs that fit leave some of it unclaimed, the first preemptible
    job that did not fit claims the rest too (goes ahead of borrowers and may reclaim its GPUs
    from them; a job that fits is never displaced by it), and a lender keeps the fewest of its
    jobs that cover its guarantee (four jobs of 8 against 26). A tenant then holds less than
    one job beyond its guarantee through a claim; a lender still never drops below it."""
    lending_hold_seconds: float = 900.0
    """A tenant that asked for GPUs within the last this many seconds keeps that many idle
    GPUs of its unused guarantee from borrowers (at most its unused guarantee; jobs submitted
    in the window and still queued or running count, requeued ones by their first
    submission). Tenants submit in bursts: a GPU lent the moment it came free is reclaimed
    seconds later by the lender's next job, a preemption of a job that had barely started.
    Held back, the lender's next jobs take the idle GPUs without evicting anyone; once it has
    been quiet this long, or uses its guarantee, its GPUs are lent again. 0: lend at once."""
    reclaim_patience_seconds: float = 0.0
    """How long after its submission a job inside its tenant's guarantee weighs a reclaim:
    while the GPUs it lacks are expected to free within that time (on the running jobs'
    predicted ends), a set of borrowed jobs whose lost work plus restarts costs more than the
    job's GPUs times that wait is not evicted; the job waits for GPUs to free, which a tenant
    below its guarantee gets first. GPUs not expected to free in time are reclaimed at once
    (waiting would only let the borrowers lose more), and past the patience whatever it costs,
    so this bounds how long a tenant waits below its guarantee. A one-GPU job would otherwise
    evict a borrower's 8-GPU job that has run for days, when a GPU frees in minutes anyway.
    0: reclaim at once, whatever it costs."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one cycle decides over. Order of the tuples does not matter."""

    now: float
    tenants: tuple[Tenant, ...] = ()
    jobs: tuple[Job, ...] = ()
    nodes: tuple[Node, ...] = ()
    config: CycleConfig = field(default_factory=CycleConfig)
    levels: tuple[Level, ...] = ()
    """The cluster's network levels, narrowest first (:mod:`gpusched.core.admission.domains`)."""
    down_labels: tuple[Mapping[str, str], ...] = ()
    """Labels of GPU nodes out of service (not Ready or cordoned): the domains they belong to
    are not whole."""
    arrivals: tuple[Job, ...] = ()
    """Jobs expected to be submitted later (:mod:`gpusched.core.admission.arrivals`): the
    forecast of expected starts plays them forward; the cycle's decisions never read them."""


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """Where one replica of an admitted job goes."""

    replica: int
    node: str
    gpus: tuple[int, ...]
    """GPU indices; on count-only nodes, nominal slots (not device indices)."""
    topology_class: TopologyScope
    score: float
    count_only: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running job evicted to make room for an admitted one."""

    victim: str
    victim_tenant: str | None
    preemptor: str
    reason: PreemptReason
    message: str
    gpus: int
    gpu_seconds_lost: float
    """GPU-seconds of work since the victim's start or last checkpoint."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A job admitted in this cycle, with its planned GPUs and the jobs evicted for it."""

    job: str
    tenant: str
    reason: AdmitReason
    message: str
    placement: tuple[ReplicaPlan, ...]
    victims: tuple[Preemption, ...] = ()
    backfill_until: float | None = None
    """Started on GPUs reserved for another job: the reservation's start it is expected to end
    by (see :attr:`Job.backfill_until`)."""
    expected_end: float | None = None
    """When it is expected to end, counted from now (None: nothing is known)."""

    @property
    def needs_preemption(self) -> bool:
        """Whether the job must wait for victims to release its GPUs."""
        return bool(self.victims)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued job left waiting, and why."""

    job: str
    tenant: str | None
    reason: WaitReason
    message: str
    queue_position: int | None = None
    """1-based position among the tenant's queued jobs (priority, then FIFO)."""
    expected_start: float | None = None
    """When the job is expected to start: its reservation's start, or a forecast's (None:
    not worked out in this cycle, or never as far as the cluster knows)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs held for a blocked job from when they come free (docs/quotas.md, "Reservations").

    Jobs after it in the admission order may use the GPUs only if they are expected to end
    before :attr:`start`; a preemptible one that runs past it is evicted for the job."""

    job: str
    tenant: str
    start: float
    """When the last GPU of the placement is expected to be free: the job's expected start."""
    end: float
    """``start`` plus the job's expected run time (infinity: not known)."""
    placement: tuple[ReplicaPlan, ...]
    idle_gpus: int
    """GPUs of the placement free now and held idle for the job: the price of the reservation."""
    kept: bool = False
    """The same GPUs as the job's reservation of the previous cycle."""


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """A tenant's standing after the cycle's decisions."""

    name: str
    guaranteed: int
    borrowing_limit: int | None
    weight: float
    used: int
    """GPUs held by ADMITTED jobs."""
    borrowed: int
    """Part of ``used`` not covered by the guarantee."""
    used_by_model: Mapping[str, int]
    """``used`` by node GPU model (``unknown`` when a node has none)."""
    fair_share: float
    """Guarantee plus weighted share of idle GPUs, capped by demand and limit."""
    pending: int
    """Jobs still queued."""
    running: int
    """Admitted jobs whose pods all run (``started_at`` set)."""
    demand: int
    """GPUs held plus GPUs of feasible queued jobs."""
    admitted: int = 0
    """Jobs holding GPUs (ADMITTED): pods being created, starting or running."""
    users: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Submitter -> (GPUs, jobs) of its ADMITTED jobs ("": no recorded submitter)."""
    lending_hold: int = 0
    """Idle GPUs of its unused guarantee kept from borrowers because it asked for GPUs
    moments ago (``CycleConfig.lending_hold_seconds``): the price of the hold."""


@dataclass(frozen=True)
class CycleResult:
    """Decisions of one cycle."""

    admissions: tuple[Admission, ...]
    waiting: tuple[Waiting, ...]
    tenants: tuple[TenantUsage, ...]
    preemption_searches: int = 0
    wait_reasons: Mapping[str, WaitReason] = field(default_factory=dict)
    """The reason of every job that waits, also in ``decisions_only`` cycles (codes only: the
    simulator records why a job waited without the cost of the waiting records)."""
    reservations: tuple[Reservation, ...] = ()
    """Reservations held after the cycle, in the order they were made."""
    largest_free: tuple[tuple[str, int], ...] = ()
    """(level, GPUs): after the cycle's admissions, the most free GPUs in one domain of each
    network level (whole domains only where the level asks), and on one node (``node``): the
    largest gang each level can still take. Empty in ``decisions_only`` cycles."""
    wake_at: float | None = None
    """When a job that waits may start without anything else changing: the first hold a job
    waited for (``HeldForLenders``) lapses, the first job that turned a reclaim down for its
    cost runs out of patience (``CycleConfig.reclaim_patience_seconds``), a job kept from the
    victims of a waiting job that found none stops being kept out (its protection ends:
    minimum runtime, longer after an earlier preemption, shorter on borrowed GPUs against a
    reclaim; or it passes the start it was backfilled up to), or a spent budget's period ends
    for a job waiting on it; the caller decides again by that time."""

    @property
    def preemptions(self) -> tuple[Preemption, ...]:
        """Every victim of the cycle."""
        return tuple(v for a in self.admissions for v in a.victims)

    def admission_of(self, key: str) -> Admission | None:
        """The admission of a job in this cycle, if any."""
        for admission in self.admissions:
            if admission.job == key:
                return admission
        return None

    def waiting_of(self, key: str) -> Waiting | None:
        """Why a job waits, if it does."""
        for waiting in self.waiting:
            if waiting.job == key:
                return waiting
        return None
