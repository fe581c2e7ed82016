"""Every event reason the operator records on a GpuJob is in docs/troubleshooting.md.

The reasons are read from the calls that record events (``Event(...)`` and ``self.event(...)``
in ``gpusched.core.lifecycle``), so a new event is caught whether it is a literal or a member
of the lifecycle's ``Reason`` enum.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from gpusched.core.admission.model import WaitReason
from gpusched.core.lifecycle.status import Reason

ROOT = Path(__file__).resolve().parents[2]
#: The module, not the function ``gpusched.core.lifecycle.plan`` its package exports.
plan = importlib.import_module("gpusched.core.lifecycle.plan")
LIFECYCLE = ROOT / "src" / "gpusched" / "core" / "lifecycle"


def _reason_arg(call: ast.Call) -> ast.expr | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "Event" and len(call.args) >= 2:
        return call.args[1]
    if isinstance(func, ast.Attribute) and func.attr == "event" and call.args:
        return call.args[0]
    return None


def _recorded_reasons() -> set[str]:
    reasons: set[str] = set()
    for path in LIFECYCLE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or (arg := _reason_arg(node)) is None:
                continue
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                reasons.add(arg.value)
            # st.Reason.X.value / Reason.X.value
            elif (
                isinstance(arg, ast.Attribute)
                and arg.attr == "value"
                and isinstance(arg.value, ast.Attribute)
                and isinstance(arg.value.value, (ast.Name, ast.Attribute))
                and ast.unparse(arg.value.value).endswith("Reason")
            ):
                reasons.add(Reason[arg.value.attr].value)
        # ``reason = st.Reason.X`` or ``return st.Reason.X, message``, then
        # ``self.event(reason.value, ...)``.
        for node in ast.walk(ast.parse(path.read_text())):
            value = None
            if isinstance(node, ast.Assign) and [ast.unparse(x) for x in node.targets] == [
                "reason"
            ]:
                value = node.value
            elif (
                isinstance(node, ast.Return)
                and isinstance(node.value, ast.Tuple)
                and node.value.elts
            ):
                value = node.value.elts[0]
            if isinstance(value, ast.Attribute) and ast.unparse(value.value).endswith("Reason"):
                reasons.add(Reason[value.attr].value)
    # Recorded through variables: a changed wait reason, a reservation made, moved or released.
    reasons |= {r.value for r in WaitReason}
    reasons |= {plan.RESERVED, plan.RESERVATION_MOVED, plan.RESERVATION_RELEASED}
    return reasons


def _documented() -> set[str]:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = text.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Z]\w+)`", line.split("|")[1]))
    wait_row = next(line for line in section.splitlines() if line.startswith("| a wait reason"))
    if "above" in wait_row:
        names |= {r.value for r in WaitReason}  # the Reasons table lists each of them
    return names


def test_every_recorded_gpujob_event_reason_is_documented() -> None:
    recorded = _recorded_reasons()
    assert {"Admitted", "Failed", "PodsCreated", "PreemptedBy"} <= recorded  # the scan works
    assert recorded - _documented() == set()


def test_every_documented_event_reason_is_recorded() -> None:
    assert _documented() - _recorded_reasons() == set()


def test_every_wait_reason_has_a_row_in_the_reasons_table() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    rows = set(re.findall(r"^\| Queued / `(\w+)`", text, re.M))
    assert {r.value for r in WaitReason} - rows == set()
