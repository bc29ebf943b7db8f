"""The default-model helper fetches, verifies and caches the GGUF with no manual step."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import reprolm
from reprolm import _download


def test_fetches_into_empty_cache_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPROLM_CACHE", str(tmp_path))
    path = reprolm.default_model_path()
    assert path == tmp_path / _download.DEFAULT_MODEL_FILE
    assert path.stat().st_size == _download._GGUF_SIZE
    assert hashlib.sha256(path.read_bytes()).hexdigest() == _download._GGUF_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [_download.DEFAULT_MODEL_FILE]  # no leftovers
    mtime = path.stat().st_mtime_ns
    assert reprolm.default_model_path() == path
    assert path.stat().st_mtime_ns == mtime


def test_checksum_mismatch_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPROLM_CACHE", str(tmp_path))
    monkeypatch.setattr(_download, "_GGUF_SHA256", "0" * 64)
    with pytest.raises(reprolm.ModelDownloadError, match="checksum"):
        reprolm.default_model_path()
    assert not (tmp_path / _download.DEFAULT_MODEL_FILE).exists()
