"""The fake backend's inputs: fault descriptions, the fault file, topology files, and the
``gpusched probe --once --dry-run --fake`` output built on them."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from probe_testdata import H100, RTX4090, WORKSTATION, MakeNode

from gpusched.api import keys
from gpusched.api.nodegputopology import LinkType
from gpusched.cli import main
from gpusched.core import Gpu, Link, NodeTopology
from gpusched.dev.fakenvml import (
    FakeSourceError,
    FakeTopologyError,
    FaultError,
    FaultFeed,
    load_topology,
    parse_fault,
    plan_pcie,
)
from gpusched.dev.localcluster.topologies import fixture_path


def test_fault_lines_are_validated_with_the_line_named() -> None:
    assert parse_fault('{"gpu": 3, "xid": 79}').xid == 79
    assert parse_fault('{"gpu": 1, "remappedRows": "pending"}').remapped_rows == "pending"
    assert (
        parse_fault('{"nvmlInit": "fail", "error": "LibraryNotFound"}').error == "LibraryNotFound"
    )
    with pytest.raises(FaultError, match=r"faults.jsonl:4: not JSON"):
        parse_fault("{gpu: 3}", "faults.jsonl:4")
    with pytest.raises(FaultError, match="exactly one of"):
        parse_fault('{"gpu": 3, "xid": 79, "lost": true}')
    with pytest.raises(FaultError, match="needs the index"):
        parse_fault('{"xid": 79}')
    with pytest.raises(FaultError, match="throttle"):
        parse_fault('{"gpu": 0, "throttle": "sometimes"}')


def test_the_fault_file_is_read_as_lines_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    feed = FaultFeed(path)
    assert feed.poll() == []
    path.write_text('{"gpu": 1, "xid": 79}\n# a comment\n{"gpu": 2, "lo')
    assert [f.gpu for f in feed.poll()] == [1]
    with path.open("a") as handle:
        handle.write('st": true}\n')
    assert [(f.gpu, f.lost) for f in feed.poll()] == [(2, True)]
    assert feed.poll() == []


def test_a_fault_for_a_gpu_the_node_lacks_is_refused(make_node: MakeNode) -> None:
    fake = make_node(WORKSTATION)
    with pytest.raises(FaultError, match="no such GPU"):
        fake.nvml.inject(parse_fault('{"gpu": 7, "xid": 79}'))
    with pytest.raises(FaultError, match="unknown NVML error"):
        fake.nvml.inject(parse_fault('{"nvmlInit": "fail", "error": "Grumpy"}'))


def test_matrix_comments_give_the_full_product_name_and_driver() -> None:
    topology = load_topology(fixture_path(H100), "n")
    assert {g.model for g in topology.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert topology.driver_version == "570.124.06"
    assert topology.node_name == "n"


def test_a_nodegputopology_yaml_can_drive_the_fake(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": keys.API_VERSION,
                "kind": "NodeGpuTopology",
                "metadata": {"name": "somewhere-else"},
                "spec": {
                    "nodeName": "somewhere-else",
                    "gpus": [{"index": 0, "uuid": "GPU-x", "model": "NVIDIA L40S"}],
                },
                "status": {"gpus": [{"index": 0, "state": "Unhealthy", "reason": "Xid79"}]},
            }
        )
    )
    topology = load_topology(path, "here")
    assert topology.node_name == "here"
    assert topology.source == "fake:node.yaml"
    assert topology.gpu(0).health.value == "Healthy"  # health is the probe's to judge


def test_bad_topology_files_are_refused_with_the_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("GPU0 GPU1\nGPU0 X NV4\n")
    with pytest.raises(FakeSourceError, match=r"bad\.txt"):
        load_topology(bad, "n")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("gpus: [{index: 0}]\n")
    with pytest.raises(FakeSourceError, match=r"wrong\.yaml"):
        load_topology(wrong, "n")


def test_a_mesh_needing_more_nvlinks_than_nvml_has_is_refused(make_node: MakeNode) -> None:
    n = 5
    topology = NodeTopology(
        node_name="n",
        gpus=tuple(Gpu(index=i) for i in range(n)),
        links=tuple(Link(a, b, LinkType.NV, nvlinks=18) for a, b in combinations(range(n), 2)),
    )
    with pytest.raises(FakeTopologyError, match="mark the board as NVSwitch"):
        make_node(topology)


def test_cells_no_pcie_tree_can_give_are_listed() -> None:
    topology = load_topology(fixture_path(RTX4090), "n")
    plan = plan_pcie(topology)
    assert any(m.startswith("GPU0-GPU1: SYS stated, NODE") for m in plan.mismatches)
    assert not [m for m in plan.mismatches if "NIC" in m]


def test_dry_run_prints_the_labels_and_the_object_it_would_publish() -> None:
    result = CliRunner().invoke(
        main,
        ["probe", "--once", "--dry-run", "--fake", str(fixture_path(H100)), "--node", "gpu-7"],
    )
    assert result.exit_code == 0, result.output
    summary, obj = list(yaml.safe_load_all(result.stdout))
    assert summary["node"] == "gpu-7"
    assert summary["labels"][keys.LABEL_GPU_COUNT] == "8"
    assert summary["labels"][keys.LABEL_NVSWITCH] == "true"
    assert summary["gfdCompatibleLabels"][keys.GFD_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert obj["kind"] == "NodeGpuTopology"
    assert obj["metadata"]["name"] == "gpu-7"
    assert len(obj["spec"]["gpus"]) == 8
    assert len(obj["spec"]["links"]) == 28
    assert obj["status"]["healthyGpus"] == 8


def test_the_cli_refuses_incoherent_flags() -> None:
    runner = CliRunner()
    fixture = str(fixture_path(H100))
    assert (
        "--dry-run goes with --once"
        in runner.invoke(main, ["probe", "--dry-run", "--fake", fixture, "--node", "n"]).output
    )
    assert (
        "needs --fake"
        in runner.invoke(
            main, ["probe", "--once", "--dry-run", "--fake-faults", "f", "--node", "n"]
        ).output
    )
    assert (
        "expected comma-separated XID"
        in runner.invoke(
            main, ["probe", "--once", "--dry-run", "--fake", fixture, "--ignore-xids", "a,b"]
        ).output
    )
