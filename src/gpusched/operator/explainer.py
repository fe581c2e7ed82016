"""``gpusched explain`` over a live cluster: read it once as the operator's watches do, decide
exactly as the operator's cycle does, apply nothing, and render the verdict on one job."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpusched.core.admission import WaitReason
from gpusched.core.admission.explain import GPU_BOUND, Explanation, describe, start_of
from gpusched.core.admission.explain import sooner as sooner_change
from gpusched.core.lifecycle import Verdict, needs_validation
from gpusched.core.lifecycle.status import admitted_by_pods, waiting_since
from gpusched.core.runtime import RuntimeHistory
from gpusched.kubeasync import AsyncApi
from gpusched.operator.decide import Decision, OperatorConfig, decide
from gpusched.operator.nodes import NodeReader
from gpusched.operator.runtimes import RuntimeBook
from gpusched.operator.store import Store
from gpusched.operator.watches import list_all


class JobNotFoundError(LookupError):
    """No GpuJob of that name."""


async def read_store(api: AsyncApi) -> Store:
    """One list of everything the operator watches, in a store of its own."""
    store = Store()
    await list_all(api, store)
    assume_unwritten_admissions(store)
    return store


def assume_unwritten_admissions(store: Store) -> None:
    """Jobs with live pods of an admission newer than their status: the operator carried the
    admission out and writes it with the pods running (its ``--record-delay``). The store holds
    them as the operator does, admitted on those pods, so the explanation is the operator's and
    not that of an operator starting now (which would find them unrecorded and decide again)."""
    for key in list(store.jobs):
        job = store.job(key)
        status = admitted_by_pods(job)
        if status is not None:
            store.defer_status(key, status, job.resource_version)


def explain_in_cluster(
    configuration: Any,
    key: str,
    config: OperatorConfig | None = None,
    *,
    sooner: bool = True,
    runtime_history: tuple[str, str] | None = None,
) -> tuple[Explanation, dict[str, Any]]:
    """:func:`explain_job` over one fresh read of the cluster a ``kubernetes`` configuration
    names (synchronous: for the CLI and scripts), decided with ``config`` (the operator's
    settings, :mod:`gpusched.operator.settings`; None: the defaults). ``runtime_history``:
    (namespace, name) of the operator's run-time history ConfigMap, read so that run times
    are predicted as the operator predicts them (a history that cannot be read predicts
    nothing)."""

    async def read() -> tuple[Store, RuntimeHistory | None]:
        api = AsyncApi(configuration)
        try:
            history = None
            if runtime_history is not None:
                book = RuntimeBook(api, *runtime_history)
                await book.load()
                history = book.history
            return await read_store(api), history
        finally:
            await api.close()

    store, history = asyncio.run(read())
    return explain_job(store, key, config, sooner=sooner, history=history)


def explain_job(
    store: Store,
    key: str,
    config: OperatorConfig | None = None,
    *,
    sooner: bool = True,
    history: RuntimeHistory | None = None,
) -> tuple[Explanation, dict[str, Any]]:
    """The explanation of ``namespace/name`` and the job's current status, decided now over
    ``store``: one cycle, the forecast played until the job is decided, and (``sooner``) the
    change that would start it sooner, with the operator's settings ``config`` (None: the
    defaults, which are not the operator's where it runs with others). Run times are
    predicted from ``history`` (the operator's; without it only declared limits are known,
    and the expected starts that hang on predicted ends are not the operator's). The job's
    template is taken as valid (checking it is the operator's business)."""
    world = store.world(datetime.now(UTC))
    verdicts: dict[str, Verdict | None] = {
        job.key: Verdict() for job in world.jobs if needs_validation(job)
    }
    config = config if config is not None else OperatorConfig()
    decision = decide(
        world, verdicts, config, NodeReader(config.node_selector), history=history, forecast=False
    )
    explanation, status = answer(decision, key, play=True)
    job = decision.cycle.jobs.get(key)
    if sooner and job is not None:
        explanation.counterfactual = sooner_change(decision.snapshot, job, explanation)
    return explanation, status


def answer(
    decision: Decision, key: str, *, play: bool = False
) -> tuple[Explanation, dict[str, Any]]:
    """The explanation of ``key`` in the state ``decision``'s cycle left, and the job's status
    as written. A waiting job's expected start is the one the decision carries (its
    reservation's, or the last forecast's), or, with ``play``, played forward now (which
    uses the cycle up: only for a decision made for this answer). A job the last forecast
    did not cover is left with none (``forecast_at`` None): :func:`unforecast` says why,
    and :func:`play_unforecast` plays it without touching the cycle."""
    facts = decision.world.job(key)
    if facts is None:
        raise JobNotFoundError(f"GpuJob {key} not found")
    forecast_at = decision.forecast_at.timestamp() if decision.forecast_at else None
    explanation = describe(decision.cycle, decision.result, key, forecast_at, play=play)
    waiting = explanation.decision == "waiting" and explanation.reservation is None
    if waiting and not play and key not in decision.forecast:
        explanation.forecast_at = None  # queued since the last forecast, or beyond its limit
    if facts.unwritten is not None:
        explanation.reason = "AdmissionNotYetWritten"
        explanation.message = (
            f"admitted (admission {facts.status.admission}): its pods exist; the operator "
            "writes the status with them running, at the latest --record-delay after admission"
        )
    return explanation, facts.written.to_k8s()


#: Waits no play gives a start (:meth:`Cycle.forecast`): no tenant owns the job, or no node
#: could hold it even idle.
_NO_PLAY = frozenset({WaitReason.NO_TENANT.value, WaitReason.NO_FEASIBLE_NODES.value})


def unforecast(decision: Decision, key: str, explanation: Explanation) -> str | None:
    """Why the operator's last forecast gives the waiting job ``key`` no expected start for
    its current wait, when one can be played forward for it (None: the explanation's start
    stands, or the job is not waiting for one).

    A forecast (once per ``--forecast-interval``) covers the jobs waiting then, the first
    ``--forecast-limit`` in admission order. Between two, a job that joined the queue (new,
    or back from a preemption or a release) has none, or the start of an earlier wait of its
    own; so has a job beyond the limit."""
    if (
        explanation.decision != "waiting"
        or explanation.reservation is not None  # its reservation's start, worked out now
        or explanation.never_starts
        or explanation.reason in _NO_PLAY
    ):
        return None
    if decision.forecast_at is None:
        return "no forecast has been made yet"
    ago = (decision.world.now - decision.forecast_at).total_seconds()
    last = f"the operator's last forecast ({_span(ago)} before this cycle)"
    since = waiting_since(decision.final_status(key)) if key in decision.settled else None
    if since is not None and since > decision.forecast_at:
        if key in decision.forecast:
            return f"{last} was of an earlier wait: it was queued again since"
        return f"{last} was made before it was queued (new, or back from a preemption or a release)"
    if key not in decision.forecast:
        limit = decision.forecast_limit
        if limit is not None and len(decision.forecast) >= limit:
            return (
                f"{last} did not cover it: it covers the jobs waiting then, the first "
                f"{limit:,} in admission order"
            )
        # Its wait's record began before, but it was not waiting for GPUs then: its pods were
        # still leaving a preemption, it was suspended, or its template was still being checked.
        return f"{last} was made while it did not wait for GPUs yet"
    return None


def play_unforecast(decision: Decision, key: str, explanation: Explanation, why: str) -> None:
    """Give ``explanation`` the expected start played forward now for job ``key`` alone, over
    the snapshot ``decision``'s cycle decided on (a cycle of its own, which only reads it, and
    a play until the job; the operator's cycle and the statuses are left as they are), saying
    why (:func:`unforecast`). Played once per job and decision."""
    if key in decision.played:
        start = decision.played[key]
    else:
        start = decision.played[key] = start_of(decision.snapshot, key)
    now = decision.snapshot.now
    explanation.expected_start = max(start, now) if start is not None else None
    explanation.forecast_at = now
    explanation.played_because = why


def render(
    e: Explanation,
    status: Mapping[str, Any],
    origin: str | None = None,
    settings: Sequence[str] = (),
) -> list[str]:
    """Human-readable lines (``origin``: who decided, and when; ``settings``: with what
    settings, where the CLI decided itself)."""
    phase = status.get("phase") or "New"
    head = f"GpuJob {e.job}: {phase}" + (f" ({status['reason']})" if status.get("reason") else "")
    out = [head]
    if origin:
        out.append(f"  {origin}")
    out.extend(f"  {line}" for line in settings)
    if not e.found:
        if status.get("message"):
            out.append(f"  {status['message']}")
        out.append("  it takes no part in admission (finished, invalid, suspended or unreadable)")
        return out
    if status.get("message"):
        out.append(f"  status says: {status['message']}")
    verdict = {
        "admitted": "the next cycle admits it",
        "waiting": "the next cycle leaves it waiting",
        "running": "it holds its GPUs",
        "terminating": "it is being evicted",
    }[e.decision]
    out.append(f"  verdict now: {verdict}" + (f": {e.reason}" if e.reason else ""))
    if e.message:
        out.append(f"    {e.message}")
    if e.queue_position:
        out.append(f"  queue: position {e.queue_position} of {e.queue_length} in tenant {e.tenant}")
    if e.decision == "waiting":
        out.extend(_expected_lines(e))
    t = e.tenant_summary
    if t:
        limit = t["borrowing_limit"] if t["borrowing_limit"] is not None else "none"
        by_model = "".join(f", {n} of model {m}" for m, n in t["guaranteed_by_model"].items())
        out.append(
            f"  tenant {t['name']}: guaranteed {t['guaranteed']}{by_model}; limit {limit}; "
            f"weight {t['weight']:g}; using {t['used']} (borrowed {t['borrowed']}); "
            f"fair share {t['fair_share']:g} of demand {t['demand']}"
        )
    elif e.tenant is None:
        out.append("  tenant: none (no TenantQuota lists this namespace)")
    out.append(f"  priority {e.priority}")
    out.extend(_preempted_lines(status))
    for p in e.placement:
        extra = f", {p['topology_class']}, score {p['score']:.1f}" if "score" in p else ""
        out.append(f"  replica {p['replica']}: node {p['node']} GPUs {p['gpus']}{extra}")
    out.extend(f"  would preempt {v}" for v in e.victims)
    out.extend(f"  preemption: {line}" for line in e.preemption)
    if e.node_summary:
        summary = ", ".join(f"{reason} {n}" for reason, n in e.node_summary.items())
        out.append(f"  nodes for one replica: {summary}")
        out.extend(
            f"    {v.node} ({v.free_gpus} free): {v.reason}: {v.detail}" for v in e.nodes[:5]
        )
    return out


def sooner_line(e: Explanation, error: str | None = None) -> str | None:
    """The ``sooner:`` line of a waiting job once the change was asked for (None: no line).
    Changes are tried only for a job waiting for GPUs (or for a node that could hold it): for
    one waiting on its quota, a cap, a budget or a missing tenant, its reason says what would
    start it, and "no change starts it sooner" would contradict it."""
    if error:
        return f"  sooner: not worked out ({error})"
    if e.counterfactual:
        return f"  sooner: {e.counterfactual}"
    if e.decision != "waiting" or e.reason not in GPU_BOUND:
        return None
    return (
        "  sooner: none of the changes tried (a looser scope, half the GPUs per replica, a "
        "gang's placement only preferred) starts it markedly sooner"
    )


def _preempted_lines(status: Mapping[str, Any]) -> list[str]:
    """How often the job was evicted, and the last eviction: by whom, why, what it cost."""
    records = status.get("preemptions") or []
    count = status.get("preemptionCount") or len(records)
    if not count:
        return []
    out = [f"  preempted {count} time(s)"]
    if records:
        last = records[-1]
        out.append(
            f"    last at {last.get('time')} by {last.get('preemptor')} ({last.get('reason')}): "
            f"{last.get('message', '')}"
        )
    return out


def _when(epoch: float, now: float) -> str:
    at = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    ahead = max(0.0, epoch - now)
    span = f"{ahead / 3600:.1f} h" if ahead >= 5400 else f"{round(ahead / 60)} min"
    return f"{at} (in about {span})"


def _span(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{round(seconds)} s" if seconds < 90 else f"{round(seconds / 60)} min"


def _expected_lines(e: Explanation) -> list[str]:
    """When the job is expected to start, on what evidence, and what would start it sooner."""
    out = []
    played = (
        f"    played forward now for this job alone, as of this cycle: {e.played_because}"
        if e.played_because
        else None
    )
    if e.expected_start is not None:
        line = f"  expected start: {_when(e.expected_start, e.now)}"
        if e.forecast_at is not None and e.now - e.forecast_at >= 1:
            line += f" (forecast {_span(e.now - e.forecast_at)} before this cycle)"
        out.append(line)
        if played:
            out.append(played)
    elif e.never_starts:
        out.append("  expected start: never, as asked (its reason says what to change)")
    elif e.reason == "NoTenant":
        out.append("  expected start: none while no TenantQuota owns its namespace")
    elif e.unforecast:
        out.append(
            f"  expected start: not worked out in this answer: {e.unforecast}; `gpusched "
            "explain` plays it forward with --sooner (the default), or decides here with --local"
        )
    elif e.forecast_at is None:
        out.append(
            "  expected start: not forecast yet (the operator forecasts waiting jobs once per "
            "--forecast-interval, the first 5,000 in admission order; `gpusched explain "
            "--local` plays the queue forward now)"
        )
    else:
        out.append(
            "  expected start: unknown (GPUs it could use are held by jobs with no predicted "
            "end, or no node can hold it)"
        )
        if played:
            out.append(played)
    r = e.reservation
    if r is not None:
        where = ", ".join(f"{p['node']} GPUs {p['gpus']}" for p in r["placement"])
        out.append(
            f"  reserved: {where} from {_when(r['start'], e.now)}; {r['idle_gpus']} of them idle "
            "until then (jobs expected to end before it may use them)"
        )
    if e.counterfactual:
        out.append(f"  sooner: {e.counterfactual}")
    return out
