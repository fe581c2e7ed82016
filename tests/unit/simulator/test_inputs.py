"""What a replay reads: the generic trace format, the adapters of the published traces, node
pools from the real matrices, TenantQuotas from YAML, and the measured job-speed model."""

from __future__ import annotations

import csv
import math
import time
from datetime import datetime
from pathlib import Path

import pytest

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.simulator import adapters
from gpusched.simulator.cluster import ClusterError, from_file, from_mix
from gpusched.simulator.model import TraceJob
from gpusched.simulator.quotas import QuotaError, load_tenant_quotas, with_quotas
from gpusched.simulator.trace import TraceError, read_trace, write_trace
from tests.unit.simulator.simdata import workload

TRACES = adapters.traces_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "philly-pollux").is_dir(), reason=f"published traces not at {TRACES}"
)

JOBS = (
    TraceJob("a", 0.0, 60.0, 1, 4, "team-a"),
    TraceJob(
        "b",
        5.5,
        3600.0,
        2,
        8,
        "team-b",
        priority=3,
        gpu_model="H100",
        scope=TopologyScope.NVLINK,
        mode=TopologyMode.REQUIRED,
        preemptible=False,
    ),
)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_trace_written_in_the_generic_format_reads_back_the_same(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"jobs{suffix}"
    write_trace(JOBS, path)
    assert read_trace(path) == JOBS


def test_a_bad_row_is_refused_naming_its_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "id,submit,duration,replicas,gpus_per_replica,tenant\na,0,60,1,4,t\nb,10,60,1,0,t\n"
    )
    with pytest.raises(TraceError, match=r"jobs.csv:3: field gpus_per_replica"):
        read_trace(path)


_GOOD = (
    '{"id": "a", "submit": 0, "duration": 60, "replicas": 1, "gpus_per_replica": 1, "tenant": "t"}'
)


@pytest.mark.parametrize(
    ("suffix", "content", "where", "says"),
    [
        (".jsonl", _GOOD.replace('"duration": 60', '"duration": Infinity'), ":1:", "Infinity"),
        (".jsonl", _GOOD.replace('"duration": 60', '"duration": NaN'), ":1:", "NaN"),
        (
            ".csv",
            "id,submit,duration,replicas,gpus_per_replica,tenant\na,0,inf,1,1,t\n",
            ":2:",
            "duration",
        ),
        (".jsonl", _GOOD + "\n" + _GOOD.replace('"t"', '"t\xe9"'), ":2:", "not UTF-8"),
    ],
)
def test_impossible_numbers_and_bad_bytes_are_refused_with_file_and_line(
    tmp_path: Path, suffix: str, content: str, where: str, says: str
) -> None:
    path = tmp_path / f"trace{suffix}"
    data = content.encode("utf-8")
    if says == "not UTF-8":
        data = data.replace("\xe9".encode(), b"\xe9")
    path.write_bytes(data)
    with pytest.raises(TraceError) as refused:
        read_trace(path)
    assert f"{path}{where}" in str(refused.value)
    assert says in str(refused.value)


def test_a_line_longer_than_any_job_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """Memory stays bounded: the reader stops at the limit instead of holding the line."""
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as handle:
        handle.write(_GOOD.encode() + b"\n")
        handle.write(b"[" + b"1," * (4 * 1024 * 1024) + b"1]\n")
    with pytest.raises(TraceError, match=r"huge.jsonl:2: line longer than"):
        read_trace(path)


def test_an_unknown_field_and_a_reused_id_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        '{"id": "a", "submit": 0, "duration": 1, "replicas": 1, "gpus_per_replica": 1,'
        ' "tenant": "t", "gpus": 3}\n'
    )
    with pytest.raises(TraceError, match=r"jobs.jsonl:1: field gpus"):
        read_trace(path)
    row = (
        '{"id": "a", "submit": 0, "duration": 1, "replicas": 1, "gpus_per_replica": 1,'
        ' "tenant": "t"}\n'
    )
    path.write_text(row + row)
    with pytest.raises(TraceError, match=r"jobs.jsonl:2: id 'a' already used on line 1"):
        read_trace(path)


