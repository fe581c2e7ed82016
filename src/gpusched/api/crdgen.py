"""Generate the CustomResourceDefinitions in ``crds/`` from the pydantic API types.

The pydantic models are the single source of truth; this module turns their JSON Schema into the
structural OpenAPI v3 schema the API server requires: references inlined, ``Optional`` unwrapped,
JSON-Schema-2020 spellings converted, defaults kept so the API server fills them in, CEL rules
(``x-kubernetes-validations``) carried over from the models, and ``spec.template`` of a GpuJob
replaced by the upstream PodTemplateSpec schema of the pinned Kubernetes release so that a bad
container spec is refused at apply time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from gpusched.api import keys
from gpusched.api.gpujob import GpuJob
from gpusched.api.networktopology import NetworkTopology
from gpusched.api.nodegputopology import NodeGpuTopology
from gpusched.api.tenantquota import TenantQuota
from gpusched.api.upstream import pod_template_spec_snapshot

EMBED_MARKER: Final = "x-gpusched-embed"
CATEGORY: Final = "gpusched"

_DROPPED_KEYS: Final = frozenset({"title", "additionalProperties", "$defs", "discriminator"})
#: Keys whose content :meth:`_Converter._object` or ``convert`` turns into structural form.
_CONVERTED_KEYS: Final = frozenset(
    {"properties", "items", "required", "patternProperties", "propertyNames"}
)
#: Extensions of upstream schemas that CRD schemas do not accept.
_UPSTREAM_DROPPED: Final = frozenset(
    {
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
        "x-kubernetes-embedded-resource",
        "default",
    }
)
#: Upstream types whose schema is replaced wholesale (the API server handles them specially).
_UPSTREAM_SPECIAL: Final[dict[str, dict[str, Any]]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": (
            r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        ),
        "x-kubernetes-int-or-string": True,
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": "string", "format": "date-time"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "description": "Labels and annotations given to every pod of the job.",
        # Kubernetes limits the annotations' total size (256 KiB), not their number; a pod
        # rarely carries more than a few tens.
        "properties": {
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "maxProperties": 256,
            },
            "annotations": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "maxProperties": 256,
            },
            "name": {"type": "string"},
            "generateName": {"type": "string"},
            "namespace": {"type": "string"},
            "finalizers": {"type": "array", "items": {"type": "string"}, "maxItems": 64},
        },
    },
}
#: Bounds added to upstream properties (type -> property -> schema keywords): a pod has at most
#: this many containers, resources per container and so on. Kubernetes bounds few of them in its
#: own validation (a pod is limited by etcd's object size, about 1.5 MiB); the CRD bounds them so
#: that one GpuJob costs the operator, which keeps every job's template in memory, a bounded
#: amount (with the operator's byte bound, ``gpujob.MAX_TEMPLATE_BYTES``, and etcd's object
#: size), and keep the CEL rules within the API server's cost budget, which prices a rule by
#: the largest list it may walk. The numbers are several times what real pods use: a few
#: containers, tens of env variables and volumes (a large one: 10 containers, 200 env entries
#: each, 50 volumes).
_UPSTREAM_BOUNDS: Final[dict[str, dict[str, dict[str, Any]]]] = {
    "io.k8s.api.core.v1.PodSpec": {
        "containers": {"maxItems": 64},
        "initContainers": {"maxItems": 64},
        # The API server refuses a pod created with ephemeral containers (they are added to a
        # running pod through its subresource), so a template never has any.
        "ephemeralContainers": {"maxItems": 0},
        "volumes": {"maxItems": 256},
        "tolerations": {"maxItems": 256},
        "nodeSelector": {"maxProperties": 256},
    },
    "io.k8s.api.core.v1.ResourceRequirements": {
        "limits": {"maxProperties": 64},
        "requests": {"maxProperties": 64},
    },
    "io.k8s.api.core.v1.Container": {
        "name": {"maxLength": 63},
        "env": {"maxItems": 1024},
        "args": {"maxItems": 1024},
        "command": {"maxItems": 256},
        "volumeMounts": {"maxItems": 256},
    },
}
#: Bound of every other list and map of the embedded template (a map's entries), by how many
#: lists and maps enclose it: 64 directly in the pod (image pull secrets, host aliases), 32 in a
#: container or volume (ports, a ConfigMap's items), 16 deeper (a selector term's values):
#: nested bounds multiply, so the deeper ones are smaller.
_UPSTREAM_DEFAULT_MAX_ITEMS: Final = (64, 32, 16)


def _default_max_items(nested: int) -> int:
    return _UPSTREAM_DEFAULT_MAX_ITEMS[min(nested, len(_UPSTREAM_DEFAULT_MAX_ITEMS) - 1)]


#: How deep (in objects below the template root) upstream descriptions are kept. Deeper ones are
#: dropped to keep the CRD well under the API server's object size limits.
_UPSTREAM_DESCRIPTION_DEPTH: Final = 2


@dataclass(frozen=True)
class CrdSpec:
    """Everything about one kind that is not in its pydantic model."""

    model: type[BaseModel]
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    columns: tuple[dict[str, Any], ...] = field(default=())
    label_named: bool = False
    """Objects whose name becomes a label value on pods, hence at most 63 characters."""

    @property
    def has_status(self) -> bool:
        """Whether the kind has a status (written through the status subresource)."""
        return "status" in self.model.model_fields

    @property
    def kind(self) -> str:
        """The kind, from the model's ``kind`` default."""
        kind = self.model.model_fields["kind"].default
        assert isinstance(kind, str)
        return kind

    @property
    def name(self) -> str:
        """``<plural>.<group>``, the CRD's own name."""
        return f"{self.plural}.{keys.GROUP}"

    @property
    def filename(self) -> str:
        """File name under ``crds/``."""
        return f"{keys.GROUP}_{self.plural}.yaml"


