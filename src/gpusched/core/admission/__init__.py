"""The admission core: tenant quotas, fair share, priorities, gangs and preemption as one pure
function from a snapshot to decisions (see docs/quotas.md).

    from gpusched.core.admission import Snapshot, run_cycle

    result = run_cycle(Snapshot(now, tenants, jobs, nodes))
    result.admissions   # jobs to start, with GPUs per replica and the victims to evict
    result.waiting      # jobs left queued, with a machine reason and a sentence
    result.tenants      # used / borrowed / fair share per tenant
    result.reservations # GPUs held for blocked jobs from when they come free

``Cycle(snapshot)`` runs the same decisions step by step; after :meth:`Cycle.run`,
:meth:`Cycle.forecast` works out every waiting job's expected start. A long-running caller
makes its cycles through one :class:`Cycles`, which keeps the pool of free GPUs from cycle to
cycle and rebuilds only the nodes whose holders changed (the same decisions, less work).
"""

from gpusched.core.admission.cycle import Cycle, run_cycle
from gpusched.core.admission.incremental import Cycles
from gpusched.core.admission.model import (
    AcrossReplicas,
    Admission,
    AdmitReason,
    Assignment,
    CycleConfig,
    CycleResult,
    Job,
    JobState,
    Level,
    Node,
    Preemption,
    PreemptReason,
    ReplicaPlan,
    Reservation,
    Snapshot,
    Taint,
    Tenant,
    TenantUsage,
    Toleration,
    Waiting,
    WaitReason,
)
from gpusched.core.admission.nodes import count_only_topology

__all__ = [
    "AcrossReplicas",
    "Admission",
    "AdmitReason",
    "Assignment",
    "Cycle",
    "CycleConfig",
    "CycleResult",
    "Cycles",
    "Job",
    "JobState",
    "Level",
    "Node",
    "PreemptReason",
    "Preemption",
    "ReplicaPlan",
    "Reservation",
    "Snapshot",
    "Taint",
    "Tenant",
    "TenantUsage",
    "Toleration",
    "WaitReason",
    "Waiting",
    "count_only_topology",
    "run_cycle",
]
