"""Each component's flag table documents every option of its command, with the code's default.

The tables are what an operator of the cluster reads to configure a component; a flag added to
the CLI without a row (or a default changed in one place only) silently drifts, so the tables are
read back and compared with the click commands themselves.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from gpusched.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: Which document holds the flag table of which command.
TABLES = {
    "operator/README.md": ("operator",),
    "scheduler/README.md": ("scheduler", "serve"),
    "device-probe/README.md": ("probe",),
    "docs/node-agent.md": ("device-plugin",),
}

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h)?$")
_UNIT = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def _command(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(click.Context(cmd), name)
        assert sub is not None, name
        cmd = sub
    return cmd


def _rows(doc: str) -> list[tuple[list[str], str]]:
    """(flags named in the first cell, the default cell) of every flag-table row."""
    rows = []
    for line in (ROOT / doc).read_text().splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", cells[0]), cells[1]))
    return rows


def _params_of(cmd: click.Command, flags: list[str]) -> list[click.Parameter]:
    """The distinct parameters the flags name, in order (`--x` / `--no-x` are one)."""
    out: list[click.Parameter] = []
    for flag in flags:
        for param in cmd.params:
            if flag in (*param.opts, *param.secondary_opts) and param not in out:
                out.append(param)
    return out


def _same_default(documented: str, default: object) -> bool:
    text = re.sub(r"\([^)]*\)", "", documented).replace("`", "").strip().lower()
    if isinstance(default, bool):
        return text in (("on", "true") if default else ("off", "false"))
    code = str(default).strip().lower()
    doc_num, code_num = _DURATION.match(text), _DURATION.match(code)
    if doc_num and code_num:
        doc_s = float(doc_num[1]) * _UNIT[doc_num[2]]
        return doc_s == float(code_num[1]) * _UNIT[code_num[2]]
    return text == code


@pytest.mark.parametrize("doc", sorted(TABLES))
def test_every_option_of_the_command_has_a_row_and_every_row_is_an_option(doc: str) -> None:
    cmd = _command(TABLES[doc])
    options = {
        opt
        for param in cmd.params
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
    }
    documented = {flag for flags, _ in _rows(doc) for flag in flags}
    assert options - documented == set(), f"options of {TABLES[doc]} without a row in {doc}"
    assert documented - options == set(), f"rows of {doc} naming no option of {TABLES[doc]}"


@pytest.mark.parametrize("doc", sorted(TABLES))
def test_documented_defaults_are_the_commands_defaults(doc: str) -> None:
    cmd = _command(TABLES[doc])
    wrong = []
    for flags, cell in _rows(doc):
        params = _params_of(cmd, flags)
        parts = re.split(r"\s*(?:/|,)\s*", cell) if len(params) > 1 else [cell]
        if len(parts) != len(params):
            continue  # one prose default for several flags (e.g. `--once`, `--dry-run`)
        for param, part in zip(params, parts, strict=True):
            default = param.default
            if default in (None, "") or default is getattr(click.core, "UNSET", object()):
                continue  # no value of its own: the row says what happens instead
            if not _same_default(part, default):
                wrong.append(f"{param.opts[0]}: documented {part!r}, code {default!r}")
    assert wrong == []
