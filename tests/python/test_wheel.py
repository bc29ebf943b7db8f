"""The abi3 wheel installs into a fresh virtual environment and generates (issue 6, item 7).

`maturin build --release` reuses cargo's target/ directory, which `pip install .` has already
filled, so the build is a re-package unless the Rust code changed since.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import reprolm
assert reprolm.__file__.startswith(sys.prefix), reprolm.__file__
model = reprolm.Model.load(sys.argv[1], threads=1)
out = model.generate(sys.argv[2], max_tokens=6)
text = "".join(c.text for c in model.stream(sys.argv[2], max_tokens=6))
print(json.dumps({"ids": out.token_ids, "text": out.text, "streamed": text}))
"""


def test_wheel_in_fresh_venv(tmp_path: Path, model_path: Path, generations: list[dict[str, Any]]) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "maturin", "build", "--release", "--out", str(dist)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    assert "-cp39-abi3-" in wheel.name  # one wheel for CPython 3.9 and later

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    # numpy, the one dependency, at the version already here (from pip's cache when possible).
    subprocess.run([*pip, f"numpy=={metadata.version('numpy')}"], check=True, capture_output=True, timeout=600)

    g = generations[0]
    run = subprocess.run([str(python), "-I", "-c", SCRIPT, str(model_path), g["prompt"]],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["ids"] == g["greedy_ids"][:6]
    assert got["text"] == got["streamed"] == " Paris.\n\nThe answer"
