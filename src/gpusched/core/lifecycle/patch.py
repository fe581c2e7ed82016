"""JSON merge patches (RFC 7386) between two versions of a status."""

from __future__ import annotations

from typing import Any


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch from ``old`` to ``new`` (None when equal); removed keys become null."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, Any] = {}
        for key, value in new.items():
            if key not in old:
                out[key] = value
            else:
                sub = merge_patch(old[key], value)
                if sub is not None:
                    out[key] = sub
        for key in old:
            if key not in new:
                out[key] = None
        return out or None
    return None if old == new else new
