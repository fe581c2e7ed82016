"""Which GPUs a bound pod holds, read only from what gpusched itself wrote.

Three components write GPU identities on pods, each through its own identity: the extender
(``gpusched.io/gpus``, ``gpu-indices``, in the Binding that binds a ``schedulerName: gpusched``
pod), the node agent (``allocated-gpus``, ``allocated-gpu-indices``: what the kubelet really
allocated) and the operator (``planned-node``, ``planned-gpu-indices``, on the pods of a GpuJob
it creates). The chart's admission policy refuses these keys from anyone else; this module is
the second line: every component reads a pod's GPUs through it, and it believes an annotation
only where gpusched could have written it:

* the extender's set only on a pod for the gpusched scheduler;
* any set only when it names exactly as many GPUs as the pod requests (a one-GPU pod claiming a
  whole node claims nothing);
* a plan only on a pod controlled by a GpuJob (ownerReference and ``job-uid`` label agree).

A claim that fails is ignored (the pod's GPUs count, but not which ones) and the reason is kept
for ``gpusched explain``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.api import keys
from gpusched.api.annotations import parse_indices


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """The GPU indices a pod is believed to hold, and what was not believed."""

    assigned: tuple[int, ...] | None = None
    """The extender's set (``gpu-indices``), when trusted."""
    allocated: tuple[int, ...] | None = None
    """The kubelet's allocation as the node agent recorded it (``allocated-gpu-indices``), when
    trusted."""
    ignored: tuple[str, ...] = ()
    """Sentences naming each annotation that was not believed, and why."""

    @property
    def held(self) -> tuple[int, ...] | None:
        """Every trusted index, increasing: a pod whose assignment and allocation differ (drift)
        keeps both sets out of other pods' reach until the difference is resolved."""
        if self.assigned is None and self.allocated is None:
            return None
        return tuple(sorted({*(self.assigned or ()), *(self.allocated or ())}))


def scheduled_by_gpusched(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is for the gpusched scheduler (so only the extender binds it)."""
    return (pod.get("spec") or {}).get("schedulerName") == keys.SCHEDULER_NAME


def controlling_gpujob(pod: Mapping[str, Any]) -> str | None:
    """UID of the GpuJob controlling the pod, when its controller reference and its
    ``gpusched.io/job-uid`` label agree (the pods the operator creates); else None."""
    meta = pod.get("metadata") or {}
    uid = (meta.get("labels") or {}).get(keys.LABEL_JOB_UID)
    if not uid:
        return None
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") == "GpuJob"
            and str(ref.get("apiVersion", "")).startswith(keys.PREFIX)
            and ref.get("uid") == uid
        ):
            return str(uid)
    return None


def distinct_indices(value: str | None) -> tuple[int, ...] | None:
    """An index list that names no GPU twice, increasing; None when absent or malformed. A set
    naming a GPU twice holds fewer GPUs than it lists, so no component believes it."""
    indices = parse_indices(value)
    if indices is None or len(set(indices)) != len(indices):
        return None
    return indices


def _claim(
    annotations: Mapping[str, str], key: str, count: int, ignored: list[str]
) -> tuple[int, ...] | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    indices = distinct_indices(raw)
    if indices is None:
        ignored.append(f"{key}={raw!r} is not a list of distinct GPU indices")
        return None
    if len(indices) != count:
        ignored.append(
            f"{key}={raw!r} names {len(indices)} GPU(s) but the pod requests {count}: not believed"
        )
        return None
    return indices


def gpu_claim(pod: Mapping[str, Any], count: int) -> GpuClaim:
    """The GPUs a bound pod requesting ``count`` GPUs is believed to hold."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    return claim_of(annotations, count, for_gpusched=scheduled_by_gpusched(pod))


def claim_of(annotations: Mapping[str, str], count: int, *, for_gpusched: bool) -> GpuClaim:
    """:func:`gpu_claim` from a pod's annotations, GPU request and whether it is for the gpusched
    scheduler."""
    ignored: list[str] = []
    assigned = None
    if keys.ANNOTATION_GPU_INDICES in annotations:
        if for_gpusched:
            assigned = _claim(annotations, keys.ANNOTATION_GPU_INDICES, count, ignored)
        else:
            ignored.append(
                f"{keys.ANNOTATION_GPU_INDICES} on a pod gpusched did not schedule "
                "(schedulerName is not gpusched): not believed"
            )
    allocated = _claim(annotations, keys.ANNOTATION_ALLOCATED_GPU_INDICES, count, ignored)
    return GpuClaim(assigned, allocated, tuple(ignored))


def planned_for(pod: Mapping[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    """The node and GPUs admission planned for the pod: only on a GpuJob's pod, and GPUs only
    when they are distinct indices."""
    if controlling_gpujob(pod) is None:
        return None, None
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    return (
        annotations.get(keys.ANNOTATION_PLANNED_NODE) or None,
        distinct_indices(annotations.get(keys.ANNOTATION_PLANNED_GPU_INDICES)),
    )


def unplaced_order(indices: Iterable[int], degraded: Collection[int]) -> list[int]:
    """GPU indices in the order a pod gpusched did not place gets them: the order placement is
    least likely to choose them (it avoids Degraded GPUs and breaks ties towards the lowest
    indices, :mod:`gpusched.core.objective`)."""
    return sorted(indices, key=lambda i: (i not in degraded, -i))
