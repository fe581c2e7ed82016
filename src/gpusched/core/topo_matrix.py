"""Parser for the matrix ``nvidia-smi topo -m`` prints, into a :class:`NodeTopology`.

Real matrices are pasted from terminals and issue threads, so the parser reads what humans and
tools actually produce: tab- or space-separated cells with irregular padding, NIC rows and columns
(``NIC0`` with a ``NIC Legend`` naming them, or ``mlx5_0`` directly), ``CPU Affinity`` /
``NUMA Affinity`` / ``GPU NUMA ID`` columns, ``N/A`` cells, the legend, leading ``#`` comments and
a stray shell prompt line. It takes text, never a path, so it stays free of I/O. Text it cannot
read raises :class:`TopologyParseError` naming the line and the token, because the person fixing a
paste needs to know exactly where it went wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from gpusched.api.annotations import whole_number
from gpusched.api.nodegputopology import LinkType
from gpusched.core.bandwidth import find_model_in_text
from gpusched.core.topology import MAX_NVLINKS_PER_PAIR, Gpu, Link, Nic, NicLink, NodeTopology

_GPU_NAME: Final = re.compile(r"GPU(\d+)")
_NIC_NAME: Final = re.compile(r"NIC(\d+)")
_DEVICE_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")
_NV_CODE: Final = re.compile(r"NV(\d+)")
_NIC_LEGEND_ENTRY: Final = re.compile(r"\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_CPU_LIST: Final = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")

#: Multi-word column labels after the device columns, as ``nvidia-smi`` prints them.
_AFFINITY_LABELS: Final[tuple[tuple[str, ...], ...]] = (
    ("CPU", "Affinity"),
    ("NUMA", "Affinity"),
    ("GPU", "NUMA", "ID"),
)

#: PCIe codes, plus ``SOC``: what drivers before NODE existed printed for today's SYS.
_PCIE_CODES: Final[dict[str, LinkType]] = {
    "PIX": LinkType.PIX,
    "PXB": LinkType.PXB,
    "PHB": LinkType.PHB,
    "NODE": LinkType.NODE,
    "SYS": LinkType.SYS,
    "SOC": LinkType.SYS,
}
_UNKNOWN_CELL: Final = "N/A"
_SELF_CELL: Final = "X"

#: Fewer GPUs than this with all pairs ``NV<same count>`` may be a bridged box, not a switch.
_MIN_NVSWITCH_GPUS: Final = 4
#: Most NVLinks one GPU has: 18 on H100, H200 and B200 (12 on A100, 6 on V100). A GPU can
#: reach its peers directly over at most this many links in all.
_MAX_NVLINKS_PER_GPU: Final = 18


class TopologyParseError(ValueError):
    """A ``topo -m`` matrix could not be read; names the 1-based line and the offending token."""

    def __init__(self, message: str, line: int | None = None, token: str | None = None) -> None:
        where = []
        if line is not None:
            where.append(f"line {line}")
        if token is not None:
            where.append(f"token {token!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.line = line
        self.token = token
        self.reason = message


@dataclass(frozen=True, slots=True)
class _Cell:
    type: LinkType | None  # None: N/A
    nvlinks: int


@dataclass(slots=True)
class _Row:
    line: int
    cells: list[str]
    affinity: list[str]


def _parse_cell(token: str, line: int) -> _Cell:
    nv = _NV_CODE.fullmatch(token)
    if nv is not None:
        count = int(nv.group(1))
        if count <= 0:
            raise TopologyParseError("an NVLink bond needs at least one link", line, token)
        if count > MAX_NVLINKS_PER_PAIR:
            raise TopologyParseError(
                f"no GPU has more than {MAX_NVLINKS_PER_PAIR} NVLinks", line, token
            )
        return _Cell(LinkType.NV, count)
    if token in _PCIE_CODES:
        return _Cell(_PCIE_CODES[token], 0)
    if token == _UNKNOWN_CELL:
        return _Cell(None, 0)
    raise TopologyParseError(
        "unknown link code (expected X, NV<n>, PIX, PXB, PHB, NODE, SYS or N/A)", line, token
    )


def _split_header(tokens: list[str], line: int) -> tuple[list[str], list[str]]:
    """Device column names, then affinity column labels (joined with single spaces)."""
    devices: list[str] = []
    labels: list[str] = []
    i = 0
    while i < len(tokens):
        label = next(
            (lab for lab in _AFFINITY_LABELS if tuple(tokens[i : i + len(lab)]) == lab), None
        )
        if label is not None:
            labels.append(" ".join(label))
            i += len(label)
            continue
        token = tokens[i]
        if labels:
            raise TopologyParseError(
                "unexpected header column after the affinity columns", line, token
            )
        if _DEVICE_NAME.fullmatch(token) is None:
            raise TopologyParseError("not a device name in the header row", line, token)
        if token in devices:
            raise TopologyParseError("device appears twice in the header row", line, token)
        devices.append(token)
        i += 1
    return devices, labels


def _is_preamble(stripped: str) -> bool:
    """Lines before the header row to skip: blank, ``#`` comments, a bare ``$`` prompt, a
    prompt of any shape that ran the command (``user@host:~$ nvidia-smi topo -m``,
    ``[root@node ~]# nvidia-smi topo -m``), and titles ending in a colon."""
    return (
        not stripped
        or stripped.startswith("#")
        or stripped.startswith("$")
        or "nvidia-smi" in stripped
        or (stripped.endswith(":") and _GPU_NAME.search(stripped) is None)
    )


_NUMA_RANGE = re.compile(r"\d+(?:[-,]\d+)+")


def _numa_value(token: str | None, line: int) -> int | None:
    if token is None or token == _UNKNOWN_CELL or _NUMA_RANGE.fullmatch(token):
        return None  # N/A, or a range of nodes: no single NUMA node to attach to
    number = whole_number(token)
    if number is None:
        raise TopologyParseError(
            "NUMA affinity is a node number (0, 1, ...), a range or N/A", line, token
        )
    return number


def parse_topo_matrix(
    text: str,
    *,
    node_name: str = "node",
    gpu_model: str | None = None,
    compute_capability: str | None = None,
    model_from_comments: bool = True,
    source: str = "topo-matrix",
) -> NodeTopology:
    """Read ``nvidia-smi topo -m`` output into a node topology.

    The matrix does not say which GPU model it describes; pass ``gpu_model`` (or the compute
    capability). Without one, and with ``model_from_comments``, a GPU family named in the leading
    ``#`` comment lines (``# machine: 8x NVIDIA H100 ...``, as our fixture files carry) is used;
    otherwise the model stays unknown and the bandwidth model uses its documented default.
    """
    lines = text.splitlines()
    comments: list[str] = []
    header_at = None
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if _is_preamble(stripped):
            if stripped.startswith("#"):
                comments.append(stripped)
            continue
        header_at = number
        break
    if header_at is None:
        raise TopologyParseError("no header row (GPU0 GPU1 ...) found")
    header_tokens = lines[header_at - 1].split()
    if not any(_GPU_NAME.fullmatch(token) for token in header_tokens):
        raise TopologyParseError(
            "expected the header row (GPU0 GPU1 ...)", header_at, header_tokens[0]
        )
    devices, labels = _split_header(header_tokens, header_at)
    gpu_columns = [name for name in devices if _GPU_NAME.fullmatch(name)]

    rows: dict[str, _Row] = {}
    nic_legend: dict[str, str] = {}
    in_matrix = True
    for number in range(header_at + 1, len(lines) + 1):
        raw = lines[number - 1]
        tokens = raw.split()
        if in_matrix:
            if not tokens:
                if rows:
                    in_matrix = False
                continue
            if tokens[0] in ("Legend:", "NIC") or raw.strip() == "NIC Legend:":
                in_matrix = False
            elif tokens[0] not in devices:
                raise TopologyParseError(
                    "row does not start with a device named in the header", number, tokens[0]
                )
            else:
                name = tokens[0]
                if name in rows:
                    raise TopologyParseError("row appears twice", number, name)
                cells = tokens[1 : 1 + len(devices)]
                if len(cells) < len(devices):
                    missing = devices[len(cells)]
                    raise TopologyParseError(
                        f"row {name} has no cell for column {missing}", number, tokens[-1]
                    )
                affinity = tokens[1 + len(devices) :]
                if len(affinity) > len(labels):
                    raise TopologyParseError(
                        f"row {name} has more cells than the header has columns",
                        number,
                        affinity[len(labels)],
                    )
                rows[name] = _Row(number, cells, affinity)
                continue
        entry = _NIC_LEGEND_ENTRY.match(raw)
        if entry is not None:
            nic_legend[entry.group(1)] = entry.group(2)

    for name in gpu_columns:
        if name not in rows:
            raise TopologyParseError(f"no row for {name}", header_at, name)

    # Read every cell once, checking the diagonal and symmetry as we go.
    parsed: dict[tuple[str, str], _Cell] = {}
    for name, row in rows.items():
        for column, token in zip(devices, row.cells, strict=True):
            if column == name:
                if token != _SELF_CELL:
                    raise TopologyParseError(
                        f"the diagonal cell of {name} must be X", row.line, token
                    )
                continue
            if token == _SELF_CELL:
                raise TopologyParseError(
                    f"X off the diagonal (row {name}, column {column})", row.line, token
                )
            cell = _parse_cell(token, row.line)
            mirror = parsed.get((column, name))
            if mirror is not None and mirror != cell:
                raise TopologyParseError(
                    f"{name}-{column} disagrees with {column}-{name} "
                    f"({_code(mirror)} on line {rows[column].line})",
                    row.line,
                    token,
                )
            parsed[(name, column)] = cell

    def lookup(a: str, b: str) -> _Cell | None:
        return parsed.get((a, b)) or parsed.get((b, a))

    gpu_index = {name: int(m.group(1)) for name in gpu_columns if (m := _GPU_NAME.fullmatch(name))}
    if len(set(gpu_index.values())) != len(gpu_index):
        raise TopologyParseError("two GPU columns share an index", header_at)
    gpu_names = sorted(gpu_columns, key=lambda n: gpu_index[n])
    nic_columns = [name for name in devices if name not in gpu_index]

    if gpu_model is None and model_from_comments:
        gpu_model = find_model_in_text("\n".join(comments))

    links: list[Link] = []
    for i, a in enumerate(gpu_names):
        for b in gpu_names[i + 1 :]:
            c = lookup(a, b)
            if c is None or c.type is None:
                continue  # N/A: not reported; scored as SYS
            links.append(Link(gpu_index[a], gpu_index[b], c.type, c.nvlinks))

    nvswitch = _looks_like_nvswitch(links, len(gpu_names))
    gpus: list[Gpu] = []
    for name in gpu_names:
        row = rows[name]
        values = dict(zip(labels, row.affinity, strict=False))
        cpu = values.get("CPU Affinity")
        if cpu is not None and cpu != _UNKNOWN_CELL and _CPU_LIST.fullmatch(cpu) is None:
            raise TopologyParseError("CPU affinity is not a CPU list", row.line, cpu)
        idx = gpu_index[name]
        own = [lk for lk in links if idx in (lk.a, lk.b) and lk.type is LinkType.NV]
        nvlinks = (
            max((lk.nvlinks for lk in own), default=0)
            if nvswitch
            else sum(lk.nvlinks for lk in own)
        )
        gpus.append(
            Gpu(
                index=idx,
                model=gpu_model,
                numa_node=_numa_value(values.get("NUMA Affinity"), row.line),
                cpu_affinity=None if cpu in (None, _UNKNOWN_CELL) else cpu,
                compute_capability=compute_capability,
                nvlink_count=min(nvlinks, 36),
                nvswitch_links=min(nvlinks, 36) if nvswitch else 0,
            )
        )

    nics: list[Nic] = []
    nic_links: list[NicLink] = []
    numa_of = {gpu.index: gpu.numa_node for gpu in gpus}
    for position, column in enumerate(nic_columns):
        numbered = _NIC_NAME.fullmatch(column)
        nic_index = int(numbered.group(1)) if numbered else position
        near_numa: set[int] = set()
        for gname in gpu_names:
            c = lookup(gname, column)
            if c is None or c.type is None:
                continue
            if c.type is LinkType.NV:
                raise TopologyParseError(
                    f"a NIC cannot be NVLinked ({gname}-{column})",
                    rows[gname].line if gname in rows else header_at,
                    _code(c),
                )
            nic_links.append(NicLink(nic_index, gpu_index[gname], c.type))
            gpu_numa = numa_of[gpu_index[gname]]
            if c.type is not LinkType.SYS and gpu_numa is not None:
                near_numa.add(gpu_numa)
        nics.append(
            Nic(
                index=nic_index,
                name=nic_legend.get(column, column),
                numa_node=near_numa.pop() if len(near_numa) == 1 else None,
            )
        )
    if len({nic.index for nic in nics}) != len(nics):
        raise TopologyParseError("two NIC columns share an index", header_at)

    return NodeTopology(
        node_name=node_name,
        gpus=tuple(gpus),
        links=tuple(links),
        nics=tuple(sorted(nics, key=lambda n: n.index)),
        nic_links=tuple(nic_links),
        nvswitch=nvswitch,
        source=source,
    )


def _code(cell: _Cell) -> str:
    if cell.type is None:
        return _UNKNOWN_CELL
    return f"NV{cell.nvlinks}" if cell.type is LinkType.NV else cell.type.value


def _looks_like_nvswitch(links: list[Link], n_gpus: int) -> bool:
    """All pairs ``NV<k>`` on four or more GPUs, with more links in all than a GPU has.

    Bridges join pairs and meshes such as DGX-1's give different counts to different peers, so a
    uniform all-to-all count is needed. It is not enough: 4-GPU boards wire every pair directly
    (DGX Station A100 prints NV4, HGX H100 4-GPU NV6), spending 3 x k of each GPU's links. Behind
    a switch, every pair instead shows the GPU's whole link count (NV12 on A100, NV18 on H100),
    so k x (n - 1) is more than any GPU has: that is what only a switch can print.
    """
    if n_gpus < _MIN_NVSWITCH_GPUS or len(links) != n_gpus * (n_gpus - 1) // 2:
        return False
    counts = {lk.nvlinks for lk in links if lk.type is LinkType.NV}
    if not all(lk.type is LinkType.NV for lk in links) or len(counts) != 1:
        return False
    return counts.pop() * (n_gpus - 1) > _MAX_NVLINKS_PER_GPU


def format_topo_matrix(topology: NodeTopology) -> str:
    """Render a topology as a ``topo -m`` style matrix (GPU and NIC rows, affinity columns).

    Used by ``gpusched topo show`` and by tests that round-trip the parser.
    """
    gpu_names = [f"GPU{g.index}" for g in topology.gpus]
    nic_names = [f"NIC{n.index}" for n in topology.nics]
    header = ["", *gpu_names, *nic_names, "CPU Affinity", "NUMA Affinity"]
    out = ["\t".join(header)]
    nic_type = {(nl.nic, nl.gpu): nl.type for nl in topology.nic_links}
    for gpu in topology.gpus:
        cells = [f"GPU{gpu.index}"]
        for other in topology.gpus:
            if other.index == gpu.index:
                cells.append(" X ")
                continue
            link = topology.link(gpu.index, other.index)
            cells.append(_UNKNOWN_CELL if link is None else link.code)
        for nic in topology.nics:
            t = nic_type.get((nic.index, gpu.index))
            cells.append(_UNKNOWN_CELL if t is None else t.value)
        cells.append(gpu.cpu_affinity or _UNKNOWN_CELL)
        cells.append(_UNKNOWN_CELL if gpu.numa_node is None else str(gpu.numa_node))
        out.append("\t".join(cells))
    for nic in topology.nics:
        cells = [f"NIC{nic.index}"]
        for gpu in topology.gpus:
            t = nic_type.get((nic.index, gpu.index))
            cells.append(_UNKNOWN_CELL if t is None else t.value)
        for peer in topology.nics:
            cells.append(" X " if peer.index == nic.index else _UNKNOWN_CELL)
        out.append("\t".join(cells))
    if topology.nics:
        out += ["", "NIC Legend:", ""]
        out += [f"  NIC{nic.index}: {nic.name}" for nic in topology.nics]
    return "\n".join(out) + "\n"
