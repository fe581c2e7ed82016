"""``gpusched explain --local`` decides with the running operator's settings, read from its
pod's command line, and says plainly which settings it assumed where it could not read them.

The API server is a stand-in answering the two reads discovery makes (the operator
namespace's pods, the Lease); the expected configurations are written out by hand from the
flags, not worked out by the code under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from gpusched.cli import main
from gpusched.commands.operator import operator, operator_config
from gpusched.core.lifecycle.spend import Pricing
from gpusched.core.runtime import JobKind, RuntimeHistory
from gpusched.kubeasync import ApiError
from gpusched.operator import settings as discovery
from gpusched.operator.decide import OperatorConfig
from gpusched.operator.explainer import explain_job
from gpusched.operator.settings import discover, operator_argv, resolve
from tests.unit.operator.test_explain_cli_errors import CLOSED
from tests.unit.operator.test_explain_runtime_history import _store

NS = "gpusched-system"
FALLBACK = [f"--lease-namespace={NS}", "--runtime-history=gpusched-operator-runtime-history"]

#: What the chart's Deployment passes the operator (`helm template` with reservationsPerTenant
#: 2, guaranteeRounding up, pricing in USD at 2, usageHalfLife 604800, gpuNodeSelector
#: {pool: gpu, a: b}), as rendered.
CHART_ARGS = [
    "--leader-elect",
    f"--lease-namespace={NS}",
    "--metrics-port=8080",
    "--resync=5",
    "--pods-ready-timeout=300",
    "--backoff-base=10",
    "--backoff-max=600",
    "--max-preemption-searches=32",
    "--record-delay=15",
    "--arrivals-on-top=10",
    "--max-node-rejections=5",
    "--max-unready-releases=5",
    "--forecast-interval=60",
    "--forecast-arrivals-window=0",
    "--reservations-per-tenant=2",
    "--guarantee-rounding=up",
    "--lending-hold-seconds=900",
    "--reclaim-patience-seconds=0",
    '--pricing={"byModel":{},"currency":"USD","default":2}',
    "--usage-half-life=604800",
    "--runtime-history=gpusched-operator-runtime-history",
    "--health-port=8081",
    "--explain-port=8082",
    "--stuck-after=120",
    "--webhook-port=9443",
    "--webhook-cert-dir=/etc/gpusched/webhook",
    "--node-selector=a=b,pool=gpu",
]

#: The configuration those arguments mean, written out.
CHART_CONFIG = OperatorConfig(
    pods_ready_timeout=300.0,
    backoff_base=10.0,
    backoff_max=600.0,
    node_selector={"a": "b", "pool": "gpu"},
    max_preemption_searches=32,
    record_delay=15.0,
    arrivals_on_top=10.0,
    max_node_rejections=5,
    max_unready_releases=5,
    forecast_interval=60.0,
    forecast_arrivals_window=0.0,
    reservations_per_tenant=2,
    guarantee_rounding="up",
    lending_hold_seconds=900.0,
    reclaim_patience_seconds=0.0,
    pricing=Pricing(currency="USD", default=2.0, by_model={}),
    usage_half_life=604800.0,
)


def _pod(
    name: str,
    args: list[str],
    *,
    created: str = "2026-11-29T10:00:00Z",
    command: tuple[str, ...] = ("gpusched", "operator"),
    phase: str = "Running",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": created},
        "spec": {"containers": [{"name": "operator", "command": list(command), "args": args}]},
        "status": {"phase": phase},
    }


class FakeApi:
    """The operator namespace's pods and Lease (None: no Lease), or the errors reading them."""

    def __init__(
        self,
        pods: list[dict[str, Any]],
        holder: str | None = None,
        *,
        pods_error: ApiError | None = None,
        lease_error: ApiError | None = None,
    ) -> None:
        self.pods, self.holder = pods, holder
        self.pods_error, self.lease_error = pods_error, lease_error

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> dict[str, Any]:
        assert method == "GET"
        if path == f"/api/v1/namespaces/{NS}/pods":
            if self.pods_error:
                raise self.pods_error
            return {"items": self.pods}
        if path == f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpusched-operator":
            if self.lease_error:
                raise self.lease_error
            if self.holder is None:
                raise ApiError(404, "NotFound", "leases.coordination.k8s.io not found")
            return {"spec": {"holderIdentity": self.holder}}
        raise AssertionError(path)


FORBIDDEN = ApiError(403, "Forbidden", "pods is forbidden: User alice cannot list pods")


