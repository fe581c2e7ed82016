"""Schemas of upstream Kubernetes types that gpusched embeds in its CRDs.

``GpuJob.spec.template`` is a full PodTemplateSpec, validated by the API server at apply time
like the template of a Deployment. Its schema is taken from the OpenAPI document shipped with the
pinned Kubernetes release (the same version the local control plane runs) and stored here, so
generating the CRDs needs neither network nor Go. ``scripts/update-upstream-schema`` refreshes it
when the pinned version changes.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Final

KUBERNETES_VERSION: Final = "v1.37.1"
POD_TEMPLATE_SPEC: Final = "io.k8s.api.core.v1.PodTemplateSpec"
_SNAPSHOT: Final = f"core-v1-pod-template-spec-{KUBERNETES_VERSION}.json"


def extract_closure(openapi: dict[str, Any], root: str) -> dict[str, Any]:
    """The schemas ``root`` refers to, directly or transitively, out of an OpenAPI v3 document."""
    schemas: dict[str, Any] = openapi["components"]["schemas"]
    closure: dict[str, Any] = {}
    pending = [root]
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        closure[name] = schemas[name]
        pending.extend(_refs(schemas[name]))
    return {"kubernetesVersion": KUBERNETES_VERSION, "root": root, "schemas": closure}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else []
        for value in node.values():
            found.extend(_refs(value))
        return found
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []


@cache
def pod_template_spec_snapshot() -> dict[str, Any]:
    """The stored closure of PodTemplateSpec for the pinned Kubernetes version."""
    text = resources.files(__name__).joinpath(_SNAPSHOT).read_text(encoding="utf-8")
    snapshot: dict[str, Any] = json.loads(text)
    return snapshot