def _column(
    name: str, type_: str, path: str, description: str, priority: int = 0
) -> dict[str, Any]:
    column: dict[str, Any] = {
        "name": name,
        "type": type_,
        "jsonPath": path,
        "description": description,
    }
    if priority:
        column["priority"] = priority
    return column


_AGE = _column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")

CRDS: Final[tuple[CrdSpec, ...]] = (
    CrdSpec(
        model=GpuJob,
        plural="gpujobs",
        singular="gpujob",
        short_names=("gj",),
        namespaced=True,
        label_named=True,
        columns=(
            _column("Tenant", "string", ".status.tenant", "TenantQuota owning the namespace."),
            _column("Replicas", "integer", ".spec.replicas", "Pods in the gang."),
            _column("GPUs", "integer", ".status.gpus", "GPUs of the whole job."),
            _column("Phase", "string", ".status.phase", "Queued, Admitted, Running, ..."),
            _column(
                "Placement",
                "string",
                ".status.placementQuality",
                "Worst achieved topology class over the replicas.",
            ),
            _column("Reason", "string", ".status.reason", "Why the job is in this phase."),
            # A timestamp, not a date column: kubectl prints future dates as <invalid>.
            _column(
                "Expected-Start",
                "string",
                ".status.expectedStart",
                "While queued: when the job is expected to start.",
            ),
            _column(
                "Message", "string", ".status.message", "The reason in a sentence.", priority=1
            ),
            _column(
                "Submitter",
                "string",
                ".metadata.annotations.gpusched\\.io/submitter",
                "Who created the job (recorded by the chart's admission policy).",
                priority=1,
            ),
            _AGE,
        ),
    ),
    CrdSpec(
        model=TenantQuota,
        plural="tenantquotas",
        singular="tenantquota",
        short_names=("tq",),
        namespaced=False,
        label_named=True,
        columns=(
            _column("Parent", "string", ".spec.parent", "The TenantQuota this one is part of."),
            _column("Guaranteed", "integer", ".spec.guaranteedGpus", "GPUs always available."),
            _column("Limit", "integer", ".spec.borrowingLimit", "Most GPUs held at once."),
            _column("Weight", "number", ".spec.weight", "Fair-share weight."),
            _column("Used", "integer", ".status.usedGpus", "GPUs held now."),
            _column("Borrowed", "integer", ".status.borrowedGpus", "GPUs held above guarantee."),
            _column("Pending", "integer", ".status.pendingJobs", "Jobs waiting."),
            _column("Running", "integer", ".status.runningJobs", "Jobs whose pods all run."),
            _column(
                "Admitted",
                "integer",
                ".status.admittedJobs",
                "Jobs holding GPUs: admitted, their pods starting or running.",
                priority=1,
            ),
            _column(
                "Spent",
                "number",
                ".status.spent",
                "Cost in the current budget period (status.currency), to the hundredth.",
            ),
            _column("Hard-Cap", "number", ".spec.budget.hardCap", "Budget hard cap.", priority=1),
            _column(
                "Cost-30d", "number", ".status.cost30d", "Cost of the last 30 days.", priority=1
            ),
            _AGE,
        ),
    ),
    CrdSpec(
        model=NetworkTopology,
        plural="networktopologies",
        singular="networktopology",
        short_names=("nt",),
        namespaced=False,
        columns=(
            _column("Levels", "string", ".spec.levels[*].name", "Levels, widest first."),
            _AGE,
        ),
    ),
    CrdSpec(
        model=NodeGpuTopology,
        plural="nodegputopologies",
        singular="nodegputopology",
        short_names=("ngt",),
        namespaced=False,
        columns=(
            _column("Model", "string", ".spec.gpus[0].model", "GPU model."),
            _column("Healthy", "integer", ".status.healthyGpus", "Placeable GPUs."),
            _column("NVSwitch", "boolean", ".spec.nvswitch", "All-to-all NVLink."),
            _column("Source", "string", ".spec.source", "nvml or fake:<file>.", priority=1),
            _AGE,
        ),
    ),
)