def test_the_leaders_chart_rendered_arguments_are_the_settings_decided_with() -> None:
    """Of two replicas in the middle of a rollout, the Lease holder's settings are the ones
    that decide, though the other pod is newer."""
    api = FakeApi(
        [
            _pod("gpusched-operator-old", CHART_ARGS, created="2026-11-29T10:00:00Z"),
            _pod("gpusched-operator-new", ["--leader-elect"], created="2026-11-29T11:00:00Z"),
        ],
        holder="gpusched-operator-old-1",
    )
    found = discover(api, NS, fallback=FALLBACK)
    assert found.config == CHART_CONFIG
    assert found.runtime_history == (NS, "gpusched-operator-runtime-history")
    assert found.source == f"pod {NS}/gpusched-operator-old, the leader"
    assert found.problem is None
    [line] = found.lines()
    assert line.startswith(f"settings: the operator's (pod {NS}/gpusched-operator-old")
    for flag in (
        "--reservations-per-tenant=2",
        "--guarantee-rounding=up",
        "--usage-half-life=168h",
    ):
        assert flag in line
    assert "--backoff-base" not in line  # at its default: not worth a word
    assert line.endswith("; the rest default")


def test_pods_that_disagree_without_a_readable_lease_are_named_and_the_newest_decides() -> None:
    api = FakeApi(
        [
            _pod("op-a", [], created="2026-11-29T10:00:00Z"),
            _pod("op-b", ["--reservations-per-tenant=1"], created="2026-11-29T11:00:00Z"),
        ],
        lease_error=ApiError(403, "Forbidden", "leases is forbidden"),
    )
    found = discover(api, NS, fallback=FALLBACK)
    assert found.config == OperatorConfig(reservations_per_tenant=1)
    assert found.source == f"pod {NS}/op-b, the newest of 2"
    assert found.problem is not None
    assert "different settings" in found.problem
    assert "403 Forbidden" in found.problem
    assert any(line == f"settings: {found.problem}" for line in found.lines())


def test_replicas_with_the_same_settings_need_no_leader() -> None:
    """No Lease (a single replica, or none elected yet) and no disagreement: no doubt."""
    args = ["--lending-hold-seconds=0", "--guarantee-rounding=up"]
    api = FakeApi([_pod("op-a", args), _pod("op-b", list(reversed(args)))])
    found = discover(api, NS)
    assert found.config == OperatorConfig(lending_hold_seconds=0.0, guarantee_rounding="up")
    assert found.problem is None
    assert found.source == f"pod {NS}/op-b, the newest of 2, all with the same settings"


def test_a_finished_pod_does_not_speak_for_the_operator() -> None:
    api = FakeApi(
        [
            _pod("op-crashed", ["--reservations-per-tenant=3"], created="2026-11-29T12:00:00Z")
            | {"status": {"phase": "Failed"}},
            _pod("op-running", ["--reservations-per-tenant=1"]),
        ]
    )
    found = discover(api, NS)
    assert found.config.reservations_per_tenant == 1
    assert found.source == f"pod {NS}/op-running, the only one running the operator"


def test_pods_that_cannot_be_listed_leave_the_defaults_assumed_and_named() -> None:
    found = discover(FakeApi([], pods_error=FORBIDDEN), NS, fallback=FALLBACK)
    assert found.source is None
    assert found.config == OperatorConfig()
    assert found.runtime_history == (NS, "gpusched-operator-runtime-history")
    head, assumed = found.lines()
    assert "could not be read" in head
    assert "403 Forbidden" in head
    assert "--operator-args" in head
    for flag in (
        "--reservations-per-tenant=0",
        "--guarantee-rounding=down",
        "--lending-hold-seconds=900",
        "--reclaim-patience-seconds=0",
        "--max-preemption-searches=32",
        "--usage-half-life=0s",
        "--node-selector=",
    ):
        assert flag in assumed.split(), flag


def test_a_namespace_without_the_operator_says_so() -> None:
    scheduler = _pod("extender", ["serve"], command=("gpusched", "scheduler"))
    found = discover(FakeApi([scheduler]), NS, fallback=["--runtime-history=mine"])
    assert found.source is None
    assert found.problem == f"no pod in namespace {NS} runs `gpusched operator`"
    assert found.runtime_history == ("gpusched-system", "mine")


def test_options_unknown_to_this_cli_are_left_out_and_named() -> None:
    """An operator newer than the CLI: the settings it knows are still the operator's."""
    api = FakeApi([_pod("op", ["--future-knob=3", "--reservations-per-tenant=2", "--shiny"])])
    found = discover(api, NS)
    assert found.config == OperatorConfig(reservations_per_tenant=2)
    assert found.ignored == ("--future-knob", "--shiny")
    assert found.problem is not None
    assert "--future-knob, --shiny" in found.problem
    assert "may differ" in found.problem


