"""The kubelet's gRPC APIs gpusched speaks (device plugin ``v1beta1``, PodResources ``v1``):
their ``.proto`` files copied verbatim from the pinned ``k8s.io/kubelet`` module, and the Python
stubs generated from them with the pinned ``grpcio-tools``.

``python -m gpusched.dev.kubeletapi`` (or ``scripts/update-kubelet-api``) refreshes both after a
Kubernetes bump; :func:`problems` is what the staleness test checks. The stubs are never edited by
hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from gpusched.dev.localcluster.binaries import repo_root

#: Our copy (under ``src/``) -> the file in the ``k8s.io/kubelet`` module.
PROTOS: Final = {
    "gpusched/kubeletapi/deviceplugin/v1beta1/api.proto": "pkg/apis/deviceplugin/v1beta1/api.proto",
    "gpusched/kubeletapi/podresources/v1/api.proto": "pkg/apis/podresources/v1/api.proto",
}
#: What protoc writes next to each ``.proto``.
GENERATED_SUFFIXES: Final = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_MODULE_DIR: Final = Path("e2e") / "tools" / "kubelet"


def pinned_version(root: Path | None = None) -> str:
    """The ``k8s.io/kubelet`` version the kubelet tool module pins (its ``replace``)."""
    text = ((root or repo_root()) / _MODULE_DIR / "go.mod").read_text(encoding="utf-8")
    match = re.search(r"^\s*k8s\.io/kubelet\s*=>\s*k8s\.io/kubelet\s+(v\S+)", text, re.M)
    if match is None:
        raise RuntimeError(f"k8s.io/kubelet is not pinned in {_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def upstream_module(root: Path | None = None) -> Path:
    """Where the Go module cache holds the pinned ``k8s.io/kubelet`` (downloaded if needed)."""
    root = root or repo_root()
    version = pinned_version(root)
    listing = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubelet@{version}"],
        cwd=root / _MODULE_DIR,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(listing)["Dir"])


def generate(proto_root: Path, out_root: Path) -> None:
    """Run protoc (from grpcio-tools) on every proto under ``proto_root`` into ``out_root``."""
    from grpc_tools import protoc  # dev dependency, pinned exactly in pyproject.toml

    for proto in PROTOS:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"--python_out={out_root}",
                f"--pyi_out={out_root}",
                f"--grpc_python_out={out_root}",
                str(proto_root / proto),
            ]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {code})")


def problems(root: Path | None = None) -> list[str]:
    """Differences between the committed protos and stubs and what the pins produce."""
    root = root or repo_root()
    src = root / "src"
    upstream = upstream_module(root)
    found: list[str] = []
    for ours, theirs in PROTOS.items():
        if (src / ours).read_bytes() != (upstream / theirs).read_bytes():
            found.append(f"src/{ours} differs from k8s.io/kubelet@{pinned_version(root)}/{theirs}")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for ours in PROTOS:
            (scratch / ours).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / ours, scratch / ours)
        generate(scratch, scratch)
        for ours in PROTOS:
            for suffix in GENERATED_SUFFIXES:
                name = ours.removesuffix(".proto") + suffix
                committed = src / name
                if not committed.exists():
                    found.append(f"src/{name} is missing")
                elif committed.read_bytes() != (scratch / name).read_bytes():
                    found.append(f"src/{name} is stale: run scripts/update-kubelet-api")
    return found


def update(root: Path | None = None) -> None:
    """Copy the pinned protos into ``src/`` and regenerate the stubs beside them."""
    root = root or repo_root()
    upstream = upstream_module(root)
    for ours, theirs in PROTOS.items():
        target = root / "src" / ours
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((upstream / theirs).read_bytes())
    generate(root / "src", root / "src")


if __name__ == "__main__":
    update()
    print(f"kubelet APIs of k8s.io/kubelet {pinned_version()} generated", file=sys.stderr)
