"""The Helm chart with the pinned helm v4: lint, render, refuse bad values, install into the real
local control plane and uninstall without leftovers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from gpusched.cli import main as gpusched_cli
from gpusched.core.labels import GFD_KEYS, gpusched_labels
from gpusched.dev.chart import render
from gpusched.dev.chart.files import chart_dir
from gpusched.dev.localcluster import LocalCluster
from gpusched.dev.localcluster.topologies import fixture_topology, fixtures_dir
from gpusched.scheduler.config import kube_scheduler_config

CI_VALUES = sorted((chart_dir() / "ci").glob("*-values.yaml"))


def _values(path: Path | None) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text())) if path else {}


def kinds(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_helm_lint_strict_passes(values: Path | None) -> None:
    args = ["lint", "--strict", str(chart_dir())]
    if values:
        args.append(f"--values={values}")
    result = render.helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"operator": {"replica": 3}}, "replica"),
        ({"scheduler": {"extender": {"metricPort": 9000}}}, "metricPort"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
        ({"deviceProbe": {"gfdLabels": "sometimes"}}, "gfdLabels"),
        ({"operator": {"replicas": "two"}}, "replicas"),
        ({"scheduler": {"extender": {"port": 70000}}}, "port"),
        ({"operator": {"replicas": 10**10}}, "replicas"),
        ({"scheduler": {"replicas": 0}}, "replicas"),
        ({"operator": {"image": {"repository": ""}}}, "repository"),
        ({"deviceProbe": {"image": {"repository": "Registry Host/x"}}}, "repository"),
        ({"deviceProbe": {"interval": "ten seconds"}}, "interval"),
        ({"deviceProbe": {"resync": "5"}}, "resync"),
        ({"scheduler": {"extender": {"httpTimeout": "30"}}}, "httpTimeout"),
        ({"deviceProbe": {"interval": "0s"}}, "interval"),
        ({"deviceProbe": {"resync": "0ms"}}, "resync"),
        ({"scheduler": {"extender": {"httpTimeout": "500ms"}}}, "httpTimeout"),
        ({"deviceProbe": {"nodeSelector": {"gpu": 'yes" --evil'}}}, "nodeSelector"),
        ({"operator": {"gpuNodeSelector": {"bad key!": "x"}}}, "bad key!"),
        ({"deviceProbe": {"podLabels": {"a": "'quoted'"}}}, "podLabels"),
        (
            {"operator": {"podPolicy": {"protectedNamespaces": ["Kube System"]}}},
            "protectedNamespaces",
        ),
        ({"operator": {"resources": {"limits": {"memory": "1 GB"}}}}, "memory"),
        ({"metrics": {"serviceMonitor": {"interval": "30 s"}}}, "interval"),
        ({"deviceProbe": {"ignoreXids": "13, 31"}}, "ignoreXids"),
    ],
)
def test_bad_values_are_refused_naming_the_key(values: dict[str, Any], named: str) -> None:
    with pytest.raises(render.ChartError) as refused:
        render.render(values)
    message = str(refused.value)
    assert "values don't meet the specifications of the schema" in message, message
    assert named in message, message


def test_default_render_has_every_component_and_no_monitoring() -> None:
    by_kind = kinds(render.render())
    assert {d["metadata"]["name"] for d in by_kind["Deployment"]} == {
        "gpusched-scheduler",
        "gpusched-operator",
    }
    assert [d["metadata"]["name"] for d in by_kind["DaemonSet"]] == ["gpusched-device-probe"]
    assert {a["metadata"]["name"] for a in by_kind["ServiceAccount"]} == {
        "gpusched-device-probe",
        "gpusched-scheduler",
        "gpusched-extender",
        "gpusched-operator",
    }
    assert len(by_kind["PodDisruptionBudget"]) == 2
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert kind not in by_kind
    assert not [
        c for c in by_kind["ConfigMap"] if "grafana_dashboard" in c["metadata"].get("labels", {})
    ]


def test_every_object_is_namespaced_to_the_release_or_cluster_scoped() -> None:
    objects = render.render(release="team-gpus", namespace="infra")
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in ("Role", "RoleBinding") and namespace == "kube-system":
            continue  # kube-scheduler's lease and authentication reader
        if namespace is not None:
            assert namespace == "infra", obj["metadata"]
        assert obj["metadata"]["name"].startswith("team-gpus-gpusched"), obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "team-gpus"


def _configmap(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name)


def test_shipped_kube_scheduler_config_is_what_the_generator_writes() -> None:
    config = _configmap(render.render(), "gpusched-scheduler")["data"]["kube-scheduler.yaml"]
    assert yaml.safe_load(config) == kube_scheduler_config("http://127.0.0.1:8888")


def test_the_probe_policy_allows_exactly_the_labels_the_probe_publishes() -> None:
    policy = next(
        o
        for o in render.render()
        if o["kind"] == "ValidatingAdmissionPolicy" and "own-node" in o["metadata"]["name"]
    )
    owned = next(v for v in policy["spec"]["variables"] if v["name"] == "ownedLabels")
    listed = set(re.findall(r"'([^']+)'", owned["expression"]))
    published: set[str] = set()
    for matrix in sorted(fixtures_dir().glob("*.txt")):
        published |= set(gpusched_labels(fixture_topology(matrix.stem, "n")))
    assert listed == published | GFD_KEYS


def test_the_priority_class_policy_reviews_only_a_creation_or_a_new_class() -> None:
    """An update that keeps the job's class (an annotation such as a workload's
    ``gpusched.io/last-checkpoint``, a label, the garbage collector removing a finalizer) is not
    reviewed: after a tenant narrows ``allowedPriorityClasses`` its existing jobs stay editable.
    The policy reviews exactly what the operator's webhook reviews for GpuJobs, so the condition
    is the webhook's; test_hostile_user.py asks the real API server."""
    objects = render.render()
    policy = next(
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"] == "gpusched-gpujob-priority-classes"
    )
    webhook = next(o for o in objects if o["kind"] == "ValidatingWebhookConfiguration")
    (gpujobs,) = [w for w in webhook["webhooks"] if w["rules"][0]["resources"] == ["gpujobs"]]
    (reviewed,) = gpujobs["matchConditions"]
    assert "oldObject.spec.priorityClassName" in reviewed["expression"]
    conditions = [c["expression"] for c in policy["spec"]["matchConditions"]]
    assert reviewed["expression"] in conditions, conditions


