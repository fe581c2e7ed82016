"""The node-side part of ``gpusched explain``: does each pod hold exactly the GPUs gpusched chose?
Read from the pod (its assignment and the node agent's ``gpusched.io/allocated-gpus``) and its
events (refused allocations, drift)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from gpusched.core.nodeagent import enforcement, pod_gpus

#: Event reasons the node agent records on pods.
NODE_AGENT_REASONS = ("GpuAllocationRefused", "GpuAssignmentDrift")


def pod_report(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    """What the node agent knows about one pod."""
    core = client.CoreV1Api(kube)
    raw = kube.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))
    pod = pod_gpus(raw)
    check = enforcement(pod)
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    notes = [
        {"reason": e.reason, "message": e.message, "count": e.count or 1}
        for e in events.items
        if e.reason in NODE_AGENT_REASONS
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


def job_pods(kube: Any, namespace: str, job: str) -> list[str]:
    """Names of a GpuJob's pods."""
    from gpusched.api import keys

    pods = client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"{keys.LABEL_JOB_NAME}={job}"
    )
    return sorted(str(p.metadata.name) for p in pods.items if p.metadata is not None)
