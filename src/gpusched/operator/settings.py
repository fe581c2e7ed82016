"""The running operator's decision settings, as ``gpusched explain --local`` finds them.

A decision made here with settings other than the operator's (``--reservations-per-tenant``,
``--guarantee-rounding``, ``--lending-hold-seconds``...) is a different decision, and nothing
would show it. So the CLI reads the settings where the operator itself gets them: the command
line of its pod. That needs nothing a ``--local`` user lacks (it lists every pod already), holds
for any installation (the chart's, or a Deployment of one's own), and is what the process
runs with, even in the middle of a rollout where the Deployment already says otherwise; the
Lease's holder names the replica that decides. The arguments are parsed by the operator's own
click command (:func:`gpusched.commands.operator.operator`) and turned into its configuration
by the same function the operator uses (:func:`~gpusched.commands.operator.operator_config`),
so a flag added to the operator is understood here without a second list of flags.

Where they cannot be read (no pod runs the operator there, pods cannot be listed, arguments
this CLI does not understand), the defaults are assumed and the answer says so and which ones:
never silently.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, Protocol

import click
from click.core import ParameterSource

from gpusched.commands.operator import operator, operator_config
from gpusched.commands.params import Duration
from gpusched.kubeasync import ApiError
from gpusched.operator.api import pods_path
from gpusched.operator.decide import OperatorConfig
from gpusched.operator.leader import LEASE_NAME

#: Most unknown options dropped from an operator's arguments before giving up on them.
_MAX_UNKNOWN: Final = 32


class Requester(Protocol):
    """What is asked of the API server (:class:`gpusched.kubeasync.BlockingApi`)."""

    def request(
        self, method: str, path: str, body: Any = None, **options: Any
    ) -> dict[str, Any]: ...


def decision_params() -> list[click.Option]:
    """The operator's options that go into its decisions: those of :class:`OperatorConfig`,
    and where its run-time history is kept. Worked out from the command and the
    configuration, not listed by hand, so that a new setting is covered when it is added."""
    names = {f.name for f in fields(OperatorConfig)} | {"lease_namespace", "runtime_history"}
    return [p for p in operator.params if isinstance(p, click.Option) and p.name in names]


@dataclass(frozen=True)
class Parsed:
    """An operator command line as the operator reads it."""

    params: dict[str, Any]
    given: frozenset[str]
    """Parameters the command line set (the rest are at their defaults)."""
    ignored: tuple[str, ...] = ()
    """Options this CLI does not know, dropped (an operator newer than the CLI)."""


def parse_args(argv: Sequence[str], *, drop_unknown: bool = False) -> Parsed:
    """``gpusched operator ARGV`` parsed by the operator's own command, without running it.
    Raises :class:`click.ClickException` (a usage error, a bad value) as the operator would
    refuse to start; with ``drop_unknown``, options this CLI does not know are dropped (and
    listed) instead of refused."""
    args = [a for a in argv if a != "--help"]  # would print help and exit
    ignored: list[str] = []
    while True:
        try:
            ctx = operator.make_context("operator", list(args))
        except click.NoSuchOption as err:
            if not drop_unknown or len(ignored) >= _MAX_UNKNOWN:
                raise
            name = err.option_name
            kept = _without_option(args, name)
            if len(kept) == len(args):  # not a token of its own (a cluster of short flags)
                raise
            ignored.append(name)
            args = kept
            continue
        given = frozenset(
            name
            for name in ctx.params
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        )
        return Parsed(dict(ctx.params), given, tuple(ignored))


def _without_option(args: Sequence[str], name: str) -> list[str]:
    """``args`` without option ``name``: ``--name=value``, or ``--name`` and the word after it
    when that is no option (its value: the operator takes no arguments of its own)."""
    kept: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == name:
            skip = i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        if a.startswith(f"{name}="):
            continue
        kept.append(a)
    return kept


def check_args(argv: Sequence[str]) -> None:
    """Raise :class:`click.ClickException` where the operator would refuse ``argv``: the
    operator arguments given on ``explain``'s command line are refused there, at once."""
    operator_config(parse_args(argv).params)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _duration(seconds: float) -> str:
    """``seconds`` as the chart's values write durations (``168h``, ``15m``, ``90s``)."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    return f"{_number(seconds)}s"


def shown(param: click.Option, value: Any) -> str:
    """``--flag=value`` as a command line would give it (and ``--operator-args`` takes it)."""
    flag = max(param.opts, key=len)
    if isinstance(param.type, Duration):
        text = _duration(value)
    elif isinstance(value, bool):
        return flag if value else (param.secondary_opts or [flag])[0]
    elif isinstance(value, int | float):
        text = _number(value)
    else:
        text = shlex.quote(str(value)) if value else ""
    return f"{flag}={text}"


def operator_argv(pod: Mapping[str, Any]) -> list[str] | None:
    """The arguments of ``gpusched operator`` in the pod's containers (None: it runs none).
    The command is found as the word ``operator`` after ``gpusched`` (also ``.../gpusched``
    and ``python -m gpusched``), or as the first argument of a container that leaves the
    image's entrypoint (``gpusched``) as it is."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        command = [str(c) for c in container.get("command") or []]
        argv = command + [str(a) for a in container.get("args") or []]
        if not command and argv[:1] == ["operator"]:
            return argv[1:]
        for i in range(1, len(argv)):
            if argv[i] == "operator" and posixpath.basename(argv[i - 1]) == "gpusched":
                return argv[i + 1 :]
    return None


