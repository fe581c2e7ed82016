"""GPU bookkeeping and the topology-blind choices the baselines make.

The baselines stand for schedulers that count GPUs per node: which node is decided by a score
over counts (most free, fewest free, first, random), and which GPUs inside it by a rule that
ignores the wiring (lowest free indices) or by NVIDIA's device plugin (its best-effort policy,
:func:`gpusched.core.baselines.gpuallocator_best_effort`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpusched.core.baselines import first_fit, gpuallocator_best_effort
from gpusched.simulator.model import JobSpec, SimNode
from gpusched.simulator.policies.base import Placed


class NodeRule(StrEnum):
    """How a baseline picks a node among those with room."""

    SPREAD = "spread"
    """Most free GPUs (kube-scheduler's LeastAllocated scoring); ties at random."""
    BEST_FIT = "best-fit"
    """Fewest free GPUs left (packing); ties by name."""
    FIRST_FIT = "first-fit"
    """First node by name with room."""
    RANDOM = "random"
    """Any node with room, uniformly."""


class GpuRule(StrEnum):
    """How a baseline picks GPUs inside the node."""

    LOWEST = "lowest"
    """The lowest free indices (an allocator that ignores the wiring)."""
    DEVICE_PLUGIN = "device-plugin"
    """NVIDIA's device plugin (``GetPreferredAllocation``, best-effort policy)."""


@dataclass
class _Slot:
    node: SimNode
    free: list[int]
    """Free GPU indices, ascending."""


class Book:
    """Which GPUs each node has free, as a count-based scheduler sees it."""

    def __init__(
        self,
        nodes: Sequence[SimNode],
        node_rule: NodeRule,
        gpu_rule: GpuRule,
        seed: int = 0,
    ) -> None:
        self.slots = {
            n.name: _Slot(n, list(n.topology.indices(n.topology.placeable_mask)))
            for n in sorted(nodes, key=lambda n: n.name)
        }
        self.node_rule = node_rule
        self.gpu_rule = gpu_rule
        self.random = random.Random(seed)
        self._chosen: dict[tuple[str, tuple[int, ...], int], tuple[int, ...]] = {}
        self.padding_fallbacks = 0
        self.largest_node = max((len(s.free) for s in self.slots.values()), default=0)

    def fits(self, node: SimNode, job: JobSpec) -> bool:
        """Whether the node may run the job's replicas at all (model)."""
        return job.gpu_model is None or node.model == job.gpu_model

    def candidates(self, job: JobSpec, k: int, taken: dict[str, int]) -> list[_Slot]:
        """Nodes that can hold one more replica of ``k`` GPUs (``taken``: GPUs tentatively
        taken on each node by earlier replicas of the same gang)."""
        return [
            s
            for s in self.slots.values()
            if len(s.free) - taken.get(s.node.name, 0) >= k and self.fits(s.node, job)
        ]

    def pick_node(self, slots: list[_Slot], taken: dict[str, int]) -> _Slot:
        """The node the rule picks among ``slots`` (not empty)."""
        rule = self.node_rule
        if rule is NodeRule.FIRST_FIT:
            return slots[0]
        if rule is NodeRule.RANDOM:
            return self.random.choice(slots)

        def free(s: _Slot) -> int:
            return len(s.free) - taken.get(s.node.name, 0)

        if rule is NodeRule.BEST_FIT:
            return min(slots, key=free)
        most = max(free(s) for s in slots)
        return self.random.choice([s for s in slots if free(s) == most])

    def pick_gpus(self, slot: _Slot, k: int, exclude: Sequence[int] = ()) -> tuple[int, ...]:
        """The GPUs the rule hands a replica of ``k`` on ``slot``."""
        available = tuple(g for g in slot.free if g not in exclude)
        if self.gpu_rule is GpuRule.LOWEST or k == 1:
            chosen = first_fit(available, k)
            assert chosen is not None
            return chosen
        key = (slot.node.topology.wiring.key, available, k)
        found = self._chosen.get(key)
        if found is None:
            result = gpuallocator_best_effort(slot.node.topology.topology, available, k)
            assert result is not None
            if result.padding_bug:
                # The plugin would fail the allocation; kubelet then uses its own choice.
                self.padding_fallbacks += 1
                lowest = first_fit(available, k)
                assert lowest is not None
                found = lowest
            else:
                found = result.gpus
            self._chosen[key] = found
        return found

    def place_gang(self, job: JobSpec) -> tuple[Placed, ...] | None:
        """Every replica of ``job`` on nodes with room now, or None (nothing is taken)."""
        k = job.gpus_per_replica
        if k > self.largest_node:
            return None
        taken: dict[str, int] = {}
        chosen: dict[str, list[int]] = {}
        out: list[Placed] = []
        for _ in range(job.replicas):
            slots = self.candidates(job, k, taken)
            if not slots:
                return None
            slot = self.pick_node(slots, taken)
            gpus = self.pick_gpus(slot, k, chosen.get(slot.node.name, ()))
            taken[slot.node.name] = taken.get(slot.node.name, 0) + k
            chosen.setdefault(slot.node.name, []).extend(gpus)
            out.append(Placed(slot.node.name, gpus))
        return tuple(out)

    def take(self, placed: Placed) -> None:
        slot = self.slots[placed.node]
        slot.free = [g for g in slot.free if g not in placed.gpus]

    def give_back(self, placed: Placed) -> None:
        slot = self.slots[placed.node]
        slot.free = sorted((*slot.free, *placed.gpus))
