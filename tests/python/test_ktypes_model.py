"""A tiny Llama whose matrices use every new tensor type (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K; random blocks): its logits match a float64 forward over the weights the `gguf` package
dequantizes, and every reproducibility guarantee holds for it (threads, prefill chunking,
ISAs, save/load). precision="int8" runs every one of them on the int8
kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import gguf
import numpy as np
import pytest

import reprolm
from _llama_f64 import Float64Llama, next_token_kl, write_tiny_llama

Q = gguf.GGMLQuantizationType
# Each new type in several roles across the two layers (d 256, FFN 512: whole 256-blocks).
TYPES = {
    "token_embd": Q.Q6_K,
    "attn_q": Q.Q4_K, "attn_k": Q.Q5_K, "attn_v": Q.Q6_K, "attn_output": Q.Q3_K,
    "ffn_gate": Q.Q2_K, "ffn_up": Q.Q5_0, "ffn_down": Q.Q5_1,
}
ROTATED = dict(zip(TYPES, [TYPES["token_embd"]] + list(TYPES.values())[2:] + [TYPES["attn_q"]]))
PROMPT = list(range(5, 5000, 173))[:24]
TOLERANCE = 1e-4


def matrix_type(name: str) -> Optional[Q]:
    parts = name.split(".")
    table = ROTATED if parts[0] == "blk" and parts[1] == "1" else TYPES
    return table[parts[-2]]


@pytest.fixture(scope="module")
def kquant_llama(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    path = tmp_path_factory.mktemp("kquant") / "kquant-llama.gguf"
    write_tiny_llama(path, model_path, d=256, ffn=512, types=matrix_type, seed=3)
    return path


@pytest.fixture(scope="module")
def logits(kquant_llama: Path) -> np.ndarray:
    return reprolm.Model.load(kquant_llama, threads=1).logits(PROMPT)


def test_the_file_uses_every_new_type(kquant_llama: Path) -> None:
    used = {t.type for t in reprolm.inspect(kquant_llama).tensors}
    assert {"Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"} <= used


def test_logits_match_the_float64_reference(kquant_llama: Path, logits: np.ndarray) -> None:
    n = len(PROMPT)
    expected = Float64Llama(kquant_llama).logits(PROMPT, np.tril(np.ones((n, n), dtype=bool)))
    scale = np.abs(expected).max()
    assert 0.5 < scale < 50, scale  # weights of a sensible size
    assert np.abs(logits - expected).max() < TOLERANCE


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_bitwise_across_isas_threads_chunking_and_sessions(kquant_llama: Path, logits: np.ndarray, isa: str,
                                                           tmp_path: Path) -> None:
    try:
        model = reprolm.Model.load(kquant_llama, threads=3, isa=isa)
    except reprolm.UnsupportedError:
        pytest.skip(f"this CPU has no {isa}")
    assert np.array_equal(model.logits(PROMPT), logits)
    session = model.session()
    rows = [session.prefill(PROMPT[:7])] + [session.prefill(PROMPT[7:9])]
    session.save(tmp_path / "s.state")
    restored = reprolm.Session.load(model, tmp_path / "s.state")
    rows += [restored.step(t) for t in PROMPT[9:]]
    assert all(np.array_equal(r, logits[i]) for r, i in zip(rows, [6, 8] + list(range(9, len(PROMPT)))))


def test_int8_precision(kquant_llama: Path, logits: np.ndarray, tmp_path: Path) -> None:
    # Every type runs the int8 kernels: deterministic, close to float32.
    one, three = (reprolm.Model.load(kquant_llama, threads=t, precision="int8") for t in (1, 3))
    int8 = one.logits(PROMPT)
    session = three.session()
    assert np.array_equal(three.logits(PROMPT), int8)
    assert np.array_equal(np.stack([session.prefill(PROMPT[:5])] + [session.step(t) for t in PROMPT[5:]]), int8[4:])
    assert not np.array_equal(int8, logits)
    # Close as the int8 path is held to on SmolLM2 (tests/python/test_precision.py): mean
    # KL(float32 || int8) of the next-token distributions at most 5e-3.
    kl = next_token_kl(logits, int8)
    assert kl.mean() <= 5e-3, kl
    # The same with every matrix in Q2_K, the type with the fewest bits.
    only_q2k = {t: Q.Q2_K for t in TYPES.values()}
    path = tmp_path / "q2k.gguf"
    write_tiny_llama(path, reprolm.default_model_path(), d=256, ffn=512, seed=3,
                     types=lambda name: only_q2k.get(matrix_type(name), matrix_type(name)))
    float32 = reprolm.Model.load(path, threads=2).logits(PROMPT)
    q2k = [reprolm.Model.load(path, threads=t, precision="int8").logits(PROMPT) for t in (1, 2)]
    assert np.array_equal(q2k[0], q2k[1]) and not np.array_equal(q2k[0], float32)
    kl = next_token_kl(float32, q2k[0])
    assert kl.mean() <= 5e-3, kl


def test_same_bits_as_the_dequantized_float32_model(kquant_llama: Path, logits: np.ndarray, tmp_path: Path) -> None:
    # The kernels use exactly the dequantized weights, in the float kernels' operation order:
    # the file converted to F32 gives the same logit bits.
    reprolm.convert(kquant_llama, tmp_path / "f32.gguf", to="f32")
    assert {t.type for t in reprolm.inspect(tmp_path / "f32.gguf").tensors} == {"F32"}
    assert np.array_equal(reprolm.Model.load(tmp_path / "f32.gguf", threads=2).logits(PROMPT), logits)
