"""GPU health: from what the device probe observed to the state the scheduler acts on.

The probe's shell collects raw observations through NVML (XID events, ECC counters, row-remapper
state, clock-event reasons, temperature, whether the GPU still answers); this module decides what
they mean, so the policy is one pure, tested function rather than conditions spread over I/O code.

The XID policy follows the NVIDIA device plugin (``internal/rm/health.go``): the "application"
XIDs 13, 31, 43, 45, 68 and 109 are caused by a workload, not the GPU, and are ignored; every other
XID makes the GPU unhealthy. A fatal XID is sticky: it is an event, and nothing NVML reports later
says the fault is gone, so the GPU stays unhealthy until the node reboots (see :func:`restore`).
Row-remap *pending* only needs a GPU reset, so running work may continue but nothing new is placed
(Unschedulable); sustained hardware slowdown makes a GPU slow, not wrong, so it is Degraded (a
placement penalty, never an exclusion).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from gpusched.api.nodegputopology import GpuHealth, GpuHealthState

#: XIDs the NVIDIA device plugin (and its DRA driver) ignore: the fault lies with the application.
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})

# Clock-event ("throttle") reason bits, as NVML defines them (nvmlClocksEventReason*); repeated
# here because the core does not import NVML bindings.
CLOCKS_EVENT_HW_SLOWDOWN: Final = 0x08
CLOCKS_EVENT_HW_THERMAL_SLOWDOWN: Final = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN: Final = 0x80
#: Reasons that mean the hardware itself cut the clocks (software power capping and idling are
#: normal operation and do not count).
HW_SLOWDOWN_MASK: Final = (
    CLOCKS_EVENT_HW_SLOWDOWN
    | CLOCKS_EVENT_HW_THERMAL_SLOWDOWN
    | CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN
)

# Machine reasons written to NodeGpuTopology status (``Xid<n>`` is built by :func:`xid_reason`).
REASON_HEALTHY: Final = "Healthy"
REASON_GPU_LOST: Final = "GpuLost"
REASON_RESET_REQUIRED: Final = "ResetRequired"
REASON_NVML_UNAVAILABLE: Final = "NvmlUnavailable"
REASON_NVML_ERROR: Final = "NvmlError"
REASON_ECC_UNCORRECTABLE: Final = "EccUncorrectable"
REASON_ROW_REMAP_FAILURE: Final = "RowRemapFailure"
REASON_ROW_REMAP_PENDING: Final = "RowRemapPending"
REASON_HW_SLOWDOWN: Final = "HwSlowdown"
REASON_HW_THERMAL_SLOWDOWN: Final = "HwThermalSlowdown"
REASON_HW_POWER_BRAKE_SLOWDOWN: Final = "HwPowerBrakeSlowdown"
REASON_HIGH_TEMPERATURE: Final = "HighTemperature"

_XID_REASON: Final = re.compile(r"Xid(\d+)")

#: Short descriptions of the XIDs operators meet most (NVIDIA's XID catalog), for messages.
XID_DESCRIPTIONS: Final[dict[int, str]] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    123: "SPI PMU RPC write failure",
    140: "ECC unrecovered error",
}

_SEVERITY: Final[dict[GpuHealthState, int]] = {
    GpuHealthState.HEALTHY: 0,
    GpuHealthState.DEGRADED: 1,
    GpuHealthState.UNSCHEDULABLE: 2,
    GpuHealthState.UNHEALTHY: 3,
}

_THROTTLE_REASONS: Final = frozenset(
    {REASON_HW_SLOWDOWN, REASON_HW_THERMAL_SLOWDOWN, REASON_HW_POWER_BRAKE_SLOWDOWN}
)


def xid_reason(xid: int) -> str:
    """The machine reason for a fatal XID, e.g. ``Xid79``."""
    return f"Xid{xid}"


def describe_xid(xid: int) -> str:
    """``XID 79 (GPU has fallen off the bus)``, or just ``XID <n>`` when not catalogued here."""
    text = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid} ({text})" if text else f"XID {xid}"


def severity(state: GpuHealthState) -> int:
    """Order of states, Healthy lowest: a node's worst GPU decides taints and summaries."""
    return _SEVERITY[state]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """What counts as unhealthy; every field is a probe flag."""

    ignored_xids: frozenset[int] = APPLICATION_XIDS
    """XIDs that never change health (the device plugin's application XIDs by default)."""
    xid_checks: bool = True
    """False: XID events are counted but never change health (``DP_DISABLE_HEALTHCHECKS=xids``)."""
    ecc_uncorrected_limit: int = 0
    """Volatile uncorrectable ECC errors tolerated before the GPU is unhealthy."""
    throttle_sustain_seconds: float = 30.0
    """How long hardware slowdown must last before the GPU is Degraded (short bursts are normal)."""
    temperature_limit_c: int | None = None
    """Temperature from which a GPU is Degraded; None uses the GPU's own slowdown threshold."""

    def __post_init__(self) -> None:
        if self.ecc_uncorrected_limit < 0:
            raise ValueError("ecc_uncorrected_limit must be >= 0")
        if self.throttle_sustain_seconds < 0:
            raise ValueError("throttle_sustain_seconds must be >= 0")
        if any(x < 0 for x in self.ignored_xids):
            raise ValueError("XIDs are non-negative integers")

    def with_xids(
        self,
        *,
        ignore: Iterable[int] | None = None,
        also_ignore: Iterable[int] = (),
        fatal: Iterable[int] = (),
    ) -> HealthPolicy:
        """This policy with its ignore list set to ``ignore`` (default: the application XIDs)
        plus ``also_ignore``, minus ``fatal``: an XID named in both is fatal (enabling wins, as
        with the device plugin's ``DP_ENABLE_HEALTHCHECKS``)."""
        base = APPLICATION_XIDS if ignore is None else frozenset(ignore)
        return replace(self, ignored_xids=(base | frozenset(also_ignore)) - frozenset(fatal))

    def xid_is_fatal(self, xid: int) -> bool:
        """Whether this XID makes a GPU unhealthy under the policy."""
        return self.xid_checks and xid not in self.ignored_xids


