"""The tenant tree: TenantQuotas that name a parent (an organisation over its teams).

Jobs belong to leaves. A tenant's *levels* are itself and its ancestors, nearest first; every
level's borrowing limit, budget and per-user caps apply to its whole subtree, and every level's
guarantee is what its subtree can always take back from outside it (docs/quotas.md, "The tenant
tree"). A parent that does not exist, or a chain of parents that comes back to itself, is not a
tree: such tenants are roots, and :attr:`TenantTree.broken` names them so the operator can say
so on their TenantQuotas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched.core.admission.model import Tenant


@dataclass(frozen=True)
class TenantTree:
    """Parents and children of the tenants of one snapshot."""

    parent: Mapping[str, str]
    """Child -> parent, valid edges only."""
    children: Mapping[str, tuple[str, ...]]
    """Parent -> its children (only tenants that have some)."""
    broken: Mapping[str, str]
    """Tenant -> why its ``parent`` was ignored (missing, or part of a cycle)."""

    @classmethod
    def of(cls, tenants: Iterable[Tenant]) -> TenantTree:
        by_name = {t.name: t for t in tenants}
        parent: dict[str, str] = {}
        broken: dict[str, str] = {}
        for name, tenant in sorted(by_name.items()):
            if tenant.parent is None:
                continue
            if tenant.parent not in by_name:
                broken[name] = f"parent TenantQuota {tenant.parent} does not exist"
            else:
                parent[name] = tenant.parent
        # Cut every cycle: a tenant whose chain of parents comes back to it is a root.
        for name in sorted(parent):
            seen = [name]
            at = parent.get(name)
            while at is not None and at not in seen:
                seen.append(at)
                at = parent.get(at)
            if at == name:
                chain = " -> ".join([*seen, name])
                for member in seen:
                    broken[member] = f"its parents form a cycle ({chain})"
        for member in broken:
            parent.pop(member, None)
        children: dict[str, list[str]] = {}
        for child, up in sorted(parent.items()):
            children.setdefault(up, []).append(child)
        return cls(parent, {k: tuple(v) for k, v in children.items()}, broken)

    @property
    def flat(self) -> bool:
        """No tenant has a parent."""
        return not self.parent

    def levels(self, name: str) -> tuple[str, ...]:
        """The tenant and its ancestors, nearest first."""
        out = [name]
        at = self.parent.get(name)
        while at is not None:
            out.append(at)
            at = self.parent.get(at)
        return tuple(out)

    def ancestors(self, name: str) -> tuple[str, ...]:
        """Its ancestors, nearest first."""
        return self.levels(name)[1:]

    def is_parent(self, name: str) -> bool:
        """Whether the tenant has children (its namespaces hold no jobs of their own)."""
        return name in self.children

    def within(self, name: str, level: str) -> bool:
        """Whether ``name`` is ``level`` or below it."""
        return level in self.levels(name)

    def lending_path(self, lender: str, claimant_level: str) -> tuple[str, ...]:
        """The levels of ``lender`` that a job claiming at ``claimant_level`` takes GPUs back
        from: the lender and its ancestors below their lowest common ancestor (all of them
        when the two are in different trees). Empty when the lender is at or below the
        claimant's level (inside what the claim is for)."""
        mine = set(self.levels(claimant_level))
        out: list[str] = []
        for level in self.levels(lender):
            if level in mine:
                break
            out.append(level)
        return () if claimant_level in self.levels(lender) else tuple(out)

    def leaves_under(self, level: str, tenants: Iterable[str]) -> list[str]:
        """The tenants among ``tenants`` at or below ``level``."""
        return [t for t in tenants if self.within(t, level)]
