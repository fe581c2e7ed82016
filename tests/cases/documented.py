"""The YAML the documentation gives users to apply: every file under docs/ and every Markdown
code block of README.md and docs/*.md that holds a gpusched.io object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documented_yaml() -> Iterator[tuple[str, str]]:
    """(where, text): a file's path, or a Markdown file's path and the block's first line."""
    for path in sorted((ROOT / "docs").rglob("*.yaml")):
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        block: list[str] | None = None
        start = 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                if block is None:
                    block, start = [], number
                else:
                    text = "\n".join(block)
                    if "apiVersion: gpusched.io/" in text:
                        yield f"{path.relative_to(ROOT)}:{start}", text
                    block = None
            elif block is not None:
                block.append(line)
