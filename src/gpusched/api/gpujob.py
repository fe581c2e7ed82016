"""GpuJob: a gang of identical GPU pods that is admitted, placed and preempted as one."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from gpusched.api import keys
from gpusched.api.base import LABEL_VALUE_PATTERN, ApiModel, LenientApiModel
from gpusched.api.meta import Condition, ObjectMeta
from gpusched.api.networktopology import LabelKey

#: Marks the ``template`` field for the CRD generator, which embeds the upstream schema there.
POD_TEMPLATE_SCHEMA: Final = "io.k8s.api.core.v1.PodTemplateSpec"

MAX_GPUS_PER_REPLICA: Final = 64
MAX_REPLICAS: Final = 4096
#: Most bytes of JSON a pod template may take, refused by the operator's webhook. The operator
#: keeps every job's template in memory, where a list item or map entry costs ~200 bytes
#: whatever its JSON size: an unbounded template (40,000 env entries fit in etcd's 1.5 MiB)
#: cost ~10 MB each. While the operator is down the API server skips the webhook; then the
#: CRD's bound on every list of the template and etcd's object size (managed fields included,
#: which grow with the entries) still hold. 256 KiB is what Kubernetes allows an object's
#: annotations in all; a large real pod (10 containers with 200 env entries each, 50 volumes
#: and their mounts) takes ~100 KiB. A count of every entry in a CEL rule was measured and not
#: kept: it cost the API server a quarter more CPU on every GpuJob write, status included
#: (docs/benchmarks.md).
MAX_TEMPLATE_BYTES: Final = 256 * 1024


class TopologyScope(StrEnum):
    """How tightly one replica's GPUs must be wired together, tightest first."""

    NVLINK = "nvlink"
    """NVLink between every pair of the replica's GPUs (an NVSwitch board, a bridged group; in a
    mesh such as DGX-1's, a fully linked quad rather than the whole island)."""
    PCIE_SWITCH = "pcie-switch"
    """All GPUs under one PCIe switch tree (PIX/PXB), or NVLinked."""
    NUMA = "numa"
    """All GPUs attached to one NUMA node (no SYS hop)."""
    NODE = "node"
    """Any GPUs of one node."""


class TopologyMode(StrEnum):
    """Whether a topology scope is a hard constraint or a preference."""

    REQUIRED = "required"
    """Never place outside the scope; wait instead."""
    PREFERRED = "preferred"
    """Place inside the scope when possible, otherwise on the best set available."""


class ReplicaSegment(ApiModel):
    """Consecutive replicas that must share a narrower domain than the whole gang."""

    replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Replicas per segment: replicas 0..n-1 form the first segment, n..2n-1 the next, and so
    on. ``spec.replicas`` must be a multiple of it."""
    node_label: LabelKey
    """Node label of the segment's domain (e.g. ``nvidia.com/gpu.clique``): every segment is
    placed inside one domain of it."""
    mode: TopologyMode = TopologyMode.REQUIRED
    """``required`` (the default): the gang waits until every segment fits inside one domain;
    ``preferred``: segments are kept whenever some placement keeps them, otherwise the gang is
    placed as if it had none (its ``nodeLabel`` and ``mode`` still apply)."""


class ReplicaTopology(ApiModel):
    """Where the replicas of a multi-node gang go relative to each other."""

    node_label: LabelKey
    """Node label whose value names a network domain (rack, block, NVLink clique), e.g.
    ``topology.kubernetes.io/rack`` or ``nvidia.com/gpu.clique``. All replicas are placed on nodes
    sharing one value of this label; with the cluster's NetworkTopology, in the narrowest level
    below it that holds the whole gang."""
    mode: TopologyMode = TopologyMode.PREFERRED
    """``required``: wait until one domain can host the whole gang; ``preferred``: use the fewest
    domains possible."""
    segment: ReplicaSegment | None = None
    """Split the gang into segments, each inside one domain of a narrower label (e.g. 16
    replicas in segments of 4 per NVLink clique, the gang inside one block). Unset: none."""


class TopologyPolicy(ApiModel):
    """Topology constraints of a job: inside each replica, and across replicas."""

    scope: TopologyScope = TopologyScope.NODE
    """How tightly the GPUs of one replica must be connected: ``nvlink``, ``pcie-switch``,
    ``numa`` or ``node``. The placement engine always picks the best-connected set it can; the scope
    says what counts as good enough."""
    mode: TopologyMode = TopologyMode.PREFERRED
    """``required`` keeps the job pending with reason ``TopologyUnsatisfiable`` rather than place a
    replica outside ``scope``; ``preferred`` places it anyway and reports the achieved class."""
    across_replicas: ReplicaTopology | None = None
    """Placement of replicas relative to each other, for multi-node gangs. Unset: any nodes."""


def _immutable(what: str) -> dict[str, JsonValue]:
    """CEL transition rule refusing changes to a field once the job exists."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": "self == oldSelf",
                "message": f"{what} is immutable; delete and recreate the GpuJob to change it",
                "reason": "FieldValueForbidden",
            }
        ]
    }


