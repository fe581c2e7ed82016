"""The extender's cache: who holds which GPU, assumptions, and rebuilding from pod annotations."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.api import keys
from gpusched.dev.localcluster.topologies import fixture_objects
from gpusched.scheduler.cache import (
    ASSUME_TTL_SECONDS,
    TENTATIVE_SECONDS,
    Assumption,
    ClusterCache,
)


def topology_object(node: str, fixture: str = "hgx-h100-sxm-8gpu-8nic") -> dict[str, Any]:
    spec, status = fixture_objects(fixture, node)
    return {"metadata": {"name": node}, "spec": spec.to_k8s(), "status": status.to_k8s()}


def pod(
    name: str,
    node: str | None,
    gpus: int,
    indices: str | None = None,
    *,
    phase: str = "Running",
    uid: str | None = None,
    scheduler: str = keys.SCHEDULER_NAME,
) -> dict[str, Any]:
    annotations = {keys.ANNOTATION_GPU_INDICES: indices} if indices is not None else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "schedulerName": scheduler,
            "containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cache() -> ClusterCache:
    cache = ClusterCache(clock=Clock())
    cache.replace_topologies([topology_object("n1"), topology_object("n2")])
    cache.replace_pods([])
    return cache


def test_cache_is_not_ready_until_both_initial_lists_arrived() -> None:
    cache = ClusterCache()
    assert not cache.ready
    cache.replace_topologies([])
    assert not cache.ready
    cache.replace_pods([])
    assert cache.ready


def test_rebuild_from_pod_annotations_marks_their_gpus_held(cache: ClusterCache) -> None:
    cache.replace_pods([pod("a", "n1", 2, "0,1"), pod("b", "n1", 1, "5"), pod("c", "n2", 1, "3")])
    assert cache.view("n1").busy == {0, 1, 5}
    assert cache.view("n2").busy == {3}


def test_terminal_and_unbound_pods_hold_nothing(cache: ClusterCache) -> None:
    cache.replace_pods(
        [
            pod("done", "n1", 2, "0,1", phase="Succeeded"),
            pod("failed", "n1", 1, "2", phase="Failed"),
            pod("pending", None, 2, "3,4"),
        ]
    )
    assert cache.view("n1").busy == frozenset()


def test_bound_gpu_pod_without_assignment_counts_as_unaccounted(cache: ClusterCache) -> None:
    cache.apply_pod(pod("foreign", "n1", 3))
    view = cache.view("n1")
    assert view.busy == frozenset()
    assert view.unaccounted == 3


def test_assumed_gpus_are_busy_until_forgotten(cache: ClusterCache) -> None:
    cache.assume(Assumption(uid="u1", key="ns/x", node="n1", gpus=(2, 3), topology_class="nvlink"))
    assert cache.view("n1").busy == {2, 3}
    assert cache.view("n1", excluding_uid="u1").busy == frozenset()
    cache.forget("u1")
    assert cache.view("n1").busy == frozenset()


def test_watch_confirmation_replaces_the_assumption(cache: ClusterCache) -> None:
    cache.assume(
        Assumption(uid="uid-x", key="ns/x", node="n1", gpus=(2, 3), topology_class="nvlink")
    )
    cache.mark_bound("uid-x")
    cache.apply_pod(pod("x", "n1", 2, "2,3"))
    assert "uid-x" not in cache.assumptions
    assert cache.view("n1").busy == {2, 3}


def test_bound_but_unconfirmed_assumption_expires_after_its_ttl(cache: ClusterCache) -> None:
    clock = cache.clock
    cache.assume(Assumption(uid="u1", key="ns/x", node="n1", gpus=(0,), topology_class="nvlink"))
    assert cache.expire() == 0  # bind still in flight: never expires
    cache.mark_bound("u1")
    clock.now += ASSUME_TTL_SECONDS + 1
    assert cache.expire() == 1
    assert cache.view("n1").busy == frozenset()


def test_a_relist_frees_the_gpus_of_binds_whose_pods_it_no_longer_shows(
    cache: ClusterCache,
) -> None:
    """Bound before the list was sent and absent from it: deleted while the watch was down.
    Listed: the pod itself holds its GPUs. Bound after it was sent, or still binding: kept (the
    list may predate them)."""
    clock = cache.clock
    for uid, gpus in (("gone", (0,)), ("kept", (1,)), ("later", (2,)), ("binding", (3,))):
        cache.assume(
            Assumption(uid=uid, key=f"ns/{uid}", node="n1", gpus=gpus, topology_class="nvlink")
        )
    cache.mark_bound("gone")
    cache.mark_bound("kept")
    clock.now += 1
    cache.listing_pods()
    clock.now += 1
    cache.mark_bound("later")
    cache.replace_pods([pod("kept", "n1", 1, "1", uid="kept")])
    assert set(cache.assumptions) == {"later", "binding"}
    assert cache.view("n1").busy == {1, 2, 3}


def test_deleting_a_pod_frees_its_gpus_and_any_assumption(cache: ClusterCache) -> None:
    cache.apply_pod(pod("a", "n1", 2, "0,1"))
    cache.assume(
        Assumption(uid="uid-a", key="ns/a", node="n1", gpus=(0, 1), topology_class="nvlink")
    )
    cache.delete_pod(pod("a", "n1", 2, "0,1"))
    assert cache.view("n1").busy == frozenset()
    assert cache.assumptions == {}


def test_annotation_naming_gpus_the_node_lacks_is_ignored(cache: ClusterCache) -> None:
    cache.apply_pod(pod("odd", "n1", 2, "1,42"))
    assert cache.view("n1").busy == {1}


def test_malformed_topology_object_is_isolated(cache: ClusterCache) -> None:
    cache.apply_topology({"metadata": {"name": "broken"}, "spec": {"gpus": "many"}})
    assert "broken" not in cache.topologies
    assert "broken" in cache.topology_errors
    assert cache.view("broken").prepared is None
    assert cache.view("n1").prepared is not None


def test_free_gpus_by_model_subtracts_held_gpus(cache: ClusterCache) -> None:
    cache.apply_pod(pod("a", "n1", 4, "0,1,2,3"))
    assert sum(cache.free_by_model().values()) == 12


def test_assumption_of_a_bind_that_never_returned_expires(cache: ClusterCache) -> None:
    from gpusched.scheduler.cache import ABANDONED_BIND_SECONDS

    clock = cache.clock
    cache.assume(Assumption(uid="u1", key="ns/x", node="n1", gpus=(0,), topology_class="nvlink"))
    clock.now += ABANDONED_BIND_SECONDS + 1
    assert cache.expire() == 1


def test_watch_confirmation_on_another_node_drops_a_stale_assumption(cache: ClusterCache) -> None:
    # kube-scheduler retried the bind on n2 while the first attempt, on n1, landed.
    cache.assume(
        Assumption(uid="uid-x", key="ns/x", node="n2", gpus=(0, 1), topology_class="nvlink")
    )
    cache.apply_pod(pod("x", "n1", 2, "4,5"))
    assert "uid-x" not in cache.assumptions
    assert cache.view("n2").busy == frozenset()
    assert cache.view("n1").busy == {4, 5}


def test_views_of_nodes_that_do_not_exist_are_not_kept() -> None:
    cache = ClusterCache()
    cache.replace_topologies([topology_object("real")])
    cache.replace_pods([])
    views = cache.views(["real", *(f"ghost-{i}" for i in range(1000))])
    assert views[1].prepared is None
    assert set(cache._views) == {"real"}


def tentative(uid: str, gpus: tuple[int, ...], node: str = "n1") -> Assumption:
    return Assumption(
        uid=uid, key=f"ns/{uid}", node=node, gpus=gpus, topology_class="nvlink", tentative=True
    )


def test_filter_time_reservation_holds_its_gpus_until_its_short_ttl(cache: ClusterCache) -> None:
    clock = cache.clock
    cache.assume(tentative("u1", (0, 1)))
    assert cache.view("n1").busy == {0, 1}
    clock.now += TENTATIVE_SECONDS - 1
    assert cache.expire() == 0
    clock.now += 2
    assert cache.expire() == 1
    assert cache.view("n1").busy == frozenset()


def test_pod_filtered_again_drops_only_its_filter_time_reservation(cache: ClusterCache) -> None:
    cache.assume(tentative("u1", (0, 1)))
    cache.assume(Assumption(uid="u2", key="ns/u2", node="n1", gpus=(2,), topology_class="nvlink"))
    cache.forget_tentative("u1")
    cache.forget_tentative("u2")  # a bind in flight keeps its reservation
    assert cache.view("n1").busy == {2}


def test_reservation_no_longer_holds_once_another_pod_has_one_of_its_gpus(
    cache: ClusterCache,
) -> None:
    reservation = tentative("u1", (0, 1))
    cache.assume(reservation)
    assert cache.holds(reservation)
    cache.apply_pod(pod("other", "n1", 1, "1"))
    assert not cache.holds(reservation)


# --- annotations a user could forge --------------------------------------------------------


def test_a_one_gpu_pod_claiming_every_gpu_holds_one_unknown_gpu(cache: ClusterCache) -> None:
    """A set naming more GPUs than the pod requests is no set the extender wrote: the node is
    not made to look full, only the pod's own request counts."""
    cache.apply_pod(pod("greedy", "n1", 1, "0,1,2,3,4,5,6,7"))
    view = cache.view("n1")
    assert view.busy == frozenset()
    assert view.unaccounted == 1


