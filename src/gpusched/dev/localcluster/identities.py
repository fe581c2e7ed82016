"""Component identities on a local cluster, exactly as the Helm chart creates them.

A component process gets a kubeconfig with a token of the chart's ServiceAccount for it, after
the objects the chart renders for that identity (ServiceAccount, RBAC, admission policies,
FlowSchema) are applied. A probe's token is bound to its Node, as the projected token of a
DaemonSet pod on that node is, so the chart's own-node policy applies to it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Final

from gpusched.dev.chart import render
from gpusched.dev.localcluster import pki
from gpusched.dev.localcluster.cluster import ClusterError, LocalCluster

NAMESPACE: Final = render.NAMESPACE
PROBE: Final = "gpusched-device-probe"
KUBE_SCHEDULER: Final = "gpusched-scheduler"
EXTENDER: Final = "gpusched-extender"
OPERATOR: Final = "gpusched-operator"
#: The node agent's additions to the probe's identity (it runs as the probe's ServiceAccount).
NODE_AGENT: Final = "node-agent"
#: Chart component (label) of each ServiceAccount.
COMPONENT: Final = {
    PROBE: "device-probe",
    KUBE_SCHEDULER: "scheduler",
    EXTENDER: "scheduler",
    OPERATOR: "operator",
}

#: Chart values a component's identity is rendered with (default: the chart's defaults).
_VALUES: Final[dict[str, dict[str, Any]]] = {NODE_AGENT: {"nodeAgent": {"enabled": True}}}
#: What users may do and write, as the chart says: the roles that let namespace editors and
#: viewers use GpuJobs, and the admission policies on everyone's writes (GPU ownership
#: annotations, GPU pods in tenants' namespaces, priority classes). Installed with the first
#: component, as the chart installs them with every release.
ACCESS: Final = "access"
#: Identities that add to another one, installed after it (the node agent runs as the probe;
#: every component comes with the admission policies).
_EXTENDS: Final = {
    NODE_AGENT: COMPONENT[PROBE],
    **dict.fromkeys(set(COMPONENT.values()), ACCESS),
}

_installed: set[tuple[Path, str]] = set()
_lock = threading.Lock()


def user(account: str, namespace: str = NAMESPACE) -> str:
    """The username a token of ``account`` authenticates as."""
    return f"system:serviceaccount:{namespace}:{account}"


def install(cluster: LocalCluster, component: str) -> None:
    """Apply the chart's identity objects of ``component`` (once per cluster and process) and
    wait until its admission policies are in force."""
    if component in _EXTENDS:
        install(cluster, _EXTENDS[component])
    key = (cluster.state_dir, component)
    with _lock:
        if key in _installed:
            return
        objects, manifest = _manifest(cluster, component)
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        if any(obj["kind"] == "ValidatingAdmissionPolicy" for obj in objects):
            _wait_policy_in_force(cluster, component)
        if any(obj["kind"] == "MutatingAdmissionPolicy" for obj in objects):
            _wait_submitter_recorded(cluster)
        _installed.add(key)


def _manifest(cluster: LocalCluster, component: str) -> tuple[list[dict[str, Any]], Path]:
    """The chart's identity objects of ``component``, and the file they are written to."""
    objects = render.identity(component, _VALUES.get(component))
    path = cluster.state_dir / "chart" / f"identity-{component}.yaml"
    return objects, render.write_manifest(objects, path)


def uninstall(cluster: LocalCluster, component: str) -> None:
    """Delete what :func:`install` applied for ``component`` (a test that needs an identity
    exactly as the chart's defaults render it removes the node agent's additions first)."""
    with _lock:
        _, manifest = _manifest(cluster, component)
        deleted = cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", str(manifest))
        _installed.discard((cluster.state_dir, component))
        # A policy that was never there is not in force: nothing to wait for (and its canary's
        # identity may not exist yet on a cluster nothing was installed on).
        if "validatingadmissionpolicy" in deleted.stdout.lower():
            _wait_policy_in_force(cluster, component, in_force=False)


def kubeconfig(cluster: LocalCluster, account: str, *, node: str | None = None) -> Path:
    """Install ``account``'s identity and return a kubeconfig with a token of it (bound to
    ``node`` when given)."""
    install(cluster, COMPONENT[account])
    if node is None:
        return _token_kubeconfig(cluster, account, "")
    bound = ("Node", node, _node_uid(cluster, node))
    return _token_kubeconfig(cluster, account, f"-{node}", bound=bound)


def namespace_editor(cluster: LocalCluster, namespace: str, name: str = "editor") -> Path:
    """A kubeconfig of an ordinary user of ``namespace``: a ServiceAccount there bound to the
    built-in ``edit`` ClusterRole in that namespace only (what a team member usually gets)."""
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
    cluster.kubectl(
        "create",
        "rolebinding",
        f"{name}-edit",
        "--clusterrole=edit",
        f"--serviceaccount={namespace}:{name}",
        "-n",
        namespace,
        check=False,
    )
    token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration=2h")
    return pki.write_kubeconfig(
        cluster.state_dir / f"user-{namespace}-{name}.kubeconfig",
        cluster.server,
        cluster.ca_cert,
        user(name, namespace),
        token=token.stdout.strip(),
    )


def _node_uid(cluster: LocalCluster, node: str, timeout: float = 120.0) -> str:
    """The Node's UID, once it exists: a kubelet that just became healthy registers its Node a
    moment later."""
    deadline = time.monotonic() + timeout
    while True:
        result = cluster.kubectl("get", "node", node, "-o", "jsonpath={.metadata.uid}", check=False)
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip()
        if time.monotonic() > deadline:
            raise ClusterError(f"node {node} not registered after {timeout:.0f}s: {result.stderr}")
        time.sleep(0.5)