@pytest.mark.parametrize(
    "args", [["--guarantee-rounding=sideways"], ["--pricing=[1]"], ["stray"], ["--node-selector=x"]]
)
def test_arguments_the_operator_would_refuse_leave_the_defaults_assumed(args: list[str]) -> None:
    found = discover(FakeApi([_pod("op", args)]), NS, fallback=FALLBACK)
    assert found.source is None
    assert found.config == OperatorConfig()
    assert found.problem is not None
    assert found.problem.startswith(f"pod {NS}/op, the only one running the operator: its ")


def test_settings_given_here_override_the_operators() -> None:
    found = resolve(
        CHART_ARGS,
        ["--guarantee-rounding=down", "--node-selector=x=y"],
        source="pod somewhere",
    )
    assert found.config.guarantee_rounding == "down"
    assert found.config.node_selector == {"x": "y"}
    assert found.config.reservations_per_tenant == 2  # the operator's, not overridden
    assert found.lines()[-1] == "settings given here: --node-selector=x=y --guarantee-rounding=down"
    assert found.to_dict()["overridden"] == {
        "node_selector": "--node-selector=x=y",
        "guarantee_rounding": "--guarantee-rounding=down",
    }


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        ({"command": ["gpusched", "operator"], "args": ["--resync=5"]}, ["--resync=5"]),
        ({"command": ["/usr/local/bin/gpusched"], "args": ["operator", "-v"]}, ["-v"]),
        ({"command": ["python", "-m", "gpusched", "operator", "--x"]}, ["--x"]),
        ({"args": ["operator", "--leader-elect"]}, ["--leader-elect"]),  # the image's entrypoint
        ({"command": ["gpusched", "scheduler"], "args": ["operator"]}, None),
        ({"command": ["sh", "-c", "gpusched operator"]}, None),
        ({"image": "busybox"}, None),
    ],
)
def test_the_operator_command_is_found_as_containers_spell_it(
    container: dict[str, Any], argv: list[str] | None
) -> None:
    pod = {"spec": {"containers": [{"name": "sidecar", "command": ["pause"]}, container]}}
    assert operator_argv(pod) == argv


def _other_value(param: click.Option) -> str:
    """A valid value of the option other than its default."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return next(str(c) for c in kind.choices if c != param.default)
    if param.name == "node_selector":
        return "k=v"
    if param.name == "pricing":
        return '{"default": 3}'
    if param.name in ("lease_namespace", "runtime_history"):
        return "other"
    if isinstance(kind, click.IntRange | click.FloatRange) or kind in (click.INT, click.FLOAT):
        return str(float(param.default or 0) + 1).removesuffix(".0")
    return "7s"  # a duration


def test_every_flag_of_the_operators_configuration_reaches_it() -> None:
    """Each decision flag, set alone to another value, changes what the operator (and
    explain) configure: none is read and then dropped on the way."""
    params = discovery.decision_params()
    flags = {max(p.opts, key=len) for p in params}
    for needed in ("--reservations-per-tenant", "--guarantee-rounding", "--pricing"):
        assert needed in flags
    default = resolve(None)
    for param in params:
        flag = f"{max(param.opts, key=len)}={_other_value(param)}"
        changed = resolve([flag], source="pod")
        assert (changed.config, changed.runtime_history) != (
            default.config,
            default.runtime_history,
        ), flag
        assert list(changed.operator_set) == [param.name], flag


def test_the_operator_itself_configures_through_the_same_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpusched operator` hands run() what operator_config makes of its flags."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr("gpusched.operator.main.run", lambda options: captured.update(o=options))
    monkeypatch.setattr("gpusched.commands.operator.configure_logging", lambda level: None)
    result = CliRunner().invoke(operator, CHART_ARGS)
    assert result.exit_code == 0, result.output
    assert captured["o"].config == CHART_CONFIG
    assert operator_config(operator.make_context("operator", list(CHART_ARGS)).params) == (
        CHART_CONFIG
    )


def test_explain_decides_with_the_settings_it_is_given() -> None:
    """The same cluster, explained with the operator's --reservations-per-tenant, shows the
    reservation the operator holds for the job; with the defaults it would show none."""
    history = RuntimeHistory()
    history.record(JobKind("team", "team", "train", 8), 3600.0)
    config = OperatorConfig(reservations_per_tenant=1)
    held, _ = explain_job(_store(), "team/next", config, sooner=False, history=history)
    assert held.reservation is not None
    assert held.reservation["placement"] == [{"node": "gpu-1", "gpus": list(range(8))}]
    plain, _ = explain_job(_store(), "team/next", sooner=False, history=history)
    assert plain.reservation is None


def _local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> dict[str, Any]:
    """``explain --local`` over a stand-in cluster whose operator pod runs CHART_ARGS;
    what explain_in_cluster was asked with, and the output."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    config = tmp_path / "closed.kubeconfig"
    config.write_text(CLOSED)
    asked: dict[str, Any] = {}

    def explain_in_cluster(configuration: Any, key: str, config: Any, **options: Any) -> Any:
        asked.update(config=config, **options)
        return explain_job(_store(), "team/next", config, sooner=False)

    monkeypatch.setattr(
        discovery,
        "find_operator",
        lambda api, namespace: discovery.Found(
            [discovery.OperatorPod("op-x", CHART_ARGS, "", live=True)], "op-x-7"
        ),
    )
    monkeypatch.setattr("gpusched.operator.explainer.explain_in_cluster", explain_in_cluster)
    monkeypatch.setattr("gpusched.node_agent.explain.job_pods", lambda *_: [])
    args = ["explain", "team/next", "--local", "--no-sooner", f"--kubeconfig={config}", *flags]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    asked["output"] = result.output
    return asked


