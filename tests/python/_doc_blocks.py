"""The Python code blocks of the README and of the documentation pages in docs/, in a fixed
order, each with the page it is on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: str
    """The page's path from the repository's root, such as ``docs/server.md``."""
    code: str


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks() -> list[Block]:
    return [Block(str(page.relative_to(ROOT)), code)
            for page in pages() for code in PYTHON_BLOCK.findall(page.read_text())]
