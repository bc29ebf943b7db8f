"""Static types: mypy --strict on the package and on the examples of the README and
the docs, and stubtest on the extension module's stub. (The examples are run by
test_docs_examples.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _doc_blocks import blocks

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = Path(__file__).resolve().parent / "stubtest_allowlist.txt"


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def readme_examples() -> list[str]:
    return [block.code for block in blocks()]


def test_package_passes_mypy_strict() -> None:
    out = mypy("python/reprolm")
    assert out.returncode == 0, out.stdout + out.stderr


def test_readme_examples_pass_mypy_strict(tmp_path: Path) -> None:
    examples = readme_examples()
    assert len(examples) >= 3
    files = []
    for i, code in enumerate(examples):
        f = tmp_path / f"readme_example_{i}.py"
        f.write_text(code)
        files.append(str(f))
    out = mypy(*files)
    assert out.returncode == 0, out.stdout + out.stderr


def test_stubtest_passes_with_reasoned_allowlist() -> None:
    for line in ALLOWLIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            entry, _, reason = line.partition("#")
            assert entry.strip() and len(reason.strip()) > 20, f"allowlist entry without a reason: {line!r}"
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "reprolm", "--allowlist", str(ALLOWLIST)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
