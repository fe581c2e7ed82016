"""What-if: how each policy's headline figures moved between two replays of the same policies
(e.g. the same trace on a cluster with more GPUs, or with another tenant setup).

Policies are matched by name; a policy in only one of the two is listed, not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpusched.simulator.figures import Figures, figures, headline
from gpusched.simulator.model import RunResult


def _delta(base: float | None, changed: float | None) -> tuple[float | None, float | None]:
    """(changed - base, the same in % of base); ``None`` where undefined."""
    if base is None or changed is None:
        return None, None
    d = changed - base
    return d, (100.0 * d / abs(base) if base else None)


@dataclass(frozen=True, slots=True)
class Change:
    """One figure before and after."""

    figure: str
    base: float | None
    changed: float | None
    delta: float | None
    """changed - base."""
    pct: float | None
    """delta in % of |base| (None when base is 0 or missing)."""

    @classmethod
    def of(cls, figure: str, base: float | None, changed: float | None) -> Change:
        """The change of ``figure`` from ``base`` to ``changed``."""
        d, pct = _delta(base, changed)
        return cls(figure, base, changed, d, pct)


@dataclass(frozen=True, slots=True)
class TenantChange:
    """One tenant's mean share (fraction of capacity) and mean queueing delay (s), before and
    after."""

    tenant: str
    share: Change
    queueing: Change


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """Every headline figure of one policy, and its tenants, before and after (the changed run's
    tenants, then those only in the baseline)."""

    policy: str
    figures: tuple[Change, ...]
    tenants: tuple[TenantChange, ...]


@dataclass(frozen=True)
class WhatIf:
    """The changes of every policy present in both replays."""

    policies: tuple[PolicyChange, ...]
    only_base: tuple[str, ...]
    """Policies only in the base replay."""
    only_changed: tuple[str, ...]
    """Policies only in the changed replay."""

    def to_json(self) -> dict[str, Any]:
        """A dict of plain JSON types."""
        return asdict(self)


def diff_figures(base: Sequence[Figures], changed: Sequence[Figures]) -> WhatIf:
    """:func:`diff` on figures already computed."""
    before: Mapping[str, Figures] = {f.policy: f for f in base}
    after: Mapping[str, Figures] = {f.policy: f for f in changed}
    policies = []
    for name, new in after.items():
        old = before.get(name)
        if old is None:
            continue
        h0, h1 = headline(old), headline(new)
        changes = tuple(Change.of(k, h0[k], h1[k]) for k in h0)
        t0 = {t.name: t for t in old.tenants}
        present = {t.name for t in new.tenants}
        tenants = []
        for t in new.tenants:
            prev = t0.get(t.name)
            tenants.append(
                TenantChange(
                    t.name,
                    Change.of("mean share", prev.mean_share if prev else None, t.mean_share),
                    Change.of(
                        "mean queueing delay (s)",
                        prev.queueing.mean if prev else None,
                        t.queueing.mean,
                    ),
                )
            )
        # A tenant only in the baseline (other TenantQuotas) is listed too: what it held goes.
        tenants += [
            TenantChange(
                t.name,
                Change.of("mean share", t.mean_share, None),
                Change.of("mean queueing delay (s)", t.queueing.mean, None),
            )
            for t in old.tenants
            if t.name not in present
        ]
        policies.append(PolicyChange(name, changes, tuple(tenants)))
    return WhatIf(
        policies=tuple(policies),
        only_base=tuple(n for n in before if n not in after),
        only_changed=tuple(n for n in after if n not in before),
    )


def diff(base: Sequence[RunResult], changed: Sequence[RunResult]) -> WhatIf:
    """How each policy's headline figures and tenants moved from ``base`` to ``changed``."""
    return diff_figures([figures(r) for r in base], [figures(r) for r in changed])
