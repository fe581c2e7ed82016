"""The node-side part of ``gpusched explain``: does each pod hold exactly the GPUs gpusched chose?
Read from the pod (its assignment and the node agent's ``gpusched.io/allocated-gpus``) and its
events (refused allocations, drift)."""

from __future__ import annotations

from typing import Any

from gpusched.api import keys
from gpusched.core.nodeagent import enforcement, pod_gpus
from gpusched.kubeasync import BlockingApi

#: Event reasons the node agent records on pods.
NODE_AGENT_REASONS = ("GpuAllocationRefused", "GpuAssignmentDrift")


def pod_report(api: BlockingApi, namespace: str, name: str) -> dict[str, Any]:
    """What the node agent knows about one pod."""
    raw = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    pod = pod_gpus(raw)
    check = enforcement(pod)
    events = api.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        params={"fieldSelector": f"involvedObject.name={name}"},
    )
    notes = [
        {"reason": e.get("reason"), "message": e.get("message"), "count": e.get("count") or 1}
        for e in events.get("items") or []
        if e.get("reason") in NODE_AGENT_REASONS
    ]
    status = raw.get("status") or {}
    return {
        "pod": pod.key,
        "node": (raw.get("spec") or {}).get("nodeName"),
        "phase": status.get("phase"),
        "admission": status.get("message")
        if status.get("reason") == "UnexpectedAdmissionError"
        else None,
        "assigned": list(pod.assigned or ()),
        "allocated": list(pod.allocated or ()),
        "enforcement": check.state.value,
        "message": check.message,
        "events": notes,
    }


def render_pod(report: dict[str, Any]) -> list[str]:
    """Human-readable lines."""
    out = [
        f"pod {report['pod']} on {report['node'] or '(not bound)'}: {report['phase']}",
        f"  GPUs assigned (gpusched.io/gpus): {','.join(report['assigned']) or 'none'}",
        f"  GPUs allocated by the kubelet: {','.join(report['allocated']) or 'not reported'}",
        f"  enforcement: {report['enforcement']}: {report['message']}",
    ]
    if report["admission"]:
        out.append(f"  admission refused: {report['admission']}")
    out.extend(f"  event {e['reason']} (x{e['count']}): {e['message']}" for e in report["events"])
    return out


def job_pods(api: BlockingApi, namespace: str, job: str) -> list[str]:
    """Names of a GpuJob's pods."""
    pods = api.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": f"{keys.LABEL_JOB_NAME}={job}"},
    )
    return sorted(str(p["metadata"]["name"]) for p in pods.get("items") or [])