def test_full_values_render_the_node_agent_and_the_operators_namespace_confinement() -> None:
    objects = render.render(_values(chart_dir() / "ci" / "full-values.yaml"))
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"probe", "node-agent"}
    assert "runtimeClassName" not in daemonset["spec"]["template"]["spec"]
    operator = next(
        o
        for o in objects
        if o["metadata"]["name"] == "gpusched-operator" and o["kind"] == "Deployment"
    )
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--node-selector=gpusched.io/pool=training,gpusched.io/tier=a" in args
    policy = next(
        o
        for o in objects
        if o["metadata"]["name"] == "gpusched-operator-pods"
        and o["kind"] == "ValidatingAdmissionPolicy"
    )
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "variables.namespaceLabels['gpusched.io/tenant'] == 'true'" in expressions


def test_the_explain_port_is_open_to_all_unless_its_network_policy_is_enabled() -> None:
    assert not [o for o in render.render() if o["kind"] == "NetworkPolicy"]


def test_the_explain_network_policy_closes_only_the_explain_port() -> None:
    """The port answers without authentication: only the listed peers (the API server, for
    its proxy) reach it; the operator's other ports stay open to all, since NetworkPolicies
    add up and a policy selecting the pods would otherwise shut the webhook, the probes and
    the scrapes out too."""
    values = _values(chart_dir() / "ci" / "full-values.yaml")
    allowed = values["operator"]["explain"]["networkPolicy"]
    objects = render.render(values)
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    operator = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpusched-operator"
    )
    pod = operator["spec"]["template"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    explain = ports.pop("explain")
    rules = policy["spec"]["ingress"]
    (open_to_all,) = [r for r in rules if "from" not in r]
    assert {p["port"] for p in open_to_all["ports"]} == set(ports.values())
    (closed,) = [r for r in rules if "from" in r]
    assert [p["port"] for p in closed["ports"]] == [explain]
    assert closed["from"] == [
        *({"ipBlock": {"cidr": cidr}} for cidr in allowed["allowCidrs"]),
        *allowed["allowFrom"],
    ]


def _gpusched_containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every container of a workload or a hook pod that runs ``gpusched``."""
    out = []
    for obj in objects:
        spec = obj.get("spec") or {}
        pod = spec.get("template", {}).get("spec") if "template" in spec else spec
        if obj["kind"] not in ("Deployment", "DaemonSet", "Pod") or not pod:
            continue
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if (container.get("command") or [""])[0] == "gpusched":
                out.append(
                    (f"{obj['kind']}/{obj['metadata']['name']}/{container['name']}", container)
                )
    return out


def _parse_with_the_cli(command_line: list[str], args: list[str], env: dict[str, str]) -> None:
    """Parse ``args`` exactly as ``gpusched <command_line>`` would, without running it."""
    command: click.Command = gpusched_cli
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        ctx = click.Context(command, info_name="gpusched")
        for name in command_line:
            assert isinstance(command, click.Group), command_line
            found = command.get_command(ctx, name)
            assert found is not None, command_line
            command = found
        command.make_context(command_line[-1], list(args))


def _argument_failures(containers: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each container whose arguments the CLI refuses, with the CLI's message."""
    failures = []
    for where, container in containers:
        env = {e["name"]: "node-a" for e in container.get("env", []) if "valueFrom" in e}
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
        args = container.get("args", [])
        try:
            _parse_with_the_cli(container["command"][1:], args, env)
        except click.ClickException as err:
            failures.append(f"{where}: {' '.join(args)}: {err.format_message()}")
    return failures


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_every_rendered_gpusched_container_parses_with_the_cli(values: Path | None) -> None:
    containers = _gpusched_containers(render.render(_values(values)))
    assert {where.split("/")[-1] for where, _ in containers} >= {"probe", "operator", "extender"}
    assert _argument_failures(containers) == []


def test_the_argument_check_catches_a_flag_the_cli_refuses() -> None:
    """Planted: the probe's interval rendered in a form its flag does not read (as the chart
    once passed ``--interval=10s`` to a flag of plain seconds)."""
    containers = _gpusched_containers(render.render())
    where, probe = next((w, c) for w, c in containers if w.endswith("/probe"))
    broken = {**probe, "args": [*probe["args"], "--interval=10 seconds"]}
    (failure,) = _argument_failures([(where, broken)])
    assert where in failure
    assert "--interval" in failure


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scheduler": {"extender": {"port": 9000, "metricsPort": 9000}}}, "both 9000"),
        ({"scheduler": {"extender": {"metricsPort": 10259}}}, "10259"),
        (
            {"nodeAgent": {"enabled": True, "metricsPort": 9402}},
            "deviceProbe.metricsPort and nodeAgent.metricsPort",
        ),
        ({"operator": {"explain": {"port": 8080}}}, r"explain.port .* \(\[8080 8081 8080 9443\]\)"),
        ({"operator": {"explain": {"port": 8081}}}, r"explain.port .* \(\[8080 8081 8081 9443\]\)"),
        ({"operator": {"explain": {"port": 9443}}}, r"explain.port .* \(\[8080 8081 9443 9443\]\)"),
        ({"operator": {"explain": {"port": 443}}}, "may not be 443"),
    ],
)
def test_ports_shared_inside_one_pod_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(render.ChartError, match=message):
        render.render(values)