def test_explain_local_decides_with_the_operators_settings_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _local(tmp_path, monkeypatch)
    assert asked["config"] == CHART_CONFIG
    assert asked["runtime_history"] == (NS, "gpusched-operator-runtime-history")
    lines = asked["output"].splitlines()
    assert lines[1] == "  decided here: --local"
    assert lines[2].startswith(f"  settings: the operator's (pod {NS}/op-x, the leader): ")
    assert "--reservations-per-tenant=2" in lines[2]


def test_explain_local_flags_override_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _local(
        tmp_path,
        monkeypatch,
        "--operator-args=--reservations-per-tenant=0 --lending-hold-seconds=60",
        "--node-selector=pool=other",
        "--json",
    )
    assert asked["config"].reservations_per_tenant == 0
    assert asked["config"].lending_hold_seconds == 60.0
    assert asked["config"].node_selector == {"pool": "other"}
    assert asked["config"].guarantee_rounding == "up"  # the operator's
    settings = json.loads(asked["output"])["settings"]
    assert settings["source"] == f"pod {NS}/op-x, the leader"
    assert settings["overridden"] == {
        "node_selector": "--node-selector=pool=other",
        "reservations_per_tenant": "--reservations-per-tenant=0",
        "lending_hold_seconds": "--lending-hold-seconds=60",
    }


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--operator-args=--reservations-per-tenant=99", "0<=x<=16"),
        ("--operator-args=--no-such-flag", "No such option '--no-such-flag'"),
        ("--operator-args='--pricing", "No closing quotation"),
        ("--node-selector=pool", "expected key=value"),
    ],
)
def test_explain_refuses_settings_the_operator_would_refuse(flag: str, said: str) -> None:
    result = CliRunner().invoke(main, ["explain", "team/next", "--local", flag])
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_an_unknown_option_given_its_value_as_the_next_word_is_left_out_with_it() -> None:
    """``--future-knob 3`` (not ``=3``): the value goes with the option, the rest stands."""
    api = FakeApi([_pod("op", ["--future-knob", "3", "--reservations-per-tenant=2"])])
    found = discover(api, NS)
    assert found.config == OperatorConfig(reservations_per_tenant=2)
    assert found.ignored == ("--future-knob",)


def test_the_lease_is_read_where_the_operators_flags_keep_it() -> None:
    """Operators in ``NS`` holding their Lease in another namespace: the holder is read
    there, and the leader's settings are the ones decided with."""

    class LeaseElsewhere(FakeApi):
        def request(
            self, method: str, path: str, body: Any = None, **options: Any
        ) -> dict[str, Any]:
            if path == "/apis/coordination.k8s.io/v1/namespaces/elections/leases/gpusched-operator":
                return {"spec": {"holderIdentity": "op-b-7"}}
            return super().request(method, path, body, **options)

    api = LeaseElsewhere(
        [
            _pod("op-a", ["--lease-namespace=elections", "--reservations-per-tenant=1"]),
            _pod(
                "op-b",
                ["--lease-namespace=elections", "--reservations-per-tenant=2"],
                created="2026-11-29T09:00:00Z",
            ),
        ]
    )
    found = discover(api, NS)
    assert found.config == OperatorConfig(reservations_per_tenant=2)
