"""The ``nvidia-smi topo -m`` parser on the real fixtures, synthetic meshes and broken pastes."""

from __future__ import annotations

import re

import pytest
from core_testdata import (
    A100,
    BRIDGED,
    DGX1,
    H100,
    REAL_FIXTURES,
    RTX4090,
    TREES,
    WORKSTATION,
    fixture_text,
    topology,
)

from gpusched.api.nodegputopology import LinkType
from gpusched.core import TopologyParseError, format_topo_matrix, parse_topo_matrix
from gpusched.core.bandwidth import generation_for


def _code(name: str, a: int, b: int) -> str:
    link = topology(name).link(a, b)
    assert link is not None
    return link.code


@pytest.mark.parametrize(
    ("name", "gpus", "nics"),
    [
        (H100, 8, 8),
        (A100, 8, 8),
        (BRIDGED, 8, 0),
        (TREES, 8, 0),
        (RTX4090, 8, 2),
        (WORKSTATION, 4, 2),
        (DGX1, 8, 0),
    ],
)
def test_every_fixture_parses_with_all_gpus_nics_and_pairs(name: str, gpus: int, nics: int) -> None:
    topo = topology(name)
    assert topo.gpu_indices == tuple(range(gpus))
    assert len(topo.nics) == nics
    assert len(topo.links) == gpus * (gpus - 1) // 2
    assert len(topo.nic_links) == gpus * nics


def test_h100_irregular_spacing_nic_legend_and_numa_columns() -> None:
    topo = topology(H100)
    assert {lk.code for lk in topo.links} == {"NV18"}
    assert topo.nvswitch
    assert [nic.name for nic in topo.nics] == [f"mlx5_{i}" for i in range(8)]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpu(0).cpu_affinity == "0-47,96-143"
    assert topo.nic_link(3, 2) is LinkType.PIX  # NIC3/NIC4 columns are the misaligned ones
    assert topo.nic_link(4, 4) is LinkType.PIX
    assert topo.nic_link(4, 3) is LinkType.SYS
    assert topo.gpu(0).nvswitch_links == 18
    assert generation_for(topo.gpu(0).model).name == "hopper"


def test_a100_switch_board_and_pxb_nics() -> None:
    topo = topology(A100)
    assert {lk.code for lk in topo.links} == {"NV12"}
    assert topo.nvswitch
    assert topo.nic_link(0, 1) is LinkType.PXB
    assert topo.nics[4].numa_node == 1


def test_bridged_pairs_tab_separated_with_empty_cells() -> None:
    topo = topology(BRIDGED)
    nv_pairs = {(lk.a, lk.b) for lk in topo.links if lk.type is LinkType.NV}
    assert nv_pairs == {(0, 2), (1, 3), (4, 5), (6, 7)}
    assert _code(BRIDGED, 0, 1) == "SYS"
    assert not topo.nvswitch
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpu(0).model is None  # the fixture does not name it
    assert topo.gpu(0).nvlink_count == 12


def test_header_without_leading_whitespace_and_na_numa() -> None:
    topo = topology(TREES)
    assert _code(TREES, 0, 1) == "PIX"
    assert _code(TREES, 0, 2) == "PXB"
    assert _code(TREES, 3, 4) == "SYS"
    assert all(g.numa_node is None for g in topo.gpus)
    assert topo.gpu(5).cpu_affinity == "0-95"


def test_nic_columns_without_legend_keep_their_column_names() -> None:
    topo = topology(RTX4090)
    assert [nic.name for nic in topo.nics] == ["NIC0", "NIC1"]
    assert topo.nic_link(0, 6) is LinkType.PHB
    assert topo.nics[0].numa_node == 1  # inferred from GPU6, the only non-SYS neighbour


def test_shell_prompt_line_and_named_nic_columns() -> None:
    topo = topology(WORKSTATION)
    assert [nic.name for nic in topo.nics] == ["mlx5_0", "mlx5_1"]
    assert _code(WORKSTATION, 0, 1) == "NV12"
    assert _code(WORKSTATION, 2, 3) == "NODE"
    assert topo.nic_link(0, 0) is LinkType.NODE
    assert topo.nics[0].numa_node == 0


def test_a_paste_that_starts_with_any_shell_prompt_and_the_command_parses() -> None:
    bare = _all_pairs(2, "NV12")
    expected = parse_topo_matrix(bare).wiring_hash
    for prompt in (
        "user@host:~$ nvidia-smi topo -m",
        "[root@gpu-node-3 ~]# nvidia-smi topo -m",
        "PS C:\\> nvidia-smi topo -m",
    ):
        assert parse_topo_matrix(f"{prompt}\n{bare}").wiring_hash == expected, prompt


def test_hybrid_cube_mesh_with_different_nvlink_counts_per_peer() -> None:
    topo = topology(DGX1)
    assert _code(DGX1, 0, 1) == "NV1"
    assert _code(DGX1, 0, 3) == "NV2"
    assert _code(DGX1, 0, 5) == "SYS"
    assert not topo.nvswitch
    assert [g.nvlink_count for g in topo.gpus] == [6] * 8
    assert generation_for(topo.gpu(0).model).name == "volta"


