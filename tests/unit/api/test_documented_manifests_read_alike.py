"""The documented manifests read the same in kubectl as in gpusched's own YAML loader.

gpusched (the simulator's --quotas / --what-if-quotas, the tests) reads YAML with PyYAML, which
takes an unquoted ``6214e9`` for a string; kubectl reads it through go-yaml, which takes it for
the number 6.214e12 and refuses the manifest ("cannot unmarshal number into ...
metadata.name"). A Philly virtual cluster named so once made the simulator's documented quota
files unusable with kubectl while every simulate run still worked. Each plain (unquoted) scalar
that PyYAML reads as a string must not be one go-yaml reads as a number or a boolean.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import yaml

from tests.cases.documented import documented_yaml

#: go-yaml v2's plain-scalar resolution (what sigs.k8s.io/yaml, hence kubectl, uses): floats
#: need no dot there, integers take base prefixes and underscores, and y / n are booleans.
_GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^[-+]?(0b[01_]+|0x[0-9a-fA-F_]+|0o?[0-7_]+|[0-9][0-9_]*)$")
_GO_SPECIAL = {"y", "Y", "n", "N", ".inf", ".Inf", ".INF", "-.inf", ".nan", ".NaN", ".NAN"}


def _plain_strings(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    if isinstance(node, yaml.ScalarNode):
        if node.style is None and node.tag == "tag:yaml.org,2002:str":
            yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _plain_strings(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _plain_strings(key)
            yield from _plain_strings(value)


TEXTS = list(documented_yaml())


def test_the_documented_manifests_are_found() -> None:
    where = {w.split(":")[0] for w, _ in TEXTS}
    assert "docs/examples/tenantquotas.yaml" in where
    assert "docs/benchmarks/simulator/philly-tree.yaml" in where
    assert "README.md" in where


@pytest.mark.parametrize(("where", "text"), TEXTS, ids=[w for w, _ in TEXTS])
def test_no_unquoted_string_is_a_number_or_boolean_to_kubectl(where: str, text: str) -> None:
    differ = [
        f"line {node.start_mark.line + 1}: {node.value}"
        for document in yaml.compose_all(text)
        if document is not None
        for node in _plain_strings(document)
        if _GO_FLOAT.match(node.value) or _GO_INT.match(node.value) or node.value in _GO_SPECIAL
    ]
    assert not differ, f"{where}: quote these, kubectl reads them as numbers: {differ}"
