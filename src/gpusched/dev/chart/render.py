"""Render the Helm chart with the pinned helm, and pick out what one component needs.

The local harness (tests, benchmarks, the demo) runs each component as a process under the
identity the chart gives it in a cluster: the chart's ServiceAccount, RBAC and admission
policies for that component, applied from ``helm template`` output, so whatever the harness runs
also proves the chart's identities sufficient.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from gpusched.api.upstream import KUBERNETES_VERSION
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.localcluster.binaries import ensure_toolchain

RELEASE: Final = "gpusched"
NAMESPACE: Final = "gpusched-system"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
#: Kinds that make up a component's identity: who it is, what it may do, what admission adds.
IDENTITY_KINDS: Final = frozenset(
    {
        "ServiceAccount",
        "Secret",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "FlowSchema",
    }
)


class ChartError(RuntimeError):
    """helm refused the chart or the values (the message is helm's)."""


@functools.cache
def helm_binary() -> str:
    """The pinned helm, built on first use."""
    return str(ensure_toolchain(lambda _message: None).path("helm"))


def helm(
    *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the pinned helm."""
    result = subprocess.run(
        [helm_binary(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise ChartError(result.stderr.strip() or result.stdout.strip())
    return result


def template_args(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Iterable[str] = (),
    kube_version: str = KUBERNETES_VERSION,
) -> list[str]:
    """``helm template`` arguments for this chart (values are read from stdin)."""
    args = [
        "template",
        release,
        str(chart_dir()),
        f"--namespace={namespace}",
        f"--kube-version={kube_version}",
        "--values=-",
    ]
    args += [f"--api-versions={version}" for version in api_versions]
    return args


@functools.cache
def _render(
    values_json: str,
    release: str,
    namespace: str,
    api_versions: tuple[str, ...],
    kube_version: str = KUBERNETES_VERSION,
) -> str:
    args = template_args(
        release=release,
        namespace=namespace,
        api_versions=api_versions,
        kube_version=kube_version,
    )
    return helm(*args, stdin=values_json).stdout


def render(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Iterable[str] = (),
    kube_version: str = KUBERNETES_VERSION,
) -> list[dict[str, Any]]:
    """Every object ``helm template`` renders (CRDs excluded, hooks included), for an API
    server of ``kube_version``."""
    text = _render(
        json.dumps(dict(values or {}), sort_keys=True),
        release,
        namespace,
        tuple(sorted(api_versions)),
        kube_version,
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def component_of(obj: Mapping[str, Any]) -> str | None:
    """The ``app.kubernetes.io/component`` label of a rendered object."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(COMPONENT_LABEL)
    return str(value) if value is not None else None


def identity(component: str, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The objects that make up ``component``'s identity in the rendered chart."""
    return [
        obj
        for obj in render(values)
        if obj["kind"] in IDENTITY_KINDS
        and component_of(obj) == component
        and not (obj.get("metadata") or {}).get("annotations", {}).get("helm.sh/hook")
    ]


def write_manifest(objects: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """Objects as one multi-document YAML file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all([dict(obj) for obj in objects], sort_keys=False))
    return path