def _all_pairs(n: int, code: str) -> str:
    """A matrix of ``n`` GPUs with every pair linked as ``code``."""
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n))
    rows = [f"GPU{i}\t" + "\t".join(" X " if i == j else code for j in range(n)) for i in range(n)]
    return "\n".join([header, *rows]) + "\n"


@pytest.mark.parametrize(
    ("code", "links_per_gpu"),
    [("NV4", 12), ("NV6", 18)],
    ids=["dgx-station-a100", "hgx-h100-4gpu"],
)
def test_four_gpus_wired_directly_to_each_other_are_not_a_switch_board(
    code: str, links_per_gpu: int
) -> None:
    topo = parse_topo_matrix(_all_pairs(4, code))
    assert not topo.nvswitch
    assert [g.nvlink_count for g in topo.gpus] == [links_per_gpu] * 4
    assert [g.nvswitch_links for g in topo.gpus] == [0] * 4


@pytest.mark.parametrize(("n", "code"), [(4, "NV12"), (4, "NV18"), (8, "NV6"), (16, "NV6")])
def test_all_pairs_with_more_links_than_a_gpu_has_are_a_switch_board(n: int, code: str) -> None:
    topo = parse_topo_matrix(_all_pairs(n, code))
    assert topo.nvswitch
    assert {g.nvswitch_links for g in topo.gpus} == {int(code[2:])}


def test_any_nvlink_count_and_legacy_soc_code() -> None:
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV7\tSOC\nGPU1\tNV7\t X \tSOC\nGPU2\tSOC\tSOC\t X \n"
    topo = parse_topo_matrix(text)
    link = topo.link(0, 1)
    assert link is not None
    assert (link.type, link.nvlinks) == (LinkType.NV, 7)
    assert topo.link(0, 2) == topo.link(1, 2).__class__(0, 2, LinkType.SYS)


def test_crlf_blank_lines_and_title_line_are_accepted() -> None:
    text = "\r\n\r\nGPU Topology:\r\n" + fixture_text(BRIDGED).replace("\n", "\r\n")
    assert parse_topo_matrix(text).wiring_hash == topology(BRIDGED).wiring_hash


def test_spaces_instead_of_tabs_parse_to_the_same_wiring() -> None:
    spaced = fixture_text(WORKSTATION).replace("\t", "   ")
    assert parse_topo_matrix(spaced).wiring_hash == topology(WORKSTATION).wiring_hash


def test_explicit_model_overrides_the_comment() -> None:
    topo = parse_topo_matrix(fixture_text(H100), gpu_model="NVIDIA A100-SXM4-80GB")
    assert generation_for(topo.gpu(0).model).name == "ampere"
    bare = parse_topo_matrix(fixture_text(H100), model_from_comments=False)
    assert bare.gpu(0).model is None


@pytest.mark.parametrize("name", REAL_FIXTURES)
def test_formatted_matrix_parses_back_to_the_same_wiring(name: str) -> None:
    topo = topology(name)
    again = parse_topo_matrix(format_topo_matrix(topo), gpu_model=topo.gpu(0).model)
    assert again.wiring_hash == topo.wiring_hash


def _error(text: str) -> TopologyParseError:
    with pytest.raises(TopologyParseError) as info:
        parse_topo_matrix(text)
    return info.value


def test_unknown_link_code_names_line_and_token() -> None:
    text = "# comment\n\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n"
    err = _error(text)
    assert (err.line, err.token) == (3, "NVX")
    assert re.match(r"line 3, token 'NVX': unknown link code", str(err))


def test_missing_cell_is_reported_on_its_row() -> None:
    err = _error("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tSYS\nGPU1\tPIX\t X\nGPU2\tSYS\tSYS\t X\n")
    assert err.line == 3
    assert "no cell for column GPU2" in str(err)


def test_asymmetric_matrix_is_refused() -> None:
    err = _error("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPXB\t X \n")
    assert (err.line, err.token) == (3, "PXB")
    assert "disagrees" in str(err)


def test_diagonal_must_be_self() -> None:
    err = _error("\tGPU0\tGPU1\nGPU0\tPIX\tPIX\nGPU1\tPIX\t X \n")
    assert (err.line, err.token) == (2, "PIX")


def test_row_for_a_device_not_in_the_header() -> None:
    err = _error("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU7\tPIX\t X \n")
    assert (err.line, err.token) == (3, "GPU7")


def test_missing_gpu_row_is_reported() -> None:
    err = _error("\tGPU0\tGPU1\nGPU0\t X \tPIX\n")
    assert err.token == "GPU1"


def test_extra_cells_and_bad_cpu_list_are_reported() -> None:
    extra = _error("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tPIX\t0\t7\nGPU1\tPIX\t X \t0\n")
    assert (extra.line, extra.token) == (2, "7")
    cpu = _error("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\tall\nGPU1\tPIX\t X \t0-3\n")
    assert (cpu.line, cpu.token) == (2, "all")


def test_text_without_a_matrix_is_refused() -> None:
    assert "no header row" in str(_error("# only comments\n\n"))
    err = _error("Failed to initialize NVML: Driver/library version mismatch\n")
    assert (err.line, err.token) == (1, "Failed")
    assert "expected the header row" in str(err)
