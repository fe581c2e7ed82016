"""docs/api.md introduces every kind the generated CRDs define, as the CRDs define it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _crds() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]


def test_api_doc_has_a_section_per_crd_with_its_short_name_and_scope() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    sections = {
        m["kind"]: (m["short"], m["scope"])
        for m in re.finditer(
            r"^## (?P<kind>\w+) \(`(?P<short>\w+)`, (?P<scope>[\w-]+)\)", text, re.M
        )
    }
    expected = {}
    for crd in _crds():
        spec = crd["spec"]
        scope = "namespaced" if spec["scope"] == "Namespaced" else "cluster-scoped"
        expected[spec["names"]["kind"]] = (spec["names"]["shortNames"][0], scope)
    assert sections == expected


def test_api_doc_counts_the_kinds_the_gpusched_category_lists() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    in_category = [c for c in _crds() if "gpusched" in c["spec"]["names"].get("categories", [])]
    word = NUMBERS[len(in_category)]
    intro = " ".join(text.split("## ")[0].split())
    assert f"{word.capitalize()} kinds" in intro
    assert f"lists all {word} kinds" in intro
