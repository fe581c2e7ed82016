"""``gpusched chart``: the Helm chart's generated files (values, schema, CRDs, dashboards)."""

from __future__ import annotations

import sys

import click


@click.group()
def chart() -> None:
    """Generate or check the generated files of deploy/helm/gpusched."""


@chart.command()
def generate() -> None:
    """Write values.yaml, values.schema.json, the chart's CRDs and the dashboards."""
    from gpusched.dev.chart import files

    for path in files.write():
        click.echo(f"wrote {path}")


@chart.command()
def check() -> None:
    """Exit 1 when a generated file of the chart differs from its source."""
    from gpusched.dev.chart import files

    outdated = files.stale()
    if outdated:
        names = ", ".join(str(path) for path in outdated)
        click.echo(f"stale chart files (run `gpusched chart generate`): {names}", err=True)
        sys.exit(1)
    click.echo("chart files are up to date")
