"""``gpusched operator``: run the GpuJob operator (a kopf operator: watches, admission cycle,
metrics, liveness, validating webhook)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gpusched.core.admission.model import GuaranteeRounding
    from gpusched.operator.decide import OperatorConfig

from gpusched.commands.logs import configure_logging
from gpusched.commands.params import DURATION, POSITIVE_DURATION


def _labels(value: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, val = part.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{part!r}: expected key=value")
        out[key] = val
    return out


@click.command()
@click.option(
    "--kubeconfig", type=click.Path(path_type=Path), help="Default: $KUBECONFIG or in-cluster."
)
@click.option(
    "--metrics-port", default=8080, show_default=True, help="Prometheus endpoint; 0 disables it."
)
@click.option(
    "--resync",
    type=POSITIVE_DURATION,
    default="30s",
    show_default=True,
    help="Most time between cycles when nothing changes (changes and deadlines start one at once).",
)
@click.option(
    "--pods-ready-timeout",
    type=POSITIVE_DURATION,
    default="300s",
    show_default=True,
    help="Time an admitted gang may take until all its pods run; then it is released and requeued.",
)
@click.option(
    "--backoff-base",
    type=POSITIVE_DURATION,
    default="10s",
    show_default=True,
    help="First requeue delay after a gang timeout (doubles each time).",
)
@click.option(
    "--backoff-max",
    type=POSITIVE_DURATION,
    default="600s",
    show_default=True,
    help="Longest requeue delay.",
)
@click.option("--node-selector", default="", help="Only use nodes with these labels (k=v,k2=v2).")
@click.option(
    "--max-preemption-searches", default=32, show_default=True, help="Victim searches per cycle."
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=False,
    show_default=True,
    help="Run cycles only while holding the Lease (for several replicas).",
)
@click.option("--lease-namespace", default="gpusched-system", show_default=True)
@click.option(
    "--status-refresh",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Least time between writes that only reword a waiting job's status (its reason "
    "is written at once).",
)
@click.option(
    "--record-delay",
    type=DURATION,
    default="15s",
    show_default=True,
    help="Longest time an admission whose pods are created waits to be written, so that "
    "its status is written once, with its pods running (0: before the pods are created).",
)
@click.option(
    "--arrivals-on-top",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Jobs that arrive within this long of a cycle that admitted, evicted and reserved "
    "nothing (and nothing else changed) are decided on top of that cycle, as of its time, "
    "instead of deciding the whole queue again (0: only within the same instant).",
)
@click.option(
    "--max-node-rejections",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Times in a row a node's kubelet may refuse to admit a job's pod (no container ran) "
    "before the job fails; each refusal requeues the gang with backoff (0: never fails).",
)
@click.option(
    "--max-unready-releases",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Times a gang may be released for --pods-ready-timeout while a pod waited on one of "
    "its own containers (an image that cannot be pulled, a missing secret), without running "
    "in between, before the job fails (0: never fails).",
)
@click.option(
    "--forecast-interval",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Least time between two forecasts of every waiting job's expected start "
    "(reservations' starts are worked out every cycle).",
)
@click.option(
    "--forecast-arrivals-window",
    type=DURATION,
    default="0",
    show_default=True,
    help="Forecasts expect each tenant's submissions of this long back to go on at their "
    "steady rate, per priority, over as long ahead; jobs that would rank ahead of a waiting "
    "job delay its expected start (0: nothing arrives; e.g. 12h; docs/quotas.md).",
)
@click.option(
    "--reservations-per-tenant",
    type=click.IntRange(min=0, max=16),
    default=0,
    show_default=True,
    help="Blocked jobs per tenant that hold GPUs reserved where they fit soonest, with "
    "backfill of jobs that end before (0: none; docs/quotas.md).",
)
@click.option(
    "--guarantee-rounding",
    type=click.Choice(["down", "up"]),
    default="down",
    show_default=True,
    help="Honour each tenant's guarantee in whole jobs rounded down (the jobs that fit inside "
    "it) or up (a job larger than what is left of it may take that back from borrowers, and a "
    "tenant keeps the fewest of its jobs that cover it; docs/quotas.md).",
)
@click.option(
    "--lending-hold-seconds",
    type=click.FloatRange(min=0, max=3600),
    default=900.0,
    show_default=True,
    help="A tenant that asked for GPUs within this many seconds keeps that many idle GPUs of "
    "its unused guarantee from borrowers, so its next jobs start without evicting anyone "
    "(0: lend idle GPUs at once; docs/quotas.md).",
)
@click.option(
    "--reclaim-patience-seconds",
    type=click.FloatRange(min=0, max=86400),
    default=0.0,
    show_default=True,
    help="For this many seconds after its submission, a job inside its tenant's guarantee "
    "reclaims lent GPUs only where the borrowers' lost work costs less than its wait for GPUs "
    "to free; after that, whatever it costs (0: reclaim at once; docs/quotas.md).",
)
@click.option(
    "--runtime-history",
    default="gpusched-operator-runtime-history",  # runtimes.DEFAULT_NAME (a test keeps them equal)
    show_default=True,
    help="ConfigMap (in --lease-namespace) keeping finished jobs' run times for prediction "
    "across restarts; empty: kept in memory only.",
)
@click.option(
    "--health-port",
    type=click.IntRange(min=0, max=65535),
    default=8081,
    show_default=True,
    help="Liveness endpoint /healthz (fails when the admission loop is stuck); 0 disables it.",
)
@click.option(
    "--explain-port",
    type=click.IntRange(min=0, max=65535),
    default=8082,
    show_default=True,
    help="HTTP port of `gpusched explain`'s answers (GET /explain/NAMESPACE/NAME), served by "
    "the leader from its last cycle; 0 disables it.",
)
@click.option(
    "--stuck-after",
    type=POSITIVE_DURATION,
    default="120s",
    show_default=True,
    help="Liveness fails when the admission loop has not come round for this long (it does at "
    "least every --resync).",
)
@click.option(
    "--webhook-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="HTTPS port of the validating webhook (TenantQuota namespaces, a GpuJob's tenant "
    "and PriorityClass); 0: no webhook.",
)
@click.option(
    "--webhook-cert-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory with the webhook's tls.crt and tls.key (reloaded when they change).",
)
@click.option(
    "--pricing",
    default="",
    help='Price of a GPU-hour per GPU model, as JSON: {"currency": "USD", "default": 2.0, '
    '"byModel": {"NVIDIA-H100-80GB-HBM3": 4.5}}. Unset: every GPU-hour costs 1 (budgets '
    "count GPU-hours).",
)
@click.option(
    "--usage-half-life",
    type=DURATION,
    default="0s",
    show_default=True,
    help="Fair share with memory: a tenant's past borrowing counts when borrowers are ranked, "
    "halving every this long (e.g. 168h); 0: no memory.",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def operator(
    *,
    kubeconfig: Path | None,
    metrics_port: int,
    resync: float,
    pods_ready_timeout: float,
    backoff_base: float,
    backoff_max: float,
    node_selector: str,
    max_preemption_searches: int,
    leader_elect: bool,
    lease_namespace: str,
    status_refresh: float,
    record_delay: float,
    arrivals_on_top: float,
    max_node_rejections: int,
    max_unready_releases: int,
    forecast_interval: float,
    forecast_arrivals_window: float,
    reservations_per_tenant: int,
    guarantee_rounding: GuaranteeRounding,
    lending_hold_seconds: float,
    reclaim_patience_seconds: float,
    runtime_history: str,
    health_port: int,
    explain_port: int,
    stuck_after: float,
    webhook_port: int,
    webhook_cert_dir: Path | None,
    pricing: str,
    usage_half_life: float,
    verbose: bool,
) -> None:
    """Run the GpuJob / TenantQuota operator until interrupted."""
    from gpusched.operator.main import RunOptions, run

    config = operator_config(click.get_current_context().params)
    configure_logging(logging.DEBUG if verbose else logging.INFO)
    if webhook_port and webhook_cert_dir is None:
        raise click.BadParameter(
            "--webhook-port needs --webhook-cert-dir", param_hint="--webhook-cert-dir"
        )
    if not verbose:
        # kopf.objects logs every handled watch event at INFO.
        for noisy in ("kubernetes", "urllib3", "aiohttp", "kopf.objects"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    run(
        RunOptions(
            kubeconfig=kubeconfig,
            config=config,
            metrics_port=metrics_port,
            resync=resync,
            leader_elect=leader_elect,
            lease_namespace=lease_namespace,
            runtime_history=runtime_history or None,
            health_port=health_port,
            explain_port=explain_port,
            stuck_after=max(stuck_after, 2 * resync),
            webhook_port=webhook_port,
            webhook_cert_dir=webhook_cert_dir,
        )
    )


def operator_config(params: Mapping[str, Any]) -> OperatorConfig:
    """The operator's decision settings from its parsed flags (``ctx.params`` of
    :func:`operator`). One function for both users: the operator itself, and ``gpusched
    explain --local``, which parses the running operator's arguments with this same command
    so that it decides with the same settings (:mod:`gpusched.operator.settings`)."""
    from gpusched.core.lifecycle.spend import Pricing
    from gpusched.operator.decide import OperatorConfig

    try:
        prices = Pricing.parse(params["pricing"])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--pricing") from err
    return OperatorConfig(
        pods_ready_timeout=params["pods_ready_timeout"],
        backoff_base=params["backoff_base"],
        backoff_max=params["backoff_max"],
        node_selector=_labels(params["node_selector"]),
        max_preemption_searches=params["max_preemption_searches"],
        status_refresh=params["status_refresh"],
        record_delay=params["record_delay"],
        arrivals_on_top=params["arrivals_on_top"],
        max_node_rejections=params["max_node_rejections"],
        max_unready_releases=params["max_unready_releases"],
        forecast_interval=params["forecast_interval"],
        forecast_arrivals_window=params["forecast_arrivals_window"],
        reservations_per_tenant=params["reservations_per_tenant"],
        guarantee_rounding=params["guarantee_rounding"],
        lending_hold_seconds=params["lending_hold_seconds"],
        reclaim_patience_seconds=params["reclaim_patience_seconds"],
        pricing=prices,
        usage_half_life=params["usage_half_life"] or None,
    )
