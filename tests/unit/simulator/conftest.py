"""Shared fixtures: the published traces directory (tests needing it skip when it is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.simulator.adapters import traces_dir as find_traces


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    path = find_traces()
    if not (path / "philly-pollux").is_dir():
        pytest.skip(f"published traces not found at {path} (set GPUSCHED_TRACES)")
    return path
