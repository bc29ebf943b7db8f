"""Every architecture through the Python API: tiny transformers-made models of each one
(tests/data/arch/, see scripts/make_arch_fixtures.py) and the real Gemma 3 270M file.

Their logits against transformers are checked in the cargo tests (tests/architectures.rs,
tests/gemma3.rs); here: the same bits across thread counts, prefill chunkings, sessions
saved and restored, the batch engine with other requests running, and int8 precision."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import reprolm

ARCH = Path(__file__).resolve().parent.parent / "data" / "arch"
TINY = ["llama3-q8_0", "mistral-f16", "qwen2-f16", "qwen3-q8_0", "phi3-f16", "gemma3-q8_0"]
PROMPT = json.loads((ARCH / "references.json").read_text())["prompts"][-1]


@pytest.mark.parametrize("name", TINY)
def test_tiny_architecture_is_bitwise_reproducible(name: str, tmp_path: Path) -> None:
    path = ARCH / f"{name}.gguf"
    one = reprolm.Model.load(path, threads=1)
    two = reprolm.Model.load(path, threads=2)
    # The model's own logits of every position equal the session's, chunked or not.
    full = one.logits(PROMPT)
    assert np.array_equal(two.logits(PROMPT), full)
    session = two.session(context_length=64)
    for part in (PROMPT[:7], PROMPT[7:8], PROMPT[8:]):
        last = session.prefill(part)
    assert np.array_equal(last, full[-1])
    # A saved session continues with the same bits.
    session.save(tmp_path / "s.state")
    restored = reprolm.Session.load(one, tmp_path / "s.state")
    assert np.array_equal(restored.step(PROMPT[0]), session.step(PROMPT[0]))
    # Generation: the same ids alone and with other requests in the batch engine.
    sampler = reprolm.Sampler(temperature=0.8, seed=5)
    alone = one.generate(PROMPT[:5], max_tokens=12, sampler=sampler).token_ids
    others = [two.submit(PROMPT[i:i + 9], max_tokens=12, sampler=reprolm.Sampler(seed=i)) for i in range(4)]
    assert two.generate(PROMPT[:5], max_tokens=12, sampler=sampler).token_ids == alone
    for r in others:
        r.result()


@pytest.mark.parametrize("name", ["qwen3-q8_0", "gemma3-q8_0"])
def test_tiny_architecture_in_int8_is_bitwise_reproducible(name: str) -> None:
    path = ARCH / f"{name}.gguf"
    a = reprolm.Model.load(path, threads=1, precision="int8").logits(PROMPT)
    b = reprolm.Model.load(path, threads=3, precision="int8").logits(PROMPT)
    assert np.array_equal(a, b)
    # The int8 kernels did run: activations quantized per group move the logits. (Their
    # accuracy is measured on the real model: tests/python/test_precision.py.)
    f32 = reprolm.Model.load(path, threads=2).logits(PROMPT)
    assert not np.array_equal(a, f32)


@pytest.fixture(scope="module")
def gemma() -> reprolm.Model:
    return reprolm.Model.load("gemma3-270m", threads=2)


def test_gemma3_generates_reproducibly(gemma: reprolm.Model) -> None:
    out = gemma.generate("The capital of France is", max_tokens=16)
    assert out.finish_reason == "length" and "France" in out.text
    solo = reprolm.Model.load("gemma3-270m", threads=1).generate("The capital of France is", max_tokens=16)
    assert solo.token_ids == out.token_ids
    sampled = [gemma.generate("Once upon a time", max_tokens=16, sampler=reprolm.Sampler(temperature=0.9, seed=s)).token_ids
               for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_gemma3_session_chunks_and_save_are_bitwise(gemma: reprolm.Model, tmp_path: Path) -> None:
    ids = gemma.tokenize("Water boils at a temperature of 100 degrees Celsius, which is")
    full = gemma.logits(ids)[-1]
    session = gemma.session(context_length=128)
    session.prefill(ids[:5])
    session.save(tmp_path / "g.state")
    restored = reprolm.Session.load(gemma, tmp_path / "g.state")
    assert np.array_equal(restored.prefill(ids[5:]), full)


def test_gemma3_base_model_has_no_chat_template(gemma: reprolm.Model) -> None:
    with pytest.raises(reprolm.ChatTemplateError):
        gemma.chat([{"role": "user", "content": "Hi"}], max_tokens=4)


def test_an_unsupported_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    data = bytearray((ARCH / "llama3-f32.gguf").read_bytes())
    # general.architecture's value: a GGUF string (u32 type 8, u64 length 5, the bytes).
    key = b"general.architecture" + (8).to_bytes(4, "little") + (5).to_bytes(8, "little")
    at = data.index(key) + len(key)
    assert data[at:at + 5] == b"llama"
    data[at:at + 5] = b"mamba"
    (tmp_path / "mamba.gguf").write_bytes(bytes(data))
    with pytest.raises(reprolm.UnsupportedError, match=r"'mamba' \(supported: llama, qwen2, qwen3, phi3, gemma3\)"):
        reprolm.Model.load(tmp_path / "mamba.gguf")
