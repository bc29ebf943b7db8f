"""Test helpers, independent of reprolm: a float64 NumPy Llama forward pass over weights
dequantized by the ``gguf`` package, and a builder for tiny random Llama GGUF files.

The reference follows the GGUF Llama graph: RMSNorm (eps from metadata) -> Q, K, V ->
RoPE in ggml "normal" mode (adjacent pairs (2i, 2i + 1) rotate by pos * base^(-2i / d_h),
base from metadata, absolute positions) -> grouped-query attention -> W_O + residual ->
RMSNorm -> SwiGLU + residual; final RMSNorm and the LM head (``output.weight``, else the tied
``token_embd.weight``). Which keys each query may attend to is a parameter, so the same code
serves full causal attention and a sliding window with attention sinks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import gguf
import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def sliding_window_mask(n: int, capacity: int, n_keep: int) -> npt.NDArray[np.bool_]:
    """allowed[t, s]: query t sees key s <= t if s is a sink (s < n_keep) or one of the
    capacity - n_keep most recent positions (s > t - (capacity - n_keep))."""
    t = np.arange(n)[:, None]
    s = np.arange(n)[None, :]
    window = capacity - n_keep
    return (s <= t) & ((s < n_keep) | (s > t - window))


def next_token_kl(want: npt.NDArray[Any], got: npt.NDArray[Any]) -> F64:
    """KL(softmax(want) || softmax(got)) of each row of two logit arrays, in float64."""
    logp = want.astype(np.float64)
    logp -= logp.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    logq = got.astype(np.float64)
    logq -= logq.max(axis=1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(axis=1, keepdims=True))
    kl: F64 = (np.exp(logp) * (logp - logq)).sum(axis=1)
    return kl


class Float64Llama:
    """A Llama GGUF file evaluated in float64."""

    def __init__(self, path: Path) -> None:
        reader = gguf.GGUFReader(path)
        arch = reader.fields["general.architecture"].contents()
        meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith(arch + ".")}
        self.n_layers = int(meta[f"{arch}.block_count"])
        self.d = int(meta[f"{arch}.embedding_length"])
        self.n_heads = int(meta[f"{arch}.attention.head_count"])
        self.n_kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", self.n_heads))
        self.head_dim = self.d // self.n_heads
        self.eps = float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        self._w: dict[str, npt.NDArray[np.float32]] = {}
        for t in reader.tensors:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = [int(x) for x in reversed(t.shape)]  # GGUF lists the contiguous dim first
            self._w[t.name] = np.asarray(w, dtype=np.float32).reshape(shape)

    def _mat(self, name: str) -> F64:
        return self._w[name].astype(np.float64)

    def _rms_norm(self, x: F64, name: str) -> F64:
        inv = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        return x * inv * self._mat(name)

    def _rope(self, x: F64, positions: npt.NDArray[np.int64]) -> F64:
        """x: [T][heads][head_dim]; rotates pairs (2i, 2i + 1)."""
        half = self.head_dim // 2
        theta = self.rope_base ** (-2.0 * np.arange(half) / self.head_dim)
        angle = positions[:, None].astype(np.float64) * theta[None, :]  # [T][half]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(self, ids: list[int], allowed: npt.NDArray[np.bool_], rows: Optional[list[int]] = None) -> F64:
        """Logits at positions ``rows`` (default: all) of ``ids`` at positions 0..len - 1,
        query t attending to the keys s with ``allowed[t, s]``."""
        n = len(ids)
        hd, h, g = self.head_dim, self.n_heads, self.n_kv_heads
        group = h // g
        positions = np.arange(n)
        x = self._w["token_embd.weight"][ids].astype(np.float64)  # [T][d]
        for layer in range(self.n_layers):
            p = f"blk.{layer}."
            xn = self._rms_norm(x, p + "attn_norm.weight")
            q = self._rope((xn @ self._mat(p + "attn_q.weight").T).reshape(n, h, hd), positions)
            k = self._rope((xn @ self._mat(p + "attn_k.weight").T).reshape(n, g, hd), positions)
            v = (xn @ self._mat(p + "attn_v.weight").T).reshape(n, g, hd)
            att = np.empty((n, h, hd))
            for head in range(h):
                kv = head // group
                scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd)  # [T][T]
                scores = np.where(allowed[:n, :n], scores, -np.inf)
                scores -= scores.max(axis=1, keepdims=True)
                a = np.exp(scores)
                a /= a.sum(axis=1, keepdims=True)
                att[:, head, :] = a @ v[:, kv, :]
            x = x + att.reshape(n, h * hd) @ self._mat(p + "attn_output.weight").T
            xn = self._rms_norm(x, p + "ffn_norm.weight")
            gate = xn @ self._mat(p + "ffn_gate.weight").T
            up = xn @ self._mat(p + "ffn_up.weight").T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ self._mat(p + "ffn_down.weight").T
        sel = list(range(n)) if rows is None else rows
        out = self._rms_norm(x[sel], "output_norm.weight")
        head = self._w.get("output.weight", self._w["token_embd.weight"])
        return out @ head.astype(np.float64).T


# Largest |sub-block scale * code| of each quantized type: random blocks get super-block
# scales near 1 / (this * sqrt(cols)), so weights stay near the f32 matrices' magnitude.
_CODE_RANGE = {
    gguf.GGMLQuantizationType.Q8_0: 128, gguf.GGMLQuantizationType.Q4_0: 8, gguf.GGMLQuantizationType.Q4_1: 15,
    gguf.GGMLQuantizationType.Q5_0: 16, gguf.GGMLQuantizationType.Q5_1: 31, gguf.GGMLQuantizationType.Q2_K: 45,
    gguf.GGMLQuantizationType.Q3_K: 128, gguf.GGMLQuantizationType.Q4_K: 945, gguf.GGMLQuantizationType.Q5_K: 1953,
    gguf.GGMLQuantizationType.Q6_K: 4096,
}
# Byte offsets of the f16 scale and, second if any, the f16 min/offset in each block.
_F16_FIELDS = {
    gguf.GGMLQuantizationType.Q8_0: [0], gguf.GGMLQuantizationType.Q4_0: [0], gguf.GGMLQuantizationType.Q4_1: [0, 2],
    gguf.GGMLQuantizationType.Q5_0: [0], gguf.GGMLQuantizationType.Q5_1: [0, 2],
    gguf.GGMLQuantizationType.Q2_K: [80, 82], gguf.GGMLQuantizationType.Q3_K: [108],
    gguf.GGMLQuantizationType.Q4_K: [0, 2], gguf.GGMLQuantizationType.Q5_K: [0, 2], gguf.GGMLQuantizationType.Q6_K: [208],
}


def random_blocks(rng: np.random.Generator, qtype: gguf.GGMLQuantizationType, rows: int, cols: int) -> npt.NDArray[np.uint8]:
    """A (rows, cols) matrix of ``qtype`` as raw blocks: random codes and sub-block scales,
    f16 scales (and mins) sized so the weights are about ``cols ** -0.5``."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block_size
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    scale = 2.0 / (_CODE_RANGE[qtype] * np.sqrt(cols))
    for i, at in enumerate(_F16_FIELDS[qtype]):
        sign = 1.0 if i == 0 else 0.5  # mins / offsets: a fraction of the range
        raw[:, at : at + 2] = (rng.uniform(0.25, 1.0, n) * scale * sign).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block_size * block_bytes)


