"""The wheel installs into a fresh virtual environment and generates: one
abi3 wheel for CPython 3.9 and later, stripped, tagged manylinux2014 (glibc 2.17, so Ubuntu
20.04 and RHEL 8 too).

The test command (scripts/test.sh) builds that wheel into dist/ with maturin and zig and
installs it; this test takes it from there, or builds it the same way when run on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
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


def built_wheel(tmp_path: Path) -> Path:
    """The manylinux2014 wheel of scripts/test.sh, or a new one built the same way."""
    wheels = sorted((ROOT / "dist").glob(f"reprolm-{metadata.version('reprolm')}-*.whl"))
    if len(wheels) == 1:
        return wheels[0]
    dist = tmp_path / "dist"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    build = subprocess.run(
        [sys.executable, "-m", "maturin", "build", "--release", "--zig", "--compatibility", "manylinux2014",
         "--out", str(dist)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_wheel_in_fresh_venv(tmp_path: Path, model_path: Path, generations: list[dict[str, Any]]) -> None:
    wheel = built_wheel(tmp_path)
    assert "-cp39-abi3-" in wheel.name  # one wheel for CPython 3.9 and later
    assert "manylinux2014_x86_64" in wheel.name or "manylinux_2_17_x86_64" in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as z:
        (so,) = [i for i in z.infolist() if i.filename.endswith(".so")]
        # Stripped: the extension with debug info was 28.6 MB; without, about 6.
        assert so.file_size < 12 << 20, so.file_size
        # the chat page of `reprolm serve` ships inside the package
        assert "reprolm/server/webui/index.html" in z.namelist()

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
