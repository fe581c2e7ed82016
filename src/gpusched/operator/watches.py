"""What the operator watches, in one table, and how each kind reaches the store.

Six kinds come through kopf (one watch per kind, ``@kopf.on.event`` into a
:class:`~gpusched.operator.feeds.KindFeed`). Pods stay on :class:`gpusched.kubewatch.Reflector`:
they are the busiest kind (about three watch events per admitted job), kopf costs about 1 ms of
CPU more per event, and its one watch per kind cannot carry gpusched's two pod watches with
different selectors (``docs/architecture.md``, "What kopf does here"). ``gpusched explain`` lists
the same table once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusched.api import keys
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.kubewatch import Reflector
from gpusched.metrics import OperatorMetrics
from gpusched.operator import api as paths
from gpusched.operator.feeds import KindFeed, not_installed
from gpusched.operator.store import Store

Raw = Mapping[str, Any]


@dataclass(frozen=True)
class Watched:
    """One watched kind: where it is listed and watched, and the store's methods for it."""

    name: str
    path: str
    methods: tuple[str, str, str]
    """The store's replace, upsert and delete methods."""
    resource: tuple[str, str, str] | None = None
    """(group, version, plural) when kopf watches the kind; None: a kubewatch Reflector."""
    params: Mapping[str, str] = field(default_factory=dict)
    optional: bool = False
    """The CRD may not be installed: a 404 means no objects."""

    def bound(
        self, store: Store
    ) -> tuple[
        Callable[[list[dict[str, Any]]], None], Callable[[Raw], None], Callable[[Raw], None]
    ]:
        replace, upsert, delete = self.methods
        return getattr(store, replace), getattr(store, upsert), getattr(store, delete)


G, V = keys.GROUP, keys.VERSION

WATCHED = (
    Watched(
        "gpujobs",
        paths.GPUJOBS,
        ("replace_jobs", "upsert_job", "delete_job"),
        (G, V, "gpujobs"),
    ),
    Watched(
        "jobpods",
        paths.PODS,
        ("replace_job_pods", "upsert_job_pod", "delete_job_pod"),
        params={"labelSelector": keys.LABEL_JOB_NAME},
    ),
    Watched(
        "gpupods",
        paths.PODS,
        ("replace_gpu_pods", "upsert_gpu_pod", "delete_gpu_pod"),
        params={
            "labelSelector": f"!{keys.LABEL_JOB_NAME}",
            "fieldSelector": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        },
    ),
    Watched(
        "nodes", paths.NODES, ("replace_nodes", "upsert_node", "delete_node"), ("", "v1", "nodes")
    ),
    Watched(
        "nodegputopologies",
        paths.TOPOLOGIES,
        ("replace_topologies", "upsert_topology", "delete_topology"),
        (G, V, "nodegputopologies"),
    ),
    Watched(
        "tenantquotas",
        paths.TENANTQUOTAS,
        ("replace_quotas", "upsert_quota", "delete_quota"),
        (G, V, "tenantquotas"),
    ),
    Watched(
        "networktopologies",
        paths.NETWORKTOPOLOGIES,
        ("replace_network", "upsert_network", "delete_network"),
        (G, V, "networktopologies"),
        optional=True,
    ),
    Watched(
        "priorities",
        paths.PRIORITY_CLASSES,
        ("replace_priorities", "upsert_priority", "delete_priority"),
        ("scheduling.k8s.io", "v1", "priorityclasses"),
    ),
)


class _Consumer:
    """A reflector's consumer made of three store methods."""

    def __init__(self, replace: Any, upsert: Any, delete: Any) -> None:
        self.replace, self.upsert, self.delete = replace, upsert, delete


def reflectors(api: AsyncApi, store: Store, metrics: OperatorMetrics) -> list[Reflector]:
    """The kubewatch watches: the kinds kopf does not watch (pods)."""

    def failed(kind: str, err: BaseException) -> None:
        metrics.api_errors.labels(f"watch-{kind}").inc()

    return [
        Reflector(w.name, api, w.path, _Consumer(*w.bound(store)), params=w.params, on_error=failed)
        for w in WATCHED
        if w.resource is None
    ]


def feeds(store: Store, metrics: OperatorMetrics) -> list[KindFeed]:
    """The kopf-fed kinds, each with its anchor and reconcile LISTs."""

    def failed(kind: str, err: BaseException) -> None:
        metrics.api_errors.labels(f"list-{kind}").inc()

    return [
        KindFeed(w.name, w.path, *w.bound(store), on_error=failed, optional=w.optional)
        for w in WATCHED
        if w.resource is not None
    ]


async def list_all(api: AsyncApi, store: Store) -> None:
    """Every watched kind listed once into ``store`` (``gpusched explain``)."""

    async def one(watched: Watched) -> list[dict[str, Any]]:
        try:
            items, _ = await api.list(watched.path, watched.params)
        except ApiError as err:
            if not (watched.optional and not_installed(err)):
                raise
            return []
        return items

    lists = await asyncio.gather(*(one(w) for w in WATCHED))
    for watched, items in zip(WATCHED, lists, strict=True):
        replace, _, _ = watched.bound(store)
        replace(items)
