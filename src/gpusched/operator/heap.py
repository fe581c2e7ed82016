"""The operator's long-lived heap, kept out of the garbage collector's full collections.

Once the store holds the cluster and the first cycle has run, nearly every object in the
process lives as long as the process: the store's jobs, pods, nodes and quotas, the kept pools
and the settled answers. CPython's collector still walks all of them in every full collection
(about a second at 12,000 jobs and 600,000 tracked objects, docs/benchmarks.md), and a full
collection comes due every few busy cycles, stalling the cycle it lands in. Frozen once after
the first cycle (``gc.freeze``, made for this), they are left out of every later collection;
objects made afterwards are collected as before. An object frozen and later dropped is freed by
its reference count as usual; only one that was part of a reference cycle then stays resident,
so what freezing can keep is bounded by the heap frozen, which was resident anyway.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> int:
    """Collect what is garbage now, then move every surviving object to the collector's
    permanent generation. Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
