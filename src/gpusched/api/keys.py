"""Every label, annotation, finalizer and resource name gpusched reads or writes.

One module so that the probe, the extender, the operator, the CLI and the docs agree on a single
spelling; nothing else in the code base may spell these strings.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "gpusched.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "gpusched.io/v1alpha1"
PREFIX: Final = f"{GROUP}/"

#: The extended resource the NVIDIA device plugin advertises and GPU pods request.
GPU_RESOURCE: Final = "nvidia.com/gpu"
#: The kube-scheduler profile (and pod ``schedulerName``) served with the extender.
SCHEDULER_NAME: Final = "gpusched"
#: Field manager used for every server-side apply by gpusched components.
FIELD_MANAGER_PROBE: Final = "gpusched-device-probe"
FIELD_MANAGER_OPERATOR: Final = "gpusched-operator"
FIELD_MANAGER_SCHEDULER: Final = "gpusched-scheduler"
FIELD_MANAGER_NODE_AGENT: Final = "gpusched-node-agent"

# --- Node labels written by the device probe (our own prefix) -------------------------------
LABEL_GPU_COUNT: Final = f"{PREFIX}gpu.count"
LABEL_GPU_HEALTHY: Final = f"{PREFIX}gpu.healthy"
LABEL_GPU_MODEL: Final = f"{PREFIX}gpu.model"
LABEL_NVLINK_ISLANDS: Final = f"{PREFIX}nvlink.islands"
LABEL_NVLINK_LARGEST_ISLAND: Final = f"{PREFIX}nvlink.largest-island"
LABEL_NVSWITCH: Final = f"{PREFIX}nvswitch"
LABEL_NUMA_NODES: Final = f"{PREFIX}numa.nodes"
LABEL_TOPOLOGY_HASH: Final = f"{PREFIX}topology.hash"
#: Marks a node the probe has published at least once; selectors for GPU nodes key on it.
LABEL_PROBED: Final = f"{PREFIX}probed"

# --- GPU Feature Discovery compatible labels (written only where GFD is absent) --------------
GFD_PREFIX: Final = "nvidia.com/"
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_COUNT: Final = "nvidia.com/gpu.count"
GFD_MEMORY: Final = "nvidia.com/gpu.memory"
GFD_FAMILY: Final = "nvidia.com/gpu.family"
GFD_COMPUTE_MAJOR: Final = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR: Final = "nvidia.com/gpu.compute.minor"
GFD_DRIVER_MAJOR: Final = "nvidia.com/cuda.driver-version.major"
GFD_DRIVER_MINOR: Final = "nvidia.com/cuda.driver-version.minor"
GFD_DRIVER_REV: Final = "nvidia.com/cuda.driver-version.revision"
GFD_DRIVER_FULL: Final = "nvidia.com/cuda.driver-version.full"
GFD_RUNTIME_MAJOR: Final = "nvidia.com/cuda.runtime-version.major"
GFD_RUNTIME_MINOR: Final = "nvidia.com/cuda.runtime-version.minor"
GFD_RUNTIME_FULL: Final = "nvidia.com/cuda.runtime-version.full"
GFD_MIG_CAPABLE: Final = "nvidia.com/mig.capable"
GFD_CLIQUE: Final = "nvidia.com/gpu.clique"
#: GFD stamps this on every node it labels; its presence means GFD owns the ``nvidia.com/`` keys.
GFD_TIMESTAMP: Final = "nvidia.com/gfd.timestamp"

#: Taint the probe may put on a node whose GPUs are all unhealthy.
TAINT_NO_HEALTHY_GPU: Final = f"{PREFIX}no-healthy-gpu"

# --- Pod labels and annotations --------------------------------------------------------------
#: Comma-separated GPU UUIDs the extender bound the pod to (the single source of truth).
ANNOTATION_GPUS: Final = f"{PREFIX}gpus"
#: Comma-separated GPU indices on the node, matching ``ANNOTATION_GPUS`` one to one.
ANNOTATION_GPU_INDICES: Final = f"{PREFIX}gpu-indices"
#: GPU UUIDs the kubelet really allocated to the pod's containers, read from its PodResources
#: API and written by the node agent (gpusched's device plugin); comma-separated, index order.
#: For a pod gpusched did not place, it is how the extender learns which GPUs the pod holds.
ANNOTATION_ALLOCATED_GPUS: Final = f"{PREFIX}allocated-gpus"
#: The indices of ``ANNOTATION_ALLOCATED_GPUS``, one to one.
ANNOTATION_ALLOCATED_GPU_INDICES: Final = f"{PREFIX}allocated-gpu-indices"
#: Achieved topology class of the bound set (``nvlink``, ``pcie-switch``, ``numa``, ``node``).
ANNOTATION_TOPOLOGY_CLASS: Final = f"{PREFIX}topology-class"
#: Requested scope and mode; the operator sets them from the GpuJob, users may set them directly.
ANNOTATION_TOPOLOGY_SCOPE: Final = f"{PREFIX}topology-scope"
ANNOTATION_TOPOLOGY_MODE: Final = f"{PREFIX}topology-mode"
#: Node the admission cycle planned for this replica (the extender prefers it).
ANNOTATION_PLANNED_NODE: Final = f"{PREFIX}planned-node"
#: GPU indices the admission cycle planned for this replica on the planned node.
ANNOTATION_PLANNED_GPU_INDICES: Final = f"{PREFIX}planned-gpu-indices"
#: On a GpuJob (or its pods): RFC 3339 time of the job's latest checkpoint, written by the
#: workload; work before it is not counted as lost when choosing preemption victims.
ANNOTATION_LAST_CHECKPOINT: Final = f"{PREFIX}last-checkpoint"
#: On a GpuJob: the user the API server authenticated when it was created, recorded by the
#: chart's admission policy (it cannot be set or changed by anyone else); per-user caps and
#: per-user spending count it.
ANNOTATION_SUBMITTER: Final = f"{PREFIX}submitter"
#: Number of replicas of the pod's gang; above 1 the placement favours NIC-local GPUs.
ANNOTATION_GANG_SIZE: Final = f"{PREFIX}gang-size"
#: Why a pod was evicted by the operator (preemption), human readable.
ANNOTATION_PREEMPTED_BY: Final = f"{PREFIX}preempted-by"

#: Annotations that say which GPUs a pod holds or will hold: only gpusched's identities write
#: them (the chart's pod-gpu-ownership admission policy; gpusched.core.podgpus believes them
#: only where gpusched could have written them). A GpuJob's template may not carry them.
OWNERSHIP_ANNOTATIONS: Final = (
    ANNOTATION_GPUS,
    ANNOTATION_GPU_INDICES,
    ANNOTATION_TOPOLOGY_CLASS,
    ANNOTATION_ALLOCATED_GPUS,
    ANNOTATION_ALLOCATED_GPU_INDICES,
    ANNOTATION_PLANNED_NODE,
    ANNOTATION_PLANNED_GPU_INDICES,
)

LABEL_JOB_NAME: Final = f"{PREFIX}job-name"
LABEL_JOB_UID: Final = f"{PREFIX}job-uid"
LABEL_TENANT: Final = f"{PREFIX}tenant"
LABEL_REPLICA_INDEX: Final = f"{PREFIX}replica-index"
#: On a GpuJob: the name its runs share for run-time prediction (default: the job's name
#: without run numbers and generated suffixes).
LABEL_FAMILY: Final = f"{PREFIX}family"
#: Admission generation of the gang the pod belongs to; a requeued job gets a new one.
LABEL_ADMISSION: Final = f"{PREFIX}admission"

#: The labels that say which GpuJob (and which gang of it) a pod belongs to: only the operator
#: writes them, when it creates the pod (the chart's gpujob-pod-identity admission policy).
GPUJOB_POD_LABELS: Final = (
    LABEL_JOB_NAME,
    LABEL_JOB_UID,
    LABEL_TENANT,
    LABEL_REPLICA_INDEX,
    LABEL_ADMISSION,
)

FINALIZER_JOB: Final = f"{PREFIX}gpujob"
#: Simulated runtime and exit code of pods on kwok nodes (see docs/development.md).
SIM_RUNTIME: Final = "sim.gpusched.io/runtime"
SIM_EXIT_CODE: Final = "sim.gpusched.io/exit-code"

# --- kwok, used by the local cluster and tests ------------------------------------------------
KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE: Final = "fake"
