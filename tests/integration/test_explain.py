"""``gpusched explain`` on the real control plane: what each node says to a waiting job, and
the leading operator answering from its last cycle."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import suppress
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpusched.cli import main
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.kube import body
from tests.integration.operator_harness import (
    POOL,
    POOL_LABEL,
    OperatorProcess,
    Scenario,
    wait_for,
)


def _explain(cluster: LocalCluster, key: str) -> dict[str, object]:
    result = CliRunner().invoke(
        main,
        [
            "explain",
            key,
            f"--kubeconfig={cluster.kubeconfig}",
            f"--node-selector={POOL_LABEL}={POOL}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    explanation: dict[str, object] = json.loads(result.output)["explanation"]
    return explanation


def test_explain_names_the_scope_on_a_node_whose_wiring_can_never_meet_it(
    sc: Scenario, local_cluster: LocalCluster
) -> None:
    [node] = sc.nodes(1, fixture="pcie-8x-rtx4090-2socket-allsys-2nic")
    _, ns = sc.tenant("pcie", guaranteed=8)
    sc.submit(ns, "filler", 7)
    sc.wait_phase(ns, "filler", "Running")
    # One GPU is free; but no two GPUs of this board share NVLink, busy or not.
    sc.submit(ns, "paired", 2, topology={"scope": "nvlink", "mode": "required"})
    sc.wait_reason(ns, "paired", "NoFeasibleNodes")
    explanation = _explain(local_cluster, f"{ns}/paired")
    [verdict] = [v for v in explanation["nodes"] if v["node"] == node]  # type: ignore[attr-defined]
    assert verdict["reason"] == "ScopeUnsatisfiable", verdict
    assert "nvlink" in verdict["detail"]
    assert verdict["free_gpus"] == 1


def _cli(cluster: LocalCluster, key: str, *flags: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        main, ["explain", key, f"--kubeconfig={cluster.kubeconfig}", "--json", *flags]
    )
    assert result.exit_code == 0, result.output
    payload: dict[str, Any] = json.loads(result.output)
    return payload


def _four_behind_a_filler(sc: Scenario, tenant: str) -> tuple[str, str, str]:
    """One node, a tenant guaranteed its 8 GPUs, 6 of them held by a filler that ends 2 h
    after its start, and a 4-GPU job waiting for them: (node, namespace, the job's key)."""
    [node] = sc.nodes(1)
    _, ns = sc.tenant(tenant, guaranteed=8)
    sc.submit(ns, "filler", 6, maxRuntimeSeconds=7200)
    sc.wait_phase(ns, "filler", "Running")
    sc.submit(ns, "four", 4)
    sc.wait_reason(ns, "four", "WaitingForCapacity")
    return node, ns, f"{ns}/four"


def _host_address() -> str | None:
    """An address of this machine the API server may proxy to (it refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.fixture
def operator_service(kube: Any, operator: OperatorProcess) -> Iterator[str]:
    """The chart's operator Service (``gpusched-operator`` in ``gpusched-system``), whose
    ``explain`` port leads to the operator process of these tests. The API server proxies only
    to endpoints that are pods with that address: a pod no scheduler takes stands for the
    operator's, with this machine's address written into its status, behind a selectorless
    Service and its own EndpointSlice."""
    address = _host_address()
    assert address is not None, "no non-loopback IPv4 address for the API server to proxy to"
    core = client.CoreV1Api(kube)
    discovery = client.DiscoveryV1Api(kube)
    namespace, name, port = identities.NAMESPACE, "gpusched-operator", operator.explain_port
    core.create_namespaced_pod(
        namespace,
        body(
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "operator", "image": "gpusched:test"}],
                },
            },
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
    )
    core.create_namespaced_service(
        namespace,
        body(
            {
                "metadata": {"name": name},
                "spec": {"ports": [{"name": "explain", "port": 8082, "targetPort": port}]},
            },
        ),
    )
    discovery.create_namespaced_endpoint_slice(
        namespace,
        body(
            {
                "metadata": {
                    "name": f"{name}-explain",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": [
                    {
                        "addresses": [address],
                        "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "namespace": namespace, "name": name},
                    }
                ],
                "ports": [{"name": "explain", "port": port, "protocol": "TCP"}],
            },
        ),
    )
    yield name
    with suppress(ApiException):
        discovery.delete_namespaced_endpoint_slice(f"{name}-explain", namespace)
    with suppress(ApiException):
        core.delete_namespaced_service(name, namespace)
    with suppress(ApiException):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def _proxied(cluster: LocalCluster, key: str, *flags: str) -> dict[str, Any]:
    """The CLI's answer through the chart's Service, once the API server knows its
    EndpointSlice (it reads them from an informer)."""
    return wait_for(
        lambda: answer if "decidedHere" not in (answer := _cli(cluster, key, *flags)) else None,
        30,
        "the API server proxying to the operator",
    )


def test_the_leading_operator_answers_from_its_last_cycle_as_a_fresh_decision_would(
    sc: Scenario, local_cluster: LocalCluster, operator: OperatorProcess, operator_service: str
) -> None:
    """The operator's answer (at its URL, and through the API server's proxy to its Service)
    agrees with the CLI's own decision over a fresh read: the reason, the expected start and
    the change that would start the job sooner."""
    node, ns, key = _four_behind_a_filler(sc, "answers")

    direct = _cli(local_cluster, key, f"--operator=http://127.0.0.1:{operator.explain_port}")
    local = _cli(local_cluster, key, "--local")
    assert "decidedHere" not in direct, direct
    assert "decidedAt" in direct
    assert local["decidedHere"] == "--local"
    mine, theirs = direct["explanation"], local["explanation"]
    assert mine["decision"] == theirs["decision"] == "waiting"
    assert mine["reason"] == theirs["reason"] == "WaitingForCapacity"
    # The filler's declared limit ends it 2 h after its start: the GPUs free then.
    started = datetime.fromisoformat(sc.status(ns, "filler")["startedAt"]).timestamp()
    assert abs(mine["expected_start"] - (started + 7200)) <= 1, mine
    assert abs(theirs["expected_start"] - (started + 7200)) <= 1, theirs
    assert [v["node"] for v in mine["nodes"]] == [node]
    assert mine["nodes"][0]["reason"] == "NotEnoughFreeGpus"
    assert mine["counterfactual"] == theirs["counterfactual"]
    assert (mine["counterfactual"] or "").startswith("2 GPUs per replica instead of 4: now")

    proxied = _proxied(local_cluster, key)  # the chart's Service, the CLI's default
    assert "decidedAt" in proxied
    assert proxied["explanation"]["expected_start"] == mine["expected_start"]

    # Printed: who decided, the expected start, then the change worked out after it.
    printed = CliRunner().invoke(
        main,
        [
            "explain",
            key,
            f"--kubeconfig={local_cluster.kubeconfig}",
            f"--operator=http://127.0.0.1:{operator.explain_port}",
        ],
    )
    assert printed.exit_code == 0, printed.output
    lines = printed.output.splitlines()
    assert lines[1].startswith("  answered by the operator from its cycle at "), lines
    assert any(line.startswith("  expected start: ") for line in lines), lines
    assert "  sooner: 2 GPUs per replica instead of 4: now" in "\n".join(lines)

    # Settings given for a decision here do not change the operator's answer: said so.
    overridden = CliRunner().invoke(
        main,
        [
            "explain",
            key,
            f"--kubeconfig={local_cluster.kubeconfig}",
            f"--operator=http://127.0.0.1:{operator.explain_port}",
            "--operator-args=--reservations-per-tenant=3",
            "--no-sooner",
        ],
    )
    assert overridden.exit_code == 0, overridden.output
    assert "apply where this CLI decides itself (--local)" in overridden.stderr

    # No operator behind the name: the CLI decides itself and says why.
    fallback = _cli(local_cluster, key, "--operator-service=none")
    assert "did not answer" in fallback["decidedHere"]
    assert fallback["explanation"]["reason"] == "WaitingForCapacity"


def test_the_operator_says_so_when_it_has_no_such_job(
    sc: Scenario, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    _, ns = sc.tenant("nojob", guaranteed=8)
    result = CliRunner().invoke(
        main,
        [
            "explain",
            f"{ns}/absent",
            f"--kubeconfig={local_cluster.kubeconfig}",
            f"--operator=http://127.0.0.1:{operator.explain_port}",
        ],
    )
    assert result.exit_code == 1
    assert f"GpuJob {ns}/absent not found in the operator's cycle" in result.output


def test_a_namespace_editor_asks_the_operator_once_granted_the_charts_explain_role(
    sc: Scenario, local_cluster: LocalCluster, operator_service: str
) -> None:
    """The chart's ``explain`` Role allows its one proxy path; without it an ordinary user is
    refused there, and cannot decide locally either (that reads the whole cluster)."""
    sc.nodes(1)
    _, ns = sc.tenant("editor", guaranteed=8)
    sc.submit(ns, "big", 16)
    sc.wait_reason(ns, "big", "NoFeasibleNodes")
    editor = identities.namespace_editor(local_cluster, ns)
    refused = CliRunner().invoke(main, ["explain", f"{ns}/big", f"--kubeconfig={editor}"])
    assert refused.exit_code == 1
    assert "403" in refused.output, refused.output
    local_cluster.kubectl(
        "create",
        "rolebinding",
        f"{ns}-explain",
        "--role=gpusched-explain",
        f"--serviceaccount={ns}:editor",
        f"--namespace={identities.NAMESPACE}",
    )
    try:
        answer = _proxied(local_cluster, f"{ns}/big", f"--kubeconfig={editor}")
        assert answer["explanation"]["reason"] == "NoFeasibleNodes"
    finally:
        local_cluster.kubectl(
            "delete", "rolebinding", f"{ns}-explain", f"--namespace={identities.NAMESPACE}"
        )


def test_explain_local_decides_with_the_settings_of_the_operators_pod(
    sc: Scenario, kube: Any, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    """With the operator's pod in its namespace (a stand-in no scheduler takes, carrying the
    command line of this test's operator process: ``--reservations-per-tenant=1`` and its
    ``--node-selector``), ``explain --local`` decides with those settings, unasked: it shows
    the reservation the operator holds for a blocked job, and says whose settings it used."""
    node, _, key = _four_behind_a_filler(sc, "settings")
    core = client.CoreV1Api(kube)
    namespace, name = identities.NAMESPACE, "gpusched-operator-settings"
    core.create_namespaced_pod(
        namespace,
        body(
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [
                        {
                            "name": "operator",
                            "image": "gpusched:test",
                            "command": ["gpusched", "operator"],
                            "args": operator.args,
                        }
                    ],
                },
            },
        ),
    )
    try:
        direct = _cli(local_cluster, key, f"--operator=http://127.0.0.1:{operator.explain_port}")
        local = _cli(local_cluster, key, "--local", "--no-sooner")
    finally:
        with suppress(ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    settings = local["settings"]
    assert settings["source"] == f"pod {namespace}/{name}, the only one running the operator"
    assert settings["problem"] is None
    assert settings["operatorSet"]["reservations_per_tenant"] == "--reservations-per-tenant=1"
    reserved = direct["explanation"]["reservation"]
    assert reserved is not None, direct
    assert [p["node"] for p in reserved["placement"]] == [node]
    mine = local["explanation"]["reservation"]
    assert mine is not None, local
    assert mine["placement"] == reserved["placement"]
    assert abs(mine["start"] - reserved["start"]) <= 1


def test_a_job_queued_since_the_last_forecast_is_told_its_start_played_forward(
    sc: Scenario, local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    """An operator forecasting once an hour: a job queued after its first forecast has no
    start in the quick answer, which says why; `gpusched explain` asks for the start played
    forward for it alone (with the change that would start it sooner) and prints it."""
    sc.nodes(1)
    _, ns = sc.tenant("unforecast", guaranteed=8)
    operator.kill()  # the module's operator forecasts every minute
    hourly = OperatorProcess(local_cluster)
    # Without a reservation, whose start every cycle works out.
    hourly.start(extra=["--forecast-interval=3600", "--reservations-per-tenant=0"])
    try:
        sc.submit(ns, "filler", 8, maxRuntimeSeconds=7200)
        sc.wait_phase(ns, "filler", "Running")
        sc.submit(ns, "late", 4)
        sc.wait_reason(ns, "late", "WaitingForCapacity")
        key = f"{ns}/late"
        url = f"--operator=http://127.0.0.1:{hourly.explain_port}"

        quick = _cli(local_cluster, key, url, "--no-sooner")["explanation"]
        assert quick["expected_start"] is None
        assert "made before it was queued" in quick["unforecast"]

        told = _cli(local_cluster, key, url)["explanation"]
        started = datetime.fromisoformat(sc.status(ns, "filler")["startedAt"]).timestamp()
        assert abs(told["expected_start"] - (started + 7200)) <= 1, told
        assert "made before it was queued" in told["played_because"]
        printed = CliRunner().invoke(
            main, ["explain", key, f"--kubeconfig={local_cluster.kubeconfig}", url]
        )
        assert printed.exit_code == 0, printed.output
        assert "played forward now for this job alone" in printed.output
    finally:
        hourly.kill()
