# ruff: noqa: N815  (Helm values keys are camelCase by convention)
"""The Helm chart's values, as types: the one source of `values.yaml` and `values.schema.json`.

Every field's docstring becomes the comment above its key in `values.yaml` and its
`description` in the schema; every object is closed (`additionalProperties: false`), so a
typo in an admin's values file is refused by `helm install` with the key named. Kubernetes
objects passed through verbatim (affinity, security contexts) stay open, like in every chart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpusched.metrics import EXTENDER_LATENCY_BUCKETS


class Closed(BaseModel):
    """A values object: no unknown keys, field docstrings as descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


#: A resource quantity (``100m``, ``512Mi``, ``2``).
Quantity = (
    Annotated[
        str, Field(pattern=r"^[+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+|[munkMGTPE]|[KMGTPE]i)?$")
    ]
    | Annotated[int, Field(ge=0)]
    | Annotated[float, Field(ge=0)]
)
PullPolicy = Literal["Always", "IfNotPresent", "Never"]

#: A Go duration as the components' flags and Kubernetes read it (``10s``, ``5m``, ``1h30m``).
GoDuration = Annotated[
    str,
    Field(
        pattern=r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$",
        examples=["10s", "5m", "1h30m"],
    ),
]
_GO_UNIT = "(ns|us|ms|s|m|h)"
_GO_PART = rf"[0-9]+(\.[0-9]+)?{_GO_UNIT}"
_GO_NONZERO_PART = rf"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*){_GO_UNIT}"
#: A Go duration longer than zero, for a period a component waits between two rounds of work:
#: its flag refuses zero (a component started with it exits, so its pod would crash-loop).
#: One part at least has a digit other than 0; the pattern stays within what both JSON Schema
#: engines read (helm's Go regexp and pydantic's have no look-ahead).
PositiveGoDuration = Annotated[
    str,
    Field(
        pattern=rf"^({_GO_PART})*{_GO_NONZERO_PART}({_GO_PART})*$",
        examples=["10s", "5m", "1h30m"],
    ),
]
#: A Go duration of whole seconds, minutes and hours, at least one second (``30s``, ``2m``,
#: ``1m30s``), for a timeout: below a second, calls that normally succeed would time out.
TimeoutGoDuration = Annotated[
    str,
    Field(
        pattern=(
            r"^(0*[1-9][0-9]*h([0-9]+m)?([0-9]+s)?"
            r"|([0-9]+h)?0*[1-9][0-9]*m([0-9]+s)?"
            r"|([0-9]+h)?([0-9]+m)?0*[1-9][0-9]*s)$"
        ),
        examples=["30s", "2m", "1m30s"],
    ),
]
#: A Prometheus duration (``30s``, ``1m``, ``1h``, ``1d``).
PromDuration = Annotated[str, Field(pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$")]
#: A label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
LabelKey = Annotated[
    str,
    Field(
        pattern=(
            r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
        ),
        max_length=317,
    ),
]
#: A label value: empty, or up to 63 letters, digits, ``-``, ``_`` and ``.``, alphanumeric at
#: both ends (no quotes, spaces or other characters Kubernetes refuses).
LabelValue = Annotated[
    str, Field(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)
]
#: A DNS label (namespace names and the like).
DnsLabel = Annotated[
    str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length=1, max_length=63)
]
#: A DNS subdomain (object names: PriorityClasses, Leases).
DnsSubdomain = Annotated[
    str,
    Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        min_length=1,
        max_length=253,
    ),
]
#: An image repository (registry and path), never empty.
ImageRepository = Annotated[
    str, Field(pattern=r"^[a-z0-9]+([._\-/:][a-z0-9]+)*$", min_length=1, max_length=255)
]
#: An image tag; empty: the chart's appVersion.
ImageTag = Annotated[str, Field(pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.\-]{0,127})?$")]
Port = Annotated[int, Field(ge=1, le=65535)]
#: Replicas of a control-plane Deployment: more than a handful only adds watch load.
Replicas = Annotated[int, Field(ge=1, le=10)]


class Image(Closed):
    repository: ImageRepository
    """Image repository (registry and path)."""
    tag: ImageTag = ""
    """Image tag; empty: the chart's appVersion."""
    pullPolicy: PullPolicy = "IfNotPresent"
    """When the kubelet pulls the image."""


