"""Fixtures of the probe's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_testdata import MakeNode

from gpusched.core import NodeTopology
from gpusched.dev.fakenvml import FakeNode, fake_node
from gpusched.dev.localcluster.topologies import fixture_path


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[MakeNode]:
    """``make_node("hgx-h100-sxm-8gpu-8nic")`` (a fixture name, a path or a NodeTopology); the
    fake sysfs tree goes into the test's temporary directory."""
    made: list[FakeNode] = []

    def make(source: str | Path | NodeTopology, node: str = "node-a", **kwargs: object) -> FakeNode:
        if isinstance(source, str):
            source = fixture_path(source)
        root = tmp_path / f"sysfs-{len(made)}"
        root.mkdir()
        fake = fake_node(source, node, sysfs_root=root, **kwargs)  # type: ignore[arg-type]
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()
