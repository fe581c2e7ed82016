"""Every test under tests/unit is a pure unit test (no cluster, no network)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/unit/" in str(item.path):
            item.add_marker(pytest.mark.unit)
