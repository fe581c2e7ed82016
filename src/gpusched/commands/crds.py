"""``gpusched crds``: write or check the generated CustomResourceDefinitions."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpusched.api import crdgen, reference

REFERENCE = Path("docs") / "reference.md"


@click.group()
def crds() -> None:
    """Generate the CRDs in crds/ from the API types."""


@crds.command()
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("crds"),
    show_default=True,
    help="Directory to write into.",
)
def generate(out: Path) -> None:
    """Write one YAML file per kind."""
    for path in crdgen.generate(out):
        click.echo(f"wrote {path}")
    chart_crds = Path("deploy") / "helm" / "gpusched" / "crds"
    if chart_crds.is_dir() and out == Path("crds"):
        for path in crdgen.generate(chart_crds):
            click.echo(f"wrote {path} (the Helm chart's copy)")
    if REFERENCE.parent.is_dir():
        REFERENCE.write_text(reference.render(), encoding="utf-8")
        click.echo(f"wrote {REFERENCE}")


@crds.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("crds"),
    show_default=True,
    help="Directory holding the CRDs.",
)
def check(directory: Path) -> None:
    """Exit 1 when the committed CRDs or docs/reference.md differ from the API types."""
    outdated = crdgen.stale(directory)
    if REFERENCE.exists() and REFERENCE.read_text(encoding="utf-8") != reference.render():
        outdated.append(str(REFERENCE))
    if outdated:
        click.echo(f"stale CRDs (run `gpusched crds generate`): {', '.join(outdated)}", err=True)
        sys.exit(1)
    click.echo("CRDs are up to date")


@crds.command(name="reference")
def reference_() -> None:
    """Print the Markdown field reference of every kind (docs/reference.md)."""
    click.echo(reference.render(), nl=False)


@crds.command()
@click.argument("kind", type=click.Choice([c.plural for c in crdgen.CRDS]))
def show(kind: str) -> None:
    """Print one CRD to stdout (for `kubectl apply -f -`)."""
    crd = next(c for c in crdgen.CRDS if c.plural == kind)
    click.echo(crdgen.render(crd), nl=False)