# --- against the real API server -----------------------------------------------------------


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_rendered_manifests_are_accepted_by_the_api_server(
    local_cluster: LocalCluster, values: Path | None
) -> None:
    # The Prometheus Operator's kinds are not served here; promtool and the e2e Prometheus
    # check what they carry (tests/integration/test_alerts.py, e2e/test_observability.py).
    objects = [
        o
        for o in render.render(_values(values), release="dryrun", namespace="gpusched-dryrun")
        if o["apiVersion"] != "monitoring.coreos.com/v1"
    ]
    manifest = render.write_manifest(objects, local_cluster.state_dir / "chart" / "dryrun.yaml")
    local_cluster.kubectl("create", "namespace", "gpusched-dryrun", check=False)
    local_cluster.kubectl("create", "namespace", "monitoring", check=False)
    result = local_cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", str(manifest), check=False
    )
    assert result.returncode == 0, result.stderr


INSTALL_NAMESPACE = "gpusched-install"
RELEASE = "gpusched-it"


@pytest.fixture
def helm_env(local_cluster: LocalCluster) -> Iterator[list[str]]:
    yield [f"--kubeconfig={local_cluster.kubeconfig}"]
    render.helm(
        "uninstall",
        RELEASE,
        f"--namespace={INSTALL_NAMESPACE}",
        f"--kubeconfig={local_cluster.kubeconfig}",
        "--ignore-not-found",
        check=False,
    )


