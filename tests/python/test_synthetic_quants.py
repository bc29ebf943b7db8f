"""Files quantized by llama.cpp's own quantizer, the way users get them: a tiny random Llama
(``scripts/synthetic_model.py tiny``, the 384-token tokenizer of the architecture fixtures)
converted by ``llama-quantize`` to each mix people download (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0,
Q3_K_M, Q2_K) and to Q5_0 and Q5_1, committed under ``tests/data/synthetic/``. Every guarantee must hold on them in
both precisions: float32 logits against a float64 forward over the weights the ``gguf``
package dequantizes, golden bits, and the same bits across threads, prefill chunking, ISAs,
sessions saved and restored, and the batch engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

import reprolm
from _llama_f64 import Float64Llama, next_token_kl

DATA = Path(__file__).resolve().parents[1] / "data" / "synthetic"
MIXES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1"]
# The ggml types each mix must contain (llama.cpp's choice per tensor; the mix's main type at least).
MAIN_TYPE = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_0": "Q4_0",
             "Q3_K_M": "Q3_K", "Q2_K": "Q2_K", "Q5_0": "Q5_0", "Q5_1": "Q5_1"}
GOLDEN = json.loads((DATA / "golden.json").read_text())
PROMPT = [1] + list(range(7, 380, 23))
TOLERANCE = 1e-4


def path(mix: str) -> Path:
    return DATA / f"tiny.{mix}.gguf"


def digest(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits, dtype="<f4").tobytes()).hexdigest()


@pytest.fixture(scope="module", params=MIXES)
def mix(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def float32_logits(mix: str) -> np.ndarray:
    return reprolm.Model.load(path(mix), threads=1).logits(PROMPT)


def test_the_files_are_the_mixes_they_claim(mix: str) -> None:
    info = reprolm.inspect(path(mix))
    types = {t.type for t in info.tensors if len(t.shape) == 2}
    assert MAIN_TYPE[mix] in types, types
    assert info.metadata["general.quantization_version"] == "2"  # written by llama.cpp's quantizer


def test_float32_logits_match_the_float64_reference(mix: str, float32_logits: np.ndarray) -> None:
    n = len(PROMPT)
    expected = Float64Llama(path(mix)).logits(PROMPT, np.tril(np.ones((n, n), dtype=bool)))
    assert 0.5 < np.abs(expected).max() < 50  # weights of a sensible size
    assert np.abs(float32_logits - expected).max() < TOLERANCE


def test_float32_logits_keep_their_golden_bits(mix: str, float32_logits: np.ndarray) -> None:
    # Checked against the float64 reference above when recorded; any change of a bit is a
    # change of the float32 kernels' operation order.
    assert digest(float32_logits) == GOLDEN[mix]


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_same_bits_across_threads_chunking_isas_and_sessions(mix: str, precision: Literal["float32", "int8"], tmp_path: Path) -> None:
    reference = reprolm.Model.load(path(mix), threads=1, precision=precision).logits(PROMPT)
    for threads in range(2, 8):
        model = reprolm.Model.load(path(mix), threads=threads, precision=precision)
        assert np.array_equal(model.logits(PROMPT), reference), threads
    for isa in ["scalar", "avx2", "avx512"]:
        try:
            model = reprolm.Model.load(path(mix), threads=3, isa=isa, precision=precision)
        except reprolm.UnsupportedError:
            continue
        assert np.array_equal(model.logits(PROMPT), reference), isa
        session = model.session()
        rows = [session.prefill(PROMPT[:6]), session.prefill(PROMPT[6:9])]
        session.save(tmp_path / f"{isa}.state")
        restored = reprolm.Session.load(model, tmp_path / f"{isa}.state")
        rows += [restored.step(t) for t in PROMPT[9:]]
        assert np.array_equal(np.stack(rows), reference[[5, 8] + list(range(9, len(PROMPT)))]), isa


def test_int8_is_close_to_float32(mix: str, float32_logits: np.ndarray) -> None:
    int8 = reprolm.Model.load(path(mix), threads=2, precision="int8").logits(PROMPT)
    kl = next_token_kl(float32_logits, int8)
    # The bound the int8 path is held to on SmolLM2 (test_precision.py).
    assert kl.mean() <= 5e-3, kl


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_batch_engine_gives_each_request_its_bits_alone(mix: str, precision: Literal["float32", "int8"]) -> None:
    model = reprolm.Model.load(path(mix), threads=2, precision=precision, max_concurrent=8)
    prompts = [PROMPT[: 3 + 2 * i] for i in range(6)]
    samplers = [reprolm.Sampler(temperature=0.9, seed=i) if i % 2 else None for i in range(6)]
    alone = [model.generate(p, max_tokens=12, sampler=s) for p, s in zip(prompts, samplers)]
    requests = [model.submit(p, max_tokens=12, sampler=s) for p, s in zip(prompts, samplers)]
    together = [r.result() for r in requests]
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs
