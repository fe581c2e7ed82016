"""Build and cache the control-plane binaries from the pinned Go modules in ``e2e/tools``.

Each tool module (kubernetes, etcd, kwok) pins its version in ``go.mod``/``go.sum``. Binaries are
built with ``go build`` (the way ``go install`` builds Go tools) into
``~/.cache/gpusched/bin/<tool>-<version>/``, keyed by version plus a digest of the module files and
the Go version, so that CI and every later run on the machine reuse them. A build shows progress
(packages compiled out of the total) because the first one takes minutes.

:data:`TOOLS` are what the local cluster and the test suite need; :func:`ensure_toolchain` builds
them. :data:`OPTIONAL_TOOLS` (Kueue, for ``gpusched bench kueue-scenario``) are built only when
something asks for one with :func:`ensure_tool`, so the first build of a fresh machine (and of
CI) does not pay for them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


def default_progress(message: str) -> None:
    """Progress lines go to stderr so ``--json`` output on stdout stays clean."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class GoTool:
    """One Go module in ``e2e/tools`` and the binaries built from it."""

    name: str
    module: str
    packages: tuple[str, ...]
    #: ``{version}`` is replaced by the pinned version.
    ldflags: str = "-s -w"
    #: Go build tags (``go build -tags``), e.g. to leave out dependencies the proxy lacks.
    tags: tuple[str, ...] = ()

    def version(self, tools_dir: Path) -> str:
        """The pinned version of ``module``, read from the tool's go.mod."""
        text = (tools_dir / self.name / "go.mod").read_text(encoding="utf-8")
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.M)
        if not match:
            raise RuntimeError(
                f"{self.module} is not required in {tools_dir / self.name / 'go.mod'}"
            )
        return match.group(1)

    def binaries(self) -> tuple[str, ...]:
        """Names of the executables, the last element of each package path."""
        return tuple(_binary_name(package) for package in self.packages)


#: Executables whose name differs from what ``go build`` calls them.
_RENAMES = {
    "go.etcd.io/etcd/server/v3": "etcd",
    # Kueue's Makefile calls it so; "runner" alone says nothing in a directory listing.
    "sigs.k8s.io/kueue/test/performance/scheduler/runner": "performance-scheduler-runner",
}


def _go_output_name(package: str) -> str:
    """The file ``go build -o dir/`` writes: the last path element, skipping a ``/vN`` suffix."""
    parts = package.rstrip("/").split("/")
    return parts[-2] if re.fullmatch(r"v\d+", parts[-1]) else parts[-1]


def _binary_name(package: str) -> str:
    return _RENAMES.get(package, _go_output_name(package))


def _kubernetes_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


KUBERNETES = GoTool(
    name="kubernetes",
    module="k8s.io/kubernetes",
    packages=(
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes/cmd/kubectl",
    ),
)
ETCD = GoTool(
    name="etcd", module="go.etcd.io/etcd/server/v3", packages=("go.etcd.io/etcd/server/v3",)
)
KWOK = GoTool(name="kwok", module="sigs.k8s.io/kwok", packages=("sigs.k8s.io/kwok/cmd/kwok",))
#: A real kubelet and the fake container runtime it runs pods on (``e2e/tools/kubelet/fakecri``).
#: Its own module, pinned to the same Kubernetes release and the same dependency versions as
#: ``kubernetes``: the packages both need come out of Go's build cache, and adding the kubelet
#: does not change the control plane's cache key.
KUBELET = GoTool(
    name="kubelet",
    module="k8s.io/kubernetes",
    packages=("k8s.io/kubernetes/cmd/kubelet", "gpusched.io/e2e/tools/kubelet/fakecri"),
)
#: Helm v4 (a module of its own: it requires the same k8s.io/* releases as the control plane).
HELM = GoTool(
    name="helm",
    module="helm.sh/helm/v4",
    packages=("helm.sh/helm/v4/cmd/helm",),
    ldflags="-s -w -X helm.sh/helm/v4/internal/version.version={version}",
)
#: Prometheus and promtool. ``remove_all_sd`` leaves out every service-discovery plugin (one of
#: their dependencies is not served by the module proxy; static and file targets remain), and
#: without ``builtinassets`` the web UI is left out: the tests use the HTTP API only.
PROMETHEUS = GoTool(
    name="prometheus",
    module="github.com/prometheus/prometheus",
    packages=(
        "github.com/prometheus/prometheus/cmd/prometheus",
        "github.com/prometheus/prometheus/cmd/promtool",
    ),
    tags=("remove_all_sd",),
)
TOOLS = (ETCD, KWOK, KUBERNETES, KUBELET, HELM, PROMETHEUS)
#: Kueue's scheduler scalability benchmark (``test/performance/scheduler``): ``minimalkueue``
#: (Kueue's core controllers and scheduler, nothing else) and the runner that generates the
#: scenario's objects, finishes admitted Workloads after their run time and records the figures.
#: Both are ``main`` packages of the module itself (not ``_test.go`` files), and Kueue's go.mod
#: has no ``replace`` directive, so they build as plain ``tool``s of a pinned module.
KUEUE = GoTool(
    name="kueue",
    module="sigs.k8s.io/kueue",
    packages=(
        "sigs.k8s.io/kueue/test/performance/scheduler/minimalkueue",
        "sigs.k8s.io/kueue/test/performance/scheduler/runner",
    ),
)
#: Built on demand only (:func:`ensure_tool`), never by :func:`ensure_toolchain`.
OPTIONAL_TOOLS = (KUEUE,)


def repo_root() -> Path:
    """The source checkout this package runs from (the local cluster is a development tool)."""
    override = os.environ.get("GPUSCHED_REPO")
    root = Path(override) if override else Path(__file__).resolve().parents[4]
    if not (root / "e2e" / "tools").is_dir():
        raise RuntimeError(
            f"{root} has no e2e/tools: the local cluster runs from a gpusched source checkout "
            "(set GPUSCHED_REPO to point at one)"
        )
    return root


def cache_dir() -> Path:
    """Root of gpusched's cache, outside any clone so every clone and CI run shares it."""
    override = os.environ.get("GPUSCHED_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "gpusched"


@dataclass(frozen=True)
class Toolchain:
    """Paths of every control-plane binary, once built."""

    directory: dict[str, Path]

    def path(self, binary: str) -> Path:
        """Absolute path of one executable, e.g. ``kube-apiserver``."""
        return self.directory[binary] / binary


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the local cluster is built from Go modules, but `go` is not on PATH")
    return subprocess.run(
        [go, "env", "GOVERSION"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _stamp(tool: GoTool, tools_dir: Path, go_version: str) -> str:
    """Digest of what the build depends on: Go, the module files and any Go source of ours
    (a module without sources keeps the digest it always had)."""
    digest = hashlib.sha256(go_version.encode())
    module_dir = tools_dir / tool.name
    for name in ("go.mod", "go.sum"):
        digest.update((module_dir / name).read_bytes())
    for source in sorted(module_dir.rglob("*.go")):
        digest.update(source.relative_to(module_dir).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_toolchain(progress: Progress = default_progress) -> Toolchain:
    """Build whatever is missing or outdated and return where every binary is."""
    tools_dir = repo_root() / "e2e" / "tools"
    go_version = _go_version()
    directories: dict[str, Path] = {}
    for tool in TOOLS:
        target = _ensure(tool, tools_dir, go_version, progress)
        for binary in tool.binaries():
            directories[binary] = target
    return Toolchain(directories)


def ensure_tool(tool: GoTool, progress: Progress = default_progress) -> Path:
    """Build one tool (typically one of :data:`OPTIONAL_TOOLS`) if it is missing or outdated,
    cached like the control plane's; the directory holding its executables."""
    return _ensure(tool, repo_root() / "e2e" / "tools", _go_version(), progress)


def module_source(tool: GoTool, progress: Progress = default_progress) -> Path:
    """The pinned module's source tree in Go's module cache (read-only), for files a tool
    needs besides its executables (Kueue's CRDs and scenario configurations)."""
    module_dir = repo_root() / "e2e" / "tools" / tool.name
    env = {**os.environ, "GOFLAGS": "-mod=readonly"}
    progress(f"[toolchain] {tool.name}: locating the source of {tool.module}")
    # Downloads it again if the module cache was cleaned since the binaries were built.
    subprocess.run(["go", "mod", "download", tool.module], cwd=module_dir, env=env, check=True)
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", tool.module],
        cwd=module_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not found:
        raise RuntimeError(f"go did not say where {tool.module} is in the module cache")
    return Path(found)


def _ensure(tool: GoTool, tools_dir: Path, go_version: str, progress: Progress) -> Path:
    version = tool.version(tools_dir)
    target = cache_dir() / "bin" / f"{tool.name}-{version}"
    stamp = _stamp(tool, tools_dir, go_version)
    with _locked(cache_dir() / "bin" / f".{tool.name}.lock"):
        if _stamp_matches(target, stamp, tool):
            progress(f"[toolchain] {tool.name} {version}: cached in {target}")
        else:
            _build(tool, version, tools_dir, target, stamp=stamp, progress=progress)
    return target


def _stamp_matches(target: Path, stamp: str, tool: GoTool) -> bool:
    stamp_file = target / ".stamp"
    if not stamp_file.exists() or stamp_file.read_text().strip() != stamp:
        return False
    return all((target / binary).exists() for binary in tool.binaries())


def _build(
    tool: GoTool, version: str, tools_dir: Path, target: Path, *, stamp: str, progress: Progress
) -> None:
    module_dir = tools_dir / tool.name
    env = {**os.environ, "GOFLAGS": "-mod=readonly"}
    progress(f"[toolchain] {tool.name} {version}: downloading modules")
    subprocess.run(["go", "mod", "download"], cwd=module_dir, env=env, check=True)
    total = _count_packages(tool, module_dir, env)
    ldflags = (
        _kubernetes_ldflags(version)
        if tool.module == KUBERNETES.module
        else tool.ldflags.format(version=version)
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=target.parent))
    command = [
        "go",
        "build",
        "-v",
        "-trimpath",
        *_tags_flag(tool),
        "-ldflags",
        ldflags,
        "-o",
        f"{staging}/",
        *tool.packages,
    ]
    progress(
        f"[toolchain] {tool.name} {version}: compiling {total} packages (first build takes minutes)"
    )
    started = time.monotonic()
    with subprocess.Popen(
        command, cwd=module_dir, env=env, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        built, errors, last_report = 0, [], 0.0
        for raw in proc.stderr:
            line = raw.rstrip()
            if line and not line.startswith(("#", " ", "\t")) and " " not in line:
                built += 1
            else:
                errors.append(line)
            now = time.monotonic()
            if now - last_report >= 15:
                last_report = now
                progress(
                    f"[toolchain] {tool.name}: {built}/{total} packages compiled, "
                    f"{now - started:.0f}s elapsed"
                )
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"building {tool.name} {version} failed:\n" + "\n".join(errors[-40:]))
    for package in tool.packages:
        (staging / _go_output_name(package)).rename(staging / _binary_name(package))
    (staging / ".stamp").write_text(stamp + "\n")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    progress(
        f"[toolchain] {tool.name} {version}: built in {time.monotonic() - started:.0f}s -> {target}"
    )


def _tags_flag(tool: GoTool) -> list[str]:
    return ["-tags", ",".join(tool.tags)] if tool.tags else []


def _count_packages(tool: GoTool, module_dir: Path, env: dict[str, str]) -> int:
    listing = subprocess.run(
        ["go", "list", "-deps", *_tags_flag(tool), *tool.packages],
        cwd=module_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sum(1 for line in listing.splitlines() if line.strip())
