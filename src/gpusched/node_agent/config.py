"""Settings of the node agent; every field is a ``gpusched device-plugin`` flag."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpusched.api import keys

#: Where the kubelet keeps device-plugin sockets (its ``kubelet.sock`` is there too).
DEFAULT_DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
#: The kubelet's PodResources socket.
DEFAULT_POD_RESOURCES_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: The device-plugin API version the plugin speaks.
API_VERSION: Final = "v1beta1"


@dataclass(frozen=True)
class AgentConfig:
    """How one node agent behaves."""

    node_name: str
    resource: str = keys.GPU_RESOURCE
    """Extended resource advertised (the ecosystem's ``nvidia.com/gpu`` by default)."""
    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    socket_name: str = "gpusched.sock"
    """The plugin's socket, inside ``device_plugin_dir``."""
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    cdi_kind: str | None = "nvidia.com/gpu"
    """CDI devices handed to containers are ``<cdi_kind>=<UUID>``; None hands none."""
    visible_devices_env: str | None = "NVIDIA_VISIBLE_DEVICES"
    """Environment variable set to the UUIDs (the container toolkit's fallback); None: unset."""
    conflicting_sockets: tuple[str, ...] = ("nvidia-*.sock",)
    """Glob patterns of other plugins' sockets in ``device_plugin_dir`` that advertise the same
    GPUs (the NVIDIA device plugin's by default): while one of them is live, no registration."""
    drift_interval: float = 30.0
    """Seconds between drift checks (one also follows each allocation)."""
    poll_interval: float = 1.0
    """Seconds between checks for a restarted kubelet (its socket recreated)."""
    admission_retry: float = 10.0
    """How long a call may wait for a pod the kubelet lists to become readable in the API."""

    @property
    def socket_path(self) -> Path:
        """The plugin's own socket."""
        return self.device_plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's Registration socket."""
        return self.device_plugin_dir / "kubelet.sock"
