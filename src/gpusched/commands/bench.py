"""``gpusched bench``: benchmarks whose figures are recorded in docs/benchmarks.md."""

from __future__ import annotations

import signal
from types import FrameType

import click

from gpusched.dev.bench.admission import admission
from gpusched.dev.bench.admission_e2e import admission_e2e
from gpusched.dev.bench.apiserver_cost import apiserver_cost
from gpusched.dev.bench.explain import explain_bench
from gpusched.dev.bench.extender import extender
from gpusched.dev.bench.gangs import gangs_bench
from gpusched.dev.bench.kueue_scenario import kueue_scenario
from gpusched.dev.bench.node_agent import node_agent
from gpusched.dev.bench.operator_cycle import operator_cycle
from gpusched.dev.bench.placement import placement
from gpusched.dev.bench.probe import probe
from gpusched.dev.bench.scheduling import scheduling


@click.group()
def bench() -> None:
    """Run a benchmark and print its figures (--json for machines)."""
    # Stopped by SIGTERM (a timeout, `kill`), a benchmark tears down the cluster it started as
    # it does on Ctrl-C: the signal becomes SystemExit, so its `finally` blocks run.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


bench.add_command(placement)
bench.add_command(probe)
bench.add_command(extender)
bench.add_command(scheduling)
bench.add_command(admission)
bench.add_command(admission_e2e)
bench.add_command(explain_bench)
bench.add_command(apiserver_cost)
bench.add_command(operator_cycle)
bench.add_command(node_agent)
bench.add_command(gangs_bench)
bench.add_command(kueue_scenario)
