"""A kubelet as far as a device plugin can tell, for tests and benchmarks: its Registration
service, its PodResources ``List`` and the calls it makes to a plugin, over unix sockets, with the
pods it lists under the caller's control."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpusched.kubeletapi.podresources.v1 import api_pb2 as pr
from gpusched.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc

RESOURCE = "nvidia.com/gpu"


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, directory: Path, requests: queue.Queue[dp.RegisterRequest]) -> None:
        self.directory = directory
        self.requests = requests

    def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:  # noqa: N802
        """Like the kubelet: accept only a plugin it can connect back to."""
        target = f"unix://{self.directory / request.endpoint}"
        with grpc.insecure_channel(target) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=5)
                stub = dp_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
            except (grpc.FutureTimeoutError, grpc.RpcError) as err:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach {target}: {err}")
        self.requests.put(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self.kubelet = kubelet

    def List(  # noqa: N802
        self, request: pr.ListPodResourcesRequest, context: Any
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    namespace=key.split("/")[0],
                    name=key.split("/")[1],
                    containers=[
                        pr.ContainerResources(
                            name=container,
                            devices=[pr.ContainerDevices(resource_name=RESOURCE, device_ids=ids)]
                            if ids
                            else [],
                        )
                        for container, ids in containers.items()
                    ],
                )
                for key, containers in sorted(self.kubelet.pods.items())
            ]
        )


class KubeletDouble:
    """A kubelet as far as a device plugin can tell."""

    def __init__(self, directory: Path) -> None:
        self.device_plugin_dir = directory / "device-plugins"
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket = directory / "pod-resources.sock"
        self.registrations: queue.Queue[dp.RegisterRequest] = queue.Queue()
        self.pods: dict[str, dict[str, list[str]]] = {}
        """What PodResources lists: ``namespace/name`` -> container -> device IDs."""
        self._servers: list[grpc.Server] = []
        self._start()

    def _start(self) -> None:
        registration = grpc.server(futures.ThreadPoolExecutor(4))
        dp_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self.device_plugin_dir, self.registrations), registration
        )
        registration.add_insecure_port(f"unix://{self.device_plugin_dir / 'kubelet.sock'}")
        resources = grpc.server(futures.ThreadPoolExecutor(4))
        pr_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
            _PodResources(self), resources
        )
        resources.add_insecure_port(f"unix://{self.pod_resources_socket}")
        for server in (registration, resources):
            server.start()
            self._servers.append(server)

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=None)
        self._servers.clear()

    def restart(self, *, keep: tuple[str, ...] = ()) -> None:
        """Like a kubelet restart: every socket in the directory removed (but those named in
        ``keep``: another plugin that serves its socket again at once), a new kubelet.sock."""
        self.stop()
        for path in self.device_plugin_dir.iterdir():
            if path.name not in keep:
                path.unlink()
        self._start()

    def drain(self) -> None:
        """Forget registrations received so far."""
        while not self.registrations.empty():
            self.registrations.get_nowait()

    def admitting(self, key: str, *containers: str) -> None:
        """List ``key`` with containers holding nothing yet (the kubelet admits it)."""
        self.pods[key] = {c: [] for c in containers or ("main",)}

    def allocated(self, key: str, container: str, devices: list[str]) -> None:
        """Record what Allocate gave a container (the kubelet's checkpoint)."""
        self.pods.setdefault(key, {})[container] = list(devices)

    def registered(self, timeout: float = 60.0) -> dp.RegisterRequest:
        """The next registration request."""
        return self.registrations.get(timeout=timeout)

    @contextmanager
    def plugin(self, endpoint: str) -> Iterator[dp_grpc.DevicePluginStub]:
        """A client of the plugin that registered ``endpoint``."""
        with grpc.insecure_channel(f"unix://{self.device_plugin_dir / endpoint}") as channel:
            yield dp_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]

    def preferred(
        self, stub: dp_grpc.DevicePluginStub, available: list[str], size: int
    ) -> list[str]:
        response = stub.GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=size
                    )
                ]
            ),
            timeout=60,
        )
        return list(response.container_responses[0].deviceIDs)

    def allocate(
        self, stub: dp_grpc.DevicePluginStub, devices: list[str]
    ) -> dp.ContainerAllocateResponse:
        response = stub.Allocate(
            dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=devices)]
            ),
            timeout=60,
        )
        answer: dp.ContainerAllocateResponse = response.container_responses[0]
        return answer
