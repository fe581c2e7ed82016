"""Every `gpusched` command line the documentation shows names commands, options and choices
the CLI has.

test_readme_commands.py checks the README's command table against the command tree; this reads
the command lines everywhere else a user or a reproducer copies them from: the shell blocks and
the inline code of README.md, docs/*.md, the reports under docs/benchmarks/ and the components'
READMEs. A renamed or removed subcommand or option, a choice no longer offered (a --scope, a
simulator policy) is caught here rather than by whoever pastes the line. Values are not run:
that a command does what its text says is for the benchmarks and the integration tests.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpusched.cli import main
from gpusched.simulator.policies import POLICIES

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(p for p in ROOT.glob("*/README.md") if p.parent.name != "node_modules"),
]

#: What may stand before `gpusched` on a command line: a prompt, environment assignments,
#: `time` / `nice` / `flock`, a path to the installed script.
_PREFIX = (
    r"(?:\$ )?(?:[A-Z_]+=\S+ +)*"
    r"(?:(?:/usr/bin/)?time(?: -v)? +|nice -n \d+ +|flock \S+ +)*"
    r"(?:[\w./-]*/)?"
)
_AT_START = re.compile(rf"^{_PREFIX}gpusched +(?P<rest>.*)$", re.S)
_SUBSHELL = re.compile(r"\$\(gpusched +(?P<rest>[^)]*)\)")


def _commands(path: Path) -> Iterator[tuple[str, str]]:
    """(where, the words after `gpusched`) of each command line of one Markdown file."""
    text = path.read_text()
    rel = path.relative_to(ROOT)
    prose: list[str] = []
    fence: str | None = None
    continued = ""  # a shell line ending in a backslash, joined with the next
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip() or "-"
            prose.append("")
            continue
        if fence is None:
            prose.append(line)
            continue
        prose.append("")
        if fence not in ("-", "sh", "bash", "shell", "console"):
            continue
        if stripped.endswith("\\"):
            continued += stripped[:-1] + " "
            continue
        code, continued = continued + stripped, ""
        for match in _SUBSHELL.finditer(code):
            yield f"{rel}:{number}", match["rest"]
        code = _SUBSHELL.sub("x", code)
        start = _AT_START.match(code)
        if start:
            yield f"{rel}:{number}", start["rest"]
    # Inline code spans may wrap across lines of a paragraph.
    joined = "\n".join(prose)
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        start = _AT_START.match(" ".join(match[1].split()))
        if start:
            yield f"{rel}:{joined.count(chr(10), 0, match.start()) + 1}", start["rest"]


def _words(rest: str) -> list[str]:
    rest = re.sub(r"\s#.*$", "", rest)  # a shell comment
    rest = rest.replace("\\|", "|").replace("[", " ").replace("]", " ")
    words = shlex.split(rest)
    for index, word in enumerate(words):  # a pipe or a redirection ends the command
        if word in ("|", "&&", ";") or re.match(r"^[0-9]?>", word):
            return words[:index]
    return words


COMMANDS = sorted({(where, rest) for path in DOCS for where, rest in _commands(path)})


def _placeholder(value: str) -> bool:
    """NAMESPACE/JOB, FILE, K, <p>, ...: a value the reader supplies."""
    return value == "..." or bool(re.fullmatch(r"[A-Z][A-Z0-9_/.-]*|<[^>]+>", value))


def _check(words: list[str]) -> str | None:
    """Why the words are not a command line of the CLI, or None."""
    command: click.Command = main
    path: list[str] = []
    while isinstance(command, click.Group):
        if not words or words[0].startswith("-"):
            return None  # a group named alone (`gpusched bench`) or its --help
        if words[0] == "...":
            return None
        alternatives = words.pop(0).split("/")  # `gpusched cluster up/down/status`
        found = [command.get_command(click.Context(command), a) for a in alternatives]
        missing = [a for a, c in zip(alternatives, found, strict=True) if c is None]
        if missing:
            return f"`gpusched {' '.join(path)}` has no subcommand {missing}"
        path.append(alternatives[0])
        first = found[0]
        assert first is not None
        command = first
    context = click.Context(command, info_name=" ".join(path))
    try:
        values, extra, _ = command.make_parser(context).parse_args(list(words))
    except click.UsageError as error:
        return f"`gpusched {' '.join(path)}`: {error.format_message()}"
    if extra:
        return f"`gpusched {' '.join(path)}` takes no more arguments than {extra}"
    for param in command.params:
        value = values.get(param.name) if param.name else None
        if not isinstance(value, str) or _placeholder(value):
            continue
        if isinstance(param.type, click.Choice):
            unknown = [v for v in value.split("|") if v not in param.type.choices]
            if unknown:
                return f"`gpusched {' '.join(path)}` {param.opts[0]}: no choice {unknown}"
        if path == ["simulate"] and param.name == "policies":
            unknown = [p for p in value.split(",") if p not in POLICIES and not _placeholder(p)]
            if unknown:
                return f"`gpusched simulate --policies`: no policy {unknown}"
    return None


def test_the_documentation_shows_command_lines_of_every_kind() -> None:
    # The reader above finds the lines it is meant to check (not a vacuous pass).
    assert len(COMMANDS) > 150
    shown = {" ".join(_words(rest)[:2]) for _, rest in COMMANDS}
    for expected in ("simulate --trace", "bench admission-e2e", "topo place", "cluster up"):
        assert expected in shown, expected


@pytest.mark.parametrize(("where", "rest"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_command_line_exists_in_the_cli(where: str, rest: str) -> None:
    problem = _check(_words(rest))
    assert problem is None, f"{where}: gpusched {rest}\n{problem}"


@pytest.mark.parametrize(
    "line",
    [
        "bench admision --trials 5",  # no such subcommand
        "bench admission --runs 5",  # no such option
        "simulate --trace philly --policies gpusched,kueue",  # no such policy
        "topo place FILE --gpus 4 --scope rack",  # no such choice
        "bench admission-e2e --steady-jobs",  # an option without its value
        "topo show FILE FILE",  # one argument too many
    ],
)
def test_the_check_refuses_what_the_cli_refuses(line: str) -> None:
    assert _check(_words(line)) is not None
    runner = CliRunner()
    assert runner.invoke(main, shlex.split(line.replace("FILE", "x.txt"))).exit_code != 0
