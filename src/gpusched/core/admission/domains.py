"""The cluster's network levels and the choices a gang makes among their domains.

A level is a node label whose value names a network domain: an NVLink clique, a rack, a leaf
switch's block, a spine. The admin lists the levels (narrowest first here; the chart takes them
widest first, as Kueue's Topology does). A gang goes to the narrowest level one of whose domains
holds all of it, and among those domains to the one with the fewest free GPUs (best fit), so the
roomiest domains stay whole for the gangs that need them. A gang split into segments keeps each
segment inside one domain of the segment's level.

These are pure choices over counts (how many replicas each node can still take); the pool turns
them into GPU sets with the placement engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.core.admission.model import AcrossReplicas, Level


@dataclass(frozen=True, slots=True)
class Domain:
    """One domain during a choice: its value, its eligible nodes, and what they can take."""

    value: str
    names: tuple[str, ...]
    free: int
    """Free GPUs on its eligible nodes."""
    capacity: int
    """Replicas of the request its nodes can still take (each node's own count, summed)."""


def level_chain(
    levels: Sequence[Level], across: AcrossReplicas | None, replicas: int
) -> tuple[Level, ...]:
    """The levels whose single domains are tried for the whole gang, narrowest first.

    A gang that names a level tries the configured levels below it first and stops at it when
    the level is required; when it is preferred, the wider levels follow (one rack of a block
    before two racks of it). A gang that names none tries every level: being close costs it
    nothing. A single replica lives on one node and needs no domain."""
    if across is None:
        return tuple(levels) if replicas > 1 else ()
    index = next((i for i, lv in enumerate(levels) if lv.node_label == across.node_label), None)
    if index is None:
        own = (Level(across.node_label),)
        return own if across.required else own + tuple(levels)
    return tuple(levels[: index + 1]) if across.required else tuple(levels)


def level_of(levels: Sequence[Level], label: str) -> Level:
    """The configured level of ``label``, or a plain one."""
    return next((lv for lv in levels if lv.node_label == label), Level(label))


def segments_in(domains: Sequence[Domain], segment: int, count: int) -> list[tuple[Domain, int]]:
    """How many segments (of ``segment`` replicas each) go to which domain: as few domains as
    possible, one domain by best fit when one holds them all, otherwise the domains that take
    the most segments first. Empty when they do not hold ``count`` segments together."""
    holding = [(d.capacity // segment, d) for d in domains if d.capacity >= segment]
    if sum(n for n, _ in holding) < count:
        return []
    whole = [d for n, d in holding if n >= count]
    if whole:
        return [(min(whole, key=lambda d: (d.free, d.value)), count)]
    out: list[tuple[Domain, int]] = []
    left = count
    for n, d in sorted(holding, key=lambda item: (-item[0], item[1].free, item[1].value)):
        take = min(n, left)
        out.append((d, take))
        left -= take
        if left == 0:
            break
    return out


def fewest_domains(domains: Sequence[Domain], replicas: int) -> list[tuple[Domain, int]]:
    """Replicas per domain for a gang no single domain holds: the fewest domains (the ones that
    take the most replicas first). May hold fewer than ``replicas`` in all."""
    out: list[tuple[Domain, int]] = []
    left = replicas
    for d in sorted(domains, key=lambda d: (-d.capacity, d.free, d.value)):
        if left == 0:
            break
        if d.capacity == 0:
            continue
        take = min(d.capacity, left)
        out.append((d, take))
        left -= take
    return out
