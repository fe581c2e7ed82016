"""``gpusched bench``: benchmarks whose figures are recorded in docs/benchmarks.md."""

from __future__ import annotations

import click

from gpusched.bench.admission import admission, admission_e2e
from gpusched.bench.extender import extender
from gpusched.bench.placement import placement
from gpusched.bench.probe import probe
from gpusched.bench.scheduling import scheduling


@click.group()
def bench() -> None:
    """Run a benchmark and print its figures (--json for machines)."""


bench.add_command(placement)
bench.add_command(probe)
bench.add_command(extender)
bench.add_command(scheduling)
bench.add_command(admission)
bench.add_command(admission_e2e)
