"""GGUF reading: dequantization bit-exact against the `gguf` package, and bad files raising
typed errors instead of crashing or hanging."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import reprolm

TYPES = {
    gguf.GGMLQuantizationType.F32: (1, 4),
    gguf.GGMLQuantizationType.F16: (1, 2),
    gguf.GGMLQuantizationType.BF16: (1, 2),
    gguf.GGMLQuantizationType.Q8_0: (32, 34),
    gguf.GGMLQuantizationType.Q4_0: (32, 18),
    gguf.GGMLQuantizationType.Q4_1: (32, 20),
    gguf.GGMLQuantizationType.Q5_0: (32, 22),
    gguf.GGMLQuantizationType.Q5_1: (32, 24),
    gguf.GGMLQuantizationType.Q2_K: (256, 84),
    gguf.GGMLQuantizationType.Q3_K: (256, 110),
    gguf.GGMLQuantizationType.Q4_K: (256, 144),
    gguf.GGMLQuantizationType.Q5_K: (256, 176),
    gguf.GGMLQuantizationType.Q6_K: (256, 210),
}

# Byte offsets of each block's f16 scales and mins (for blocks with finite ones).
F16_FIELDS = {
    gguf.GGMLQuantizationType.Q8_0: [0],
    gguf.GGMLQuantizationType.Q4_0: [0],
    gguf.GGMLQuantizationType.Q4_1: [0, 2],
    gguf.GGMLQuantizationType.Q5_0: [0],
    gguf.GGMLQuantizationType.Q5_1: [0, 2],
    gguf.GGMLQuantizationType.Q2_K: [80, 82],
    gguf.GGMLQuantizationType.Q3_K: [108],
    gguf.GGMLQuantizationType.Q4_K: [0, 2],
    gguf.GGMLQuantizationType.Q5_K: [0, 2],
    gguf.GGMLQuantizationType.Q6_K: [208],
}


def assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    theirs = np.asarray(theirs, dtype=np.float32).reshape(-1)
    assert ours.shape == theirs.shape
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))


def test_dequantize_real_tensors_bit_exact(model_path: Path) -> None:
    reader = gguf.GGUFReader(model_path)
    seen = set()
    for t in reader.tensors:
        if t.tensor_type in seen and not t.name.startswith("blk.0."):
            continue
        seen.add(t.tensor_type)
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        ours = reprolm.dequantize(int(t.tensor_type), raw.tobytes())
        theirs = gguf.quants.dequantize(np.ascontiguousarray(t.data).view(np.uint8), t.tensor_type)
        assert_same_bits(ours, theirs)
    assert {gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.F32} <= seen


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # random scales include inf and NaN
@pytest.mark.parametrize("qtype", list(TYPES))
def test_dequantize_random_blocks_bit_exact(qtype: gguf.GGMLQuantizationType) -> None:
    rng = np.random.default_rng(int(qtype))
    _, block_bytes = TYPES[qtype]
    raw = rng.integers(0, 256, size=(257, block_bytes * 4), dtype=np.uint8)
    ours = reprolm.dequantize(int(qtype), raw.tobytes())
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        dtype = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16}
        theirs = (
            raw.view(dtype[qtype]).astype(np.float32)
            if qtype in dtype
            else gguf.quants.dequantize(raw, qtype)
        )
    else:
        theirs = gguf.quants.dequantize(raw, qtype)
    assert_same_bits(ours, theirs)


@pytest.mark.parametrize("qtype", list(F16_FIELDS))
def test_dequantize_random_blocks_with_finite_scales_bit_exact(qtype: gguf.GGMLQuantizationType) -> None:
    # Every value a number: NaN positions cannot hide a difference.
    rng = np.random.default_rng(1000 + int(qtype))
    _, block_bytes = TYPES[qtype]
    raw = rng.integers(0, 256, size=(3001, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        raw[:, at : at + 2] = rng.standard_normal(len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    ours = reprolm.dequantize(int(qtype), raw.tobytes())
    theirs = gguf.quants.dequantize(raw, qtype)
    assert not np.isnan(ours).any()
    assert_same_bits(ours, theirs)


def test_dequantize_rejects_partial_blocks_and_unknown_types() -> None:
    with pytest.raises(reprolm.InvalidArgumentError):
        reprolm.dequantize(int(gguf.GGMLQuantizationType.Q4_1), bytes(21))
    with pytest.raises(reprolm.InvalidArgumentError):
        reprolm.dequantize(int(gguf.GGMLQuantizationType.Q4_K), bytes(143))
    with pytest.raises(reprolm.UnknownTensorTypeError):
        reprolm.dequantize(int(gguf.GGMLQuantizationType.IQ4_NL), bytes(18))


# --- bad files -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_bytes(model_path: Path) -> bytes:
    return model_path.read_bytes()


@pytest.fixture(scope="module")
def layout(model_path: Path) -> dict[str, list[int]]:
    """Byte offsets inside the real file: metadata fields, tensor infos, data section."""
    reader = gguf.GGUFReader(model_path)
    fields = [f.offset for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    infos = [t.field.offset for t in reader.tensors]
    return {"fields": fields, "infos": infos, "data": [reader.data_offset]}


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        reprolm.Model.load(tmp_path / "nope.gguf")


def test_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        reprolm.Model.load(tmp_path)


@pytest.mark.parametrize(
    "data, error",
    [
        (b"", reprolm.GgufFormatError),
        (b"GGUF", reprolm.GgufFormatError),
        (b"GGML" + bytes(100), reprolm.GgufFormatError),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), reprolm.UnsupportedError),
        (b"GGUF" + struct.pack("<IQQ", 4, 0, 0), reprolm.UnsupportedError),
    ],
)
def test_bad_headers(tmp_path: Path, data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        reprolm.Model.load(write(tmp_path, "bad.gguf", data))


def test_truncated_at_twenty_offsets(tmp_path: Path, model_bytes: bytes, layout: dict[str, list[int]]) -> None:
    fields, infos, data = layout["fields"], layout["infos"], layout["data"][0]
    cuts = [0, 3, 8, 20, 23]  # header
    cuts += [fields[0] + 5, fields[len(fields) // 2] + 9, fields[-1] + 3, fields[-5] - 1]  # metadata
    cuts += [fields[-1] + 2000, infos[0] + 2, infos[1] + 20, infos[len(infos) // 2] + 7, infos[-1] + 30]
    cuts += [data - 1, data, data + 1000]  # tensor infos -> data section
    cuts += [len(model_bytes) // 2, len(model_bytes) - 4096, len(model_bytes) - 1]  # data
    assert len(set(cuts)) == 20
    for cut in sorted(set(cuts)):
        path = write(tmp_path, "truncated.gguf", model_bytes[:cut])
        with pytest.raises(reprolm.GgufFormatError):
            reprolm.Model.load(path)


def test_absurd_tensor_count(tmp_path: Path, model_bytes: bytes) -> None:
    data = bytearray(model_bytes[:4_000_000])
    data[8:16] = struct.pack("<Q", 2**60)
    with pytest.raises(reprolm.GgufFormatError, match="tensor count"):
        reprolm.Model.load(write(tmp_path, "count.gguf", bytes(data)))


def test_absurd_string_length(tmp_path: Path, model_bytes: bytes) -> None:
    data = bytearray(model_bytes[:4_000_000])
    data[24:32] = struct.pack("<Q", 2**40)  # length of the first metadata key
    with pytest.raises(reprolm.GgufFormatError, match="string length"):
        reprolm.Model.load(write(tmp_path, "string.gguf", bytes(data)))


def test_unknown_tensor_type_names_the_tensor(
    tmp_path: Path, model_bytes: bytes, layout: dict[str, list[int]]
) -> None:
    # token_embd.weight: u64 name length, name, u32 n_dims, 2 x u64 dims, then u32 type.
    at = layout["infos"][0] + 8 + len("token_embd.weight") + 4 + 16
    assert struct.unpack_from("<I", model_bytes, at)[0] == 8  # Q8_0
    data = bytearray(model_bytes)
    data[at : at + 4] = struct.pack("<I", 99)
    with pytest.raises(reprolm.UnknownTensorTypeError, match="token_embd.weight"):
        reprolm.Model.load(write(tmp_path, "type.gguf", bytes(data)))
    # A type ggml defines is named as ggml names it, with what is supported instead.
    data[at : at + 4] = struct.pack("<I", int(gguf.GGMLQuantizationType.IQ4_NL))
    with pytest.raises(reprolm.UnknownTensorTypeError, match=r"token_embd.*IQ4_NL \(ggml type 20\).*supports F32, F16"):
        reprolm.Model.load(write(tmp_path, "q5.gguf", bytes(data)))


def test_files_with_unsupported_types_can_be_inspected_but_not_loaded_or_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "mixed.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("norm.weight", np.arange(8, dtype=np.float32))
    iq2 = gguf.GGMLQuantizationType.IQ2_XXS  # blocks of 256 values in 66 bytes
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((3, 2 * 66), dtype=np.uint8), raw_dtype=iq2)
    w.add_tensor("tail.weight", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = reprolm.inspect(path)
    assert [(t.name, t.type, t.shape, t.n_bytes) for t in info.tensors] == [
        ("norm.weight", "F32", (8,), 32),
        ("blk.0.ffn_down.weight", "IQ2_XXS", (512, 3), 3 * 2 * 66),
        ("tail.weight", "F32", (4,), 16),
    ]
    for rewrite in (lambda: reprolm.convert(path, tmp_path / "out.gguf", to="f16"),
                    lambda: reprolm.quantize(path, tmp_path / "out.gguf", type="q8_0")):
        with pytest.raises(reprolm.UnknownTensorTypeError, match="blk.0.ffn_down.weight.*IQ2_XXS"):
            rewrite()
    assert not (tmp_path / "out.gguf").exists()


def test_model_errors_are_reprolm_errors() -> None:
    assert issubclass(reprolm.GgufFormatError, reprolm.ReprolmError)
    assert issubclass(reprolm.InvalidArgumentError, ValueError)


PEAK_OF_A_LOAD = """
import sys, reprolm

def status():
    fields = (line.split() for line in open("/proc/self/status"))
    return {f[0].rstrip(":"): int(f[1]) * 1024 for f in fields if len(f) > 1 and f[1].isdigit()}

model = reprolm.Model.load(sys.argv[1], precision=sys.argv[2])
after = status()
print(after["VmHWM"] - after["VmRSS"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_loading_holds_little_beyond_the_loaded_model(name: str, precision: str) -> None:
    """Quantized tensors are packed block by block, each block's file pages released once
    packed, into the buffer the model keeps: a fresh process's peak resident memory during
    the load is at most a few MiB above what it holds afterwards. Holding a whole tensor's
    pages, or a copy of its packed bytes, would add up to Gemma 3's 178 MB embedding."""
    try:
        path = reprolm.model_path(name)
    except reprolm.ModelDownloadError as e:  # no network: the only reason to skip
        pytest.skip(f"{name} cannot be fetched: {e}")
    out = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_LOAD, str(path), precision], capture_output=True, text=True, check=True
    )
    transient = int(out.stdout)
    assert transient < 12 << 20, f"the load peaked {transient / 2**20:.1f} MiB above the loaded model"