def _release_objects(cluster: LocalCluster) -> list[str]:
    """Every object labelled with the test release, cluster-wide."""
    kinds_ = (
        "serviceaccounts,secrets,configmaps,services,deployments,daemonsets,"
        "poddisruptionbudgets,roles,rolebindings,clusterroles,clusterrolebindings,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings,"
        "mutatingadmissionpolicies,mutatingadmissionpolicybindings,"
        "validatingwebhookconfigurations,flowschemas,priorityclasses"
    )
    result = cluster.kubectl(
        "get", kinds_, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name"
    )
    return result.stdout.split()


def test_helm_install_then_uninstall_leaves_nothing_behind(
    local_cluster: LocalCluster, helm_env: list[str]
) -> None:
    crds_before = local_cluster.kubectl("get", "crds", "-o", "name").stdout.split()
    installed = render.helm(
        "install",
        RELEASE,
        str(chart_dir()),
        f"--namespace={INSTALL_NAMESPACE}",
        "--create-namespace",
        *helm_env,
    )
    # NOTES.txt tells the admin what to do next.
    for step in ("TenantQuota", "GpuJob", "kubectl label node", "dashboard"):
        assert step in installed.stdout, installed.stdout
    status = json.loads(
        render.helm(
            "status", RELEASE, f"--namespace={INSTALL_NAMESPACE}", "-o", "json", *helm_env
        ).stdout
    )
    assert status["info"]["status"] == "deployed"
    rendered = render.render(release=RELEASE, namespace=INSTALL_NAMESPACE)
    present = set(_release_objects(local_cluster))
    assert len(present) == len(rendered) - _hooks(rendered), sorted(present)

    render.helm("uninstall", RELEASE, f"--namespace={INSTALL_NAMESPACE}", "--wait", *helm_env)
    deadline = time.monotonic() + 60
    while _release_objects(local_cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _release_objects(local_cluster) == []
    # CRDs stay (Helm never deletes what crds/ installed: it would delete every GpuJob).
    assert local_cluster.kubectl("get", "crds", "-o", "name").stdout.split() == crds_before
    local_cluster.kubectl("delete", "namespace", INSTALL_NAMESPACE, "--wait=false")


def _hooks(objects: list[dict[str, Any]]) -> int:
    return sum(1 for o in objects if "helm.sh/hook" in o["metadata"].get("annotations", {}))


def test_helm_template_output_is_what_install_applies(local_cluster: LocalCluster) -> None:
    """`helm install --dry-run=server` against the real API server renders the same objects."""
    result = render.helm(
        "install",
        "dry",
        str(chart_dir()),
        "--namespace=gpusched-dry",
        "--dry-run=server",
        f"--kubeconfig={local_cluster.kubeconfig}",
        "-o",
        "json",
    )
    manifest = json.loads(result.stdout)["manifest"]
    served = [d for d in yaml.safe_load_all(manifest) if d]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in served) == sorted(
        (o["kind"], o["metadata"]["name"])
        for o in render.render(release="dry", namespace="gpusched-dry")
        if "helm.sh/hook" not in o["metadata"].get("annotations", {})
    )