#: Why protection from preemption may only shrink once a job exists: admission decided on it
#: (a job is backfilled onto GPUs reserved for another because it is preemptible, or ends in
#: time), and borrowed GPUs go only to jobs that can be evicted when their owner wants them
#: back. A job that could turn that protection up after admission would keep what it was
#: given on the promise to leave.
_ONE_WAY: Final = (
    "{what} once the GpuJob exists: admission decided on it; delete and recreate the GpuJob "
    "to ask for more protection from preemption"
)


def _one_way(rule: str, what: str) -> dict[str, JsonValue]:
    """CEL transition rule letting a field change only towards less protection."""
    return {
        "x-kubernetes-validations": [
            {"rule": rule, "message": _ONE_WAY.format(what=what), "reason": "FieldValueForbidden"}
        ]
    }


#: CEL: container ``c`` asks for GPUs (limits or requests).
_ASKS_GPUS: Final = (
    f"has(c.resources) && ((has(c.resources.limits) && '{keys.GPU_RESOURCE}' in c.resources.limits)"
    f" || (has(c.resources.requests) && '{keys.GPU_RESOURCE}' in c.resources.requests))"
)

_TEMPLATE_RULES: Final[dict[str, JsonValue]] = {
    "x-kubernetes-validations": [
        {
            "rule": "has(self.spec) && has(self.spec.containers) && size(self.spec.containers) > 0",
            "message": "at least one container is required",
            "fieldPath": ".spec.containers",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.restartPolicy) "
            "|| self.spec.restartPolicy != 'Always'",
            "message": "a GpuJob's pods run to completion: restartPolicy Never (the default) or "
            "OnFailure",
            "fieldPath": ".spec.restartPolicy",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.nodeName)",
            "message": "nodeName is chosen by gpusched; leave it empty",
            "fieldPath": ".spec.nodeName",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.schedulerName) "
            "|| self.spec.schedulerName == 'gpusched'",
            "message": "schedulerName is set to gpusched by the operator; leave it empty",
            "fieldPath": ".spec.schedulerName",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || (!has(self.spec.priorityClassName) "
            "&& !has(self.spec.priority))",
            "message": "the pods' priority comes from the GpuJob's spec.priorityClassName; leave "
            "priorityClassName and priority out of the template",
            "fieldPath": ".spec.priorityClassName",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.terminationGracePeriodSeconds)",
            "message": "the pods' grace period is the GpuJob's checkpointGracePeriodSeconds "
            "(capped by its tenant); leave terminationGracePeriodSeconds out of the template",
            "fieldPath": ".spec.terminationGracePeriodSeconds",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.initContainers) || "
            f"!self.spec.initContainers.exists(c, {_ASKS_GPUS})",
            "message": f"init containers may not request {keys.GPU_RESOURCE}: the job's GPUs are "
            "gpusPerReplica, given to the first container",
            "fieldPath": ".spec.initContainers",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.spec) || !has(self.spec.containers) || "
            f"self.spec.containers.filter(c, {_ASKS_GPUS}).size() == 0 || "
            f"(self.spec.containers.filter(c, {_ASKS_GPUS}).size() == 1 && "
            f"[self.spec.containers[0]].exists(c, {_ASKS_GPUS}))",
            "message": f"only the first container gets GPUs (gpusPerReplica, set by the "
            f"operator); the others may not request {keys.GPU_RESOURCE}",
            "fieldPath": ".spec.containers",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.metadata) || !has(self.metadata.annotations) || "
            f"![{', '.join(repr(k) for k in keys.OWNERSHIP_ANNOTATIONS)}]"
            ".exists(k, k in self.metadata.annotations)",
            "message": "the annotations that say which GPUs a pod holds are written by gpusched "
            f"alone; remove {', '.join(keys.OWNERSHIP_ANNOTATIONS)} from the template",
            "fieldPath": ".metadata.annotations",
            "reason": "FieldValueForbidden",
        },
    ]
}


