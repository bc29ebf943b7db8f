"""The default-model helper fetches, verifies and caches the GGUF with no manual step."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

import reprolm
from reprolm import _download


DEFAULT = _download.MODELS[_download.DEFAULT_MODEL]


def test_fetches_into_empty_cache_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPROLM_CACHE", str(tmp_path))
    path = reprolm.default_model_path()
    assert path == tmp_path / _download.DEFAULT_MODEL_FILE
    assert path.stat().st_size == DEFAULT.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == DEFAULT.sha256
    assert [p.name for p in tmp_path.iterdir()] == [_download.DEFAULT_MODEL_FILE]  # no leftovers
    mtime = path.stat().st_mtime_ns
    assert reprolm.default_model_path() == path
    assert path.stat().st_mtime_ns == mtime


def test_checksum_mismatch_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPROLM_CACHE", str(tmp_path))
    monkeypatch.setitem(_download.MODELS, DEFAULT.name, dataclasses.replace(DEFAULT, sha256="0" * 64))
    with pytest.raises(reprolm.ModelDownloadError, match="checksum"):
        reprolm.default_model_path()
    assert not (tmp_path / _download.DEFAULT_MODEL_FILE).exists()


_FIRST_USE = "import reprolm; reprolm.Model.default(); print('loaded')"


def test_first_model_default_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    # The fetch inside the first Model.default() shows its progress.
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", _FIRST_USE], stdout=subprocess.PIPE, stderr=follower,
                               env={**os.environ, "REPROLM_CACHE": str(tmp_path)})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=600) == 0
    os.close(leader)
    shown = b"".join(chunks).decode()
    assert "fetching the default model" in shown
    assert "downloading [" in shown and "verifying [" in shown
    assert shown.count("100%") >= 2, shown[-500:]
    assert (tmp_path / _download.DEFAULT_MODEL_FILE).stat().st_size == DEFAULT.size


def test_first_model_default_is_silent_without_a_terminal(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "REPROLM_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert (out.stdout, out.stderr) == ("loaded\n", "")
    assert (tmp_path / _download.DEFAULT_MODEL_FILE).is_file()
