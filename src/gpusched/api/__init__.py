"""The gpusched API: custom resource types, label and annotation keys, extender wire types.

Every contract between components lives here, once. The CRDs in ``crds/`` are generated from
these models (``gpusched crds generate``).
"""

from gpusched.api.gpujob import (
    GpuJob,
    GpuJobSpec,
    GpuJobStatus,
    JobPhase,
    PreemptionRecord,
    ReplicaPlacement,
    ReplicaTopology,
    TopologyMode,
    TopologyPolicy,
    TopologyScope,
)
from gpusched.api.meta import Condition, ConditionStatus, ObjectMeta
from gpusched.api.networktopology import NetworkLevel, NetworkTopology, NetworkTopologySpec
from gpusched.api.nodegputopology import (
    GpuHealth,
    GpuHealthState,
    GpuInfo,
    GpuLink,
    LinkType,
    NicInfo,
    NicLink,
    NodeGpuTopology,
    NodeGpuTopologySpec,
    NodeGpuTopologyStatus,
)
from gpusched.api.tenantquota import (
    PreemptionPolicy,
    ReclaimPolicy,
    TenantQuota,
    TenantQuotaSpec,
    TenantQuotaStatus,
    WithinTenantPreemption,
)

__all__ = [
    "Condition",
    "ConditionStatus",
    "GpuHealth",
    "GpuHealthState",
    "GpuInfo",
    "GpuJob",
    "GpuJobSpec",
    "GpuJobStatus",
    "GpuLink",
    "JobPhase",
    "LinkType",
    "NetworkLevel",
    "NetworkTopology",
    "NetworkTopologySpec",
    "NicInfo",
    "NicLink",
    "NodeGpuTopology",
    "NodeGpuTopologySpec",
    "NodeGpuTopologyStatus",
    "ObjectMeta",
    "PreemptionPolicy",
    "PreemptionRecord",
    "ReclaimPolicy",
    "ReplicaPlacement",
    "ReplicaTopology",
    "TenantQuota",
    "TenantQuotaSpec",
    "TenantQuotaStatus",
    "TopologyMode",
    "TopologyPolicy",
    "TopologyScope",
    "WithinTenantPreemption",
]
