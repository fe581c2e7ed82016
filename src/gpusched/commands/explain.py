"""``gpusched explain [-n NAMESPACE] JOB``: why a GpuJob is where it is, or why it waits, and
when it is expected to start.

The leading operator answers from its last admission cycle (through the API server's proxy to
its Service, or ``--operator URL``): the cycle's verdict on the job with the evidence, its
tenant's standing, who it may preempt (or who may preempt it), what each node says to one of
its replicas and its expected start; then, asked separately because each variant is a cycle of
its own, one change that would start it sooner. Where no operator answers (or with
``--local``), the CLI reads the cluster as the operator does and decides itself, writing
nothing. For each of the job's pods it adds whether the kubelet gave its containers exactly the
GPUs gpusched chose (the node agent's report). ``gpusched explain pod/NAME`` says that for any
pod.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import click

#: What Kubernetes allows as an object's name (a DNS subdomain) and as a namespace (a DNS
#: label). The names go into API paths: anything else (``..``, an empty name, a slash) would
#: ask for another path than the object's, so it is refused before anything is asked.
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _target(job: str, namespace: str) -> tuple[str, str, str]:
    """(kind, namespace, name) of the JOB argument: ``""`` for a GpuJob or ``"pod"``; a name or
    namespace Kubernetes would not accept is refused as the bad parameter it is."""
    kind, _, target = job.partition("/") if job.startswith("pod/") else ("", "", job)
    hint = "'-n' / '--namespace'"
    if "/" in target:
        namespace, target = target.split("/", 1)
        hint = "JOB"
    if len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace):
        raise click.BadParameter(
            f"{namespace!r} is not a namespace (lowercase letters, digits and '-', at most 63)",
            param_hint=hint,
        )
    if len(target) > 253 or not _NAME.fullmatch(target):
        raise click.BadParameter(
            f"{job!r}: {target!r} is not a {'pod' if kind else 'GpuJob'} name (lowercase "
            "letters, digits, '-' and '.', at most 253); expected NAME, NAMESPACE/NAME, "
            "pod/NAME or pod/NAMESPACE/NAME",
            param_hint="JOB",
        )
    return kind, namespace, target


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line (YAML and connection errors span several)."""
    return " ".join(str(err).split()) or type(err).__name__


def _operator_url(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r}: expected an http:// or https:// URL")
    return value


def _operator_args(_: click.Context, __: click.Parameter, value: str) -> list[str]:
    """The words of ``--operator-args``, checked as the operator would check them."""
    from gpusched.operator.settings import check_args

    try:
        args = shlex.split(value)
        check_args(args)
    except (ValueError, click.ClickException) as err:
        message = err.format_message() if isinstance(err, click.ClickException) else str(err)
        raise click.BadParameter(message) from None
    return args


def _node_selector(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str]:
    if value is None:
        return []
    return _operator_args(ctx, param, shlex.join([f"--node-selector={value}"]))


