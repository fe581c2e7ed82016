"""Valid and invalid GpuJob / TenantQuota manifests shared by the unit and integration tests.

Each invalid case names the field a good error message must mention. ``upstream`` marks cases
only the API server can catch, because they concern the embedded PodTemplateSpec schema that the
Python models pass through as a plain mapping.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


def _manifest(
    kind: str, name: str, base: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    body = dict(base)
    for key, value in overrides.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return {
        "apiVersion": "gpusched.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": body,
    }


def gpujob(name: str = "job", **spec: Any) -> dict[str, Any]:
    """A valid GpuJob with ``spec`` fields overridden (None deletes a field)."""
    base = {
        "gpusPerReplica": 4,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
    }
    return _manifest("GpuJob", name, base, spec)


def tenantquota(name: str = "tenant", **spec: Any) -> dict[str, Any]:
    """A valid TenantQuota with ``spec`` fields overridden (None deletes a field)."""
    return _manifest("TenantQuota", name, {"namespaces": ["team"], "guaranteedGpus": 8}, spec)


def networktopology(name: str = "default", **spec: Any) -> dict[str, Any]:
    """A valid NetworkTopology with ``spec`` fields overridden (None deletes a field)."""
    levels = [
        {"name": "rack", "nodeLabel": "topology.kubernetes.io/rack"},
        {"name": "clique", "nodeLabel": "nvidia.com/gpu.clique", "wholeDomains": True},
    ]
    return _manifest("NetworkTopology", name, {"levels": levels}, spec)


_GPU = "nvidia.com/gpu"


def _template(**pod_spec: Any) -> dict[str, Any]:
    return {"spec": pod_spec}


def _env(count: int, prefix: str = "E") -> list[dict[str, str]]:
    return [{"name": f"{prefix}{i}", "value": "v"} for i in range(count)]


def large_template(
    containers: int = 10, env: int = 200, volumes: int = 50, mounts: int = 50
) -> dict[str, Any]:
    """A pod template as large as real ones get: ``containers`` containers with ``env`` env
    entries and ``mounts`` of the ``volumes`` volumes each, ports, args, labels. Its list items
    and map entries: containers x (env + mounts + 4) + volumes + 4."""
    return {
        "metadata": {"labels": {"app": "trainer", "team": "nlp"}, "annotations": {"a": "b"}},
        "spec": {
            "containers": [
                {
                    "name": f"c{c}",
                    "image": "registry.example.com/trainer:1.0",
                    "args": ["--config", "/etc/trainer/config.yaml"],
                    "env": _env(env, prefix=f"C{c}_VARIABLE_"),
                    "ports": [{"containerPort": 8000 + c}],
                    "volumeMounts": [
                        {"name": f"v{v}", "mountPath": f"/mnt/v{v}"} for v in range(mounts)
                    ],
                }
                for c in range(containers)
            ],
            "volumes": [{"name": f"v{v}", "emptyDir": {}} for v in range(volumes)],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }


def template_entries(template: Any) -> int:
    """List items and map entries of a template at every depth, counted from its JSON (the
    truth the CRD's CEL rule must agree with)."""
    if isinstance(template, list):
        return len(template) + sum(template_entries(item) for item in template)
    if isinstance(template, dict):
        return sum(_entries_below(key, value) for key, value in template.items())
    return 0


#: Objects of the PodTemplateSpec whose keys are data (a map), not fields.
_MAPS = frozenset({"labels", "annotations", "nodeSelector", "limits", "requests"})


def _entries_below(key: str, value: Any) -> int:
    if key in _MAPS and isinstance(value, dict):
        return len(value) + sum(template_entries(v) for v in value.values())
    return template_entries(value)


@dataclass(frozen=True)
class Invalid:
    """A manifest the API server must refuse, and the field its message must name."""

    id: str
    manifest: dict[str, Any]
    field: str
    upstream: bool = False

    @property
    def plural(self) -> str:
        """The kind's resource name (``gpujobs``, ``networktopologies``)."""
        kind = str(self.manifest["kind"]).lower()
        return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"

    def named(self, name: str) -> dict[str, Any]:
        """The manifest with a unique object name (a NetworkTopology keeps its own: only
        ``default`` is valid, and a case about its name names another)."""
        manifest = copy.deepcopy(self.manifest)
        if manifest["kind"] == "NetworkTopology":
            return manifest
        too_long = len(manifest["metadata"]["name"]) > 63
        # A case about an over-long name stays over-long.
        manifest["metadata"]["name"] = f"{name}-{'x' * 64}" if too_long else name
        return manifest


INVALID: tuple[Invalid, ...] = (
    Invalid("gpujob-zero-gpus", gpujob(gpusPerReplica=0), "spec.gpusPerReplica"),
    # A model is matched against the nvidia.com/gpu.product label: a name no node can carry.
    Invalid("gpujob-model-not-a-label-value", gpujob(gpuModel="NVIDIA H100"), "spec.gpuModel"),
    Invalid("gpujob-model-ends-in-a-dash", gpujob(gpuModel="NVIDIA-H100-"), "spec.gpuModel"),
    Invalid("gpujob-negative-gpus", gpujob(gpusPerReplica=-2), "spec.gpusPerReplica"),
    Invalid("gpujob-too-many-gpus", gpujob(gpusPerReplica=65), "spec.gpusPerReplica"),
    Invalid("gpujob-gpus-missing", gpujob(gpusPerReplica=None), "spec.gpusPerReplica"),
    Invalid("gpujob-gpus-wrong-type", gpujob(gpusPerReplica="four"), "spec.gpusPerReplica"),
    Invalid("gpujob-zero-replicas", gpujob(replicas=0), "spec.replicas"),
    Invalid("gpujob-unknown-scope", gpujob(topology={"scope": "rack"}), "spec.topology.scope"),
    Invalid("gpujob-unknown-mode", gpujob(topology={"mode": "maybe"}), "spec.topology.mode"),
    Invalid(
        "gpujob-across-replicas-without-label",
        gpujob(topology={"acrossReplicas": {"mode": "required"}}),
        "spec.topology.acrossReplicas.nodeLabel",
    ),
    Invalid("gpujob-negative-min-runtime", gpujob(minRuntimeSeconds=-1), "spec.minRuntimeSeconds"),
    Invalid(
        "gpujob-negative-grace",
        gpujob(checkpointGracePeriodSeconds=-5),
        "spec.checkpointGracePeriodSeconds",
    ),
    Invalid("gpujob-unknown-field", gpujob(gpus=4), "spec.gpus"),
    Invalid("gpujob-template-missing", gpujob(template=None), "spec.template"),
    Invalid(
        "gpujob-containers-missing",
        gpujob(template=_template(restartPolicy="Never")),
        "spec.template.spec.containers",
    ),
    Invalid(
        "gpujob-containers-empty",
        gpujob(template=_template(containers=[])),
        "spec.template.spec.containers",
    ),
    Invalid(
        "gpujob-node-name-set",
        gpujob(template=_template(nodeName="n1", containers=[{"name": "c", "image": "i"}])),
        "spec.template.spec.nodeName",
    ),
    Invalid(
        "gpujob-pods-restarted-forever",
        gpujob(
            template=_template(restartPolicy="Always", containers=[{"name": "c", "image": "i"}])
        ),
        "spec.template.spec.restartPolicy",
    ),
    Invalid(
        "gpujob-container-without-name",
        gpujob(template=_template(containers=[{"image": "busybox"}])),
        "spec.template.spec.containers[0].name",
        upstream=True,
    ),
    Invalid(
        "gpujob-container-bad-quantity",
        gpujob(
            template=_template(
                containers=[{"name": "c", "image": "i", "resources": {"limits": {"cpu": "lots"}}}]
            )
        ),
        "spec.template.spec.containers[0].resources.limits",
        upstream=True,
    ),
    Invalid(
        "gpujob-container-port-wrong-type",
        gpujob(
            template=_template(
                containers=[{"name": "c", "image": "i", "ports": [{"containerPort": "http"}]}]
            )
        ),
        "spec.template.spec.containers[0].ports[0].containerPort",
        upstream=True,
    ),
    # Hostile templates: GPUs beyond gpusPerReplica, forged ownership, a priority of their own.
    Invalid(
        "gpujob-gpus-in-a-second-container",
        gpujob(
            template=_template(
                containers=[
                    {"name": "main", "image": "i"},
                    {"name": "side", "image": "i", "resources": {"limits": {_GPU: "8"}}},
                ]
            )
        ),
        "spec.template.spec.containers",
    ),
    Invalid(
        "gpujob-gpus-in-an-init-container",
        gpujob(
            template=_template(
                initContainers=[
                    {"name": "warm", "image": "i", "resources": {"requests": {_GPU: 8}}}
                ],
                containers=[{"name": "main", "image": "i"}],
            )
        ),
        "spec.template.spec.initContainers",
    ),
    Invalid(
        "gpujob-template-claims-gpus",
        gpujob(
            template={
                "metadata": {"annotations": {"gpusched.io/gpu-indices": "0,1,2,3"}},
                "spec": {"containers": [{"name": "main", "image": "i"}]},
            }
        ),
        "spec.template.metadata.annotations",
    ),
    Invalid(
        "gpujob-template-plans-its-node",
        gpujob(
            template={
                "metadata": {"annotations": {"gpusched.io/planned-node": "n1"}},
                "spec": {"containers": [{"name": "main", "image": "i"}]},
            }
        ),
        "spec.template.metadata.annotations",
    ),
    # Refused by the CRD only: the models read stored jobs too, and a job stored before the
    # rule must stay readable (its pods get the job's grace period instead).
    Invalid(
        "gpujob-template-grace-period",
        gpujob(
            template=_template(
                terminationGracePeriodSeconds=10**9, containers=[{"name": "main", "image": "i"}]
            )
        ),
        "spec.template.spec.terminationGracePeriodSeconds",
        upstream=True,
    ),
    Invalid(
        "gpujob-template-priority-class",
        gpujob(
            template=_template(
                priorityClassName="high", containers=[{"name": "main", "image": "i"}]
            )
        ),
        "spec.template.spec.priorityClassName",
    ),
    Invalid(
        "gpujob-system-priority-class",
        gpujob(priorityClassName="system-node-critical"),
        "spec.priorityClassName",
    ),
    Invalid(
        "tenantquota-min-runtime-cap-too-long",
        tenantquota(preemption={"maxMinRuntimeSeconds": 8 * 86400}),
        "spec.preemption.maxMinRuntimeSeconds",
    ),
    Invalid(
        "tenantquota-bad-priority-class",
        tenantquota(allowedPriorityClasses=["High Priority"]),
        "spec.allowedPriorityClasses[0]",
    ),
    Invalid(
        "tenantquota-borrowing-below-guarantee",
        tenantquota(borrowingLimit=4),
        "spec.borrowingLimit",
    ),
    Invalid("tenantquota-zero-weight", tenantquota(weight=0), "spec.weight"),
    Invalid("tenantquota-negative-weight", tenantquota(weight=-1.5), "spec.weight"),
    # Weighted borrowing is GPUs over weight: a weight this small would rank as infinity.
    Invalid("tenantquota-vanishing-weight", tenantquota(weight=1e-320), "spec.weight"),
    Invalid("tenantquota-weight-below-least", tenantquota(weight=0.005), "spec.weight"),
    Invalid(
        "tenantquota-negative-guarantee", tenantquota(guaranteedGpus=-1), "spec.guaranteedGpus"
    ),
    Invalid(
        "tenantquota-guarantee-wrong-type",
        tenantquota(guaranteedGpus="eight"),
        "spec.guaranteedGpus",
    ),
    Invalid("tenantquota-parent-not-a-name", tenantquota(parent="Org A"), "spec.parent"),
    Invalid(
        "tenantquota-soft-cap-above-hard-cap",
        tenantquota(budget={"softCap": 20, "hardCap": 10}),
        "spec.budget.softCap",
    ),
    Invalid(
        "tenantquota-user-cap-zero", tenantquota(perUser={"maxGpus": 0}), "spec.perUser.maxGpus"
    ),
    Invalid("tenantquota-bad-namespace", tenantquota(namespaces=["Team_A"]), "spec.namespaces[0]"),
    Invalid(
        "tenantquota-models-exceed-guarantee",
        tenantquota(guaranteedGpusByModel={"NVIDIA-H100-80GB-HBM3": 6, "NVIDIA-A100-SXM4-80GB": 4}),
        "spec.guaranteedGpusByModel",
    ),
    Invalid(
        "tenantquota-model-not-a-label-value",
        tenantquota(guaranteedGpus=8, guaranteedGpusByModel={"NVIDIA H100 80GB HBM3": 4}),
        "spec.guaranteedGpusByModel",
    ),
    Invalid(
        "tenantquota-model-too-long",
        tenantquota(guaranteedGpus=8, guaranteedGpusByModel={"H" * 64: 4}),
        "spec.guaranteedGpusByModel",
    ),
    Invalid(
        "tenantquota-negative-model-guarantee",
        tenantquota(guaranteedGpusByModel={"NVIDIA-H100-80GB-HBM3": -1}),
        "spec.guaranteedGpusByModel",
    ),
    Invalid(
        "tenantquota-unknown-reclaim-policy",
        tenantquota(preemption={"reclaimBorrowed": "Sometimes"}),
        "spec.preemption.reclaimBorrowed",
    ),
    Invalid("tenantquota-unknown-field", tenantquota(maxGpus=4), "spec.maxGpus"),
    Invalid(
        "gpujob-segment-does-not-divide-replicas",
        gpujob(
            replicas=6,
            topology={
                "acrossReplicas": {
                    "nodeLabel": "example.com/block",
                    "segment": {"replicas": 4, "nodeLabel": "topology.kubernetes.io/rack"},
                }
            },
        ),
        "spec.topology.acrossReplicas.segment.replicas",
    ),
    Invalid(
        "gpujob-segment-without-label",
        gpujob(
            replicas=4,
            topology={
                "acrossReplicas": {"nodeLabel": "example.com/block", "segment": {"replicas": 2}}
            },
        ),
        "spec.topology.acrossReplicas.segment.nodeLabel",
    ),
    Invalid(
        "gpujob-across-replicas-label-not-a-label",
        gpujob(replicas=2, topology={"acrossReplicas": {"nodeLabel": "rack label"}}),
        "spec.topology.acrossReplicas.nodeLabel",
    ),
    Invalid(
        "gpujob-segment-label-not-a-label",
        gpujob(
            replicas=4,
            topology={
                "acrossReplicas": {
                    "nodeLabel": "example.com/block",
                    "segment": {"replicas": 2, "nodeLabel": "-clique-"},
                }
            },
        ),
        "spec.topology.acrossReplicas.segment.nodeLabel",
    ),
    Invalid(
        "gpujob-segment-mode-unknown",
        gpujob(
            replicas=4,
            topology={
                "acrossReplicas": {
                    "nodeLabel": "example.com/block",
                    "segment": {
                        "replicas": 2,
                        "nodeLabel": "topology.kubernetes.io/rack",
                        "mode": "sometimes",
                    },
                }
            },
        ),
        "spec.topology.acrossReplicas.segment.mode",
    ),
    Invalid(
        "networktopology-not-named-default",
        networktopology("racks"),
        "metadata.name",
        upstream=True,
    ),
    Invalid("networktopology-no-levels", networktopology(levels=[]), "spec.levels"),
    Invalid(
        "networktopology-label-twice",
        networktopology(
            levels=[
                {"name": "rack", "nodeLabel": "topology.kubernetes.io/rack"},
                {"name": "row", "nodeLabel": "topology.kubernetes.io/rack"},
            ]
        ),
        "spec.levels",
    ),
    Invalid(
        "networktopology-bad-label",
        networktopology(levels=[{"name": "rack", "nodeLabel": "rack label"}]),
        "spec.levels[0].nodeLabel",
    ),
    Invalid(
        "networktopology-level-name-missing",
        networktopology(levels=[{"nodeLabel": "topology.kubernetes.io/rack"}]),
        "spec.levels[0].name",
    ),
    Invalid("gpujob-name-too-long", gpujob("j" * 64), "metadata.name", upstream=True),
    # Templates that would cost the operator, which keeps every job in memory, far more than a
    # real pod's: refused by the CRD (the API server), which holds while the operator is down.
    Invalid(
        "gpujob-template-too-many-env-entries",
        gpujob(template=_template(containers=[{"name": "c", "image": "i", "env": _env(1025)}])),
        "spec.template.spec.containers[0].env",
        upstream=True,
    ),
    Invalid(
        "gpujob-template-too-many-config-map-items",
        gpujob(
            template=_template(
                containers=[{"name": "c", "image": "i"}],
                volumes=[
                    {
                        "name": "v",
                        "configMap": {
                            "name": "m",
                            "items": [{"key": f"k{i}", "path": f"p{i}"} for i in range(33)],
                        },
                    }
                ],
            )
        ),
        "spec.template.spec.volumes[0].configMap.items",
        upstream=True,
    ),
    Invalid(
        "gpujob-template-ephemeral-containers",
        gpujob(
            template=_template(
                containers=[{"name": "c", "image": "i"}],
                ephemeralContainers=[{"name": "debug", "image": "i"}],
            )
        ),
        "spec.template.spec.ephemeralContainers",
        upstream=True,
    ),
    Invalid("tenantquota-name-too-long", tenantquota("t" * 64), "metadata.name", upstream=True),
)