class GpuJobSpec(ApiModel):
    """What the job needs. Tenant and quota come from the namespace, never from this spec."""

    # The same rule as _segments_divide_replicas, for the API server (CEL); then the transition
    # rules of optional fields, which a rule on the field itself misses when it is added or
    # removed (the API server runs those only when the old and the new object both have it).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.topology) || !has(self.topology.acrossReplicas) || "
                    "!has(self.topology.acrossReplicas.segment) || "
                    "self.replicas % self.topology.acrossReplicas.segment.replicas == 0",
                    "message": "replicas must be a multiple of "
                    "topology.acrossReplicas.segment.replicas",
                    "fieldPath": ".topology.acrossReplicas.segment.replicas",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "has(self.gpuModel) == has(oldSelf.gpuModel)",
                    "message": "gpuModel is immutable; delete and recreate the GpuJob to change it",
                    "fieldPath": ".gpuModel",
                    "reason": "FieldValueForbidden",
                },
                {
                    "rule": "!has(oldSelf.maxRuntimeSeconds) || (has(self.maxRuntimeSeconds) "
                    "&& self.maxRuntimeSeconds <= oldSelf.maxRuntimeSeconds)",
                    "message": _ONE_WAY.format(
                        what="maxRuntimeSeconds may be lowered but not raised or removed"
                    ),
                    "fieldPath": ".maxRuntimeSeconds",
                    "reason": "FieldValueForbidden",
                },
            ]
        }
    )

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, json_schema_extra=_immutable("replicas"))
    """Number of pods in the gang. All are admitted together or none is."""
    gpus_per_replica: int = Field(
        ge=1, le=MAX_GPUS_PER_REPLICA, json_schema_extra=_immutable("gpusPerReplica")
    )
    """GPUs for each pod, all on one node. The operator sets the ``nvidia.com/gpu`` limit of the
    pod's first container to this value."""
    gpu_model: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        json_schema_extra=_immutable("gpuModel"),
    )
    """Restrict placement to nodes whose GPUs are this model, as in the ``nvidia.com/gpu.product``
    label (e.g. ``NVIDIA-H100-80GB-HBM3``). Unset: any model."""
    topology: TopologyPolicy = Field(
        default_factory=TopologyPolicy, json_schema_extra=_immutable("topology")
    )
    """Topology constraints for each replica's GPU set and for the gang as a whole."""
    priority_class_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!self.startsWith('system-')",
                    "message": "Kubernetes' system- priority classes are for cluster components, "
                    "not GpuJobs",
                    "reason": "FieldValueForbidden",
                }
            ]
        },
    )
    """A PriorityClass whose value orders this job against others of its tenant and decides who
    may preempt whom; the job's pods run with it. Kubernetes' own ``system-`` classes are
    refused, and a tenant may list the classes its jobs may use (TenantQuota
    ``allowedPriorityClasses``). Unset: the cluster's global default PriorityClass, else 0."""
    preemptible: bool = Field(
        True,
        json_schema_extra=_one_way("self || !oldSelf", "preemptible may be turned on but not off"),
    )
    """Whether higher-priority jobs of the tenant, or a tenant reclaiming its guarantee, may
    evict this job. ``false`` jobs are never victims (and may not run on borrowed capacity).
    Once the job exists it may be turned on, not off."""
    min_runtime_seconds: int = Field(
        0,
        ge=0,
        le=7 * 24 * 3600,
        json_schema_extra=_one_way(
            "self <= oldSelf", "minRuntimeSeconds may be lowered but not raised"
        ),
    )
    """The job cannot be preempted until it has run this long since it last started; at most
    the tenant's ``preemption.maxMinRuntimeSeconds``, and on borrowed GPUs at most its
    ``preemption.borrowedProtectionSeconds`` against a tenant reclaiming its guarantee. Once the
    job exists it may be lowered, not raised."""
    max_runtime_seconds: int | None = Field(None, ge=60, le=30 * 24 * 3600)
    """A declared limit on the job's run time: when its pods have all been running this long,
    the job ends ``Failed`` with reason ``MaxRuntimeExceeded``. It also stands for the job's
    predicted run time (instead of its tenant's recent history), which gives it an honest
    expected end and lets it start on GPUs reserved for another job when it ends before that
    job's reservation starts. Unset: no limit. Once the job exists it may be added or lowered, not
    raised or removed."""
    checkpoint_grace_period_seconds: int = Field(30, ge=0, le=24 * 3600)
    """Seconds between the preemption notice (SIGTERM) and the kill, for the job to checkpoint;
    at most the tenant's ``preemption.maxCheckpointGracePeriodSeconds``, and at most its
    ``preemption.borrowedProtectionSeconds`` when a guarantee is reclaimed."""
    suspend: bool = False
    """A suspended job is not admitted; suspending a running job releases its pods and GPUs."""
    template: dict[str, Any] = Field(
        json_schema_extra={"x-gpusched-embed": POD_TEMPLATE_SCHEMA, **_TEMPLATE_RULES}
    )
    """The pod template of every replica (a standard PodTemplateSpec). ``schedulerName`` and the
    GPU resource limit are set by the operator."""

    @model_validator(mode="after")
    def _segments_divide_replicas(self) -> GpuJobSpec:
        across = self.topology.across_replicas
        if across is not None and across.segment and self.replicas % across.segment.replicas:
            raise ValueError(
                "spec.topology.acrossReplicas.segment.replicas: spec.replicas must be a "
                "multiple of it"
            )
        return self

    @model_validator(mode="after")
    def _template_is_schedulable(self) -> GpuJobSpec:
        spec = self.template.get("spec")
        if not isinstance(spec, dict) or not spec.get("containers"):
            raise ValueError("spec.template.spec.containers: at least one container is required")
        if (self.priority_class_name or "").startswith("system-"):
            raise ValueError(
                "spec.priorityClassName: Kubernetes' system- priority classes are for cluster "
                "components, not GpuJobs"
            )
        if spec.get("nodeName"):
            raise ValueError("spec.template.spec.nodeName is chosen by gpusched; leave it empty")
        if spec.get("restartPolicy") == "Always":
            raise ValueError(
                "spec.template.spec.restartPolicy: a GpuJob's pods run to completion: Never "
                "(the default) or OnFailure"
            )
        if spec.get("schedulerName") not in (None, keys.SCHEDULER_NAME):
            raise ValueError("spec.template.spec.schedulerName is set by the operator")
        if "priorityClassName" in spec or "priority" in spec:
            raise ValueError(
                "spec.template.spec.priorityClassName: the pods' priority comes from the "
                "GpuJob's spec.priorityClassName"
            )
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(spec.get(kind) or []):
                if (kind, i) != ("containers", 0) and _asks_gpus(container):
                    raise ValueError(
                        f"spec.template.spec.{kind}[{i}]: only the first container gets GPUs "
                        f"(gpusPerReplica); the others may not request {keys.GPU_RESOURCE}"
                    )
        annotations = (self.template.get("metadata") or {}).get("annotations") or {}
        owned = sorted(k for k in keys.OWNERSHIP_ANNOTATIONS if k in annotations)
        if owned:
            raise ValueError(
                f"spec.template.metadata.annotations: {', '.join(owned)} are written by gpusched "
                "alone"
            )
        return self


