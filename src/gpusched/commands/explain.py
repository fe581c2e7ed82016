"""``gpusched explain [-n NAMESPACE] JOB``: why a GpuJob is where it is, or why it waits.

It reads the cluster exactly as the operator does, runs the same admission cycle without writing
anything, and prints the cycle's verdict on the job with the evidence: its tenant's standing, who
it may preempt (or who may preempt it) and what each node says to one of its replicas. For each
of the job's pods it adds whether the kubelet gave its containers exactly the GPUs gpusched chose
(the node agent's report). ``gpusched explain pod/NAME`` says that for any pod.
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
    """Why JOB (a GpuJob, NAME or NAMESPACE/NAME) is where it is, or why it waits; with
    pod/NAME (or pod/NAMESPACE/NAME), whether a pod holds exactly the GPUs gpusched chose."""
    from gpusched.commands.operator import _labels
    from gpusched.kube import load_configuration
    from gpusched.kubeasync import ApiError, BlockingApi
    from gpusched.node_agent.explain import job_pods, pod_report, render_pod
    from gpusched.operator.explainer import JobNotFoundError, explain_in_cluster, render

    kind, _, target = job.partition("/") if job.startswith("pod/") else ("", "", job)
    if "/" in target:
        namespace, target = target.split("/", 1)
    configuration = load_configuration(kubeconfig)
    kube = BlockingApi(configuration)
    try:
        if kind == "pod":
            reports = [pod_report(kube, namespace, target)]
        else:
            result, status = explain_in_cluster(
                configuration, f"{namespace}/{target}", _labels(node_selector)
            )
            reports = [pod_report(kube, namespace, p) for p in job_pods(kube, namespace, target)]
    except JobNotFoundError as err:
        raise click.ClickException(str(err)) from None
    except ApiError as err:
        raise click.ClickException(f"{kind or 'gpujob'} {namespace}/{target}: {err}") from None
    finally:
        kube.close()
    if as_json:
        payload: dict[str, object] = {"pods": reports}
        if kind != "pod":
            payload = {"status": status, "explanation": result.to_dict(), **payload}
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    lines = [] if kind == "pod" else render(result, status)
    for report in reports:
        lines.extend(render_pod(report))
    click.echo("\n".join(lines))
