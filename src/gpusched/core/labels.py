"""Node labels the device probe publishes, computed from a node's topology and health.

Two families: our own keys under ``gpusched.io/`` (always written by the probe), and keys
compatible with NVIDIA GPU Feature Discovery under ``nvidia.com/`` with GFD's exact value
formats, which the probe writes only where GFD does not (:func:`gfd_managed_keys` tells the shell
which ones another writer already holds). Label values are limited to 63 characters of
``[A-Za-z0-9._-]``, so anything free-form is sanitised the way GFD does it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Final

from gpusched.api import keys
from gpusched.api.annotations import whole_number
from gpusched.core import NodeTopology, build_graph, nvlink_islands, prepare

MAX_LABEL_VALUE: Final = 63
_LABEL_VALUE_INVALID: Final = re.compile(r"[^A-Za-z0-9._-]")
_EDGE: Final = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")

#: GFD's ``gpu.family`` by compute capability major version (minor splits 7.x and 8.x).
_FAMILIES: Final[dict[int, str]] = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
    13: "rubin",
}

#: Every ``nvidia.com/`` key :func:`gfd_labels` may produce.
GFD_KEYS: Final = frozenset(
    {
        keys.GFD_PRODUCT,
        keys.GFD_COUNT,
        keys.GFD_MEMORY,
        keys.GFD_FAMILY,
        keys.GFD_COMPUTE_MAJOR,
        keys.GFD_COMPUTE_MINOR,
        keys.GFD_DRIVER_MAJOR,
        keys.GFD_DRIVER_MINOR,
        keys.GFD_DRIVER_REV,
        keys.GFD_DRIVER_FULL,
        keys.GFD_RUNTIME_MAJOR,
        keys.GFD_RUNTIME_MINOR,
        keys.GFD_RUNTIME_FULL,
        keys.GFD_MIG_CAPABLE,
        keys.GFD_CLIQUE,
    }
)


def sanitize_label_value(text: str) -> str:
    """A valid label value from free text, as GFD sanitises product names: characters outside
    ``[A-Za-z0-9._-]`` dropped, spaces turned into ``-``, at most 63 characters, alphanumeric at
    both ends (so ``NVIDIA H100 80GB HBM3`` becomes ``NVIDIA-H100-80GB-HBM3``)."""
    value = _LABEL_VALUE_INVALID.sub("", text.strip().replace(" ", "-"))
    return _EDGE.sub("", value[:MAX_LABEL_VALUE])


def gpu_family(compute_capability: str | None) -> str | None:
    """GFD's architecture family (``hopper``, ``ampere``, ``ada-lovelace`` ...), ``undefined``
    for a capability GFD does not name, None when the capability is unknown or malformed."""
    if not compute_capability:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", compute_capability.strip())
    if match is None:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _FAMILIES.get(major, "undefined")


def _common(values: Iterable[str | None]) -> str | None:
    """The most frequent known value (lowest first occurrence breaks ties)."""
    counts = Counter(v for v in values if v)
    if not counts:
        return None
    return counts.most_common(1)[0][0]


def gpusched_labels(topology: NodeTopology) -> dict[str, str]:
    """Our own labels: counts, model, NVLink islands, NVSwitch, NUMA nodes, wiring hash.

    Wiring labels describe all GPUs (they change only with hardware); ``gpu.healthy`` counts the
    placeable ones and is the label that follows health. A node without GPUs carries counts of 0
    and the ``probed`` marker, so a selector can tell "probed, nothing there" from "not probed".
    """
    labels = {
        keys.LABEL_PROBED: "true",
        keys.LABEL_GPU_COUNT: str(len(topology.gpus)),
        keys.LABEL_GPU_HEALTHY: str(len(topology.placeable_gpus)),
    }
    if not topology.gpus:
        return labels
    model = _common(g.model for g in topology.gpus)
    if model is not None and sanitize_label_value(model):
        labels[keys.LABEL_GPU_MODEL] = sanitize_label_value(model)
    labels[keys.LABEL_NVLINK_ISLANDS] = str(len(nvlink_islands(build_graph(topology))))
    # What the label promises is the largest nvlink-scoped replica: a clique, not an island.
    wiring = prepare(topology).wiring
    labels[keys.LABEL_NVLINK_LARGEST_ISLAND] = str(wiring.largest_nvlink_set(wiring.all_mask))
    labels[keys.LABEL_NVSWITCH] = "true" if topology.nvswitch else "false"
    numa = {g.numa_node for g in topology.gpus if g.numa_node is not None}
    if numa:
        labels[keys.LABEL_NUMA_NODES] = str(len(numa))
    labels[keys.LABEL_TOPOLOGY_HASH] = topology.wiring_hash[:MAX_LABEL_VALUE]
    return labels


def _version_parts(version: str) -> list[str]:
    return [part for part in version.strip().split(".") if part]


def gfd_labels(topology: NodeTopology, *, mig_capable: bool | None = None) -> dict[str, str]:
    """GFD-compatible labels with GFD's value formats (product sanitised, memory in MiB, driver
    version split into major/minor/revision, CUDA version as ``major.minor``). Keys whose value
    is unknown are left out rather than guessed."""
    if not topology.gpus:
        return {}
    labels: dict[str, str] = {keys.GFD_COUNT: str(len(topology.gpus))}
    model = _common(g.model for g in topology.gpus)
    if model is not None and sanitize_label_value(model):
        labels[keys.GFD_PRODUCT] = sanitize_label_value(model)
    memories = [g.memory_mib for g in topology.gpus if g.memory_mib is not None]
    if memories:
        labels[keys.GFD_MEMORY] = str(min(memories))
    capability = _common(g.compute_capability for g in topology.gpus)
    if capability is not None:
        family = gpu_family(capability)
        if family is not None:
            major, minor = capability.split(".")
            labels[keys.GFD_FAMILY] = family
            labels[keys.GFD_COMPUTE_MAJOR] = str(int(major))
            labels[keys.GFD_COMPUTE_MINOR] = str(int(minor))
    if topology.driver_version:
        parts = _version_parts(topology.driver_version)
        full = sanitize_label_value(topology.driver_version)
        if full:
            labels[keys.GFD_DRIVER_FULL] = full
        for key, part in zip(
            (keys.GFD_DRIVER_MAJOR, keys.GFD_DRIVER_MINOR, keys.GFD_DRIVER_REV), parts, strict=False
        ):
            if sanitize_label_value(part):
                labels[key] = sanitize_label_value(part)
    if topology.cuda_driver_version:
        parts = _version_parts(topology.cuda_driver_version)
        if len(parts) >= 2 and all(whole_number(p) is not None for p in parts[:2]):
            labels[keys.GFD_RUNTIME_MAJOR] = parts[0]
            labels[keys.GFD_RUNTIME_MINOR] = parts[1]
            labels[keys.GFD_RUNTIME_FULL] = f"{parts[0]}.{parts[1]}"
    if mig_capable is not None:
        labels[keys.GFD_MIG_CAPABLE] = "true" if mig_capable else "false"
    if topology.clique and sanitize_label_value(topology.clique) == topology.clique:
        labels[keys.GFD_CLIQUE] = topology.clique
    return labels


def gfd_present(labels: Mapping[str, str]) -> bool:
    """Whether GPU Feature Discovery labels this node (it stamps ``nvidia.com/gfd.timestamp``)."""
    return keys.GFD_TIMESTAMP in labels


def gfd_managed_keys(
    labels: Mapping[str, str], foreign_label_keys: Iterable[str]
) -> frozenset[str]:
    """The ``nvidia.com/`` keys the probe must leave alone.

    All of them when GFD runs on the node (its timestamp label is present) or when another writer
    holds ``nvidia.com/gpu.product`` (GFD without timestamps, or an admin's own labelling);
    otherwise just the individual keys another field manager holds. ``foreign_label_keys`` are
    the label keys some field manager other than the probe has set.
    """
    foreign = frozenset(foreign_label_keys)
    if gfd_present(labels) or keys.GFD_PRODUCT in foreign:
        return GFD_KEYS
    return GFD_KEYS & foreign


def node_labels(
    topology: NodeTopology,
    *,
    mig_capable: bool | None = None,
    leave_alone: Iterable[str] = (),
) -> dict[str, str]:
    """Every label the probe applies: its own, plus the GFD-compatible ones not in
    ``leave_alone`` (usually :func:`gfd_managed_keys`)."""
    skip = frozenset(leave_alone)
    gfd = {k: v for k, v in gfd_labels(topology, mig_capable=mig_capable).items() if k not in skip}
    return {**gpusched_labels(topology), **gfd}
