"""The ``gpusched`` command line: one entry point, one module per subcommand group.

Subcommands are imported only when invoked (click's documented lazy-group pattern), so each
component's optional dependencies (aiohttp, pynvml, the kubernetes client) are needed only
by the commands that use them, and ``gpusched --help`` starts instantly.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpusched import __version__

#: Subcommand name -> "module:attribute" of its click command.
SUBCOMMANDS: dict[str, str] = {
    "bench": "gpusched.commands.bench:bench",
    "chart": "gpusched.commands.chart:chart",
    "cluster": "gpusched.commands.cluster:cluster",
    "crds": "gpusched.commands.crds:crds",
    "demo": "gpusched.commands.demo:demo",
    "device-plugin": "gpusched.commands.device_plugin:device_plugin",
    "explain": "gpusched.commands.explain:explain",
    "simulate": "gpusched.commands.simulate:simulate",
    "operator": "gpusched.commands.operator:operator",
    "probe": "gpusched.commands.probe:probe",
    "scheduler": "gpusched.commands.scheduler:scheduler",
    "topo": "gpusched.commands.topo:topo",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attribute = self._lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=LazyGroup, lazy=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="gpusched")
def main() -> None:
    """gpusched: GPU scheduling for Kubernetes that follows the hardware's wiring."""