def test_the_submitter_is_recorded_by_a_mutating_policy_only_where_the_api_server_has_them() -> (
    None
):
    def submitter_kinds(version: str) -> list[str]:
        return [
            o["kind"]
            for o in render.render(kube_version=version)
            if o["metadata"]["name"].endswith("gpujob-submitter")
        ]

    assert submitter_kinds("1.36.0") == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    # Before 1.36 the validating policy alone lets a creator record nobody but themself.
    assert submitter_kinds("1.33.2") == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_the_operators_default_run_time_history_is_the_configmap_the_chart_grants() -> None:
    """An operator started without ``--runtime-history`` under the chart's identity (the local
    harness, the benchmarks, a user running it by hand) reads and writes the ConfigMap the
    chart's Role names for the default release, and the chart passes that same name."""
    from gpusched.commands.operator import operator as operator_command
    from gpusched.operator.runtimes import DEFAULT_NAME

    cli_default = next(p.default for p in operator_command.params if p.name == "runtime_history")
    assert cli_default == DEFAULT_NAME
    objects = render.render()
    granted = {
        name
        for o in objects
        if o["kind"] == "Role"
        for rule in o.get("rules") or []
        if "configmaps" in rule.get("resources", []) and "get" in rule.get("verbs", [])
        for name in rule.get("resourceNames") or []
    }
    assert DEFAULT_NAME in granted
    args = [
        arg
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
        for arg in c.get("args") or []
    ]
    assert f"--runtime-history={DEFAULT_NAME}" in args


def _scraped_job(service: dict[str, Any], job_label: str, endpoint: dict[str, Any]) -> str:
    """The job label of a target, as the Prometheus Operator makes it: the Service's
    ``jobLabel`` label, then the endpoint's relabelings (action replace, Prometheus' defaults:
    regex ``(.*)``, replacement ``$1``, separator ``;``)."""
    labels = {
        "job": service["metadata"]["labels"][job_label],
        "__meta_kubernetes_pod_node_name": "n",
    }
    for relabel in endpoint.get("relabelings", []):
        assert relabel.get("action", "replace") == "replace", relabel
        value = ";".join(labels.get(s, "") for s in relabel.get("sourceLabels", []))
        match = re.fullmatch(relabel.get("regex", "(.*)"), value)
        if match:
            labels[relabel["targetLabel"]] = match.expand(
                relabel.get("replacement", "$1").replace("$1", r"\1")
            )
    return labels["job"]


def test_each_scraped_port_is_the_job_its_alerts_and_dashboards_select() -> None:
    objects = render.render(
        {"nodeAgent": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}}
    )
    services = [o for o in objects if o["kind"] == "Service"]
    jobs: dict[tuple[str | None, str], str] = {}
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        for endpoint in monitor["spec"]["endpoints"]:
            key = (render.component_of(monitor), endpoint["port"])
            jobs[key] = _scraped_job(service, monitor["spec"]["jobLabel"], endpoint)
    # The node agent shares the probe's Service: its `up` must not count as a probe's.
    assert jobs == {
        ("device-probe", "metrics"): "gpusched-device-probe",
        ("device-probe", "agent-metrics"): "gpusched-node-agent",
        ("scheduler", "metrics"): "gpusched-extender",
        ("operator", "metrics"): "gpusched-operator",
    }