@dataclass(frozen=True)
class OperatorPod:
    """A pod running the operator, and its arguments."""

    name: str
    argv: list[str]
    created: str
    live: bool
    """Neither finished nor being deleted."""


@dataclass(frozen=True)
class Found:
    """What the operator's namespace says of the operator."""

    pods: list[OperatorPod] = field(default_factory=list)
    leader: str | None = None
    """The Lease's holder (``<pod>-<pid>`` in a cluster), if it could be read."""
    problem: str | None = None
    """Why no pod could be looked at."""
    lease_problem: str | None = None


def find_operator(api: Requester, namespace: str) -> Found:
    """The pods of ``namespace`` that run the operator, and the Lease's holder."""
    try:
        items = api.request("GET", pods_path(namespace)).get("items") or []
    except ApiError as err:
        return Found(problem=f"the pods in {namespace} could not be listed: {err}")
    pods = []
    for item in items:
        argv = operator_argv(item)
        if argv is None:
            continue
        meta = item.get("metadata") or {}
        phase = (item.get("status") or {}).get("phase")
        pods.append(
            OperatorPod(
                name=str(meta.get("name")),
                argv=argv,
                created=str(meta.get("creationTimestamp") or ""),
                live=not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"),
            )
        )
    if not pods:
        return Found(problem=f"no pod in namespace {namespace} runs `gpusched operator`")
    leader, lease_problem = None, None
    where = _lease_namespace(pods) or namespace
    path = f"/apis/coordination.k8s.io/v1/namespaces/{where}/leases/{LEASE_NAME}"
    try:
        leader = (api.request("GET", path).get("spec") or {}).get("holderIdentity") or None
    except ApiError as err:
        lease_problem = f"the Lease {where}/{LEASE_NAME} could not be read: {err}"
    return Found(pods, leader, None, lease_problem)


def _lease_namespace(pods: Sequence[OperatorPod]) -> str | None:
    """The namespace of the Lease the live pods' operators hold (their ``--lease-namespace``,
    or its default; None: none can be read, or they do not agree)."""
    names = set()
    for pod in pods:
        if not pod.live:
            continue
        try:
            parsed = parse_args(pod.argv, drop_unknown=True)
        except click.ClickException:
            continue
        names.add(str(parsed.params["lease_namespace"]))
    return names.pop() if len(names) == 1 else None


def _holds(pod: str, holder: str) -> bool:
    """Whether the Lease holder ``<hostname>-<pid>`` is the pod (its hostname)."""
    name, _, pid = holder.rpartition("-")
    return name == pod and pid.isdigit()


