"""The node agent's clients of the kubelet: registration and the PodResources API (gRPC over
unix sockets)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpusched.core.nodeagent import KubeletPod
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpusched.kubeletapi.podresources.v1 import api_pb2 as pr
from gpusched.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from gpusched.node_agent.config import API_VERSION

#: Deadline of one call to the kubelet.
CALL_TIMEOUT_SECONDS = 10.0


def unix_target(path: Path) -> str:
    """The gRPC target of a unix socket."""
    return f"unix://{path}"


@dataclass(frozen=True, slots=True)
class SocketIdentity:
    """Which incarnation of a socket file this is: a restarted kubelet makes a new one."""

    inode: int
    created_ns: int


def socket_identity(path: Path) -> SocketIdentity | None:
    """The identity of the socket at ``path``, None when there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return SocketIdentity(stat.st_ino, stat.st_ctime_ns)


async def register(
    kubelet_socket: Path, endpoint: str, resource: str, *, preferred_allocation: bool = True
) -> None:
    """Register the plugin serving ``endpoint`` (a file name in the kubelet's device-plugin
    directory) for ``resource``; raises :class:`grpc.aio.AioRpcError` when refused."""
    async with grpc.aio.insecure_channel(unix_target(kubelet_socket)) as channel:
        stub = dp_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        await stub.Register(
            dp.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource,
                options=dp.DevicePluginOptions(
                    get_preferred_allocation_available=preferred_allocation
                ),
            ),
            timeout=CALL_TIMEOUT_SECONDS,
        )


class PodResourcesClient:
    """Reads the kubelet's PodResources ``List`` over one long-lived channel."""

    def __init__(self, socket: Path, resource: str) -> None:
        self.socket = socket
        self.resource = resource
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> pr_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(unix_target(self.socket))
        return pr_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    async def list(self) -> dict[str, KubeletPod]:
        """Every pod the kubelet lists, with the devices of our resource per container."""
        try:
            response = await self._stub().List(
                pr.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError:
            await self.close()  # a restarted kubelet needs a new connection
            raise
        pods: dict[str, KubeletPod] = {}
        for pod in response.pod_resources:
            devices = {
                container.name: frozenset(
                    device_id
                    for devices in container.devices
                    if devices.resource_name == self.resource
                    for device_id in devices.device_ids
                )
                for container in pod.containers
            }
            entry = KubeletPod(pod.namespace, pod.name, devices)
            pods[entry.key] = entry
        return pods

    async def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


async def live_socket(path: Path, timeout: float = 2.0) -> bool:
    """Whether something accepts gRPC connections on the unix socket ``path``."""
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError:
            return False
    return True
