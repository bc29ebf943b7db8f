"""Peak resident memory while loading a K-quant model: the file's pages are released as the
loader packs them, so loading never holds the file beside its packed copy.

The model is a Llama-architecture file of about 170 MB written at test time: the metadata and
tokenizer of the committed ``tests/data/synthetic/tiny.Q4_K_M.gguf`` with larger shapes, and
random Q4_K / Q6_K blocks (finite scales) as its matrices, the types of llama.cpp's Q4_K_M
mix. Each load runs in a fresh subprocess, which reports its resident memory after importing
reprolm (``before``) and its high-water mark after the load (``VmHWM``): the difference is
what loading took, interpreter and libraries excluded.

The bound beyond the weights, ``LOAD_OVERHEAD``: the file pieces in flight (1 MiB per
loading thread, released once packed), the 4 KiB pages that straddle two pieces (released at
the end of the load), the file's header and F32 vectors (read in place), the dequantized norm
vectors, the tokenizer, the worker threads' stacks, code pages touched for the first time and
allocator slack. No KV cache or forward scratch is allocated by a load (the batch engine and
sessions allocate theirs on first use). Without the release of the file's pages the peak would
be the file plus the packed weights, about twice the bound asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent.parent / "data"
MIB = 1 << 20
LOAD_OVERHEAD = 32 * MIB

# Shapes of the generated model: about 170 MB in Q4_K / Q6_K.
D_MODEL, N_HEADS, N_KV_HEADS, FFN, N_LAYERS = 1536, 24, 8, 6144, 8
HEAD_DIM = D_MODEL // N_HEADS
OVERRIDES = {
    "llama.block_count": N_LAYERS,
    "llama.embedding_length": D_MODEL,
    "llama.feed_forward_length": FFN,
    "llama.attention.head_count": N_HEADS,
    "llama.attention.head_count_kv": N_KV_HEADS,
    "llama.attention.key_length": HEAD_DIM,
    "llama.attention.value_length": HEAD_DIM,
    "llama.rope.dimension_count": HEAD_DIM,
}
Q = gguf.GGMLQuantizationType
# Where each K-quant block keeps its f16 scales: (offset, bytes) within the block.
SCALES = {Q.Q4_K: (0, 4), Q.Q6_K: (208, 2)}


def random_blocks(rng: np.random.Generator, ty: "gguf.GGMLQuantizationType", cols: int, rows: int) -> np.ndarray:
    """[rows][row bytes] random blocks of `ty` whose f16 scales are a finite 2^-10."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[ty]
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    offset, n = SCALES[ty]
    blocks[:, offset:offset + n] = np.frombuffer(np.full(n // 2, 2.0**-10, dtype=np.float16).tobytes(), np.uint8)
    return blocks.reshape(rows, cols // block_values * block_bytes)


def write_model(path: Path) -> None:
    reader = gguf.GGUFReader(DATA / "synthetic" / "tiny.Q4_K_M.gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = OVERRIDES.get(field.name, field.contents())
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    vocab = int(reader.fields["llama.vocab_size"].contents())
    rng = np.random.default_rng(0)
    d_kv = N_KV_HEADS * HEAD_DIM

    def matrix(name: str, ty: "gguf.GGMLQuantizationType", cols: int, rows: int) -> None:
        writer.add_tensor(name, random_blocks(rng, ty, cols, rows), raw_dtype=ty)

    matrix("token_embd.weight", Q.Q6_K, D_MODEL, vocab)
    writer.add_tensor("output_norm.weight", np.ones(D_MODEL, dtype=np.float32))
    for i in range(N_LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(D_MODEL, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(D_MODEL, dtype=np.float32))
        matrix(f"blk.{i}.attn_q.weight", Q.Q4_K, D_MODEL, D_MODEL)
        matrix(f"blk.{i}.attn_k.weight", Q.Q4_K, D_MODEL, d_kv)
        matrix(f"blk.{i}.attn_v.weight", Q.Q6_K, D_MODEL, d_kv)
        matrix(f"blk.{i}.attn_output.weight", Q.Q4_K, D_MODEL, D_MODEL)
        matrix(f"blk.{i}.ffn_gate.weight", Q.Q4_K, D_MODEL, FFN)
        matrix(f"blk.{i}.ffn_up.weight", Q.Q4_K, D_MODEL, FFN)
        matrix(f"blk.{i}.ffn_down.weight", Q.Q6_K if i % 2 else Q.Q4_K, FFN, D_MODEL)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("load_memory") / "kquant.gguf"
    write_model(path)
    return path


CHILD = """
import json, sys
import reprolm

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

before = status("VmRSS")
model = reprolm.Model.load(sys.argv[1], threads=2, precision=sys.argv[2])
print(json.dumps({"before": before, "peak": status("VmHWM"),
                  "weights": model._loaded.weight_bytes_per_token, "vocab": model.config.vocab_size}))
"""


def load_in_child(path: Path, precision: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), precision], check=True, capture_output=True,
                         text=True, timeout=600)
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_generated_model_is_a_kquant_file_of_a_meaningful_size(kquant_model: Path) -> None:
    import reprolm

    info = reprolm.inspect(kquant_model)
    types = {t.type for t in info.tensors}
    assert types == {"Q4_K", "Q6_K", "F32"}
    assert os.path.getsize(kquant_model) > 150 * 10**6 > 4 * LOAD_OVERHEAD


def test_int8_load_peak_is_at_most_the_file_plus_the_overhead(kquant_model: Path) -> None:
    """At int8 the K-quant matrices are held in as many bytes as the file's blocks: the whole
    load stays within the file's size plus LOAD_OVERHEAD."""
    r = load_in_child(kquant_model, "int8")
    file_bytes = os.path.getsize(kquant_model)
    assert r["weights"] <= file_bytes
    assert r["peak"] - r["before"] <= file_bytes + LOAD_OVERHEAD, (
        f"loading took {(r['peak'] - r['before']) / MIB:.1f} MiB for a file of {file_bytes / MIB:.1f} MiB")


def test_float32_load_peak_is_at_most_the_held_weights_plus_the_overhead(kquant_model: Path) -> None:
    """At float32 the K-quant matrices are held in decoded groups, larger than the file's
    blocks: the load is bounded by the held weights plus LOAD_OVERHEAD (never the file and the
    packed copy together)."""
    r = load_in_child(kquant_model, "float32")
    assert r["peak"] - r["before"] <= r["weights"] + LOAD_OVERHEAD, (
        f"loading took {(r['peak'] - r['before']) / MIB:.1f} MiB for {r['weights'] / MIB:.1f} MiB of weights")


@pytest.mark.xfail(strict=True, reason="float32 holds K-quant matrices in decoded groups, larger than the file")
def test_float32_load_peak_is_at_most_the_file_plus_the_overhead(kquant_model: Path) -> None:
    r = load_in_child(kquant_model, "float32")
    assert r["peak"] - r["before"] <= os.path.getsize(kquant_model) + LOAD_OVERHEAD
