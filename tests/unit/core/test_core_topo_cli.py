"""``gpusched topo show`` and ``gpusched topo place`` on matrices and NodeGpuTopology YAML."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner
from core_testdata import BRIDGED, H100, fixtures_dir, topology

from gpusched.api.nodegputopology import NodeGpuTopology
from gpusched.cli import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["topo", *args])
    return result.exit_code, result.output


def _fixture(name: str) -> str:
    return str(fixtures_dir() / f"{name}.txt")


def test_show_prints_islands_groups_and_best_sets() -> None:
    code, out = _run("show", _fixture(BRIDGED))
    assert code == 0, out
    assert "NVLink islands:    {0,2}  {1,3}  {4,5}  {6,7}" in out
    assert "NUMA nodes:        0: {0,1,2,3}  1: {4,5,6,7}" in out
    assert "k=2: GPUs 0,2  class nvlink" in out
    assert "k=4: GPUs 0,1,2,3  class node" in out
    assert "k=8:" in out


def test_show_json_lists_nics_and_best_sets() -> None:
    code, out = _run("show", _fixture(H100), "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["nvswitch"] is True
    assert data["nics"][0] == {"index": 0, "name": "mlx5_0", "numa_node": 0, "local_gpus": [0]}
    assert data["best_sets"]["8"]["topology_class"] == "nvlink"


def test_place_json_has_gpus_score_class_and_reasons() -> None:
    code, out = _run(
        "place",
        _fixture(BRIDGED),
        "--gpus",
        "2",
        "--busy",
        "0,3",
        "--scope",
        "nvlink",
        "--required",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["gpus"] == [4, 5]
    assert data["topology_class"] == "nvlink"
    assert isinstance(data["score"], float)
    assert data["reasons"]


def test_place_refusal_exits_nonzero_with_the_reason() -> None:
    code, out = _run("place", _fixture(BRIDGED), "--gpus", "4", "--scope", "nvlink", "--required")
    assert code == 1
    assert "cannot place: ScopeUnsatisfiable" in out
    code, out = _run(
        "place", _fixture(BRIDGED), "--gpus", "4", "--scope", "nvlink", "--required", "--json"
    )
    assert code == 1
    assert json.loads(out)["reason"] == "ScopeUnsatisfiable"


def test_place_health_flags_exclude_gpus() -> None:
    code, out = _run("place", _fixture(BRIDGED), "--gpus", "2", "--unhealthy", "0", "--json")
    assert code == 0, out
    assert json.loads(out)["gpus"] == [1, 3]


def test_place_reads_a_nodegputopology_yaml(tmp_path: Path) -> None:
    spec, status = topology(BRIDGED).to_api()
    obj = NodeGpuTopology(metadata={"name": "n1"}, spec=spec, status=status)
    path = tmp_path / "n1.yaml"
    path.write_text(yaml.safe_dump(obj.to_k8s()))
    code, out = _run("place", str(path), "--gpus", "2", "--json")
    assert code == 0, out
    assert json.loads(out)["gpus"] == [0, 2]


def test_unreadable_matrix_names_line_and_token(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV?\nGPU1\tNV?\t X \n")
    code, out = _run("show", str(path))
    assert code == 1
    assert "line 2, token 'NV?'" in out


def test_unknown_busy_index_is_a_usage_error() -> None:
    code, out = _run("place", _fixture(BRIDGED), "--gpus", "2", "--busy", "12")
    assert code == 2
    assert "no GPU 12" in out


def test_binary_and_non_utf8_files_are_refused_with_the_place(tmp_path: Path) -> None:
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    code, out = _run("show", str(binary))
    assert code == 1
    assert "binary file" in out
    latin = tmp_path / "matrix.txt"
    latin.write_bytes(b"\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \xe9\n")
    code, out = _run("show", str(latin))
    assert code == 1
    assert f"{latin}:3:" in out
    assert "not UTF-8" in out
    assert "Traceback" not in out


def _matrix_with(fixture: str, old: str, new: str, tmp_path: Path) -> str:
    text = (fixtures_dir() / f"{fixture}.txt").read_text()
    assert old in text
    path = tmp_path / "edited.txt"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_impossible_wiring_in_a_matrix_is_refused_naming_the_token(tmp_path: Path) -> None:
    absurd = _matrix_with(H100, " X      NV18", " X      NV999", tmp_path)
    code, out = _run("show", absurd)
    assert code == 1
    assert "NV999" in out
    assert "no GPU has more than" in out


def test_a_negative_numa_node_is_refused(tmp_path: Path) -> None:
    text = (fixtures_dir() / f"{BRIDGED}.txt").read_text().splitlines()
    row = next(i for i, line in enumerate(text) if line.startswith("GPU0"))
    cells = text[row].split("\t")
    numa = max(i for i, c in enumerate(cells) if c.strip() == "0")
    cells[numa] = "-7"
    text[row] = "\t".join(cells)
    path = tmp_path / "negative.txt"
    path.write_text("\n".join(text) + "\n")
    code, out = _run("show", str(path))
    assert code == 1
    assert "'-7'" in out


def test_duplicate_uuids_in_a_nodegputopology_are_refused(tmp_path: Path) -> None:
    spec = topology(H100).to_api()[0].to_k8s()
    for gpu in spec["gpus"]:
        gpu["uuid"] = f"GPU-{gpu['index']:08d}-0000-0000-0000-000000000000"
    spec["gpus"][1]["uuid"] = spec["gpus"][0]["uuid"]
    path = tmp_path / "dup.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpusched.io/v1alpha1",
                "kind": "NodeGpuTopology",
                "metadata": {"name": "n"},
                "spec": spec,
            }
        )
    )
    code, out = _run("show", str(path))
    assert code == 1
    assert "same UUID" in out
