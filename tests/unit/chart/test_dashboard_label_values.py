"""The label values a dashboard panel's description names are the ones the components export:
the admission cycle's stages as a real cycle observes them, and the filter's refusal reasons."""

from __future__ import annotations

import re

from gpusched.core.placement import RefusalReason
from gpusched.dev.bench.admission import Workload, build_snapshot
from gpusched.dev.bench.operator_cycle import NOW, load_store
from gpusched.dev.chart import dashboards
from gpusched.operator.decide import OperatorConfig, decide
from gpusched.operator.nodes import NodeReader


def _description(title: str) -> str:
    for dashboard in dashboards.DASHBOARDS:
        for panel in dashboard.panels():
            if panel.title == title:
                return panel.description
    raise AssertionError(f"no panel {title!r}")


def test_the_cycle_panel_names_exactly_the_stages_a_cycle_observes() -> None:
    snapshot = build_snapshot(Workload(nodes=4, tenants=2, queued=6, fill=0.5), 1)
    store = load_store(snapshot, {n.name: "nvswitch" for n in snapshot.nodes})
    decision = decide(store.world(NOW), {}, OperatorConfig(), NodeReader())
    # The loop observes each stage of the decision, then the whole cycle.
    observed = {*decision.seconds, "cycle"}
    described = _description("Admission cycle p90 by stage")
    named = {item.split(" (")[0].strip() for item in re.split(r"\),\s*", described.rstrip(".)"))}
    assert named == observed


def test_the_refused_nodes_panel_names_exactly_the_reasons_filter_counts() -> None:
    described = _description("Nodes refused by filter")
    named = set(re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)+\b", described))
    # Every refusal of the placement core, and a node without a NodeGpuTopology.
    assert named == {reason.value for reason in RefusalReason} | {"NoTopology"}
