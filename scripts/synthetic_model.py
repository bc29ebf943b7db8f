"""Writes Llama-architecture GGUF files of realistic shapes with random weights and a real
tokenizer, then quantizes them with llama.cpp's own quantizer: the 1-8 B files the benchmarks
measure, without a model hub.

The F16 file has the shapes of a named preset (or of the flags), the tokenizer metadata of
another GGUF file (by default the default model, SmolLM2's 49,152 tokens; any GGUF with
``tokenizer.ggml.*`` keys works, e.g. a vocab-only file of Llama 3's 128,256 tokens) and
weights drawn from a seeded normal distribution (matrices with standard deviation
``cols**-0.5``, so activations keep their scale through the layers; norms 1). Tensors are
written one at a time, so an 8 B file needs no more memory than its largest matrix.

Quantized copies are made by ``llama-quantize`` (built by ``scripts/llamacpp-tools.sh`` into
``~/.cache/llamacpp-tools/bin``, or ``--llama-quantize PATH``), or by llama-cpp-python's
``llama_model_quantize`` when that is installed and no binary is found. Usage::

    python scripts/synthetic_model.py llama-1b --out-dir ~/models --types Q4_K_M Q8_0
    python scripts/synthetic_model.py llama-3.2-1b --tokenizer ggml-vocab-llama-bpe.gguf --types Q4_K_M
    python scripts/synthetic_model.py --list

Prints the path of every file it wrote, one per line. Files that exist are kept (delete them
to make them again); the same preset, seed and tokenizer give the same F16 bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import gguf
import numpy as np

# llama.cpp's quantizer's type names and their llama_ftype ids (llama.h), for the Python path.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
          "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}


@dataclasses.dataclass(frozen=True)
class Shape:
    """The numbers that size a Llama-architecture model."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    head_dim: int = 0
    """0: ``d_model / n_heads``."""
    tied_output: bool = True
    rope_base: float = 500000.0
    context_length: int = 8192

    @property
    def head_width(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


PRESETS = {
    # The 1.1 B shape of the big-models comparison: SmolLM2's vocabulary (the default tokenizer).
    "llama-1b": Shape(2048, 16, 32, 8, 8192),
    "llama-3.2-1b": Shape(2048, 16, 32, 8, 8192),
    "llama-3.2-3b": Shape(3072, 28, 24, 8, 8192),
    "qwen2.5-1.5b": Shape(1536, 28, 12, 2, 8960, rope_base=1000000.0),
    "qwen2.5-7b": Shape(3584, 28, 28, 4, 18944, tied_output=False, rope_base=1000000.0),
    "llama-3-8b": Shape(4096, 32, 32, 8, 14336, tied_output=False),
    # Small enough for a test run (seconds), wide enough for whole 256-value K-quant blocks.
    "tiny": Shape(256, 2, 4, 2, 512, context_length=2048),
}


def tokenizer_fields(source: Path) -> Iterator[tuple[str, Any, Any, Any]]:
    """``(key, value, type, array sub-type)`` of every ``tokenizer.*`` key of ``source``."""
    reader = gguf.GGUFReader(source)
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            yield name, field.contents(), field.types[0], sub_type


def tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor's name and numpy shape (rows, cols), in llama.cpp's order."""
    d, hd = shape.d_model, shape.head_width
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, d))]
    for i in range(shape.n_layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (d,)),
            (p + "attn_q.weight", (shape.n_heads * hd, d)),
            (p + "attn_k.weight", (shape.n_kv_heads * hd, d)),
            (p + "attn_v.weight", (shape.n_kv_heads * hd, d)),
            (p + "attn_output.weight", (d, shape.n_heads * hd)),
            (p + "ffn_norm.weight", (d,)),
            (p + "ffn_gate.weight", (shape.ffn_dim, d)),
            (p + "ffn_up.weight", (shape.ffn_dim, d)),
            (p + "ffn_down.weight", (d, shape.ffn_dim)),
        ]
    out.append(("output_norm.weight", (d,)))
    if not shape.tied_output:
        out.append(("output.weight", (vocab, d)))
    return out


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Norm weights are ones (f32, as converters write them); matrices are F16 draws."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    out = np.empty(shape, dtype=np.float16)
    std = shape[1] ** -0.5
    for start in range(0, shape[0], 4096):  # rows in slices: no f64 copy of a whole matrix
        stop = min(start + 4096, shape[0])
        out[start:stop] = rng.normal(0.0, std, (stop - start, shape[1])).astype(np.float16)
    return out


def write_f16(path: Path, shape: Shape, tokenizer: Path, seed: int, name: str) -> None:
    """The F16 file, streamed tensor by tensor."""
    fields = list(tokenizer_fields(tokenizer))
    vocab = next(len(v) for k, v, _, _ in fields if k == "tokenizer.ggml.tokens")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"reprolm synthetic {name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(shape.n_layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.d_model)
    writer.add_feed_forward_length(shape.ffn_dim)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    writer.add_key_length(shape.head_width)
    writer.add_value_length(shape.head_width)
    writer.add_rope_dimension_count(shape.head_width)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    for key, value, vtype, sub_type in fields:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    layout = tensors(shape, vocab)
    for tname, tshape in layout:
        dtype = np.float32 if len(tshape) == 1 else np.float16
        writer.add_tensor_info(tname, tshape, np.dtype(dtype), int(np.prod(tshape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, tshape in layout:
        writer.write_tensor_data(random_tensor(rng, tshape))
    writer.close()


def quantizer(explicit: Optional[Path]) -> Optional[Path]:
    """The ``llama-quantize`` binary to use, if one is found."""
    candidates = [explicit] if explicit else []
    if os.environ.get("LLAMA_QUANTIZE"):
        candidates.append(Path(os.environ["LLAMA_QUANTIZE"]))
    candidates.append(Path.home() / ".cache" / "llamacpp-tools" / "bin" / "llama-quantize")
    on_path = shutil.which("llama-quantize")
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def quantize(source: Path, target: Path, qtype: str, binary: Optional[Path], threads: int) -> None:
    """``target`` = ``source`` quantized to ``qtype`` by llama.cpp (output matrix and mixes as
    llama.cpp chooses them for that type)."""
    tmp = target.with_suffix(".part")
    if binary is not None:
        run = subprocess.run([str(binary), str(source), str(tmp), qtype, str(threads)], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{binary} failed with {run.returncode}:\n{run.stderr[-4000:]}")
    else:
        try:
            import llama_cpp  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise SystemExit("no llama-quantize found (run scripts/llamacpp-tools.sh or pass "
                             "--llama-quantize) and llama-cpp-python is not installed") from None
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[qtype]
        params.nthread = threads
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise SystemExit(f"llama_model_quantize failed with {rc}")
    tmp.rename(target)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", nargs="?", choices=sorted(PRESETS), help="the shape to write")
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    parser.add_argument("--out-dir", type=Path, default=Path.home() / ".cache" / "reprolm" / "synthetic")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a GGUF file whose tokenizer.* keys are copied (default: the default model)")
    parser.add_argument("--types", nargs="*", default=["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"],
                        choices=sorted(FTYPES), help="llama.cpp quantization types to make from the F16 file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-quantize", type=Path, default=None, help="path of llama.cpp's llama-quantize")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    args = parser.parse_args(argv)
    if args.list:
        for name, shape in PRESETS.items():
            print(f"{name:14s} {shape}")
        return 0
    if args.preset is None:
        parser.error("name a preset (see --list)")
    shape = PRESETS[args.preset]
    if args.tokenizer is None:
        import reprolm

        args.tokenizer = reprolm.default_model_path()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.preset}-{args.tokenizer.stem.split('.')[0].lower()}-s{args.seed}"
    f16 = args.out_dir / f"{stem}.F16.gguf"
    made_f16 = False
    targets = [args.out_dir / f"{stem}.{t}.gguf" for t in args.types]
    if not f16.exists() and (args.keep_f16 or not targets or any(not t.exists() for t in targets)):
        part = f16.with_suffix(".part")
        write_f16(part, shape, args.tokenizer, args.seed, args.preset)
        part.rename(f16)
        made_f16 = True
    binary = quantizer(args.llama_quantize)
    for qtype, target in zip(args.types, targets):
        if not target.exists():
            quantize(f16, target, qtype, binary, args.threads)
        print(target)
    if args.keep_f16 or not args.types:
        print(f16)
    elif made_f16:
        f16.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