def _token_kubeconfig(
    cluster: LocalCluster,
    account: str,
    suffix: str,
    *,
    bound: tuple[str, str, str] | None = None,
) -> Path:
    """A kubeconfig with a fresh token of ``account`` (bound to an object: kind, name, uid)."""
    args = ["create", "token", account, "-n", NAMESPACE, "--duration=48h"]
    if bound is not None:
        kind, name, uid = bound
        args += [
            f"--bound-object-kind={kind}",
            f"--bound-object-name={name}",
            f"--bound-object-uid={uid}",
        ]
    token = cluster.kubectl(*args).stdout.strip()
    return pki.write_kubeconfig(
        cluster.state_dir / f"sa-{account}{suffix}.kubeconfig",
        cluster.server,
        cluster.ca_cert,
        user(account),
        token=token,
    )


#: A write each component's policy refuses, sent as a server-side dry run (admission runs, nothing
#: is stored): (account, kubectl arguments; account None: the cluster admin).
_CANARIES: Final[dict[str, tuple[str | None, list[str], str | None]]] = {
    # Nobody but the extender writes which GPUs a pod holds.
    ACCESS: (
        None,
        ["create", "-f", "-", "--dry-run=server", "-n", NAMESPACE],
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: gpusched-policy-check\n"
        "  annotations: {gpusched.io/gpus: GPU-x}\n"
        "spec: {containers: [{name: c, image: x}]}\n",
    ),
    # A token without a node claim may write no NodeGpuTopology.
    "device-probe": (
        PROBE,
        ["create", "-f", "-", "--dry-run=server"],
        "apiVersion: gpusched.io/v1alpha1\nkind: NodeGpuTopology\n"
        "metadata: {name: gpusched-policy-check}\nspec: {nodeName: gpusched-policy-check}\n",
    ),
    # No annotation on a pod bound to no node (the canary pod below).
    NODE_AGENT: (
        PROBE,
        ["annotate", "pod", "gpusched-policy-check", "-n", NAMESPACE, "x=y", "--dry-run=server"],
        None,
    ),
    # kube-scheduler deletes no pod (its preemption is off).
    "scheduler": (
        KUBE_SCHEDULER,
        ["delete", "pod", "gpusched-policy-check", "-n", NAMESPACE, "--dry-run=server"],
        None,
    ),
    # No pod in kube-system.
    "operator": (
        OPERATOR,
        ["run", "gpusched-policy-check", "-n", "kube-system", "--image=x", "--dry-run=server"],
        None,
    ),
}


#: What a canary needs to exist first, created as the cluster admin: a pod bound to no node.
_CANARY_POD: Final = (
    "run",
    "gpusched-policy-check",
    "-n",
    NAMESPACE,
    "--image=x",
    '--overrides={"spec": {"schedulerName": "gpusched-policy-check"}}',
)
_CANARY_SETUP: Final = {
    "scheduler": _CANARY_POD,
    NODE_AGENT: _CANARY_POD,
}


#: A GpuJob the submitter policy annotates (created as a server-side dry run only).
_SUBMITTER_CANARY: Final = """
apiVersion: gpusched.io/v1alpha1
kind: GpuJob
metadata: {name: submitter-canary, namespace: default}
spec:
  replicas: 1
  gpusPerReplica: 1
  template: {spec: {containers: [{name: main, image: canary}]}}
"""


def _wait_submitter_recorded(cluster: LocalCluster, timeout: float = 60.0) -> None:
    """Wait until the API server applies the chart's mutating policy that records a GpuJob's
    submitter (a policy takes effect a moment after it is created)."""
    deadline = time.monotonic() + timeout
    answer = ""
    while time.monotonic() < deadline:
        result = subprocess.run(
            [
                cluster.binary("kubectl"),
                f"--kubeconfig={cluster.kubeconfig}",
                "create",
                "--dry-run=server",
                "-o",
                "jsonpath={.metadata.annotations.gpusched\\.io/submitter}",
                "-f",
                "-",
            ],
            input=_SUBMITTER_CANARY,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        answer = result.stdout.strip() or result.stderr.strip()
        if result.returncode == 0 and result.stdout.strip():
            return
        time.sleep(0.2)
    raise ClusterError(
        f"the chart's submitter policy does not annotate GpuJobs after {timeout:.0f}s ({answer})"
    )


def _wait_policy_in_force(
    cluster: LocalCluster, component: str, timeout: float = 60.0, *, in_force: bool = True
) -> None:
    """Wait until the API server enforces ``component``'s policy (or, ``in_force=False``, no
    longer does: its canary write is accepted)."""
    canary = _CANARIES.get(component)
    if canary is None:
        return
    account, args, stdin = canary
    setup = _CANARY_SETUP.get(component)
    if setup is not None:
        cluster.kubectl(*setup, check=False)
    config = _token_kubeconfig(cluster, account, "-canary") if account else cluster.kubeconfig
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run(
            [cluster.binary("kubectl"), f"--kubeconfig={config}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        refused = result.returncode != 0 and "ValidatingAdmissionPolicy" in result.stderr
        if refused == in_force:
            return
        time.sleep(0.2)
    state = "in force" if in_force else "still in force"
    raise ClusterError(
        f"the chart's admission policy for {component} is {'not ' if in_force else ''}"
        f"{'in force' if in_force else state} after {timeout:.0f}s (kubeconfig {config})"
    )
