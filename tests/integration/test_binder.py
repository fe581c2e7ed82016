"""The extender's binder refusing, or finding a bind already done, against the real API server:
a node that no longer fits, a pod already bound (here or elsewhere), a pod gone or recreated, and
a Binding call that fails although the pod is bound."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from kubernetes import client

from gpusched.api import keys
from gpusched.api.extender import ExtenderBindingArgs
from gpusched.api.gpujob import TopologyScope
from gpusched.core.scheduling import gpu_request
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.metrics import SchedulerMetrics
from gpusched.scheduler.binder import Binder
from gpusched.scheduler.cache import ClusterCache
from tests.unit.scheduler.test_cache import topology_object

_ids = itertools.count()


@pytest.fixture
def namespace(kube: Any) -> Iterator[str]:
    name = f"bind-{next(_ids)}-{int(time.time() * 1000) % 10**7}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


@pytest.fixture
def nodes(gpu_nodes: Callable[..., list[str]]) -> list[str]:
    return gpu_nodes(2, prefix="bind")


def _pod(core: Any, namespace: str, name: str, gpus: int = 4) -> dict[str, Any]:
    response = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                # No kube-scheduler serves gpusched in this module (the extender fixture is not
                # used): the pod stays unbound until a test binds it.
                "schedulerName": keys.SCHEDULER_NAME,
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
                    }
                ],
            },
        },
        _preload_content=False,
    )
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def _args(pod: dict[str, Any], node: str) -> ExtenderBindingArgs:
    meta = pod["metadata"]
    return ExtenderBindingArgs.model_validate(
        {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
    )


def _binder(kube: Any, node_names: list[str]) -> tuple[Binder, ClusterCache]:
    cache = ClusterCache()
    cache.replace_topologies([topology_object(n) for n in node_names])
    cache.replace_pods([])
    return Binder(AsyncApi(kube.configuration), cache, SchedulerMetrics()), cache


def _run(binder: Binder, *args: ExtenderBindingArgs) -> list[str]:
    async def main() -> list[str]:
        try:
            return [await binder.bind(a) for a in args]
        finally:
            await binder.close()

    return asyncio.run(main())


def _read(core: Any, namespace: str, name: str) -> Any:
    return core.read_namespaced_pod(name, namespace)


def test_a_node_that_no_longer_fits_is_refused_and_the_pod_stays_unbound(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    binder, cache = _binder(kube, nodes)
    holder = _pod(core, namespace, "holder", 8)
    holder["spec"]["nodeName"] = nodes[0]
    holder["metadata"]["annotations"] = {keys.ANNOTATION_GPU_INDICES: "0,1,2,3,4,5,6,7"}
    holder["status"] = {"phase": "Running"}
    cache.apply_pod(holder)  # every GPU of the node held
    pod = _pod(core, namespace, "late")
    [error] = _run(binder, _args(pod, nodes[0]))
    assert f"node {nodes[0]} no longer fits" in error
    assert _read(core, namespace, "late").spec.node_name is None
    assert not cache.assumptions


def test_a_pod_already_bound_here_is_success_and_elsewhere_is_refused(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    pod = _pod(core, namespace, "retried")
    first, _ = _binder(kube, nodes)
    [ok] = _run(first, _args(pod, nodes[0]))
    assert ok == ""
    bound = _read(core, namespace, "retried")
    assert bound.spec.node_name == nodes[0]
    indices = bound.metadata.annotations[keys.ANNOTATION_GPU_INDICES]
    # A retry of the same bind (kube-scheduler gave up waiting) by a restarted extender.
    again, _ = _binder(kube, nodes)
    [retry, elsewhere] = _run(again, _args(pod, nodes[0]), _args(pod, nodes[1]))
    assert retry == ""
    assert elsewhere == f"pod is already bound to node {nodes[0]}"
    after = _read(core, namespace, "retried")
    assert (after.spec.node_name, after.metadata.annotations[keys.ANNOTATION_GPU_INDICES]) == (
        nodes[0],
        indices,
    )


def test_a_pod_gone_or_recreated_under_its_name_is_refused(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    binder, cache = _binder(kube, nodes)
    gone = _pod(core, namespace, "gone")
    core.delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
    old = _pod(core, namespace, "again")
    core.delete_namespaced_pod("again", namespace, grace_period_seconds=0)
    _pod(core, namespace, "again")  # a new pod, another UID
    errors = _run(binder, _args(gone, nodes[0]), _args(old, nodes[0]))
    assert errors == ["pod no longer exists", "pod was deleted and recreated"]
    assert _read(core, namespace, "again").spec.node_name is None
    assert not cache.assumptions


def test_a_failed_binding_call_on_a_pod_bound_anyway_keeps_its_real_gpus_reserved(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    here = _pod(core, namespace, "here")
    there = _pod(core, namespace, "there")
    # Both pods got bound by an earlier attempt whose answer never came back.
    earlier, _ = _binder(kube, nodes)
    assert _run(earlier, _args(here, nodes[0]), _args(there, nodes[1])) == ["", ""]
    actual = {
        name: _read(core, namespace, name).metadata.annotations[keys.ANNOTATION_GPU_INDICES]
        for name in ("here", "there")
    }
    # A new extender that saw the pods in filter and in its watch of pending pods (so it does not
    # read them first) binds again: the Binding call fails (the pod already has a node); the pod
    # turns out bound.
    binder, cache = _binder(kube, nodes)
    for pod in (here, there):
        binder.memory.remember(pod, gpu_request(pod), {})
        binder.pending.upsert(pod)
    [same, other] = _run(binder, _args(here, nodes[0]), _args(there, nodes[0]))
    assert same == ""  # bound where asked: success
    assert other.startswith("API error while binding")  # bound elsewhere: kube-scheduler retries
    reserved = {a.key.split("/")[1]: (a.node, a.gpus) for a in cache.assumptions.values()}
    assert reserved["here"][0] == nodes[0]
    assert reserved["there"][0] == nodes[1]  # the GPUs it really holds, not the ones chosen
    for name, (_, gpus) in reserved.items():
        assert ",".join(map(str, gpus)) == actual[name]


def _placements(binder: Binder) -> dict[str, float]:
    """``gpusched_placements_total`` per topology class, as the binder's registry exports it."""
    registry = binder.metrics.registry
    counted = {
        scope.value: registry.get_sample_value(
            "gpusched_placements_total", {"topology_class": scope.value}
        )
        or 0.0
        for scope in TopologyScope
    }
    return {k: v for k, v in counted.items() if v}


