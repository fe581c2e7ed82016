"""Start, find and stop the control-plane processes without leaving any behind.

Each process runs in its own session (process group), so stopping it also stops anything it
forked. A process is identified by pid *and* kernel start time, so a ``down`` run long after
``up`` never signals an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Popen objects of processes started by this interpreter, so they are reaped (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcessRecord:
    """What identifies a started process across interpreter lifetimes."""

    name: str
    pid: int
    start_ticks: int
    log: str

    def to_json(self) -> dict[str, Any]:
        """Serialisable form for the cluster state file."""
        return asdict(self)


def _start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` in clock ticks, None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    ticks = _start_ticks(proc.pid)
    return ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks or 0, log=str(log))


def is_running(record: ProcessRecord) -> bool:
    """Whether the recorded process (not merely its pid) still runs."""
    child = _CHILDREN.get(record.pid)
    if child is not None and child.poll() is not None:
        return False
    return _start_ticks(record.pid) == record.start_ticks


def exit_code(record: ProcessRecord) -> int | None:
    """Exit status when this interpreter started the process and it has ended."""
    child = _CHILDREN.get(record.pid)
    return child.poll() if child is not None else None


def stop(record: ProcessRecord, grace_seconds: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after the grace period."""
    if is_running(record):
        _signal_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and is_running(record):
            time.sleep(0.05)
    # The group may hold children even after the leader exited.
    _signal_group(record.pid, signal.SIGKILL)
    child = _CHILDREN.pop(record.pid, None)
    if child is not None:
        child.wait(timeout=grace_seconds)
    deadline = time.monotonic() + grace_seconds
    while _group_alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