@dataclass(frozen=True, slots=True)
class GpuObservation:
    """What the probe saw of one GPU in one cycle; None means "could not be read"."""

    index: int
    uuid: str | None = None
    lost: bool = False
    """NVML answered ``GPU is lost`` (fallen off the bus or otherwise inaccessible)."""
    reset_required: bool = False
    """NVML answered ``GPU requires reset``."""
    nvml_unavailable: str | None = None
    """NVML itself could not be used on the node (init failed); the text says why."""
    query_error: str | None = None
    """An identity query failed with an unexpected NVML error; the text names the call."""
    xids: tuple[int, ...] = ()
    """XID events received since the previous classification, in order."""
    ecc_uncorrected: int | None = None
    """Volatile (since last reset) uncorrectable ECC error count."""
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    throttle_reasons: int | None = None
    """Current clock-event reason bitmask."""
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    """The GPU's own slowdown threshold, when NVML reports it."""
    power_w: float | None = None


@dataclass(frozen=True, slots=True)
class GpuHealthRecord:
    """The judged health of one GPU, plus the little history the next judgement needs."""

    index: int
    uuid: str | None
    state: GpuHealthState
    reason: str
    message: str
    since: datetime
    """When the GPU entered this state with this reason."""
    fatal_xid: int | None = None
    """First fatal XID seen: keeps the GPU unhealthy until the node reboots."""
    throttled_since: datetime | None = None
    """Start of the current uninterrupted hardware slowdown."""
    temperature_c: int | None = None
    power_w: float | None = None

    @property
    def placeable(self) -> bool:
        """Whether new work may land here (Healthy or Degraded)."""
        return self.state in (GpuHealthState.HEALTHY, GpuHealthState.DEGRADED)

    def to_api(self) -> GpuHealth:
        """The status entry the probe publishes."""
        return GpuHealth(
            index=self.index,
            uuid=self.uuid,
            state=self.state,
            reason=self.reason,
            message=self.message,
            since=self.since,
            fatal_xid=self.fatal_xid,
            temperature_c=self.temperature_c,
            power_w=self.power_w,
        )