def clean_description(text: str) -> str:
    """A docstring as ``kubectl explain`` should show it: reflowed, Markdown code spans."""
    paragraphs = [" ".join(part.split()) for part in text.strip().split("\n\n")]
    return "\n\n".join(paragraphs).replace("``", "`")


class SchemaError(ValueError):
    """A model uses a JSON Schema construct that has no structural-schema equivalent."""


class _Converter:
    """Turns one pydantic JSON Schema document into a structural schema."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._defs: dict[str, Any] = document.get("$defs", {})

    def convert(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        node = self._resolve(node)
        if EMBED_MARKER in node:
            embedded = _embed_upstream(node[EMBED_MARKER])
            if "description" in node:
                embedded["description"] = clean_description(node["description"])
            for key, value in node.items():
                if key.startswith("x-kubernetes-"):
                    embedded[key] = value
            return embedded
        if "anyOf" in node:
            node = self._unwrap_optional(node, path)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED_KEYS or key in _CONVERTED_KEYS:
                continue
            if key == "exclusiveMinimum":
                out["minimum"], out["exclusiveMinimum"] = value, True
            elif key == "exclusiveMaximum":
                out["maximum"], out["exclusiveMaximum"] = value, True
            elif key == "default":
                if value is not None:
                    out["default"] = value
            elif key == "const":
                out["enum"] = [value]
            elif key == "description":
                out["description"] = clean_description(value)
            else:
                out[key] = value
        kind = node.get("type")
        if kind == "object":
            self._object(node, out, path)
        elif kind == "array":
            out["items"] = self.convert(node["items"], f"{path}[]")
        elif kind is None and "enum" not in node:
            raise SchemaError(f"{path}: no type")
        if "enum" in node and "type" not in out:
            out["type"] = "string"
        return out

    def _object(self, node: dict[str, Any], out: dict[str, Any], path: str) -> None:
        properties: dict[str, Any] = node.get("properties", {})
        extra = node.get("additionalProperties")
        if not extra and "patternProperties" in node:
            extra = self._constrained_keys_map(node, path)
        if properties:
            out["properties"] = {}
            required = set(node.get("required", ()))
            for name, sub in properties.items():
                converted = self.convert(sub, f"{path}.{name}")
                if (
                    name not in required
                    and converted.get("type") == "object"
                    and "properties" in converted
                    and "default" not in converted
                    and not self._is_optional(sub)
                ):
                    # A non-optional nested object: default it so the API server fills in the
                    # defaults of its fields even when the user omits the whole object.
                    converted["default"] = {}
                out["properties"][name] = converted
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = self.convert(extra, f"{path}{{}}")
        elif extra is not False:
            out["x-kubernetes-preserve-unknown-fields"] = True

    def _constrained_keys_map(self, node: dict[str, Any], path: str) -> Any:
        """The value schema of a map whose keys pydantic constrains (``dict[Pattern, V]``).

        A structural schema has neither ``patternProperties`` nor ``propertyNames``, so the
        keys' rule must come as CEL on the field (``x-kubernetes-validations``), which the
        API server evaluates; a model without one would lose the check silently."""
        patterns: dict[str, Any] = node["patternProperties"]
        if len(patterns) != 1:
            raise SchemaError(f"{path}: a map with more than one key pattern is not supported")
        if not node.get("x-kubernetes-validations"):
            raise SchemaError(
                f"{path}: the map's keys are constrained; check them in an "
                "x-kubernetes-validations rule (a structural schema cannot)"
            )
        return next(iter(patterns.values()))

    def _is_optional(self, node: dict[str, Any]) -> bool:
        return any(option.get("type") == "null" for option in node.get("anyOf", ()))

    def _unwrap_optional(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        options = [option for option in node["anyOf"] if option.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"{path}: unions other than Optional[X] are not supported")
        merged = {key: value for key, value in node.items() if key != "anyOf"}
        return {**self._resolve(options[0]), **merged}

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" not in node:
            return node
        target = self._resolve(self._defs[node["$ref"].rsplit("/", 1)[-1]])
        rest = {key: value for key, value in node.items() if key != "$ref"}
        return {**target, **rest}


def _embed_upstream(root: str) -> dict[str, Any]:
    snapshot = pod_template_spec_snapshot()
    schemas: dict[str, Any] = snapshot["schemas"]

    def convert(name: str, depth: int, nested: int) -> dict[str, Any]:
        if name in _UPSTREAM_SPECIAL:
            return copy.deepcopy(_UPSTREAM_SPECIAL[name])
        out = walk(schemas[name], depth, nested)
        for prop, bounds in _UPSTREAM_BOUNDS.get(name, {}).items():
            out["properties"][prop].update(bounds)
        return out

    def walk(node: dict[str, Any], depth: int, nested: int) -> dict[str, Any]:
        """``nested``: how many lists and maps enclose the node."""
        if "allOf" in node and len(node["allOf"]) == 1:
            inner = node["allOf"][0]
            base = (
                convert(inner["$ref"].rsplit("/", 1)[-1], depth, nested)
                if "$ref" in inner
                else walk(inner, depth, nested)
            )
            if "description" in node and depth <= _UPSTREAM_DESCRIPTION_DEPTH:
                base["description"] = node["description"]
            return base
        if "$ref" in node:
            return convert(node["$ref"].rsplit("/", 1)[-1], depth, nested)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _UPSTREAM_DROPPED or key in ("properties", "items", "additionalProperties"):
                continue
            if key == "description" and depth > _UPSTREAM_DESCRIPTION_DEPTH:
                continue
            out[key] = value
        if "properties" in node:
            out["properties"] = {
                k: walk(v, depth + 1, nested) for k, v in node["properties"].items()
            }
            out.setdefault("type", "object")
        if "items" in node:
            out["items"] = walk(node["items"], depth + 1, nested + 1)
            out.setdefault("maxItems", _default_max_items(nested))
            _keep_list_map_key_defaults(node, out)
        if isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = walk(node["additionalProperties"], depth + 1, nested + 1)
            out.setdefault("maxProperties", _default_max_items(nested))
        if (
            out.get("type") == "object"
            and "properties" not in out
            and "additionalProperties" not in out
        ):
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out

    def _keep_list_map_key_defaults(node: dict[str, Any], out: dict[str, Any]) -> None:
        # A list-type=map needs each key field required or defaulted; the upstream defaults
        # (e.g. a port's protocol: TCP) are the only ones kept for that reason.
        map_keys = node.get("x-kubernetes-list-map-keys", ())
        item_ref = node["items"].get("$ref") or node["items"].get("allOf", [{}])[0].get("$ref")
        if not map_keys or not item_ref:
            return
        item_schema = schemas[item_ref.rsplit("/", 1)[-1]]
        required = set(item_schema.get("required", ()))
        for map_key in map_keys:
            upstream = item_schema["properties"][map_key]
            if map_key not in required and "default" in upstream:
                out["items"]["properties"][map_key]["default"] = upstream["default"]

    return convert(root, 0, 0)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a top-level kind."""
    document = model.model_json_schema(by_alias=True, mode="validation")
    converter = _Converter(document)
    properties: dict[str, Any] = document["properties"]
    schema: dict[str, Any] = {
        "type": "object",
        "description": clean_description(model.__doc__ or ""),
        "properties": {
            "apiVersion": {"type": "string", "description": "gpusched.io/v1alpha1"},
            "kind": {"type": "string", "description": "Kind of the object."},
            "metadata": {"type": "object"},
            "spec": converter.convert(properties["spec"], "spec"),
        },
        "required": ["spec"],
    }
    if "status" in properties:
        schema["properties"]["status"] = converter.convert(properties["status"], "status")
        schema["properties"]["status"].pop("default", None)
    # Rules over the whole object (e.g. on metadata.name), from the model's own schema.
    if "x-kubernetes-validations" in document:
        schema["x-kubernetes-validations"] = list(document["x-kubernetes-validations"])
    return schema


