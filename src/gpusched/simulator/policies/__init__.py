"""The policies a replay compares: gpusched as shipped and the baselines standing for what
people run today (each names its assumptions; they are printed in every report)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from gpusched.core.admission import CycleConfig, Level, Tenant
from gpusched.core.admission.arrivals import WINDOW_SECONDS
from gpusched.simulator.model import SimNode
from gpusched.simulator.policies.base import Decisions, Placed, SimPolicy, Start
from gpusched.simulator.policies.book import NodeRule
from gpusched.simulator.policies.easy_backfill import EasyBackfillPolicy
from gpusched.simulator.policies.gpusched import GpuschedPolicy
from gpusched.simulator.policies.kubedefault import KubeDefaultPolicy
from gpusched.simulator.policies.kueue import KueueLikePolicy
from gpusched.simulator.policies.packing import PackingPolicy

Build = Callable[[Sequence[SimNode], Sequence[Tenant], int], SimPolicy]

POLICIES: Final[dict[str, Build]] = {
    "gpusched": lambda nodes, tenants, seed: GpuschedPolicy(nodes, tenants),
    # The same with one reservation per tenant (--reservations-per-tenant=1).
    "gpusched-reservations": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, CycleConfig(reservations_per_tenant=1)
    ),
    # Fair share with memory: past borrowing halves every 7 days (--usage-half-life=168h,
    # Slurm's default PriorityDecayHalfLife).
    "gpusched-usage-decay": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, usage_half_life=7 * 86400.0
    ),
    # Guarantees rounded up to whole jobs (--guarantee-rounding=up).
    "gpusched-guarantee-up": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, CycleConfig(guarantee_rounding="up")
    ),
    # Idle GPUs lent at once, with no hold after a lender's burst (--lending-hold-seconds=0).
    "gpusched-lend-at-once": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, CycleConfig(lending_hold_seconds=0)
    ),
    # Reclaims weighed against the owner's wait for an hour (--reclaim-patience-seconds=3600).
    "gpusched-reclaim-patience": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, CycleConfig(reclaim_patience_seconds=3600)
    ),
    # Expected starts counting each tenant's steady rate of submissions of the last 12 h
    # again over the next 12 h (--forecast-arrivals-window=12h).
    "gpusched-arrivals": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, arrivals_window=WINDOW_SECONDS
    ),
    # Jobs arriving within 5 minutes of a cycle that changed nothing decided on top of it,
    # as of its time, rather than by a whole cycle.
    "gpusched-on-top": lambda nodes, tenants, seed: GpuschedPolicy(
        nodes, tenants, arrivals_on_top=300.0
    ),
    "kube-default": KubeDefaultPolicy,
    "kueue-like": KueueLikePolicy,
    "best-fit": lambda nodes, tenants, seed: PackingPolicy(nodes, NodeRule.BEST_FIT, seed),
    "first-fit": lambda nodes, tenants, seed: PackingPolicy(nodes, NodeRule.FIRST_FIT, seed),
    "random": lambda nodes, tenants, seed: PackingPolicy(nodes, NodeRule.RANDOM, seed),
    # Oracle run times: the replay hands it its own cluster and speed model when it starts.
    "easy-backfill": lambda nodes, tenants, seed: EasyBackfillPolicy(nodes, seed),
}


def build(
    name: str,
    nodes: Sequence[SimNode],
    tenants: Sequence[Tenant],
    seed: int,
    levels: Sequence[Level] = (),
) -> SimPolicy:
    """A fresh policy by name (see :data:`POLICIES`). gpusched's policies read the cluster's
    network ``levels`` (narrowest first) as the operator reads its NetworkTopology; the
    baselines know nodes only."""
    try:
        make = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    policy = make(nodes, tenants, seed)
    if isinstance(policy, GpuschedPolicy):
        policy.levels = tuple(levels)
        policy.name = name  # the variants (reservations, memory) are told apart in reports
    return policy


__all__ = ["POLICIES", "Decisions", "Placed", "SimPolicy", "Start", "build"]
