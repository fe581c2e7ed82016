"""Deployed components must not carry development scaffolding.

The operator, the extender and the probe run in production images; if one of them imported the
local control plane or the fake NVML, a missing Go toolchain or a fixture path would become a
production failure mode. The check reads the import statements, so it needs no imports itself.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src" / "gpusched"
PRODUCT_PACKAGES = [
    "api",
    "core",
    "operator",
    "scheduler",
    "device_probe",
    "node_agent",
    "kubeletapi",
]
PRODUCT_MODULES = ["kube.py", "kubeasync.py", "kubewatch.py", "metrics.py"]


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _product_files() -> list[Path]:
    files = [SRC / name for name in PRODUCT_MODULES if (SRC / name).exists()]
    for package in PRODUCT_PACKAGES:
        files.extend(sorted((SRC / package).rglob("*.py")))
    return files


def test_product_files_are_found() -> None:
    assert len(_product_files()) > 30


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_product_module_does_not_import_development_scaffolding(path: Path) -> None:
    imported = _imported_modules(path)
    offending = [name for name in imported if name.split(".")[:2] == ["gpusched", "dev"]]
    assert offending == [], f"{path.relative_to(SRC)} imports {offending}"