@needs_traces
def test_philly_keeps_every_job_and_its_gpu_hours() -> None:
    with (TRACES / "philly-pollux" / "philly.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [r for r in rows if float(r["duration"]) > 0]
    w = adapters.philly(cluster_gpus=576)
    assert len(w.jobs) == len(kept) == 82_247
    # Every job keeps its run time; only jobs above 8 GPUs are rounded up to whole replicas.
    assert math.isclose(
        sum(j.duration for j in w.jobs), sum(float(r["duration"]) for r in kept), rel_tol=1e-9
    )
    # Every job holds the GPUs it asked for; larger ones as gangs of at most 8 per replica.
    assert sorted(j.gpus for j in w.jobs) == sorted(int(r["num_gpus"]) for r in kept)
    assert all(j.gpus_per_replica <= 8 for j in w.jobs)
    assert {(j.replicas, j.gpus_per_replica) for j in w.jobs if j.gpus == 12} == {(2, 6)}
    assert {t.name for t in w.tenants} == {r["cluster"] for r in rows}
    assert sum(t.guaranteed for t in w.tenants) == 576
    assert min(j.submit for j in w.jobs) == 0.0


@needs_traces
def test_philly_priorities_are_the_same_for_a_seed_and_change_with_it() -> None:
    first = adapters.philly(cluster_gpus=64, limit=2000, seed=1)
    again = adapters.philly(cluster_gpus=64, limit=2000, seed=1)
    other = adapters.philly(cluster_gpus=64, limit=2000, seed=2)
    assert [j.priority for j in first.jobs] == [j.priority for j in again.jobs]
    assert [j.priority for j in first.jobs] != [j.priority for j in other.jobs]
    share = sum(j.priority for j in first.jobs) / len(first.jobs)
    assert 0.17 < share < 0.23


@needs_traces
def test_openb_is_its_gpu_nodes_and_its_gpu_pods_that_ran() -> None:
    w, cluster = adapters.openb()
    assert (len(cluster.nodes), cluster.gpus) == (1213, 6212)
    with (TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv").open(newline="") as f:
        ran = [
            r
            for r in csv.DictReader(f)
            if int(r["num_gpu"]) >= 1
            and r["scheduled_time"]
            and float(r["deletion_time"]) > float(r["scheduled_time"])
        ]
    assert len(w.jobs) == len(ran) == 6203  # 7,064 GPU pods, 861 deleted while pending
    run = sum(float(r["deletion_time"]) - float(r["scheduled_time"]) for r in ran)
    assert sum(j.duration for j in w.jobs) == pytest.approx(run)
    assert any("861 pods deleted while pending (never ran) left out" in n for n in w.notes)


def test_an_openb_pod_runs_from_its_scheduling_and_a_pod_that_never_ran_is_left_out(
    tmp_path: Path,
) -> None:
    root = tmp_path / "alibaba-gpu-v2023"
    root.mkdir()
    (root / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,T4\n"
    )
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    (root / "openb_pod_list_default.csv").write_text(
        header
        + "creation_time,deletion_time,scheduled_time\n"
        + "waited,1000,1024,2,1000,,LS,Running,100,1100,400\n"
        + "pending,1000,1024,1,1000,,LS,Pending,200,900,\n"
        + "at-once,1000,1024,1,1000,,LS,Succeeded,300,350,300\n"
    )
    w, _ = adapters.openb(tmp_path)
    assert [(j.id, j.submit, j.duration) for j in w.jobs] == [
        ("waited", 0.0, 700.0),
        ("at-once", 200.0, 50.0),
    ]
    assert any("1 pods deleted while pending" in n for n in w.notes)
    fgd, _ = adapters.openb_inflated(tmp_path, demand=0.5)
    assert [j.id.split("#")[0] for j in fgd.jobs][:3] == ["waited", "pending", "at-once"]


@needs_traces
def test_the_fgd_inflation_stops_once_the_demand_is_reached() -> None:
    w, cluster = adapters.openb_inflated(demand=1.3)
    asked = [j.gpus for j in w.jobs]
    assert sum(asked) >= 1.3 * cluster.gpus > sum(asked[:-1])
    assert all(j.duration == math.inf for j in w.jobs)
    assert [j.submit for j in w.jobs] == [float(i) for i in range(len(w.jobs))]


def test_a_node_pool_has_the_counts_and_gpus_of_its_mix() -> None:
    cluster = from_mix("hgx-h100-sxm-8gpu-8nic=3,workstation-2socket-4x-a100-nvlink-bridge-2nic=2")
    assert len(cluster.nodes) == 5
    assert cluster.gpus == 3 * 8 + 2 * 4
    assert [n.name for n in cluster.nodes][:4] == ["h100-0", "h100-1", "h100-2", "ws-a100-0"]


@pytest.mark.parametrize("count", ["0", "two", "\u00b2", "-1", ""])
def test_a_node_pool_count_that_is_no_whole_number_is_refused_naming_the_entry(count: str) -> None:
    with pytest.raises(ClusterError, match="expected <fixture>=<count>, count >= 1"):
        from_mix(f"hgx-h100-sxm-8gpu-8nic={count}")


def test_an_unknown_fixture_is_refused_listing_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"known: .*hgx-h100-sxm-8gpu-8nic"):
        from_mix("dgx-b300=2")
    path = tmp_path / "pool.yaml"
    path.write_text("nodes: [{fixture: hgx-h100-sxm-8gpu-8nic}]\n")
    with pytest.raises(ClusterError, match="expected 'nodes:"):
        from_file(path)


QUOTAS = """\
apiVersion: gpusched.io/v1alpha1
kind: TenantQuota
metadata: {name: research}
spec: {namespaces: [team-a, team-b], guaranteedGpus: 16, borrowingLimit: 24, weight: 2}
---
apiVersion: gpusched.io/v1alpha1
kind: TenantQuota
metadata: {name: prod}
spec: {namespaces: [serving], guaranteedGpus: 8}
"""


def test_tenant_quotas_from_yaml_own_the_jobs_of_their_namespaces(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(QUOTAS)
    w = with_quotas(workload(*JOBS), load_tenant_quotas(path))
    assert {j.id: j.tenant for j in w.jobs} == {"a": "research", "b": "research"}
    research = next(t for t in w.tenants if t.name == "research")
    assert (research.guaranteed, research.borrowing_limit, research.weight) == (16, 24, 2.0)


def test_a_tenant_quota_with_a_bad_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(QUOTAS.replace("guaranteedGpus: 8", "guaranteedGpus: -8"))
    with pytest.raises(QuotaError, match=r"document 2: spec\.guaranteedGpus"):
        load_tenant_quotas(path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("just a string\n", r"document 1: the plain value 'just a string', not a TenantQuota"),
        ("42\n", r"document 1: the plain value 42, not a TenantQuota"),
        (QUOTAS + "---\n- a\n- list\n", r"document 3: a list, not a TenantQuota"),
        ("kind: List\nitems: {a: 1}\n", r"document 1: items: not a list"),
        ("kind: List\nitems:\n", r"document 1: items: not a list"),
    ],
)
def test_a_yaml_document_that_is_no_manifest_is_refused_naming_it(
    tmp_path: Path, text: str, said: str
) -> None:
    """A file that is YAML but holds no mapping (a typo'd path to some other file) is a
    QuotaError, which the CLI reports in one line."""
    path = tmp_path / "quotas.yaml"
    path.write_text(text)
    with pytest.raises(QuotaError, match=said):
        load_tenant_quotas(path)


def test_philly_submit_times_are_read_as_utc_whatever_the_machine_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two pairs of rows around the 2017 US daylight-saving changes: in UTC, the jobs are 40 and
    # 80 minutes apart; read as Los Angeles local time they would be 100 and 20 minutes apart.
    root = tmp_path / "philly-pollux"
    root.mkdir()
    (root / "philly.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-03-12 01:50:00,60.0,1,60.0,vc\n"
        "2017-03-12 03:10:00,60.0,1,60.0,vc\n"
        "2017-11-05 01:30:00,60.0,1,60.0,vc\n"
        "2017-11-05 02:10:00,60.0,1,60.0,vc\n"
    )
    (root / "philly_vc_nodes.csv").write_text("vc,node num\nvc,1\n")
    first_change = (datetime(2017, 11, 5, 1, 30) - datetime(2017, 3, 12, 1, 50)).total_seconds()
    expected = [0.0, 4800.0, first_change, first_change + 2400.0]
    for zone in ("America/Los_Angeles", "UTC"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        try:
            w = adapters.philly(tmp_path, cluster_gpus=8)
        finally:
            monkeypatch.undo()
            time.tzset()
        assert [j.submit for j in w.jobs] == expected, zone
