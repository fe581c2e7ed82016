"""A pod network for real kubelet nodes that run a chart's own pods as processes.

One bridge on this machine, ``gpusched0`` with the gateway address; each such node's fake
runtime puts every pod in a network namespace of its own, on a /24 of the node, joined to the
bridge (``e2e/tools/kubelet/fakecri/processes.go``). The cluster's API server then listens on
the gateway too, so pods reach it at the address the runtime gives them for the ``kubernetes``
Service. Creating links and namespaces needs root and ``ip`` (iproute2), like the kubelet nodes.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Final

BRIDGE: Final = "gpusched0"
GATEWAY: Final = "10.250.0.1"
PREFIX_LENGTH: Final = 16
#: Names of the network namespaces the runtimes create (``<prefix><node>n<pod>``).
NETNS_PREFIX: Final = "gpc"


class PodNetworkError(RuntimeError):
    """The pod network cannot be set up here (no root, no iproute2)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def ensure_bridge() -> None:
    """Create the bridge with the gateway address, unless it exists."""
    if shutil.which("ip") is None:
        raise PodNetworkError("a pod network needs `ip` (iproute2) and root")
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        return
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/{PREFIX_LENGTH}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def node_subnet(index: int) -> str:
    """The address prefix of the ``index``-th node's pods (``10.250.<index>.``), 1-based."""
    if not 1 <= index <= 250:
        raise PodNetworkError(f"node index {index} is outside 1..250")
    return f"10.250.{index}."


def netns_prefix(index: int) -> str:
    """The prefix of the ``index``-th node's network namespace names."""
    return f"{NETNS_PREFIX}{index}n"


def remove_all() -> None:
    """Delete every namespace the runtimes left (a runtime killed before it cleaned up) and the
    bridge."""
    if shutil.which("ip") is None:
        return
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ", 1)[0]
        if name.startswith(NETNS_PREFIX):
            _ip("netns", "delete", name, check=False)
    _ip("link", "delete", BRIDGE, check=False)
