"""The README stays an entry point: at most 300 lines, and every link in it resolves (a file of
the repository, and the heading an anchor names)."""

from __future__ import annotations

import re
from pathlib import Path

from _doc_blocks import ROOT

README = (ROOT / "README.md").read_text()
# [text](target): the targets of inline links, outside code blocks and code spans.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading of plain words."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = CODE.sub("", page.read_text())
    return {slug(m) for m in re.findall(r"^#{1,6} (.*?)\s*$", text, re.MULTILINE)}


def links() -> list[str]:
    return LINK.findall(CODE.sub("", README))


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 300


def test_every_link_resolves() -> None:
    found = links()
    assert len(found) >= 10  # the links into the docs
    for target in found:
        assert not re.match(r"[a-z]+:", target), f"the README links outside the repository: {target}"
        path, _, anchor = target.partition("#")
        page = (ROOT / path).resolve() if path else ROOT / "README.md"
        assert page.is_file() and ROOT in page.parents, f"README links to a missing file: {target}"
        if anchor:
            assert anchor in anchors(page), f"README links to a missing heading: {target}"


def test_the_slugs_are_those_of_the_docs() -> None:
    assert slug("precision=\"int8\"") == "precisionint8"
    assert slug("Gemma 3 270M (Q4_K_M)") == "gemma-3-270m-q4_k_m"
    assert "precisionint8" in anchors(ROOT / "docs" / "precision.md")
