"""The ``gpusched`` command line: one entry point, one module per subcommand group."""

from __future__ import annotations

import click

from gpusched import __version__
from gpusched.commands.bench import bench
from gpusched.commands.crds import crds


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpusched")
def main() -> None:
    """gpusched: GPU scheduling for Kubernetes that follows the hardware's wiring."""


main.add_command(bench)
main.add_command(crds)