def _with_name_rule(crd: CrdSpec) -> dict[str, Any]:
    schema = structural_schema(crd.model)
    if crd.label_named:
        schema["x-kubernetes-validations"] = [
            *schema.get("x-kubernetes-validations", []),
            {
                "rule": "size(self.metadata.name) <= 63",
                "message": f"metadata.name must be at most 63 characters: the {crd.kind} name is "
                "written as a label value on its pods",
                "reason": "FieldValueInvalid",
            },
        ]
    return schema


def crd_manifest(crd: CrdSpec) -> dict[str, Any]:
    """The complete CustomResourceDefinition object for one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": crd.name,
            "labels": {"app.kubernetes.io/part-of": "gpusched"},
        },
        "spec": {
            "group": keys.GROUP,
            "names": {
                "kind": crd.kind,
                "listKind": f"{crd.kind}List",
                "plural": crd.plural,
                "singular": crd.singular,
                "shortNames": list(crd.short_names),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced" if crd.namespaced else "Cluster",
            "versions": [
                {
                    "name": keys.VERSION,
                    "served": True,
                    "storage": True,
                    **({"subresources": {"status": {}}} if crd.has_status else {}),
                    "additionalPrinterColumns": list(crd.columns),
                    "schema": {"openAPIV3Schema": _with_name_rule(crd)},
                }
            ],
        },
    }


_HEADER: Final = "# Generated by `gpusched crds generate` from gpusched.api; do not edit.\n"


def render(crd: CrdSpec) -> str:
    """The YAML text of one CRD file, byte-for-byte reproducible."""
    body = yaml.safe_dump(crd_manifest(crd), sort_keys=False, width=100, allow_unicode=True)
    return _HEADER + body


def generate(directory: Path) -> list[Path]:
    """Write every CRD into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for crd in CRDS:
        path = directory / crd.filename
        path.write_text(render(crd), encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Names of CRD files in ``directory`` that differ from what the models generate."""
    out = []
    for crd in CRDS:
        path = directory / crd.filename
        if not path.exists() or path.read_text(encoding="utf-8") != render(crd):
            out.append(crd.filename)
    return out