def test_gpu_indices_on_another_schedulers_pod_are_not_believed(cache: ClusterCache) -> None:
    cache.apply_pod(pod("nodename", "n1", 2, "4,5", scheduler="default-scheduler"))
    view = cache.view("n1")
    assert view.busy == frozenset()
    assert view.unaccounted == 2


def test_a_bound_pods_set_changed_later_keeps_the_bound_set(cache: ClusterCache) -> None:
    """gpusched never rewrites a bound pod's GPUs: a pod whose annotation is changed to another
    pod's GPUs keeps the ones it was bound to, and the extender never hands those out."""
    cache.replace_pods([pod("mine", "n1", 2, "0,1"), pod("theirs", "n1", 2, "2,3")])
    cache.apply_pod(pod("mine", "n1", 2, "2,3"))
    assert cache.view("n1").busy == {0, 1, 2, 3}
    assert cache.pods["ns/mine"].gpus == (0, 1)
    # A relist (after a watch expired) remembers the bound set too.
    cache.replace_pods([pod("mine", "n1", 2, "2,3"), pod("theirs", "n1", 2, "2,3")])
    assert cache.view("n1").busy == {0, 1, 2, 3}


def test_the_kubelets_allocation_is_held_beside_the_assignment(cache: ClusterCache) -> None:
    """When a pod really holds other GPUs than its assignment (drift the node agent reported),
    both sets stay out of other pods' reach."""
    body = pod("drifted", "n1", 2, "0,1")
    body["metadata"]["annotations"][keys.ANNOTATION_ALLOCATED_GPU_INDICES] = "0,6"
    cache.apply_pod(body)
    assert cache.view("n1").busy == {0, 1, 6}


def _network(*labels: str, name: str = "default") -> dict[str, Any]:
    """A NetworkTopology listing ``labels`` widest first, as the API takes them."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "NetworkTopology",
        "metadata": {"name": name},
        "spec": {
            "levels": [{"name": f"l{i}", "nodeLabel": label} for i, label in enumerate(labels)]
        },
    }


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_views_carry_each_nodes_domains_narrowest_level_first(cache: ClusterCache) -> None:
    rack, clique = "topology.kubernetes.io/rack", keys.GFD_CLIQUE
    cache.replace_nodes([_node("n1", **{rack: "r1", clique: "c1"}), _node("n2", **{rack: "r1"})])
    assert cache.view("n1").domains == ()  # no levels yet
    cache.replace_levels([_network(rack, clique), _network(clique, name="other")])
    assert cache.view("n1").domains == ("c1", "r1")
    assert cache.view("n2").domains == (None, "r1")
    # A relabelled node is seen at once (its cached view is dropped).
    cache.apply_node(_node("n2", **{rack: "r2", clique: "c2"}))
    assert cache.view("n2").domains == ("c2", "r2")
    cache.delete_levels(_network(name="default"))
    assert cache.view("n1").domains == ()
