"""Why a job is where it is: the admission cycle's own answer, with the evidence behind it.

``gpusched explain`` runs exactly the cycle the operator runs over the same snapshot, then looks
at the job in the state the cycle left: its decision and reason, its tenant's standing, whether it
may preempt and whom, and what every node would say to one of its replicas right now. A waiting
job also gets its expected start (its reservation's, or the forecast's), and one change to it
that would start it markedly sooner, when there is one (:func:`counterfactual`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpusched.api.gpujob import TopologyScope
from gpusched.core.admission.cycle import Cycle
from gpusched.core.admission.model import CycleResult, Job, JobState, Node, Snapshot, WaitReason
from gpusched.core.admission.pool import Request
from gpusched.core.admission.preemption import by_cost, protected_until
from gpusched.core.placement import SCOPES, Placement, RefusalReason, place

#: Nodes listed in detail (the rest are counted by reason).
DETAIL_NODES = 5
#: The preemption line of a job whose tenant (or one above it) spent its budget's hard cap.
SPENT_PREEMPTS = (
    "its tenant spent its budget's hard cap: none of its jobs claims a guarantee or evicts "
    "anyone before the next period"
)
#: The preemption line of a job that could never start as asked.
NEVER_PREEMPTS = (
    "it can never start as asked (its reason says what to change): it claims no guarantee "
    "and evicting jobs would not start it"
)


@dataclass
class NodeVerdict:
    """What one node says to one replica of the job now."""

    node: str
    ok: bool
    reason: str
    """``Fits`` or a machine reason (``NotEnoughFreeGpus``, ``ModelMismatch``, ...)."""
    detail: str
    free_gpus: int


@dataclass
class Explanation:
    """Everything ``gpusched explain`` prints."""

    job: str
    found: bool
    tenant: str | None = None
    state: str = ""
    decision: str = ""
    """``admitted``, ``waiting``, ``running`` (holds GPUs) or ``terminating``."""
    reason: str = ""
    message: str = ""
    queue_position: int | None = None
    queue_length: int = 0
    priority: int = 0
    tenant_summary: dict[str, Any] = field(default_factory=dict)
    claims_guarantee: bool = False
    """Inside the tenant's guarantee given all its demand: may reclaim lent GPUs."""
    borrowed: bool = False
    """For a job holding GPUs: it runs on capacity borrowed from other tenants."""
    placement: list[dict[str, Any]] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    preemption: list[str] = field(default_factory=list)
    """Sentences on who this job may preempt (waiting) or who may preempt it (holding GPUs)."""
    nodes: list[NodeVerdict] = field(default_factory=list)
    node_summary: dict[str, int] = field(default_factory=dict)
    expected_start: float | None = None
    """Waiting: when it is expected to start (epoch seconds; None: nobody can say)."""
    reservation: dict[str, Any] | None = None
    """Waiting with GPUs reserved: start, nodes and GPUs, idle GPUs."""
    forecast_at: float | None = None
    """When the expected start was worked out (epoch seconds; None: no forecast covers the
    job yet)."""
    played_because: str | None = None
    """Set when the expected start was played forward for this job alone, on the snapshot of
    the cycle explained, because the operator's last forecast gave it none for its current
    wait: why it did not (the job queued since, or beyond the jobs it covers)."""
    unforecast: str | None = None
    """Set in the operator's quick answer when its last forecast gave the waiting job no start
    for its current wait and none was played yet: why. The start played forward for the job
    alone comes with the answer on the change that would start it sooner (seconds at scale)."""
    counterfactual: str | None = None
    """One change to the job that would start it markedly sooner, and how much sooner."""
    never_starts: bool = False
    """Waiting: it could never start as asked, as the cluster and its tenant's limits stand
    (no node holds it even idle, larger than a borrowing limit or a per-user GPU cap): no
    GPUs freeing up and no preemption would start it, only the change its reason names."""
    now: float = 0.0
    """When the cycle explained decided (epoch seconds)."""

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["nodes"] = [n.__dict__ for n in self.nodes[:DETAIL_NODES]]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        """An explanation :meth:`to_dict` gave (sent over HTTP by the operator); keys it does
        not know are left out, so an older CLI reads a newer operator's answer."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["nodes"] = [NodeVerdict(**n) for n in values.get("nodes", [])]
        return cls(**values)


def explain(snapshot: Snapshot, key: str) -> Explanation:
    """Run the cycle over ``snapshot`` and explain job ``key``; a waiting job gets its expected
    start (played forward until it is decided) and the change that would start it sooner."""
    cycle = Cycle(snapshot)
    out = describe(cycle, cycle.run(), key, play=True)
    job = cycle.jobs.get(key)
    if job is not None:
        out.counterfactual = sooner(snapshot, job, out)
    return out


def describe(
    cycle: Cycle,
    result: CycleResult,
    key: str,
    forecast_at: float | None = None,
    *,
    play: bool = False,
) -> Explanation:
    """Job ``key`` in the state ``cycle`` left after deciding ``result``, reading nothing the
    cycle did not work out: a waiting job's expected start is the one ``result`` carries (its
    reservation's, or that of the last forecast, made at ``forecast_at``). The operator
    answers ``explain`` this way from its last cycle, in milliseconds, where deciding again
    takes a cycle and playing the queue forward seconds; :func:`sooner` is asked for
    separately. With ``play`` the expected start is played forward now, until the job is
    decided (which uses the cycle's one forecast up: only for a cycle run for this answer)."""
    snapshot = cycle.snapshot
    job = cycle.jobs.get(key)
    if job is None:
        return Explanation(key, found=False, message="the job is not part of the snapshot")
    out = Explanation(key, found=True, tenant=job.tenant, state=job.state.value)
    out.priority = job.priority
    out.now = snapshot.now
    tenant = cycle.tenants.get(job.tenant or "")
    if tenant is not None:
        ledger = cycle.ledgers[tenant.name]
        usage = next((u for u in result.tenants if u.name == tenant.name), None)
        out.tenant_summary = {
            "name": tenant.name,
            "guaranteed": tenant.guaranteed,
            "guaranteed_by_model": dict(tenant.guaranteed_by_model),
            "borrowing_limit": tenant.borrowing_limit,
            "weight": tenant.weight,
            "used": ledger.used,
            "borrowed": ledger.borrowed(),
            "fair_share": usage.fair_share if usage else 0.0,
            "demand": cycle.demand.get(tenant.name, 0),
            "within_tenant": tenant.within_tenant.value,
            "reclaim": tenant.reclaim.value,
        }
        out.claims_guarantee = tenant.name in cycle.tenants and key in cycle.claims[tenant.name]
        out.queue_length = len(cycle.queued.get(tenant.name, []))
    admission = result.admission_of(key)
    waiting = result.waiting_of(key)
    request = Request.of(job)
    if admission is not None:
        out.decision = "admitted"
        out.reason = admission.reason.value
        out.message = admission.message
        out.placement = [
            {
                "replica": p.replica,
                "node": p.node,
                "gpus": list(p.gpus),
                "topology_class": p.topology_class.value,
                "score": p.score,
            }
            for p in admission.placement
        ]
        out.victims = [f"{v.victim} ({v.reason.value}): {v.message}" for v in admission.victims]
        return out
    if waiting is not None:
        out.decision = "waiting"
        out.reason = waiting.reason.value
        out.message = waiting.message
        out.queue_position = waiting.queue_position
        if tenant is not None:
            out.never_starts = cycle.never_starts(job)
            # Who it might evict, or whether it claims a guarantee, says nothing about a job no
            # eviction would start (and the cycle counts no guarantee claim for it).
            if out.never_starts:
                out.preemption = [NEVER_PREEMPTS]
            elif waiting.reason is WaitReason.BUDGET_EXHAUSTED:
                out.preemption = [SPENT_PREEMPTS]
            else:
                out.preemption = _may_preempt(cycle, key)
        out.nodes, out.node_summary = _nodes(cycle, request)
        if play:
            out.expected_start = cycle.forecast(until=key).get(key)
            out.forecast_at = snapshot.now
        else:
            # The last forecast's answer, never before now: the status shows it so (a start
            # that has passed without the job starting is now at the earliest).
            told = waiting.expected_start
            out.expected_start = max(told, snapshot.now) if told is not None else None
            out.forecast_at = forecast_at
        reservation = next((r for r in result.reservations if r.job == key), None)
        if reservation is not None:
            out.forecast_at = snapshot.now
            out.reservation = {
                "start": reservation.start,
                "placement": [
                    {"node": p.node, "gpus": list(p.gpus)} for p in reservation.placement
                ],
                "idle_gpus": reservation.idle_gpus,
            }
        return out
    if job.state is JobState.ADMITTED:
        out.decision = "running"
        out.placement = [
            {"replica": i, "node": a.node, "gpus": list(a.gpus) or a.size}
            for i, a in enumerate(job.placement)
        ]
        if tenant is not None:
            out.borrowed = key in cycle.borrowed_jobs(tenant.name)
            out.reason = "Borrowing" if out.borrowed else "WithinGuarantee"
        out.preemption = _may_be_preempted(cycle, key)
        return out
    out.decision = "terminating"
    out.message = (
        f"its pods are leaving their GPUs; they are kept for {job.reserved_for}"
        if job.reserved_for
        else "its pods are leaving their GPUs"
    )
    return out


def _may_preempt(cycle: Cycle, key: str) -> list[str]:
    job = cycle.jobs[key]
    assert job.tenant is not None
    tenant = cycle.tenants[job.tenant]
    lines = []
    candidates, _, _ = cycle.candidates(job, tenant, Request.of(job))
    if tenant.within_tenant.value == "Never":
        lines.append(f"tenant {tenant.name} does not preempt its own jobs (withinTenant: Never)")
    if key in cycle.claims[tenant.name]:
        rounded = cycle.snapshot.config.guarantee_rounding == "up" and not cycle.ledgers[
            tenant.name
        ].fits_within(job)
        lines.append(
            (
                "claims the rest of the tenant's guarantee, rounded up to this job "
                "(guarantee rounding: up)"
                if rounded
                else "inside the tenant's guarantee"
            )
            + ": may reclaim GPUs lent to other tenants"
            + (" (reclaimBorrowed: Never)" if tenant.reclaim.value == "Never" else "")
        )
    else:
        lines.append(
            "beyond the tenant's guarantee (given its higher-priority and older jobs): may not "
            "reclaim lent GPUs"
        )
    if key in cycle.claims[tenant.name] and cycle.weighs_reclaim(job):
        left = cycle.patience_left(job)
        budget = cycle.gain(job, Request.of(job), candidates)
        wait = budget / job.total_gpus
        if budget == float("inf"):
            verdict = "no running job's end is known, so any such eviction is worth it"
        elif wait < left:
            verdict = f"{wait / 3600:.1f} h expected, so at most {budget / 3600:.1f} GPU-hours now"
        else:
            verdict = f"{wait / 3600:.1f} h expected, so reclaims now"
        lines.append(
            f"for another {left:.0f}s (reclaim patience) it reclaims lent GPUs only if the "
            "work the borrowers lose (plus a restart each) is less than its GPUs times the wait "
            f"it would have without them, or if they are not expected to free by then: {verdict}"
        )
    own = [c for c in candidates if c.reason.value == "HigherPriority"]
    if own:
        budget = cycle.gain(job, Request.of(job), candidates)
        lines.append(
            "may evict its own tenant's lower-priority jobs only if the work they lose (plus a "
            "restart each) is less than its GPUs times the wait it would have without them: "
            + (
                "no running job's end is known, so any such eviction is worth it"
                if budget == float("inf")
                else f"at most {budget / 3600:.1f} GPU-hours now"
            )
        )
    if candidates:
        names = ", ".join(f"{c.job.key} ({c.reason.value})" for c in by_cost(candidates)[:5])
        more = f" and {len(candidates) - 5} more" if len(candidates) > 5 else ""
        searched_out = cycle.searches >= cycle.snapshot.config.max_preemption_searches
        lines.append(
            f"{len(candidates)} preemptible job(s) qualify, cheapest first: {names}{more}; "
            + (
                "but this cycle's victim searches went to jobs ahead of it"
                if searched_out
                else "no set of them makes the gang placeable within the tenant's quota, "
                "leaves every lending tenant its guarantee and is worth its cost"
            )
        )
    else:
        lines.append("no running job qualifies as a victim now")
    # Only jobs this one could ever evict, each by the protection that holds against it: its
    # own tenant's lower priorities by their minimum runtime (longer after earlier
    # preemptions); other tenants' jobs, when it claims its guarantee, by the shorter one a
    # reclaim heeds.
    reclaims = key in cycle.claims[tenant.name] and tenant.reclaim.value != "Never"
    evicts_own = tenant.within_tenant.value != "Never"
    protected: list[tuple[float, str]] = []
    for jobs in cycle.admitted.values():
        for j in jobs.values():
            if not j.preemptible or j.started_at is None:
                continue
            same = j.tenant == tenant.name
            if same and not (evicts_own and j.priority < job.priority):
                continue
            if not same and not (reclaims and cycle.ledgers[j.tenant or ""].borrowed() > 0):
                continue
            until = protected_until(j, reclaim=not same)
            if until is not None and until > cycle.now:
                protected.append((until, j.key))
    if protected:
        until, first = min(protected)
        lines.append(
            f"{len(protected)} running job(s) it could evict are inside their minimum runtime "
            f"(longer after an earlier preemption, shorter against a reclaim); the first "
            f"({first}) becomes preemptible in {until - cycle.now:.0f}s"
        )
    return lines


def _may_be_preempted(cycle: Cycle, key: str) -> list[str]:
    job = cycle.jobs[key]
    lines = []
    if not job.preemptible:
        return ["not preemptible (spec.preemptible: false)"]
    tenant = cycle.tenants.get(job.tenant or "")
    borrowed = tenant is not None and cycle.ledgers[tenant.name].borrowed() > 0
    until = protected_until(job)
    if until is None:
        lines.append("not started yet: protected until all its pods run")
    elif until > cycle.now:
        lines.append(
            f"protected by its minimum runtime for another {until - cycle.now:.0f}s"
            + (
                f" (longer after its {job.preemptions} earlier preemption(s))"
                if job.preemptions
                else ""
            )
            + (" against its own tenant's higher-priority jobs" if borrowed else "")
        )
    if tenant is not None:
        lines.append(
            "its tenant runs on borrowed GPUs beyond its guarantee: a tenant reclaiming its "
            "own may preempt this job as long as its tenant keeps its guarantee"
            if borrowed
            else "runs inside its tenant's guarantee: other tenants cannot reclaim it"
        )
        if borrowed and until is not None:
            # A reclaim heeds only the (shorter) protection on borrowed GPUs: not the longer
            # one after earlier preemptions, nor a minimum runtime above the tenant's bound.
            reclaim_until = protected_until(job, reclaim=True) or cycle.now
            bound = (
                "(its minimum runtime, at most its tenant's preemption.borrowedProtectionSeconds"
            )
            lines.append(
                f"against a reclaim it is protected for another {reclaim_until - cycle.now:.0f}s "
                f"{bound})"
                if reclaim_until > cycle.now
                else f"against a reclaim it is no longer protected {bound}, has passed)"
            )
        if tenant.within_tenant.value == "LowerPriority":
            lines.append(
                f"jobs of tenant {tenant.name} with priority above {job.priority} may preempt it"
            )
    return lines


def _scope_never_met(node: Node, request: Request) -> str | None:
    """Why the node's wiring can never give one replica its required scope, even idle (None:
    it can, or the scope is only preferred). Said before free GPUs: freeing GPUs would not
    help."""
    policy = request.policy
    if not policy.required:
        return None
    topology = node.topology
    idle = place(topology, request.gpus_per_replica, policy, free_mask=topology.placeable_mask)
    if isinstance(idle, Placement) or idle.reason is not RefusalReason.SCOPE_UNSATISFIABLE:
        return None
    best = f"; at best {idle.best_class.value}" if idle.best_class is not None else ""
    return (
        f"its wiring can never give {request.gpus_per_replica} GPUs scope "
        f"{policy.describe()}, even idle{best}"
    )


def _nodes(cycle: Cycle, request: Request) -> tuple[list[NodeVerdict], dict[str, int]]:
    """What every node says to one replica, in the state the cycle left."""
    pool = cycle.pool
    verdicts = []
    k = request.gpus_per_replica
    for slot in pool.slots.values():
        node = slot.node
        free = slot.free_count
        if request.gpu_model is not None and node.model != request.gpu_model:
            verdicts.append(
                NodeVerdict(node.name, False, "ModelMismatch", f"GPU model {node.model}", free)
            )
            continue
        if not pool.eligible(slot, request):
            if node.count_only and request.policy.scope is not TopologyScope.NODE:
                reason, text = "NoTopology", "no NodeGpuTopology: only scope node can be met"
            elif any(node.labels.get(k_) != v for k_, v in request.node_selector):
                reason, text = "SelectorMismatch", "labels do not match the nodeSelector"
            else:
                reason, text = "Taints", "a NoSchedule/NoExecute taint is not tolerated"
            verdicts.append(NodeVerdict(node.name, False, reason, text, free))
            continue
        never = _scope_never_met(node, request)
        if never is not None:
            verdicts.append(NodeVerdict(node.name, False, "ScopeUnsatisfiable", never, free))
            continue
        result = place(node.topology, k, request.policy, free_mask=slot.free)
        if isinstance(result, Placement):
            ok = result.scope_satisfied or not request.policy.required
            text = "; ".join(result.reasons[:2])
            verdicts.append(
                NodeVerdict(node.name, ok, "Fits" if ok else "ScopeUnsatisfiable", text, free)
            )
        else:
            verdicts.append(
                NodeVerdict(node.name, False, result.reason.value, "; ".join(result.reasons), free)
            )
    order = {"Fits": 0, "ScopeUnsatisfiable": 1, "NotEnoughFreeGpus": 2}
    verdicts.sort(key=lambda v: (order.get(v.reason, 3), -v.free_gpus, v.node))
    return verdicts, dict(Counter(v.reason for v in verdicts).most_common())


#: Waits that an earlier start of the same job could end (not quota, not a missing tenant).
GPU_BOUND = frozenset(
    {
        WaitReason.WAITING_FOR_CAPACITY.value,
        WaitReason.TOPOLOGY_UNSATISFIABLE.value,
        WaitReason.DOMAIN_DEGRADED.value,
        # Never placeable as asked: the change that makes it placeable is the answer.
        WaitReason.NO_FEASIBLE_NODES.value,
    }
)
#: A variant counts when it starts at least this much sooner (seconds, or share of the wait).
SOONER_SECONDS = 600.0
SOONER_SHARE = 0.25


def sooner(snapshot: Snapshot, job: Job, explanation: Explanation) -> str | None:
    """The one change to a waiting job that starts it markedly sooner than its expected start
    (None: none does, or the job waits for something other than GPUs). Each variant is decided
    by a cycle of its own over ``snapshot``, which it only reads: it may run beside the next
    cycle."""
    if explanation.decision != "waiting" or explanation.reason not in GPU_BOUND:
        return None
    baseline = explanation.expected_start
    if baseline is None and explanation.forecast_at is None:
        # No forecast covered the job (the operator's answer between forecasts): its own start
        # is not known to be never, and a change is sooner only against that start.
        baseline = _start_of(snapshot, job)
        if baseline is not None and baseline <= snapshot.now:
            return None  # it starts now as it is
    return counterfactual(snapshot, job, baseline)


def counterfactual(snapshot: Snapshot, job: Job, baseline: float | None) -> str | None:
    """The one change to ``job`` that starts it soonest, when markedly sooner than
    ``baseline``: a looser topology scope, half the GPUs per replica, and for a gang its
    segments or its domain only preferred. Each looser scope is tried, tightest first, and of
    those starting the job equally soon the tightest is offered (the loosest asks the most of
    the job's speed). Each variant is decided once, by a cycle of its own over the same
    snapshot, then forecast: at most six, and the looser scopes stop at one starting it now."""
    variants: list[tuple[str, Job]] = []
    across = job.across
    if across is not None and across.segment_label is not None and across.segment_required:
        variants.append(
            (
                "`segment.mode: preferred` instead of `required`",
                replace(job, across=replace(across, segment_required=False)),
            )
        )
    if across is not None and across.required:
        variants.append(
            (
                "`acrossReplicas.mode: preferred` instead of `required`",
                replace(job, across=replace(across, required=False)),
            )
        )
    policy = job.policy
    # Every looser scope, tightest first: one may help where the next looser does not (a
    # count-only node meets only `node`). A scope is kept only when it starts the job sooner
    # than each tighter one, so of two that start it equally soon the tighter is offered.
    scopes = [
        (
            f"scope `{looser.value}` instead of `{policy.scope.value}`",
            replace(job, policy=replace(policy, scope=looser)),
        )
        for looser in SCOPES[SCOPES.index(policy.scope) + 1 :]
    ]
    halves: list[tuple[str, Job]] = []
    if job.gpus_per_replica > 1 and job.gpus_per_replica % 2 == 0:
        half = job.gpus_per_replica // 2
        halves.append(
            (
                f"{half} GPUs per replica instead of {job.gpus_per_replica}",
                replace(job, gpus_per_replica=half),
            )
        )
    best: tuple[float, str] | None = None
    for group in (variants, scopes, halves):
        for text, variant in group:
            start = _start_of(snapshot, variant)
            if start is not None and (best is None or start < best[0]):
                best = (start, text)
            if group is scopes and start is not None and start <= snapshot.now:
                break  # no looser scope starts it sooner than now
    if best is None:
        return None
    start, text = best
    if baseline is not None:
        gain = baseline - start
        if gain < max(SOONER_SECONDS, SOONER_SHARE * (baseline - snapshot.now)):
            return None
        if start <= snapshot.now:
            return f"{text}: now ({_span(gain)} earlier)"
        return f"{text}: about {_span(gain)} earlier"
    return (
        f"{text}: now"
        if start <= snapshot.now
        else f"{text}: in about {_span(start - snapshot.now)}"
    )


def _start_of(snapshot: Snapshot, variant: Job) -> float | None:
    """When ``variant`` would start in place of its job (see :func:`start_of`)."""
    jobs = tuple(variant if j.key == variant.key else j for j in snapshot.jobs)
    return start_of(replace(snapshot, jobs=jobs), variant.key)


def start_of(snapshot: Snapshot, key: str) -> float | None:
    """When job ``key`` of ``snapshot`` starts: a cycle of its own over the snapshot, which it
    only reads (so it may run beside the operator's next cycle), admits it now, or its
    forecast played until that job is decided tells when (None: never, as far as anyone
    knows). A cycle and one play: the jobs after it in the queue are not played."""
    cycle = Cycle(snapshot)
    if cycle.run().admission_of(key) is not None:
        return snapshot.now
    return cycle.forecast(until=key).get(key)


def _span(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.0f} h"
    return f"{max(1, round(seconds / 60))} min"