@dataclass(frozen=True)
class OperatorSettings:
    """The settings ``explain --local`` decides with, and where they come from."""

    config: OperatorConfig
    runtime_history: tuple[str, str] | None
    """(namespace, name) of the run-time history ConfigMap (None: the operator keeps none)."""
    source: str | None
    """Where the operator's settings were read (None: they could not be)."""
    problem: str | None
    """Why they could not be read, or what is doubtful about them."""
    values: dict[str, str]
    """Every decision setting used, ``flag -> --flag=value``."""
    operator_set: dict[str, str]
    """The operator's settings other than the defaults."""
    overridden: dict[str, str]
    """The settings given here (``--operator-args``, ``--node-selector``)."""
    ignored: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What the human-readable answer says of them."""
        out = []
        if self.source is not None:
            mine = " ".join(self.operator_set.values())
            line = f"settings: the operator's ({self.source}): " + (
                f"{mine}; the rest default" if mine else "all default"
            )
            out.append(line)
        else:
            assumed = [v for k, v in self.values.items() if k not in self.overridden]
            out.append(
                f"settings: the operator's could not be read ({self.problem}); assumed the "
                "defaults (--operator-args gives others):"
            )
            out.append(f"  {' '.join(assumed)}")
        if self.source is not None and self.problem:
            out.append(f"settings: {self.problem}")
        if self.overridden:
            out.append(f"settings given here: {' '.join(self.overridden.values())}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "problem": self.problem,
            "operatorSet": self.operator_set,
            "overridden": self.overridden,
            "ignored": list(self.ignored),
            "values": self.values,
        }


def resolve(
    argv: Sequence[str] | None,
    overrides: Sequence[str] = (),
    *,
    source: str | None = None,
    problem: str | None = None,
    fallback: Sequence[str] = (),
) -> OperatorSettings:
    """The settings of the operator's arguments ``argv`` (None: not found, ``problem`` says
    why; ``fallback`` then, the arguments assumed instead besides the defaults), with
    ``overrides`` (operator arguments given here) on top: the last of an option wins, as on
    the operator's own command line. ``overrides`` must parse (see :func:`parse_args`)."""
    ignored: tuple[str, ...] = ()
    theirs: list[str] = list(fallback)
    if argv is not None:
        try:
            parsed = parse_args(argv, drop_unknown=True)
            operator_config(parsed.params)
        except click.ClickException as err:
            problem = f"{source}: its arguments could not be read: {err.format_message()}"
            source = None
        else:
            theirs, ignored = list(argv), parsed.ignored
            for name in ignored:
                theirs = _without_option(theirs, name)
            if ignored:
                note = (
                    f"options this CLI does not know were left out: {', '.join(ignored)} "
                    "(is the operator newer than this CLI?); the decision may differ"
                )
                problem = f"{problem}; {note}" if problem else note
    if source is None:
        theirs = list(fallback)
    own = parse_args(theirs)
    given = parse_args(overrides).given if overrides else frozenset()
    combined = parse_args([*theirs, *overrides])
    defaults = parse_args([]).params
    params = decision_params()
    history = combined.params["runtime_history"]
    return OperatorSettings(
        config=operator_config(combined.params),
        runtime_history=(combined.params["lease_namespace"], history) if history else None,
        source=source,
        problem=problem,
        values={p.name: shown(p, combined.params[p.name]) for p in params if p.name},
        operator_set={
            p.name: shown(p, own.params[p.name])
            for p in params
            if p.name and source is not None and own.params[p.name] != defaults[p.name]
        },
        overridden={p.name: shown(p, combined.params[p.name]) for p in params if p.name in given},
        ignored=ignored,
    )


def discover(
    api: Requester,
    namespace: str,
    overrides: Sequence[str] = (),
    *,
    fallback: Sequence[str] = (),
) -> OperatorSettings:
    """The settings the operator in ``namespace`` decides with (see the module), with
    ``overrides`` on top."""
    found = find_operator(api, namespace)
    if not found.pods:
        return resolve(None, overrides, problem=found.problem, fallback=fallback)
    for pod in found.pods:
        if found.leader and _holds(pod.name, found.leader):
            return resolve(
                pod.argv,
                overrides,
                source=f"pod {namespace}/{pod.name}, the leader",
                fallback=fallback,
            )
    live = [p for p in found.pods if p.live] or found.pods
    newest = max(live, key=lambda p: (p.created, p.name))
    problem = None
    if len(live) > 1 and _differ(live):
        why = found.lease_problem or (
            f"the Lease's holder {found.leader!r} is none of them"
            if found.leader
            else f"no Lease {namespace}/{LEASE_NAME} names a holder"
        )
        problem = (
            f"the operator's pods run with different settings and the leader is unknown "
            f"({why}): the newest pod's were used"
        )
    where = (
        "the only one running the operator"
        if len(live) == 1
        else f"the newest of {len(live)}" + ("" if problem else ", all with the same settings")
    )
    return resolve(
        newest.argv,
        overrides,
        source=f"pod {namespace}/{newest.name}, {where}",
        problem=problem,
        fallback=fallback,
    )


def _differ(pods: Sequence[OperatorPod]) -> bool:
    """Whether the pods' decision settings are not all the same (or cannot be compared)."""
    names = [p.name for p in decision_params() if p.name]
    seen = set()
    for pod in pods:
        try:
            params = parse_args(pod.argv, drop_unknown=True).params
        except click.ClickException:
            return True
        seen.add(tuple(repr(params[n]) for n in names))
    return len(seen) > 1
