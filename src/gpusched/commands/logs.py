"""One log format for every long-running component, so their lines read alike side by side."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str | int) -> None:
    """Log to stderr at ``level`` (a name such as ``info`` or a ``logging`` constant)."""
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=FORMAT)