class KubeSchedulerImage(Closed):
    repository: ImageRepository = "registry.k8s.io/kube-scheduler"
    """The stock kube-scheduler image."""
    tag: ImageTag = ""
    """Image tag; empty: the cluster's own version (kube-scheduler must match the control
    plane's minor version)."""
    pullPolicy: PullPolicy = "IfNotPresent"
    """When the kubelet pulls the image."""


class Resources(Closed):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources, e.g. `cpu: 100m`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits, e.g. `memory: 512Mi`."""


class Toleration(Closed):
    key: Annotated[str, Field(pattern=r"^([A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]?$")] = ""
    """Taint key the toleration applies to (empty with `operator: Exists`: every taint)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Exists` or `Equal`."""
    value: LabelValue = ""
    """Taint value for `Equal`."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """Taint effect; empty: every effect."""
    tolerationSeconds: int | None = Field(None, ge=0)
    """For `NoExecute`: how long the pod stays bound after the taint appears."""


class Placement(Closed):
    nodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Node labels the pods require."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate."""
    affinity: dict[str, Any] = Field(default_factory=dict)
    """A Kubernetes `affinity` object, passed through."""
    podAnnotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations on the pods."""
    podLabels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Extra labels on the pods."""


class DisruptionBudget(Closed):
    enabled: bool = True
    """Create a PodDisruptionBudget, so node drains keep one replica serving."""
    minAvailable: int = Field(1, ge=0, le=10)
    """Replicas a voluntary disruption must leave running."""


def _probe_image() -> Image:
    return Image(repository="ghcr.io/gpusched/gpusched-device-probe")


def _scheduler_image() -> Image:
    return Image(repository="ghcr.io/gpusched/gpusched-scheduler")


def _operator_image() -> Image:
    return Image(repository="ghcr.io/gpusched/gpusched-operator")


class DeviceProbe(Placement):
    enabled: bool = True
    """Run the device probe DaemonSet on GPU nodes."""
    image: Image = Field(default_factory=_probe_image)
    """Image built from `device-probe/Dockerfile`."""
    runtimeClassName: Annotated[str, Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$")] = (
        "nvidia"
    )
    """RuntimeClass that injects NVML and the GPU device nodes (the NVIDIA container toolkit's);
    empty: the node's default runtime (when it is the NVIDIA one, or with CDI)."""
    nodeSelector: dict[LabelKey, LabelValue] = Field(
        default_factory=lambda: {"feature.node.kubernetes.io/pci-10de.present": "true"}
    )
    """GPU nodes. The default is Node Feature Discovery's label for an NVIDIA PCI device; with
    the GPU Operator, `nvidia.com/gpu.present: "true"` works as well."""
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
            Toleration(key="gpusched.io/no-healthy-gpu", operator="Exists"),
        ]
    )
    """Taints of GPU nodes the probe tolerates, including its own no-healthy-GPU taint."""
    interval: PositiveGoDuration = "10s"
    """Time between health readings (XID events are published at once); longer than zero."""
    resync: PositiveGoDuration = "300s"
    """Full re-read of the inventory and of what the API server holds; longer than zero."""
    telemetryRefresh: GoDuration = "600s"
    """Least time between writes caused by temperature or power alone."""
    taintUnhealthy: bool = False
    """Taint a node none of whose GPUs is usable with
    `gpusched.io/no-healthy-gpu=true:NoSchedule` (removed when one is again)."""
    gfdLabels: Literal["auto", "never"] = "auto"
    """`auto`: write GPU Feature Discovery's `nvidia.com/` labels only where GFD does not;
    `never`: none."""
    ignoreXids: Annotated[str, Field(pattern=r"^([0-9]+(,[0-9]+)*)?$")] = ""
    """XIDs that never change health, comma separated; empty: the probe's default list
    (the NVIDIA device plugin's)."""
    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    """Log level."""
    extraArgs: list[str] = Field(default_factory=list)
    """More `gpusched probe` flags."""
    metricsPort: Port = 9402
    """Port of the probe's Prometheus endpoint."""
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "10m", "memory": "100Mi"}, limits={"memory": "160Mi"}
        )
    )
    """The probe's resources (about 90 MiB RSS on an 8-GPU node)."""
    maxUnavailable: (
        Annotated[str, Field(pattern=r"^[0-9]{1,3}%$")] | Annotated[int, Field(ge=1)]
    ) = "10%"
    """Probe pods replaced at once during a rolling update."""


class NodeAgent(Closed):
    enabled: bool = False
    """Add gpusched's device plugin as a second container of the probe DaemonSet, so each
    container gets exactly the GPUs the extender chose. It replaces NVIDIA's device plugin on
    those nodes (see docs/install.md)."""
    metricsPort: Port = 9403
    """Port of the node agent's Prometheus endpoint."""
    kubeletDir: Annotated[str, Field(pattern=r"^/[^\s\"']*[^/\s\"']$")] = "/var/lib/kubelet"
    """The kubelet's root directory on the host (device-plugins/ and pod-resources/ below it)."""
    extraArgs: list[str] = Field(default_factory=list)
    """More `gpusched device-plugin` flags."""
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "10m", "memory": "80Mi"}, limits={"memory": "160Mi"}
        )
    )
    """The node agent's resources."""


class KubeScheduler(Closed):
    image: KubeSchedulerImage = Field(default_factory=KubeSchedulerImage)
    """The kube-scheduler serving the `gpusched` profile."""
    qps: int = Field(200, ge=1, le=10000)
    """Queries per second to the API server."""
    burst: int = Field(400, ge=1, le=20000)
    """Burst above `qps`."""
    verbosity: int = Field(1, ge=0, le=10)
    """`-v` log verbosity."""
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "512Mi"}
        )
    )
    """kube-scheduler's resources."""


class Extender(Closed):
    image: Image = Field(default_factory=_scheduler_image)
    """Image built from `scheduler/Dockerfile`."""
    port: Port = 8888
    """Loopback port kube-scheduler calls the extender on (never reachable from outside the pod)."""
    metricsPort: Port = 8889
    """Port serving only `/metrics`, `/healthz` and `/readyz` on the pod's address."""
    httpTimeout: TimeoutGoDuration = "30s"
    """How long kube-scheduler waits for one extender call: whole seconds, minutes or hours, at
    least 1s (zero would mean kube-scheduler's own default, shorter ones fail busy calls)."""
    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    """Log level (`debug` logs every refused node)."""
    maxNodes: int = Field(5000, ge=1, le=100000)
    """Most node names one request may carry (the largest cluster served); the request body is
    bounded to what kube-scheduler sends for that many nodes."""
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "200m", "memory": "256Mi"}, limits={"memory": "1Gi"}
        )
    )
    """The extender's resources (its cache grows with nodes and GPU pods)."""


class FlowSchema(Closed):
    enabled: bool = True
    """Give the scheduler's and the extender's API requests kube-scheduler's own priority level,
    so binds do not queue behind other workloads (API Priority and Fairness)."""
    priorityLevel: DnsSubdomain = "workload-high"
    """PriorityLevelConfiguration the requests go to."""
    matchingPrecedence: int = Field(800, ge=1, le=10000)
    """Precedence among FlowSchemas (lower wins; the built-in `service-accounts` is 9000)."""


class LeaderElection(Closed):
    leaseName: DnsSubdomain = "gpusched-scheduler"
    """Lease the kube-scheduler replicas elect a leader with."""
    leaseNamespace: DnsLabel = "kube-system"
    """Namespace of that Lease."""


class Scheduler(Placement):
    enabled: bool = True
    """Run the scheduler Deployment: a stock kube-scheduler serving the `gpusched` profile with
    the extender beside it in one pod."""
    replicas: Replicas = 2
    """Replicas; one leads (Lease), the others keep their caches warm."""
    kubeScheduler: KubeScheduler = Field(default_factory=KubeScheduler)
    """The kube-scheduler container."""
    extender: Extender = Field(default_factory=Extender)
    """The extender container."""
    leaderElection: LeaderElection = Field(default_factory=LeaderElection)
    """kube-scheduler's leader election."""
    flowSchema: FlowSchema = Field(default_factory=FlowSchema)
    """API Priority and Fairness for the scheduler's requests."""
    podDisruptionBudget: DisruptionBudget = Field(default_factory=DisruptionBudget)
    """Disruption budget of the scheduler pods."""


class PodPolicy(Closed):
    protectedNamespaces: list[DnsLabel] = Field(
        default_factory=lambda: ["kube-system", "kube-public", "kube-node-lease"]
    )
    """Namespaces the operator may never create, change or delete pods in (the release's own
    namespace is always added)."""
    namespaceLabels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Labels a namespace must carry for the operator to write pods in it; empty: any namespace
    not protected. Label your tenants' namespaces (say `gpusched.io/tenant: "true"`) and set
    this to confine the operator to them."""


class Webhook(Closed):
    enabled: bool = True
    """Serve the validating webhook from the operator: `kubectl apply` is refused, naming the
    field, for a TenantQuota claiming a namespace another one owns, a GpuJob in a namespace no
    TenantQuota owns or naming a PriorityClass that does not exist. Its `failurePolicy` is
    `Ignore`: while no operator replica answers, objects are accepted and the operator explains
    later (docs/install.md)."""
    port: Port = 9443
    """The operator's HTTPS port for the webhook (the Service listens on 443)."""
    timeoutSeconds: int = Field(5, ge=1, le=30)
    """Seconds the API server waits for the webhook before accepting the object anyway."""
    certificateSecret: Annotated[
        str, Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", max_length=253)
    ] = ""
    """A `kubernetes.io/tls` Secret with the webhook's certificate (`tls.crt`, `tls.key`,
    `ca.crt`), e.g. from cert-manager; empty: the chart makes a CA and a certificate for the
    Service (kept across upgrades)."""


#: An IPv4 or IPv6 address block in CIDR notation (``10.0.0.0/24``, ``fd00::/64``).
Cidr = Annotated[
    str, Field(pattern=r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:.]*)/[0-9]{1,3}$")
]


class ExplainNetworkPolicy(Closed):
    enabled: bool = False
    """A NetworkPolicy on the operator's pods that lets only `allowCidrs` and `allowFrom` reach
    the explain port (its other ports stay open to all, as without it). The port answers
    without authentication, so any pod that can reach it reads every job's explanation and can
    make the leader run extra cycles; the `<release>-explain` Role governs only the API
    server's proxy path. Off by default: the allow-list must name the API server's addresses,
    which only the cluster's admin knows (docs/install.md); with an empty one the policy would
    shut out `gpusched explain` through the proxy too. It needs a CNI that enforces
    NetworkPolicies."""
    allowCidrs: list[Cidr] = Field(default_factory=list)
    """Address blocks that may reach the explain port: the API server's as the operator's pods
    see them (for `gpusched explain` through its proxy), e.g. `10.0.0.10/32`."""
    allowFrom: list[dict[str, Any]] = Field(default_factory=list)
    """NetworkPolicyPeers that may reach it too, as Kubernetes writes them (`podSelector`,
    `namespaceSelector`), e.g. a namespace of tools that ask the port directly. A
    kube-apiserver running as a static pod uses its node's network: list its node's address
    in `allowCidrs`, a podSelector does not match it."""


class Explain(Closed):
    port: Port = 8082
    """The operator's HTTP port for `gpusched explain`: the leading replica answers from its
    last admission cycle (milliseconds, where deciding again takes a cycle over the whole
    cluster); the Service names it `explain`. It answers whoever reaches it, unauthenticated:
    close it with `networkPolicy`."""
    groups: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default_factory=list)
    """Groups allowed to ask it through the API server's proxy to the operator's Service (a
    Role granting `services/proxy` on that Service alone), e.g. `system:authenticated`. An
    answer names other tenants' jobs and the nodes, whatever the asker may read otherwise;
    empty: only those the admin binds the `<release>-explain` Role to. Without it `gpusched
    explain` decides locally, which needs read access to the whole cluster. The Role governs
    that path only, not the port itself (`networkPolicy`)."""
    users: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default_factory=list)
    """Users allowed to ask it (as `groups`)."""
    networkPolicy: ExplainNetworkPolicy = Field(default_factory=ExplainNetworkPolicy)
    """Who may reach the explain port itself, from inside the cluster."""


class Pricing(Closed):
    currency: Annotated[str, Field(min_length=1, max_length=32)] = "GPU-hours"
    """Unit of every cost in TenantQuota status, metrics and budgets (e.g. `USD`)."""
    default: float = Field(1.0, ge=0, le=1e6)
    """Price of one GPU-hour of a model not listed in `byModel` (1 with the default currency:
    budgets then count GPU-hours)."""
    byModel: dict[LabelValue, Annotated[float, Field(ge=0, le=1e6)]] = Field(default_factory=dict)
    """Price of one GPU-hour per GPU model, keyed by the `nvidia.com/gpu.product` label value,
    e.g. `NVIDIA-H100-80GB-HBM3: 4.5`."""


class Operator(Placement):
    enabled: bool = True
    """Run the GpuJob / TenantQuota operator."""
    image: Image = Field(default_factory=_operator_image)
    """Image built from `operator/Dockerfile`."""
    replicas: Replicas = 2
    """Replicas; one runs admission cycles (Lease `gpusched-operator`), the others take over."""
    resync: float = Field(5.0, gt=0, le=3600)
    """Seconds between admission cycles when nothing changes."""
    podsReadyTimeout: float = Field(300.0, gt=0, le=86400)
    """Seconds an admitted gang may take until all its pods run; then it is requeued."""
    backoffBase: float = Field(10.0, gt=0, le=3600)
    """First requeue delay after a gang timeout (doubles each time)."""
    backoffMax: float = Field(600.0, gt=0, le=86400)
    """Longest requeue delay."""
    gpuNodeSelector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Only place GpuJobs on nodes with these labels; empty: every node with a NodeGpuTopology."""
    maxPreemptionSearches: int = Field(32, ge=0, le=10000)
    """Victim searches per admission cycle."""
    recordDelay: float = Field(15.0, ge=0, le=300)
    """Longest seconds an admission whose pods are created goes unwritten, so that the job's
    status is written once, with its pods running (0: written before the pods are created)."""
    arrivalsOnTop: float = Field(10.0, ge=0, le=300)
    """Seconds after an admission cycle that changed nothing within which jobs that arrived
    (and nothing else) are decided on top of it, as of its time, instead of deciding the whole
    queue again (0: only within the same instant)."""
    maxNodeRejections: int = Field(5, ge=0, le=1000)
    """Times in a row a node's kubelet may refuse to admit a job's pod (no container ran, e.g.
    after a kubelet restart) before the job fails; each refusal requeues the gang with backoff
    (0: never fails)."""
    maxUnreadyReleases: int = Field(5, ge=0, le=1000)
    """Times a gang may be released for the pods-ready timeout while a pod waited on one of
    its own containers (an image that cannot be pulled, a missing secret), without running in
    between, before the job fails (0: never fails)."""
    reservationsPerTenant: int = Field(0, ge=0, le=16)
    """Blocked jobs per tenant that hold GPUs reserved where they fit soonest, with backfill of
    jobs expected to end before (0: none). Off by default: see docs/quotas.md and the Philly
    figures in docs/benchmarks.md before turning it on."""
    guaranteeRounding: Literal["down", "up"] = "down"
    """How each tenant's guarantee is honoured in whole jobs: "down", the jobs that fit inside
    it; "up", a job larger than what is left of it may take that back from borrowers, and a
    tenant keeps the fewest of its jobs that cover it (docs/quotas.md, "Guarantees in whole
    jobs")."""
    lendingHoldSeconds: float = Field(900.0, ge=0, le=3600)
    """A tenant that asked for GPUs within this many seconds keeps that many idle GPUs of its
    unused guarantee from borrowers, so its next jobs start without evicting anyone (0: lend
    idle GPUs at once; docs/quotas.md, "Lending after a burst")."""
    reclaimPatienceSeconds: float = Field(0.0, ge=0, le=86400)
    """For this many seconds after its submission, a job inside its tenant's guarantee reclaims
    lent GPUs only where the borrowers' lost work costs less than its expected wait for GPUs to
    free; after that, whatever it costs (0: reclaim at once; docs/quotas.md, "Reclaim
    weighed against the wait")."""
    forecastInterval: float = Field(60.0, gt=0, le=3600)
    """Least seconds between two forecasts of every waiting job's expected start (a forward
    replay of the queue); reservations' starts are worked out every cycle."""
    forecastArrivalsWindow: float = Field(0.0, ge=0, le=7 * 86400)
    """Seconds of past submissions each forecast expects to go on at their steady rate, per
    tenant and priority, over as many seconds ahead: jobs that would rank ahead of a waiting job
    delay its expected start (0: nothing arrives; e.g. 43200; docs/quotas.md, "Expected
    start")."""
    pricing: Pricing = Field(default_factory=Pricing)
    """Price of a GPU-hour per GPU model: what TenantQuota spending (`status.periodCost`,
    `cost7d`, ...) and budgets count (docs/quotas.md, "Budgets and cost")."""
    usageHalfLife: float = Field(0.0, ge=0, le=365 * 86400)
    """Fair share with memory: seconds over which a tenant's past borrowing halves when
    borrowers are ranked (e.g. 604800 for a week); 0: no memory (docs/quotas.md)."""
    metricsPort: Port = 8080
    """Port of the operator's Prometheus endpoint."""
    healthPort: Port = 8081
    """Port of the operator's liveness endpoint (`/healthz`, served by kopf)."""
    stuckAfter: float = Field(120.0, ge=10, le=86400)
    """Seconds the admission loop may go without coming round before liveness fails and the
    kubelet restarts the container."""
    webhook: Webhook = Field(default_factory=Webhook)
    """The validating webhook (cross-object checks at apply time)."""
    explain: Explain = Field(default_factory=Explain)
    """`gpusched explain`'s answers from the leading operator (docs/troubleshooting.md)."""
    verbose: bool = False
    """Debug logging."""
    podPolicy: PodPolicy = Field(default_factory=PodPolicy)
    """Admission policy on the operator's pod writes: only pods of GpuJob gangs, never in the
    protected namespaces."""
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "200m", "memory": "256Mi"}, limits={"memory": "1Gi"}
        )
    )
    """The operator's resources."""
    podDisruptionBudget: DisruptionBudget = Field(default_factory=DisruptionBudget)
    """Disruption budget of the operator pods."""


class PriorityClass(Closed):
    create: bool = True
    """Create a PriorityClass for gpusched's own pods, so they are not preempted by workloads."""
    name: Annotated[str, Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", max_length=253)] = ""
    """Its name; empty: `<release>-system`. With `create: false`, an existing class to use
    (e.g. `system-cluster-critical`), or empty for none."""
    value: int = Field(1000000000, ge=0, le=1000000000)
    """Its value: above any workload, below Kubernetes' own system classes."""


class AdmissionPolicies(Closed):
    enabled: bool = True
    """Admission policies on everyone's writes (ValidatingAdmissionPolicies, Kubernetes 1.30+):
    only gpusched writes the annotations that say which GPUs a pod holds; a namespace a
    TenantQuota owns gets GPUs through GpuJobs only (a pod asking `nvidia.com/gpu` directly is
    refused there); a GpuJob names only a PriorityClass its tenant allows. Off, each component
    still refuses to trust what it did not write, but a user can block GPUs and escape quota
    (docs/install.md)."""


class ServiceMonitor(Closed):
    enabled: bool = False
    """Create ServiceMonitors for the Prometheus Operator (CRD `monitoring.coreos.com/v1`)."""
    interval: PromDuration = "30s"
    """Scrape interval."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Extra labels, e.g. the `release` label your Prometheus selects ServiceMonitors by."""


class AlertThresholds(Closed):
    extenderLatencySeconds: float = Field(1.0, gt=0, lt=EXTENDER_LATENCY_BUCKETS[-1])
    """p99 extender filter or bind latency that counts as slow (below 60: the latency
    histogram's top bucket, above which a p99 cannot be told)."""
    probeStaleSeconds: int = Field(300, gt=0, le=86400)
    """A probe that has not completed a reading for this long is not reporting."""
    jobPendingSeconds: int = Field(3600, gt=0, le=31536000)
    """A tenant whose oldest queued GpuJob has waited longer alerts."""
    preemptionsPerHour: float = Field(20.0, gt=0, le=1000000)
    """Preemptions per hour across the cluster above which preemption is churning."""


class PrometheusRule(Closed):
    enabled: bool = False
    """Create a PrometheusRule with gpusched's alerts (Prometheus Operator)."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Extra labels, e.g. the `release` label your Prometheus selects rules by."""
    thresholds: AlertThresholds = Field(default_factory=AlertThresholds)
    """Alert thresholds."""


class GrafanaDashboards(Closed):
    enabled: bool = False
    """Create one ConfigMap per dashboard for the Grafana sidecar."""
    label: LabelKey = "grafana_dashboard"
    """Label the sidecar looks for (kube-prometheus-stack's default)."""
    labelValue: LabelValue = "1"
    """Value of that label."""
    namespace: Annotated[
        str, Field(pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=63)
    ] = ""
    """Namespace of the ConfigMaps; empty: the release's. Must be one the sidecar watches."""
    folder: Annotated[str, Field(pattern=r"^[^\"'\\\n]*$", max_length=253)] = "gpusched"
    """Grafana folder (the sidecar's `k8s-sidecar-target-directory` annotation); empty: none."""


class Metrics(Closed):
    serviceMonitor: ServiceMonitor = Field(default_factory=ServiceMonitor)
    """Prometheus Operator scraping."""
    prometheusRule: PrometheusRule = Field(default_factory=PrometheusRule)
    """Prometheus Operator alerts."""
    grafanaDashboards: GrafanaDashboards = Field(default_factory=GrafanaDashboards)
    """Grafana dashboards."""


class ChartTests(Closed):
    timeoutSeconds: int = Field(10, ge=1, le=600)
    """How long each `helm test` check waits for a component to answer."""


class NetworkLevel(Closed):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
    """What people call the level (`clique`, `rack`, `block`); used in messages."""
    nodeLabel: LabelKey
    """Node label whose value names a domain of the level, e.g. `nvidia.com/gpu.clique`."""
    wholeDomains: bool = False
    """Gangs placed in one domain of this level get only domains with every node and GPU up
    (set it for NVLink cliques)."""


class NetworkTopology(Closed):
    levels: list[NetworkLevel] = Field(default_factory=list, max_length=8)
    """The cluster's network levels above the node, widest first (e.g. block, rack, clique).
    Non-empty: the chart creates the NetworkTopology `default` from them; empty: none is
    created (create or edit it yourself, `kubectl get nt`). docs/placement.md."""


class Values(Closed):
    nameOverride: Annotated[
        str, Field(pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=40)
    ] = ""
    """Replaces the chart name in resource names."""
    fullnameOverride: Annotated[
        str, Field(pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=40)
    ] = ""
    """Replaces `<release>-<chart>` in resource names."""
    imagePullSecrets: list[dict[str, str]] = Field(default_factory=list)
    """Secrets for pulling gpusched's images, e.g. `[{name: regcred}]`."""
    priorityClass: PriorityClass = Field(default_factory=PriorityClass)
    """Priority of gpusched's pods."""
    deviceProbe: DeviceProbe = Field(default_factory=DeviceProbe)
    """The device probe: NVML -> node labels and NodeGpuTopology."""
    nodeAgent: NodeAgent = Field(default_factory=NodeAgent)
    """The node agent (device plugin) beside the probe."""
    scheduler: Scheduler = Field(default_factory=Scheduler)
    """kube-scheduler with the gpusched extender."""
    operator: Operator = Field(default_factory=Operator)
    """The GpuJob / TenantQuota operator."""
    networkTopology: NetworkTopology = Field(default_factory=NetworkTopology)
    """Network levels gangs are placed in (NetworkTopology `default`)."""
    admissionPolicies: AdmissionPolicies = Field(default_factory=AdmissionPolicies)
    """What users may write: GPU ownership, GPU pods in tenants' namespaces, priority classes."""
    metrics: Metrics = Field(default_factory=Metrics)
    """Prometheus and Grafana integration."""
    tests: ChartTests = Field(default_factory=ChartTests)
    """`helm test` hooks."""