def test_a_retried_bind_counts_one_placement_whether_or_not_the_attempt_that_landed_counted(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    # Counted by the attempt that landed: kube-scheduler's retry adds nothing.
    pod = _pod(core, namespace, "counted")
    binder, _ = _binder(kube, nodes)
    assert _run(binder, _args(pod, nodes[0]), _args(pod, nodes[0])) == ["", ""]
    placed = _read(core, namespace, "counted").metadata.annotations
    assert _placements(binder) == {placed[keys.ANNOTATION_TOPOLOGY_CLASS]: 1.0}
    # Landed on the API server although the Binding call failed on the extender's side (so that
    # attempt counted nothing): the retry that finds it bound counts it, with its class.
    landed = _pod(core, namespace, "landed")
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "landed",
            "annotations": {
                keys.ANNOTATION_GPU_INDICES: "0,1,2,3",
                keys.ANNOTATION_TOPOLOGY_CLASS: "pcie-switch",
            },
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[1]},
    }
    core.create_namespaced_pod_binding("landed", namespace, binding, _preload_content=False)
    retried, _ = _binder(kube, nodes)
    assert _run(retried, _args(landed, nodes[1]), _args(landed, nodes[1])) == ["", ""]
    assert _placements(retried) == {"pcie-switch": 1.0}


class _Flaky:
    """The real API server behind a connection that fails the next Binding calls: ``"503"``
    answers before sending it (the server stored nothing, but a 5xx cannot say so),
    ``"lost"`` sends it and loses the answer."""

    def __init__(self, api: AsyncApi, faults: list[str]) -> None:
        self.api = api
        self.faults = faults

    async def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        if path.endswith("/binding") and self.faults:
            fault = self.faults.pop(0)
            if fault == "503":
                raise ApiError(503, "ServiceUnavailable", "etcdserver: request timed out")
            await self.api.request(method, path, body, **options)
            raise TimeoutError
        return await self.api.request(method, path, body, **options)

    async def close(self) -> None:
        await self.api.close()


def test_a_binding_without_a_certain_answer_keeps_its_gpus_until_it_is_known(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    """A server error or a lost answer says nothing of whether the Binding was stored: its
    GPUs are not handed to another pod, and the pod's own retry binds them."""
    core = client.CoreV1Api(kube)
    first, second = _pod(core, namespace, "first", 8), _pod(core, namespace, "second", 8)
    binder, cache = _binder(kube, nodes)
    flaky = _Flaky(binder.api, ["503"])
    binder.api = cast(AsyncApi, flaky)
    errors = _run(binder, _args(first, nodes[0]), _args(second, nodes[0]), _args(first, nodes[0]))
    assert errors[0].startswith("API error while binding: 503")
    assert errors[1] == f"node {nodes[0]} no longer fits: NotEnoughFreeGpus: fewer than 8 free GPUs"
    assert errors[2] == ""
    assert _read(core, namespace, "first").spec.node_name == nodes[0]
    assert _read(core, namespace, "second").spec.node_name is None
    assert [a.key for a in cache.assumptions.values()] == [f"{namespace}/first"]


def test_a_binding_whose_answer_was_lost_is_a_success_when_it_was_stored(
    kube: Any, namespace: str, nodes: list[str]
) -> None:
    core = client.CoreV1Api(kube)
    pod = _pod(core, namespace, "landed-unanswered")
    binder, cache = _binder(kube, nodes)
    binder.api = cast(AsyncApi, _Flaky(binder.api, ["lost"]))
    assert _run(binder, _args(pod, nodes[0])) == [""]
    bound = _read(core, namespace, "landed-unanswered")
    assert bound.spec.node_name == nodes[0]
    [held] = cache.assumptions.values()
    assert ",".join(map(str, held.gpus)) == bound.metadata.annotations[keys.ANNOTATION_GPU_INDICES]