@dataclass(frozen=True, slots=True)
class _Finding:
    state: GpuHealthState
    reason: str
    message: str


def _throttle_finding(reasons: int, sustained_for: timedelta) -> _Finding:
    seconds = int(sustained_for.total_seconds())
    if reasons & CLOCKS_EVENT_HW_THERMAL_SLOWDOWN:
        reason, what = REASON_HW_THERMAL_SLOWDOWN, "hardware thermal slowdown"
    elif reasons & CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN:
        reason, what = REASON_HW_POWER_BRAKE_SLOWDOWN, "hardware power-brake slowdown"
    else:
        reason, what = REASON_HW_SLOWDOWN, "hardware slowdown"
    return _Finding(
        GpuHealthState.DEGRADED,
        reason,
        f"{what} has cut the clocks for at least {seconds}s; placed after healthy GPUs",
    )


def classify(
    observation: GpuObservation,
    previous: GpuHealthRecord | None,
    now: datetime,
    policy: HealthPolicy = HealthPolicy(),
) -> GpuHealthRecord:
    """Judge one GPU from this cycle's observation and its previous record.

    The worst finding wins (Unhealthy over Unschedulable over Degraded); among equally severe
    ones the more fundamental cause is named (a lost GPU before its XID, an XID before the ECC
    counter that explains it). ``since`` is kept while state and reason stay the same, so a
    republished status does not change unless the health did.
    """
    if previous is not None and (
        previous.index != observation.index
        or (previous.uuid and observation.uuid and previous.uuid != observation.uuid)
    ):
        previous = None  # another GPU now sits at this index: its history does not apply
    obs = observation

    fatal_xid = previous.fatal_xid if previous is not None else None
    if fatal_xid is not None and not policy.xid_is_fatal(fatal_xid):
        fatal_xid = None  # the policy changed since: the XID no longer counts
    if fatal_xid is None:
        fatal_xid = next((x for x in obs.xids if policy.xid_is_fatal(x)), None)

    throttled_since: datetime | None = None
    if obs.throttle_reasons is not None and obs.throttle_reasons & HW_SLOWDOWN_MASK:
        throttled_since = (
            previous.throttled_since
            if previous is not None and previous.throttled_since is not None
            else now
        )

    findings: list[_Finding] = []
    unhealthy = GpuHealthState.UNHEALTHY
    if obs.lost:
        findings.append(
            _Finding(unhealthy, REASON_GPU_LOST, "NVML reports the GPU lost (fallen off the bus)")
        )
    if obs.reset_required:
        findings.append(
            _Finding(unhealthy, REASON_RESET_REQUIRED, "NVML reports the GPU needs a reset")
        )
    if obs.nvml_unavailable is not None:
        findings.append(
            _Finding(
                unhealthy,
                REASON_NVML_UNAVAILABLE,
                f"NVML cannot be used on this node: {obs.nvml_unavailable}",
            )
        )
    if fatal_xid is not None:
        findings.append(
            _Finding(
                unhealthy,
                xid_reason(fatal_xid),
                f"{describe_xid(fatal_xid)} reported; unhealthy until the node reboots",
            )
        )
    if obs.ecc_uncorrected is not None and obs.ecc_uncorrected > policy.ecc_uncorrected_limit:
        findings.append(
            _Finding(
                unhealthy,
                REASON_ECC_UNCORRECTABLE,
                f"{obs.ecc_uncorrected} uncorrectable ECC error(s) since the last GPU reset",
            )
        )
    if obs.remapped_rows_failure:
        findings.append(
            _Finding(
                unhealthy,
                REASON_ROW_REMAP_FAILURE,
                "row remapping failed: the GPU's memory can no longer be repaired",
            )
        )
    if obs.query_error is not None:
        findings.append(_Finding(unhealthy, REASON_NVML_ERROR, obs.query_error))
    if obs.remapped_rows_pending:
        findings.append(
            _Finding(
                GpuHealthState.UNSCHEDULABLE,
                REASON_ROW_REMAP_PENDING,
                "a memory row remap is pending: running work may finish, reset the GPU to apply it",
            )
        )
    if throttled_since is not None and obs.throttle_reasons is not None:
        sustained = now - throttled_since
        if sustained >= timedelta(seconds=policy.throttle_sustain_seconds):
            findings.append(_throttle_finding(obs.throttle_reasons, sustained))
    limit = policy.temperature_limit_c or obs.slowdown_temperature_c
    if obs.temperature_c is not None and limit is not None and obs.temperature_c >= limit:
        findings.append(
            _Finding(
                GpuHealthState.DEGRADED,
                REASON_HIGH_TEMPERATURE,
                f"temperature at or above {limit} C; placed after healthy GPUs",
            )
        )

    worst = max(findings, key=lambda f: severity(f.state), default=None)
    if worst is None:
        worst = _Finding(GpuHealthState.HEALTHY, REASON_HEALTHY, "")
    since = now
    message = worst.message
    if previous is not None and previous.state == worst.state and previous.reason == worst.reason:
        since = previous.since
        if worst.reason in _THROTTLE_REASONS:
            message = previous.message  # the duration in it only grows; keep the first wording
    return GpuHealthRecord(
        index=obs.index,
        uuid=obs.uuid or (previous.uuid if previous is not None else None),
        state=worst.state,
        reason=worst.reason,
        message=message,
        since=since,
        fatal_xid=fatal_xid,
        throttled_since=throttled_since,
        temperature_c=obs.temperature_c,
        power_w=obs.power_w,
    )


