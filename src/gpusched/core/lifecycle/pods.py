"""The pods of an admitted gang, built from the GpuJob's template.

Names are deterministic, ``<job>-<admission>-<replica>``: creating a pod twice (an operator that
restarted halfway through a gang) answers AlreadyExists instead of making a duplicate, and a
requeued job's new gang never collides with the pods of its previous admission.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Final

from gpusched.api import keys
from gpusched.api.annotations import format_indices
from gpusched.api.gpujob import GpuJob, ReplicaPlacement

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
MAX_NAME: Final = 253


def pod_name(job: str, admission: int, replica: int) -> str:
    """``<job>-<admission>-<replica>``, shortened with a digest if the job name is very long."""
    suffix = f"-{admission}-{replica}"
    if len(job) + len(suffix) <= MAX_NAME:
        return job + suffix
    digest = hashlib.sha256(job.encode()).hexdigest()[:10]
    return f"{job[: MAX_NAME - len(suffix) - 11]}-{digest}{suffix}"


def pod_manifest(
    job: GpuJob,
    *,
    tenant: str,
    admission: int,
    replica: int,
    placement: ReplicaPlacement | None,
    grace_seconds: int | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """One replica's pod. ``placement`` pins it to the planned node (None for a dry run).
    ``grace_seconds``: the job's grace period as its tenant caps it
    (:meth:`~gpusched.core.lifecycle.tenants.Protection.grace`), the pod's own."""
    meta = job.metadata
    spec = job.spec
    name = meta.name or ""
    template = copy.deepcopy(spec.template)
    tmeta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        keys.LABEL_JOB_NAME: name,
        keys.LABEL_JOB_UID: meta.uid or "",
        keys.LABEL_TENANT: tenant,
        keys.LABEL_REPLICA_INDEX: str(replica),
        keys.LABEL_ADMISSION: str(admission),
    }
    # The CRD refuses templates carrying gpusched's GPU ownership annotations; a job stored
    # before that rule still never passes them on (the pod-gpu-ownership policy would refuse
    # the pod).
    inherited = {
        k: v
        for k, v in (tmeta.get("annotations") or {}).items()
        if k not in keys.OWNERSHIP_ANNOTATIONS
    }
    annotations = {
        **inherited,
        keys.ANNOTATION_TOPOLOGY_SCOPE: spec.topology.scope.value,
        keys.ANNOTATION_TOPOLOGY_MODE: spec.topology.mode.value,
        keys.ANNOTATION_GANG_SIZE: str(spec.replicas),
    }
    pod_spec["schedulerName"] = keys.SCHEDULER_NAME
    # The pod's own grace period is what a delete without one gives it: the deletion of its job
    # (after which nothing charges its GPUs to the tenant), a failed gang's cleanup, a drain.
    # The template's would let a pod that ignores SIGTERM hold its GPUs for as long as it
    # likes; the CRD refuses it, and a job stored before that rule gets the job's too.
    if grace_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace_seconds
    else:
        pod_spec.pop("terminationGracePeriodSeconds", None)
    # A pod left to Kubernetes' default (Always) would be restarted when its work is done and
    # never end; the CRD refuses Always, and a job stored before that rule runs to completion
    # too. (Any other value goes to the API server as written, which judges it.)
    if pod_spec.get("restartPolicy") in (None, "Always"):
        pod_spec["restartPolicy"] = "Never"
    # The pods run at the job's priority, so the kubelet's and the scheduler's preemption, and
    # ResourceQuotas scoped by PriorityClass, see what admission saw.
    pod_spec.pop("priority", None)
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    else:
        pod_spec.pop("priorityClassName", None)
    containers = pod_spec.get("containers") or []
    if containers:
        first = containers[0]
        resources = first.setdefault("resources", {})
        limits = resources.setdefault("limits", {})
        limits[keys.GPU_RESOURCE] = str(spec.gpus_per_replica)
        requests = resources.get("requests")
        if isinstance(requests, dict) and keys.GPU_RESOURCE in requests:
            requests[keys.GPU_RESOURCE] = str(spec.gpus_per_replica)
    if placement is not None:
        annotations[keys.ANNOTATION_PLANNED_NODE] = placement.node
        if placement.gpu_indices:
            annotations[keys.ANNOTATION_PLANNED_GPU_INDICES] = format_indices(placement.gpu_indices)
        # Binding follows the admission decision even without the extender.
        pod_spec["nodeSelector"] = {
            **(pod_spec.get("nodeSelector") or {}),
            HOSTNAME_LABEL: placement.node,
        }
    metadata: dict[str, Any] = {
        "namespace": meta.namespace,
        "labels": labels,
        "annotations": annotations,
    }
    if dry_run:
        metadata["generateName"] = f"{name[:200]}-dry-run-"
    else:
        metadata["name"] = pod_name(name, admission, replica)
        metadata["ownerReferences"] = [
            {
                "apiVersion": keys.API_VERSION,
                "kind": "GpuJob",
                "name": name,
                "uid": meta.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