def _asks_gpus(container: Any) -> bool:
    """Whether a template container requests the GPU resource (limits or requests)."""
    resources = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(resources, dict):
        return False
    return any(
        isinstance(resources.get(kind), dict) and keys.GPU_RESOURCE in resources[kind]
        for kind in ("limits", "requests")
    )


class JobPhase(StrEnum):
    """Where a job is in its life."""

    QUEUED = "Queued"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PREEMPTED = "Preempted"
    SUSPENDED = "Suspended"


TERMINAL_PHASES: Final = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED})


class ReplicaPlacement(ApiModel):
    """Where one replica runs and how well its GPUs are connected."""

    replica: int = Field(ge=0)
    """Replica index, 0-based."""
    node: str
    """Node name."""
    gpu_indices: list[int] = Field(default_factory=list)
    """GPU indices on the node (``nvidia-smi`` numbering)."""
    gpu_uuids: list[str] = Field(default_factory=list)
    """GPU UUIDs, once bound."""
    topology_class: str | None = None
    """Achieved topology class of the set: ``nvlink``, ``pcie-switch``, ``numa`` or ``node``."""
    score: float | None = None
    """Placement score of the set (higher is better), comparable across nodes of one model."""


class PreemptionRecord(ApiModel):
    """One time this job was preempted."""

    time: datetime
    """When the eviction was issued."""
    preemptor: str
    """``namespace/name`` of the job that needed the GPUs."""
    reason: str
    """Machine reason, e.g. ``ReclaimGuarantee`` or ``HigherPriority``."""
    message: str = ""
    """Sentence for humans."""


class ReservedGpus(ApiModel):
    """GPUs held for a waiting job: where it starts when they come free."""

    start: datetime
    """When the reserved GPUs are expected to be free (from the running jobs' predicted ends)."""
    placement: list[ReplicaPlacement] = Field(default_factory=list)
    """Node and GPU set per replica."""
    idle_gpus: int = Field(0, ge=0)
    """Reserved GPUs free now and kept idle for the job (except for jobs that end in time)."""