@click.command()
@click.argument("job")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--kubeconfig", type=click.Path(path_type=Path), help="Default: $KUBECONFIG.")
@click.option(
    "--operator",
    "operator_url",
    default=None,
    callback=_operator_url,
    help="URL of the operator's explain port (e.g. http://localhost:8082 through `kubectl "
    "port-forward`). Default: its Service, through the API server's proxy.",
)
@click.option("--operator-namespace", default="gpusched-system", show_default=True)
@click.option("--operator-service", default="gpusched-operator", show_default=True)
@click.option(
    "--local",
    is_flag=True,
    help="Do not ask the operator: read the cluster and decide here (slower at scale).",
)
@click.option(
    "--sooner/--no-sooner",
    default=True,
    show_default=True,
    help="Also work out one change that would start a waiting job sooner (a cycle per variant).",
)
@click.option(
    "--operator-args",
    default="",
    callback=_operator_args,
    help="When deciding here: operator flags to decide with instead of the running "
    "operator's (read from its pod in --operator-namespace), e.g. "
    "'--reservations-per-tenant=2 --guarantee-rounding=up'.",
)
@click.option(
    "--node-selector",
    default=None,
    callback=_node_selector,
    help="When deciding here: the operator's --node-selector (short for --operator-args).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def explain(
    job: str,
    *,
    namespace: str,
    kubeconfig: Path | None,
    operator_url: str | None,
    operator_namespace: str,
    operator_service: str,
    local: bool,
    sooner: bool,
    operator_args: list[str],
    node_selector: list[str],
    as_json: bool,
) -> None:
    """Why JOB (a GpuJob, NAME or NAMESPACE/NAME) is where it is, or why it waits; with
    pod/NAME (or pod/NAMESPACE/NAME), whether a pod holds exactly the GPUs gpusched chose."""
    import aiohttp
    import yaml
    from kubernetes.config.config_exception import ConfigException

    from gpusched.core.admission.explain import Explanation
    from gpusched.kube import load_configuration
    from gpusched.kubeasync import ApiError, BlockingApi
    from gpusched.node_agent.explain import job_pods, pod_report, render_pod
    from gpusched.operator import asking
    from gpusched.operator.explainer import (
        JobNotFoundError,
        explain_in_cluster,
        render,
        sooner_line,
    )
    from gpusched.operator.settings import discover

    kind, namespace, target = _target(job, namespace)
    key = f"{namespace}/{target}"
    try:
        configuration = load_configuration(kubeconfig)
    # The kubernetes loader raises TypeError and AttributeError on a file that is YAML but not
    # a kubeconfig (a plain string, a list).
    except (ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, AttributeError) as err:
        where = kubeconfig or "$KUBECONFIG, the pod's service account or ~/.kube/config"
        raise click.ClickException(
            f"cannot read the Kubernetes configuration ({where}): {_one_line(err)}"
        ) from None
    kube = BlockingApi(configuration)
    payload: dict[str, Any] = {}
    unanswered: str | None = None  # why the operator, asked, did not answer
    try:
        if kind == "pod":
            reports = [pod_report(kube, namespace, target)]
            if as_json:
                click.echo(json.dumps({"pods": reports}, indent=2, default=str))
            else:
                click.echo("\n".join(line for r in reports for line in render_pod(r)))
            return
        fetch = (
            asking.at_url(operator_url)
            if operator_url
            else asking.through_proxy(kube, operator_namespace, operator_service, "explain")
        )
        answer: dict[str, Any] | None = None
        if not local:
            try:
                answer = asking.ask(fetch, key)
            except asking.NoAnswerError as err:
                unanswered = f"the operator did not answer ({err})"
        if answer is not None:
            if operator_args or node_selector:
                click.echo(
                    "note: the operator answered from its own settings; --operator-args and "
                    "--node-selector apply where this CLI decides itself (--local)",
                    err=True,
                )
            result = Explanation.from_dict(answer["explanation"])
            status = answer["status"]
            origin = _origin(answer)
            payload = {"answeredBy": answer.get("answeredBy"), "decidedAt": answer["decidedAt"]}
            asked = sooner and result.decision == "waiting"
            if asked:
                # Asked before printing: a job the last forecast did not cover gets its start
                # played forward with this answer (seconds at scale, like the change).
                try:
                    later = asking.ask(fetch, key, sooner=True)
                    result.counterfactual = later["counterfactual"]
                    if later.get("playedBecause"):
                        result.expected_start = later.get("expectedStart")
                        result.forecast_at = later.get("forecastAt")
                        result.played_because = later["playedBecause"]
                        result.unforecast = None
                except asking.NoAnswerError as err:
                    result.counterfactual = None
                    payload["soonerError"] = str(err)
            if not as_json:
                click.echo("\n".join(render(result, status, origin)))
            if asked:
                line = sooner_line(result, payload.get("soonerError"))
                if line is not None and not as_json:
                    click.echo(line)
        else:
            settings = discover(
                kube,
                operator_namespace,
                [*operator_args, *node_selector],
                # Where no operator can be read: as the chart installs it for that Service
                # (it names the run-time history after it, in the release's namespace).
                fallback=[
                    f"--lease-namespace={operator_namespace}",
                    f"--runtime-history={operator_service}-runtime-history",
                ],
            )
            result, status = explain_in_cluster(
                configuration,
                key,
                settings.config,
                sooner=sooner,
                runtime_history=settings.runtime_history,
            )
            why = unanswered or "--local"
            payload = {"decidedHere": why, "settings": settings.to_dict()}
            if not as_json:
                click.echo(
                    "\n".join(render(result, status, f"decided here: {why}", settings.lines()))
                )
                # render printed a change found; say as the operator's answer does when none.
                line = sooner_line(result) if sooner and not result.counterfactual else None
                if line is not None:
                    click.echo(line)
        reports = [pod_report(kube, namespace, p) for p in job_pods(kube, namespace, target)]
    except (JobNotFoundError, asking.JobUnknownError) as err:
        raise click.ClickException(str(err)) from None
    except ApiError as err:
        before = f"{unanswered}; deciding here instead: " if unanswered else ""
        raise click.ClickException(
            f"{kind or 'gpujob'} {namespace}/{target}: {before}{err}"
        ) from None
    except (aiohttp.ClientError, OSError) as err:  # TimeoutError is an OSError
        before = f"{unanswered}; deciding here instead: " if unanswered else ""
        raise click.ClickException(
            f"{kind or 'gpujob'} {namespace}/{target}: {before}the API server at "
            f"{configuration.host} did not answer: {_one_line(err)}"
        ) from None
    except ValueError as err:
        raise click.ClickException(
            f"{kind or 'gpujob'} {namespace}/{target}: an answer could not be read: "
            f"{_one_line(err)}"
        ) from None
    finally:
        kube.close()
    if as_json:
        payload.update(status=status, explanation=result.to_dict(), pods=reports)
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    lines = [line for report in reports for line in render_pod(report)]
    if lines:
        click.echo("\n".join(lines))


def _origin(answer: dict[str, Any]) -> str:
    decided = datetime.fromisoformat(answer["decidedAt"])
    ago = max(0.0, (datetime.now(UTC) - decided).total_seconds())
    who = f" ({answer['answeredBy']})" if answer.get("answeredBy") else ""
    return (
        f"answered by the operator{who} from its cycle at "
        f"{decided.strftime('%H:%M:%SZ')} ({ago:.0f} s ago)"
    )