def write_tiny_llama(path: Path, tokenizer_source: Path, *, seed: int = 0, context_length: int = 16384,
                     d: int = 64, ffn: int = 128,
                     types: Optional[Callable[[str], Optional[gguf.GGMLQuantizationType]]] = None) -> None:
    """A 2-layer Llama (d 64, 2 query heads, 1 KV head, FFN 128) with random f32 weights and
    the tokenizer of ``tokenizer_source``, without an end-of-sequence id (generation runs to
    ``max_tokens``). Fast enough to generate thousands of tokens in a test.

    ``types(name)``, if given, is the ggml type of each matrix ("token_embd.weight",
    "blk.0.attn_q.weight", ...) or None for f32; quantized ones are :func:`random_blocks`."""
    src = gguf.GGUFReader(tokenizer_source)
    heads, kv_heads, layers = 2, 1, 2
    dkv = d * kv_heads // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(context_length)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    for name, field in src.fields.items():
        if name.startswith("tokenizer.ggml.") and name != "tokenizer.ggml.eos_token_id":
            value: Any = field.contents()
            sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, value, field.types[0], sub_type=sub_type)
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)

    def mat(name: str, rows: int, cols: int, std: Optional[float] = None) -> None:
        qtype = types(name) if types is not None else None
        if qtype is None:
            w.add_tensor(name, rng.normal(0.0, cols**-0.5 if std is None else std, (rows, cols)).astype(np.float32))
        else:
            w.add_tensor(name, random_blocks(rng, qtype, rows, cols), raw_dtype=qtype)

    mat("token_embd.weight", vocab, d, std=1.0)
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, dtype=np.float32))
        mat(p + "attn_q.weight", d, d)
        mat(p + "attn_k.weight", dkv, d)
        mat(p + "attn_v.weight", dkv, d)
        mat(p + "attn_output.weight", d, d)
        w.add_tensor(p + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        mat(p + "ffn_gate.weight", ffn, d)
        mat(p + "ffn_up.weight", ffn, d)
        mat(p + "ffn_down.weight", d, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