class GpuJobStatus(ApiModel):
    """What happened to the job and why; written only by the operator."""

    phase: JobPhase | None = None
    """Queued, Admitted, Running, Succeeded, Failed, Preempted or Suspended."""
    tenant: str | None = None
    """The TenantQuota that owns the job's namespace."""
    reason: str | None = None
    """Machine reason for the current phase (e.g. ``QuotaExceeded``, ``WaitingForCapacity``)."""
    message: str | None = None
    """Why the job is where it is, in one sentence."""
    queue_position: int | None = Field(None, ge=1)
    """1-based position among the tenant's pending jobs, while queued."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """QuotaReserved, Admitted, PodsReady, Preempted and Finished, each with reason and message."""
    placement: list[ReplicaPlacement] = Field(default_factory=list)
    """Node and GPU set per replica: while admitted, the GPUs held for it (planned); once
    its pods run, the GPUs they were bound to; after it ends, where it ran. Empty whenever
    the job holds no placement and did not run on the last one: queued (also after a
    release or a preemption), suspended, or failed before its pods all ran (refused, or
    given up after pods-ready timeouts or kubelet refusals; its conditions say why)."""
    placement_quality: str | None = None
    """Worst achieved topology class over ``placement``'s replicas (printer column); unset
    whenever ``placement`` is empty."""
    gpus: int | None = Field(None, ge=0)
    """Total GPUs of the job, replicas x gpusPerReplica (printer column)."""
    admission: int = Field(0, ge=0)
    """How many times the job has been admitted; names the current gang's pods."""
    submitted_at: datetime | None = None
    """When the operator first queued the job."""
    admitted_at: datetime | None = None
    """When the current admission happened."""
    started_at: datetime | None = None
    """When all replicas of the current admission were running (their containers' start as
    the kubelet recorded it, between the pods' creation and the moment the operator saw it)."""
    finished_at: datetime | None = None
    """When the job succeeded or failed (its pods' containers' end, when they recorded one)."""
    gpu_seconds: float = Field(0.0, ge=0)
    """GPU-seconds consumed by the job so far (metered)."""
    preemptions: list[PreemptionRecord] = Field(default_factory=list, max_length=20)
    """The most recent preemptions of this job, newest last."""
    preemption_count: int = Field(0, ge=0)
    """How many times the job has been preempted in total."""
    expected_start: datetime | None = None
    """While queued: when the job is expected to start, from the running jobs' predicted ends
    (its reservation's start, else a forward replay of the queue). Unset when nobody can say
    (GPUs held by jobs with no predicted end, or no node can ever hold it)."""
    first_expected_start: datetime | None = None
    """The first expected start this wait was given, kept to measure how good it was."""
    reservation: ReservedGpus | None = None
    """While queued: the GPUs held for this job, if it got a reservation."""
    expected_end: datetime | None = None
    """While admitted: when the job is expected to end (its declared limit, else its
    predicted run time)."""
    backfill_until: datetime | None = None
    """While admitted onto GPUs reserved for another job: the reservation's start. A job still
    running then may be preempted for it (if preemptible and past its minimum run time)."""
    requeue_at: datetime | None = None
    """While queued after its pods were not all running in time: not admitted again before this
    time (exponential backoff)."""
    requeue_count: int = Field(0, ge=0)
    """How many times the gang was released and queued again with backoff (pods not all
    running in time, pods refused by the API server or by a node)."""
    node_rejections: int = Field(0, ge=0)
    """Times in a row a node's kubelet refused to admit a pod of the job (no container ran);
    reset when the job runs. At the operator's ``--max-node-rejections`` the job fails."""
    unready_releases: int = Field(0, ge=0)
    """Times the gang was released for not running in time while a pod waited on one of its
    own containers (an image that cannot be pulled, a missing secret), without running in
    between; reset when the job runs. At the operator's ``--max-unready-releases`` the job
    fails (``PodsReadyTimeout``)."""
    observed_generation: int | None = None
    """The spec generation this status was computed from."""


class GpuJob(LenientApiModel):
    """A GPU job: ``replicas`` pods of ``gpusPerReplica`` GPUs each, scheduled as one gang."""

    api_version: Literal["gpusched.io/v1alpha1"] = keys.API_VERSION
    kind: Literal["GpuJob"] = "GpuJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GpuJobSpec
    status: GpuJobStatus = Field(default_factory=GpuJobStatus)

    @property
    def total_gpus(self) -> int:
        """GPUs the whole gang holds when running."""
        return self.spec.replicas * self.spec.gpus_per_replica
