"""The README's command table names every command and subcommand of the `gpusched` CLI, and
nothing that is not one: it is the first place a user looks for what the tool can do."""

from __future__ import annotations

import re
from pathlib import Path

import click

from gpusched.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _command_rows() -> dict[str, set[str]]:
    """Per top-level command named in the table, the subcommands its rows name."""
    text = README.read_text()
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    named: dict[str, set[str]] = {}
    for cell in re.findall(r"`gpusched ([a-z-]+)((?: [a-z0-9/-]+)?)[^`]*`", section):
        command, rest = cell
        subs = named.setdefault(command, set())
        words = rest.strip()
        if words:
            subs.update(words.split("/"))
    return named


def _cli() -> dict[str, set[str]]:
    """Every command of the CLI with its subcommands (the groups load them lazily)."""
    assert isinstance(main, click.Group)
    out: dict[str, set[str]] = {}
    context = click.Context(main)
    for name in main.list_commands(context):
        command = main.get_command(context, name)
        assert command is not None
        subs: set[str] = set()
        if isinstance(command, click.Group):
            subs = set(command.list_commands(click.Context(command)))
        out[name] = subs
    return out


def test_the_readme_names_every_command_and_subcommand() -> None:
    named = _command_rows()
    commands = _cli()
    assert len(commands) >= 10
    for name, subs in commands.items():
        assert name in named, f"README's command table does not name `gpusched {name}`"
        missing = subs - named[name]  # (a command without subcommands has none to miss)
        assert not missing, f"README does not name `gpusched {name}` {sorted(missing)}"


def test_the_readme_names_no_command_the_cli_lacks() -> None:
    commands = _cli()
    for name, subs in _command_rows().items():
        assert name in commands, f"README names `gpusched {name}`, which does not exist"
        if not commands[name]:
            continue  # a command without subcommands: the words after it are its arguments
        unknown = subs - commands[name]
        assert not unknown, f"README names `gpusched {name}` {sorted(unknown)}"
