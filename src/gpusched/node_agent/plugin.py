"""The ``v1beta1.DevicePlugin`` service the kubelet calls: the device list, the preferred
allocation and the verified Allocate. Decisions come from :mod:`gpusched.core.nodeagent` over a
snapshot built here from the pod cache, the kubelet's PodResources and the published GPUs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from gpusched.core.nodeagent import NodeState, PodGpus, Verdict, admitting, pod_gpus
from gpusched.core.nodeagent import preferred_allocation as decide_preferred
from gpusched.core.nodeagent import verify_allocation as decide_allocation
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpusched.metrics import NodeAgentMetrics
from gpusched.node_agent.config import AgentConfig
from gpusched.node_agent.kubelet import PodResourcesClient
from gpusched.node_agent.sources import DeviceSource, PodCache

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass
class Snapshots:
    """Builds :class:`NodeState` snapshots for the decisions."""

    config: AgentConfig
    pods: PodCache
    devices: DeviceSource
    pod_resources: PodResourcesClient
    api: AsyncApi

    async def take(self, *, fresh_pods: bool = False) -> NodeState:
        """The node now. Pods the kubelet lists that the cache does not know yet are read from
        the API server (the kubelet saw them, so a direct read does); ``fresh_pods`` re-lists
        every pod of the node (a cache a moment behind could miss a reservation)."""
        try:
            kubelet = await self.pod_resources.list()
        except grpc.aio.AioRpcError as err:
            log.warning("PodResources List on %s: %s", self.config.pod_resources_socket, err)
            kubelet = None
        pods = await self._fresh_pods() if fresh_pods else self.pods.snapshot()
        state = NodeState(self.config.node_name, pods, kubelet, self.devices.gpus)
        if fresh_pods or kubelet is None:
            return state
        # The pods being admitted are read afresh: one the cache has not seen yet, or one
        # deleted a moment ago that the cache still shows, must not be decided on stale facts.
        admission = admitting(state)
        for key in (
            {p.key for p in admission.pods} | set(admission.gone) | (set(kubelet) - set(pods))
        ):
            pod = await self._read_pod(key)
            if pod is None:
                pods.pop(key, None)
            else:
                pods[key] = pod
        return NodeState(self.config.node_name, pods, kubelet, self.devices.gpus)

    async def _fresh_pods(self) -> dict[str, PodGpus]:
        listing = await self.api.request(
            "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.config.node_name}"
        )
        parsed = (pod_gpus(item, self.config.resource) for item in listing.get("items") or [])
        return {p.key: p for p in parsed}

    async def _read_pod(self, key: str) -> PodGpus | None:
        namespace, name = key.split("/", 1)
        try:
            pod = await self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        if (pod.get("spec") or {}).get("nodeName") != self.config.node_name:
            return None  # a pod of that name, recreated elsewhere
        return pod_gpus(pod, self.config.resource)


def container_response(devices: Iterable[str], config: AgentConfig) -> dp.ContainerAllocateResponse:
    """What a container gets: CDI device names and the visible-devices variable."""
    uuids = list(devices)
    response = dp.ContainerAllocateResponse()
    if config.visible_devices_env:
        response.envs[config.visible_devices_env] = ",".join(uuids)
    if config.cdi_kind:
        response.cdi_devices.extend(dp.CDIDevice(name=f"{config.cdi_kind}={u}") for u in uuids)
    return response


class DevicePluginService(dp_grpc.DevicePluginServicer):
    """The device-plugin gRPC service of one node."""

    def __init__(
        self,
        config: AgentConfig,
        snapshots: Snapshots,
        metrics: NodeAgentMetrics,
        *,
        on_verdict: Callable[[str, Verdict], None] | None = None,
    ) -> None:
        self.config = config
        self.snapshots = snapshots
        self.metrics = metrics
        self.on_verdict = on_verdict
        self.streams = 0
        self._admission = asyncio.Lock()

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Any
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: dp.Empty, context: Any
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        """One device per GPU UUID, with its health and NUMA node; re-sent on every change."""
        source = self.snapshots.devices
        self.streams += 1
        try:
            while True:
                seen = source.version
                gpus = source.gpus
                self.metrics.devices.labels(HEALTHY).set(sum(1 for g in gpus if g.healthy))
                self.metrics.devices.labels(UNHEALTHY).set(sum(1 for g in gpus if not g.healthy))
                yield dp.ListAndWatchResponse(
                    devices=[
                        dp.Device(
                            ID=g.uuid,
                            health=HEALTHY if g.healthy else UNHEALTHY,
                            topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=g.numa_node)])
                            if g.numa_node is not None
                            else None,
                        )
                        for g in gpus
                    ]
                )
                await source.wait_change(seen)
        finally:
            self.streams -= 1

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        started = time.perf_counter()
        response = dp.PreferredAllocationResponse()
        async with self._admission:
            for container in request.container_requests:
                verdict = await self._decide(partial(_preferred, container))
                self._account("preferred", verdict, started)
                if not verdict.ok:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, _message(verdict))
                response.container_responses.append(
                    dp.ContainerPreferredAllocationResponse(deviceIDs=list(verdict.devices))
                )
        return response

    async def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        started = time.perf_counter()
        response = dp.AllocateResponse()
        async with self._admission:
            for container in request.container_requests:
                devices = list(container.devices_ids)
                verdict = await self._decide(partial(_allocation, devices))
                self._account("allocate", verdict, started)
                if not verdict.ok:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, _message(verdict))
                order = {g.uuid: g.index for g in self.snapshots.devices.gpus}
                devices.sort(key=lambda d: (order.get(d, 1 << 30), d))
                response.container_responses.append(container_response(devices, self.config))
        return response

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    async def _decide(self, decide: Callable[[NodeState], Verdict]) -> Verdict:
        """Decide on a snapshot; a pod gpusched did not place, and any refusal, is decided again
        on a fresh list of the node's pods (a cache a moment behind must neither let a foreign pod
        take a new reservation nor refuse, or name the wrong owner, on stale facts); a pod not yet
        readable is waited for a little."""
        deadline = time.monotonic() + self.config.admission_retry
        while True:
            try:
                state = await self.snapshots.take()
                verdict = decide(state)
                if not verdict.ok or not verdict.placed_by_gpusched:
                    verdict = decide(await self.snapshots.take(fresh_pods=True))
            except ApiError as err:
                if time.monotonic() >= deadline:
                    raise
                log.info("API server read failed (%s); retrying", err)
                await asyncio.sleep(0.5)
                continue
            if verdict.ok or time.monotonic() >= deadline or not _transient(verdict):
                return verdict
            await asyncio.sleep(0.2)

    def _account(self, call: str, verdict: Verdict, started: float) -> None:
        seconds = time.perf_counter() - started
        self.metrics.call_seconds.labels(call).observe(seconds)
        outcome = "accepted" if verdict.ok else "refused"
        reason = verdict.reason.value if verdict.reason is not None else ""
        self.metrics.calls.labels(call, outcome, reason).inc()
        if verdict.ok:
            log.info("%s for pod %s: %s", call, verdict.pod, ",".join(verdict.devices))
        else:
            log.warning("%s refused: %s", call, verdict.message)
        if self.on_verdict is not None:
            self.on_verdict(call, verdict)


def _preferred(request: dp.ContainerPreferredAllocationRequest, state: NodeState) -> Verdict:
    return decide_preferred(
        state,
        request.available_deviceIDs,
        list(request.must_include_deviceIDs),
        request.allocation_size,
    )


def _allocation(devices: list[str], state: NodeState) -> Verdict:
    return decide_allocation(state, devices)


def _transient(verdict: Verdict) -> bool:
    """Refusals a moment's wait can cure: the kubelet's view or the pod read lagging."""
    from gpusched.core.nodeagent import RefusalReason

    return verdict.reason in (RefusalReason.NO_POD_RESOURCES, RefusalReason.NO_ADMITTING_POD)


def _message(verdict: Verdict) -> str:
    reason = verdict.reason.value if verdict.reason is not None else ""
    return f"gpusched device plugin: {reason}: {verdict.message}"
