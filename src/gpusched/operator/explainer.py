"""``gpusched explain`` over a live cluster: read it as the operator does, run the same cycle
without writing, render the verdict on one job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched.core.admission.explain import Explanation, explain
from gpusched.operator.controller import Controller, OperatorConfig
from gpusched.operator.readonly import ReadOnlyApi


class JobNotFoundError(LookupError):
    """No GpuJob of that name."""


def explain_job(
    kube: Any, key: str, node_selector: Mapping[str, str] | None = None
) -> tuple[Explanation, dict[str, Any]]:
    """The explanation of ``namespace/name`` and the job's current status."""
    controller = Controller(
        ReadOnlyApi(kube), OperatorConfig(node_selector=dict(node_selector or {}))
    )
    try:
        snapshot, world = controller.dry_snapshot()
    finally:
        controller.close()
    record = next((r for r in world.jobs if r.key == key), None)
    if record is None:
        raise JobNotFoundError(f"GpuJob {key} not found")
    return explain(snapshot, key), dict(record.raw.get("status") or {})


def render(e: Explanation, status: Mapping[str, Any]) -> list[str]:
    """Human-readable lines."""
    phase = status.get("phase") or "New"
    head = f"GpuJob {e.job}: {phase}" + (f" ({status['reason']})" if status.get("reason") else "")
    out = [head]
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
