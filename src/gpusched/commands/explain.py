"""``gpusched explain [-n NAMESPACE] JOB``: why a GpuJob is where it is, or why it waits.

It reads the cluster exactly as the operator does, runs the same admission cycle without writing
anything, and prints the cycle's verdict on the job with the evidence: its tenant's standing, who
it may preempt (or who may preempt it) and what each node says to one of its replicas.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("job")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--kubeconfig", type=click.Path(path_type=Path), help="Default: $KUBECONFIG.")
@click.option("--node-selector", default="", help="The operator's --node-selector, if it has one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def explain(
    job: str, namespace: str, kubeconfig: Path | None, node_selector: str, as_json: bool
) -> None:
    """Why JOB (a GpuJob, NAME or NAMESPACE/NAME) is where it is, or why it waits."""
    from gpusched.commands.operator import _labels
    from gpusched.kube import load_configuration
    from gpusched.operator.explainer import JobNotFoundError, explain_in_cluster, render

    if "/" in job:
        namespace, job = job.split("/", 1)
    try:
        result, status = explain_in_cluster(
            load_configuration(kubeconfig), f"{namespace}/{job}", _labels(node_selector)
        )
    except JobNotFoundError as err:
        raise click.ClickException(str(err)) from None
    if as_json:
        payload = {"status": status, "explanation": result.to_dict()}
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    click.echo("\n".join(render(result, status)))
