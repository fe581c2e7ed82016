"""The node agent process: serve the device plugin, keep it registered with the kubelet, and check
the kubelet's allocations against gpusched's assignments.

Registration follows the kubelet's life: a restarted kubelet deletes every socket in its
device-plugin directory and makes a new ``kubelet.sock``, so the agent watches both (a ``stat``
per second: the inode says whether it is still the same kubelet) and, when either changed, serves
a fresh socket and registers again. A restarted agent does the same at start-up. Nothing the
decisions need lives only in this process (assignments are on the pods, allocations in the
kubelet), so neither restart loses anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from gpusched.api import keys
from gpusched.core.nodeagent import Drift, DriftKind, NodeState, PodGpus, Verdict, check_drift
from gpusched.kubeasync import ApiError, AsyncApi
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpusched.kubewatch import Reflector
from gpusched.metrics import NodeAgentMetrics
from gpusched.node_agent.config import AgentConfig
from gpusched.node_agent.kubelet import (
    PodResourcesClient,
    SocketIdentity,
    live_socket,
    register,
    socket_identity,
    unix_target,
)
from gpusched.node_agent.plugin import DevicePluginService, Snapshots
from gpusched.node_agent.sources import DeviceSource, PodCache

log = logging.getLogger(__name__)

COMPONENT = "gpusched-node-agent"
#: Event reasons (on the pod, or on the Node for a conflicting plugin).
REASON_REFUSED = "GpuAllocationRefused"
REASON_DRIFT = "GpuAssignmentDrift"
REASON_CONFLICT = "ConflictingDevicePlugin"


@dataclass
class NodeAgent:
    """One node's device plugin and drift checker."""

    config: AgentConfig
    api: AsyncApi
    """The one client: watches, the reads on the kubelet's admission path, the writes (events,
    annotations)."""
    metrics: NodeAgentMetrics = field(default_factory=NodeAgentMetrics)
    last_drift: tuple[Drift, ...] = ()
    _reported: set[tuple[str, str, tuple[str, ...]]] = field(default_factory=set)
    _conflict_reported: str | None = None
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        self.devices = DeviceSource(self.config.node_name, loop)
        self.pods = PodCache(self.config.resource)
        watches = self._start_watches()
        pod_resources = PodResourcesClient(self.config.pod_resources_socket, self.config.resource)
        self.snapshots = Snapshots(self.config, self.pods, self.devices, pod_resources, self.api)
        self._drift_due = asyncio.Event()
        self.service = DevicePluginService(
            self.config, self.snapshots, self.metrics, on_verdict=self._on_verdict
        )
        drift = asyncio.create_task(self._drift_loop(stop))
        try:
            while not (self.pods.synced.is_set() and self.devices.synced.is_set()):
                if await _wait(stop, 0.2):
                    return
            log.info(
                "node %s: %d GPU(s) published, %d pod(s) bound",
                self.config.node_name,
                len(self.devices.gpus),
                len(self.pods.snapshot()),
            )
            while not stop.is_set():
                await self._serve_once(stop)
        finally:
            for watch in watches:
                watch.cancel()
            drift.cancel()
            await pod_resources.close()
            await self.api.close()

    # --- watches -------------------------------------------------------------------------

    def _start_watches(self) -> list[asyncio.Task[None]]:
        """The node's pods and its NodeGpuTopology, as tasks of this loop."""
        node = self.config.node_name
        return [
            Reflector(
                "pods",
                self.api,
                "/api/v1/pods",
                self.pods,
                params={"fieldSelector": f"spec.nodeName={node}"},
            ).start(),
            Reflector(
                "nodegputopology",
                self.api,
                f"/apis/{keys.GROUP}/{keys.VERSION}/nodegputopologies",
                self.devices,
                params={"fieldSelector": f"metadata.name={node}"},
            ).start(),
        ]

    # --- serving and registration --------------------------------------------------------

    async def _serve_once(self, stop: asyncio.Event) -> None:
        """Serve a fresh socket, register, and return when the kubelet restarted (or stop)."""
        sock = self.config.socket_path
        sock.parent.mkdir(parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(unix_target(sock))
        await server.start()
        try:
            kubelet = await self._register(stop)
            while kubelet is not None and not await _wait(stop, self.config.poll_interval):
                if socket_identity(sock) is None:
                    log.info("the plugin socket %s was removed (kubelet restart)", sock)
                    return
                if socket_identity(self.config.kubelet_socket) != kubelet:
                    log.info("the kubelet's socket changed (kubelet restart): registering again")
                    return
        finally:
            self.metrics.registered.set(0)
            await server.stop(grace=1)

    async def _register(self, stop: asyncio.Event) -> SocketIdentity | None:
        """Register once the kubelet is there and no conflicting plugin is; the identity of the
        kubelet socket registered with, None when stopped first or when our socket is gone."""
        backoff = 1.0
        while not stop.is_set():
            if socket_identity(self.config.socket_path) is None:
                # A kubelet that restarted meanwhile deleted our socket: serve a new one first
                # (it would refuse a registration it cannot connect back to).
                log.info("the plugin socket is gone; serving a new one")
                return None
            conflict = await self._conflicting_plugin()
            if conflict is not None:
                await self._report_conflict(conflict)
                if await _wait(stop, max(self.config.poll_interval, 5.0)):
                    return None
                continue
            self.metrics.conflict.set(0)
            self._conflict_reported = None
            identity = socket_identity(self.config.kubelet_socket)
            if identity is None:
                if await _wait(stop, self.config.poll_interval):
                    return None
                continue
            try:
                await register(
                    self.config.kubelet_socket, self.config.socket_name, self.config.resource
                )
            except grpc.aio.AioRpcError as err:
                log.warning("registering with the kubelet failed: %s", err.details())
                if await _wait(stop, backoff):
                    return None
                backoff = min(backoff * 2, 30.0)
                continue
            self.metrics.registered.set(1)
            self.metrics.registrations.inc()
            log.info(
                "registered %s for %s with the kubelet",
                self.config.socket_name,
                self.config.resource,
            )
            return identity
        return None

    async def _conflicting_plugin(self) -> Path | None:
        """A live socket of another plugin that would advertise the same GPUs."""
        directory = self.config.device_plugin_dir
        mine = {self.config.socket_path.name, self.config.kubelet_socket.name}
        for pattern in self.config.conflicting_sockets:
            for path in sorted(directory.glob(pattern)):
                if path.name not in mine and path.is_socket() and await live_socket(path, 1.0):
                    return path
        return None

    async def _report_conflict(self, path: Path) -> None:
        self.metrics.conflict.set(1)
        if self._conflict_reported == str(path):
            return
        self._conflict_reported = str(path)
        message = (
            f"another device plugin serves {path} on this node; gpusched's plugin does not "
            f"register {self.config.resource} while it runs (two plugins would hand out the same "
            "GPUs). Keep the NVIDIA device plugin off gpusched's GPU nodes (see docs/node-agent.md)"
        )
        log.error(message)
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.config.node_name}}
        await self._event(node, "Warning", REASON_CONFLICT, message)

    # --- verdicts and drift --------------------------------------------------------------

    def _on_verdict(self, call: str, verdict: Verdict) -> None:
        if verdict.ok:
            if call == "allocate":
                asyncio.get_running_loop().call_later(1.0, self._drift_due.set)
            return
        if verdict.pod is None:
            return
        target = _pod_ref(self.pods.snapshot(), verdict.pod)
        task = asyncio.create_task(self._event(target, "Warning", REASON_REFUSED, verdict.message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drift_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drift_due.wait(), self.config.drift_interval)
            self._drift_due.clear()
            try:
                await self.check_drift()
            except Exception:  # the checker must outlive any one bad round
                log.exception("drift check failed")
                self.metrics.drift_checks.labels("error").inc()

    async def check_drift(self) -> tuple[Drift, ...]:
        """Compare the kubelet's allocations with the assignments; publish what it finds."""
        state = await self.snapshots.take()
        if state.kubelet is None:
            self.metrics.drift_checks.labels("error").inc()
            return self.last_drift
        report = check_drift(state)
        for kind in DriftKind:
            self.metrics.drift_pods.labels(kind.value).set(
                sum(1 for d in report.drifts if d.kind is kind)
            )
        self.metrics.drift_checks.labels("drift" if report.drifts else "ok").inc()
        for drift in report.drifts:
            mark = (drift.pod, drift.kind.value, drift.held)
            if mark not in self._reported:
                self._reported.add(mark)
                log.error("drift: %s", drift.message)
                await self._event(
                    _pod_ref(state.pods, drift.pod),
                    "Warning",
                    REASON_DRIFT,
                    drift.message,
                )
        await self._annotate(state, report.allocated)
        self.last_drift = report.drifts
        return report.drifts

    async def _annotate(self, state: NodeState, allocated: Mapping[str, tuple[str, ...]]) -> None:
        """Write what each pod really holds on it (once per change)."""
        index = {g.uuid: g.index for g in state.gpus}
        for key, held in sorted(allocated.items()):
            pod = state.pods.get(key)
            if pod is None or pod.allocated == held:
                continue
            annotations = {keys.ANNOTATION_ALLOCATED_GPUS: ",".join(held)}
            if all(d in index for d in held):
                annotations[keys.ANNOTATION_ALLOCATED_GPU_INDICES] = ",".join(
                    str(index[d]) for d in held
                )
            await self._patch_annotations(pod.namespace, pod.name, annotations)

    async def _patch_annotations(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> None:
        try:
            await self.api.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"metadata": {"annotations": annotations}},
                params={"fieldManager": keys.FIELD_MANAGER_NODE_AGENT},
                content_type="application/merge-patch+json",
            )
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as err:
            log.info("annotating pod %s/%s: %s", namespace, name, err)

    async def _event(self, obj: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """Record a Kubernetes event on ``obj`` (best effort)."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": COMPONENT, "host": self.config.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.config.node_name,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", event)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as err:
            log.info("event %s not recorded: %s", reason, err)


def _pod_ref(pods: Mapping[str, PodGpus], key: str) -> dict[str, Any]:
    """The object reference of an event on pod ``key``."""
    namespace, name = key.split("/", 1)
    pod = pods.get(key)
    meta = {"namespace": namespace, "name": name, "uid": pod.uid if pod else None}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; True when stopping."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