def restore(
    published: GpuHealth,
    boot_time: datetime | None,
    policy: HealthPolicy = HealthPolicy(),
) -> GpuHealthRecord | None:
    """The record a restarted probe continues from, given what it published before.

    Only what the probe cannot observe again is carried over: a fatal XID reported during the
    current boot (``since`` not before ``boot_time``), whether it is the named reason or was
    published beside a more fundamental one, and how long a slowdown has lasted. The published
    ``since`` is kept so that an unchanged state republishes identically. Returns None when the
    entry has no timestamp to continue from.
    """
    if published.since is None:
        return None
    since = published.since
    fatal_xid = _published_xid(published)
    if (
        fatal_xid is None
        or published.state is not GpuHealthState.UNHEALTHY
        or not policy.xid_is_fatal(fatal_xid)
        or (boot_time is not None and since < boot_time)
    ):
        fatal_xid = None
    throttled_since: datetime | None = None
    if published.state is GpuHealthState.DEGRADED and published.reason in _THROTTLE_REASONS:
        throttled_since = since - timedelta(seconds=policy.throttle_sustain_seconds)
    return GpuHealthRecord(
        index=published.index,
        uuid=published.uuid,
        state=published.state,
        reason=published.reason,
        message=published.message,
        since=since,
        fatal_xid=fatal_xid,
        throttled_since=throttled_since,
        temperature_c=published.temperature_c,
        power_w=published.power_w,
    )


def _published_xid(published: GpuHealth) -> int | None:
    """The fatal XID a status entry records: its own field, or the reason of an entry written
    before the field existed."""
    if published.fatal_xid is not None:
        return published.fatal_xid
    match = _XID_REASON.fullmatch(published.reason)
    return int(match.group(1)) if match is not None else None
