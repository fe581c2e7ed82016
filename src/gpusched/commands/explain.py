"""``gpusched explain [-n NAMESPACE] JOB``: why a GpuJob is where it is, or why it waits.

It reads the cluster exactly as the operator does, runs the same admission cycle without writing
anything, and prints the cycle's verdict on the job with the evidence: its tenant's standing, who
it may preempt (or who may preempt it) and what each node says to one of its replicas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


def _print(e: Any, status: dict[str, Any]) -> None:
    echo = click.echo
    if not e.found:
        echo(f"{e.job}: {e.message}")
        return
    phase = status.get("phase") or "New"
    echo(
        f"GpuJob {e.job}: {phase}" + (f" ({status.get('reason')})" if status.get("reason") else "")
    )
    if status.get("message"):
        echo(f"  status says: {status['message']}")
    verdict = {
        "admitted": "the next cycle admits it",
        "waiting": "the next cycle leaves it waiting",
        "running": "it holds its GPUs",
        "terminating": "it is being evicted",
    }[e.decision]
    echo(f"  verdict now: {verdict}" + (f": {e.reason}" if e.reason else ""))
    if e.message:
        echo(f"    {e.message}")
    if e.queue_position:
        echo(f"  queue: position {e.queue_position} of {e.queue_length} in tenant {e.tenant}")
    t = e.tenant_summary
    if t:
        limit = t["borrowing_limit"] if t["borrowing_limit"] is not None else "none"
        by_model = "".join(f", {n} of model {m}" for m, n in t["guaranteed_by_model"].items())
        echo(
            f"  tenant {t['name']}: guaranteed {t['guaranteed']}{by_model}; limit {limit}; "
            f"weight {t['weight']:g}; using {t['used']} (borrowed {t['borrowed']}); "
            f"fair share {t['fair_share']:g} of demand {t['demand']}"
        )
    elif e.tenant is None:
        echo("  tenant: none (no TenantQuota lists this namespace)")
    echo(f"  priority {e.priority}")
    for p in e.placement:
        extra = f", {p['topology_class']}, score {p['score']:.1f}" if "score" in p else ""
        echo(f"  replica {p['replica']}: node {p['node']} GPUs {p['gpus']}{extra}")
    for v in e.victims:
        echo(f"  would preempt {v}")
    for line in e.preemption:
        echo(f"  preemption: {line}")
    if e.node_summary:
        summary = ", ".join(f"{reason} {n}" for reason, n in e.node_summary.items())
        echo(f"  nodes for one replica: {summary}")
        for v in e.nodes[:5]:
            echo(f"    {v.node} ({v.free_gpus} free): {v.reason}: {v.detail}")


@click.command()
@click.argument("job")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--kubeconfig", type=click.Path(path_type=Path), help="Default: $KUBECONFIG.")
@click.option("--node-selector", default="", help="The operator's --node-selector, if it has one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def explain(
    job: str, namespace: str, kubeconfig: Path | None, node_selector: str, as_json: bool
) -> None:
    """Why JOB (a GpuJob) is where it is, or why it waits."""
    from gpusched.commands.operator import _labels
    from gpusched.core.admission.explain import explain as explain_job
    from gpusched.kube import api_client
    from gpusched.operator.controller import Controller, OperatorConfig
    from gpusched.operator.readonly import ReadOnlyApi

    if "/" in job:
        namespace, job = job.split("/", 1)
    kube = api_client(kubeconfig)
    controller = Controller(ReadOnlyApi(kube), OperatorConfig(node_selector=_labels(node_selector)))
    try:
        snapshot, world = controller.dry_snapshot()
    finally:
        controller.close()
    key = f"{namespace}/{job}"
    record = next((r for r in world.jobs if r.key == key), None)
    if record is None:
        raise click.ClickException(f"GpuJob {key} not found")
    result = explain_job(snapshot, key)
    status = dict(record.raw.get("status") or {})
    if as_json:
        click.echo(
            json.dumps({"status": status, "explanation": result.to_dict()}, indent=2, default=str)
        )
        return
    if not result.found:
        phase = status.get("phase") or "New"
        click.echo(f"GpuJob {key}: {phase} ({status.get('reason', '')})")
        if status.get("message"):
            click.echo(f"  {status['message']}")
        click.echo("  it takes no part in admission (finished, invalid, suspended or unparseable)")
        return
    _print(result, status)
