"""The GpuJob lifecycle as pure functions: what each job's pods mean for it, and the writes that
carry out one admission cycle's decisions.

    settled = settle(job, context, now, config)      # per job: state, status, actions
    result = run_cycle(build_snapshot(...))          # the admission core
    groups = plan(jobs, settled, result, now).groups # ordered, conditional writes

The operator feeds these from its watch cache and applies the groups; ``gpusched explain`` runs
the same functions and applies nothing.
"""

from gpusched.core.lifecycle.actions import (
    Action,
    CreatePod,
    DeletePod,
    Event,
    Group,
    PatchPod,
    Stage,
    Step,
    Urgency,
    WriteStatus,
)
from gpusched.core.lifecycle.facts import (
    JobFacts,
    PodFacts,
    Unwritten,
    gone_by,
    leaving_deadlines,
    leaving_victims,
    owns,
    parse_time,
)
from gpusched.core.lifecycle.patch import merge_patch
from gpusched.core.lifecycle.plan import Plan, QuietJob, Refresh, plan, write_status
from gpusched.core.lifecycle.settle import (
    JobContext,
    LifecycleConfig,
    Refusal,
    Settled,
    Verdict,
    needs_validation,
    settle,
)
from gpusched.core.lifecycle.snapshot import (
    build_snapshot,
    charged_pod,
    charged_pod_key,
    core_job,
    core_levels,
    foreign_busy,
    foreign_pods,
    job_shape,
    submitted_job,
)
from gpusched.core.lifecycle.tenants import (
    MeteredJob,
    Protection,
    QuotaUpdate,
    TenantMap,
    class_not_allowed,
    core_tenant,
    protection_of,
    quota_status,
    tenant_map,
)

__all__ = [
    "Action",
    "CreatePod",
    "DeletePod",
    "Event",
    "Group",
    "JobContext",
    "JobFacts",
    "LifecycleConfig",
    "MeteredJob",
    "PatchPod",
    "Plan",
    "PodFacts",
    "Protection",
    "QuietJob",
    "QuotaUpdate",
    "Refresh",
    "Refusal",
    "Settled",
    "Stage",
    "Step",
    "TenantMap",
    "Unwritten",
    "Urgency",
    "Verdict",
    "WriteStatus",
    "build_snapshot",
    "charged_pod",
    "charged_pod_key",
    "class_not_allowed",
    "core_job",
    "core_levels",
    "core_tenant",
    "foreign_busy",
    "foreign_pods",
    "gone_by",
    "job_shape",
    "leaving_deadlines",
    "leaving_victims",
    "merge_patch",
    "needs_validation",
    "owns",
    "parse_time",
    "plan",
    "protection_of",
    "quota_status",
    "settle",
    "submitted_job",
    "tenant_map",
    "write_status",
]
