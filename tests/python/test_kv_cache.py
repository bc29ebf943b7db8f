"""The KV cache and sessions (docs/theory.md, "The KV cache").

1. Correctness of the cache to the bit: one prefill, chunked prefills, prefix reuse after truncate and a
   restored session give identical logits.
2. Cost and size: ``kv_bytes`` here; the counted multiplications in ``tests/op_counts.rs``
   (``cargo test --release --features count-ops --test op_counts``).
3. Sliding window: identical to no window while everything fits, else equal to a float64
   reference that attends to exactly the kept positions.
4. f16 cache: within F16_TOLERANCE of the f32 cache, still bitwise reproducible.
5. Overflow: "error" raises before any work; a sliding window runs 10,000 tokens.
6. Bad state files raise typed errors.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm
from _llama_f64 import Float64Llama, sliding_window_mask, write_tiny_llama

F16_TOLERANCE = 0.1
"""Max |logit difference| between the f16 and the f32 cache. f16 keeps 11 significant bits
(relative rounding error <= 2^-11 = 4.9e-4 per stored key and value); through 30 layers that
moved logits (magnitude 10 to 20) by at most 0.040 over all 373 positions of the six reference
prompts with their greedy continuations, 0.0045 to 0.010 at the prompts' last positions. The
bound leaves a 2.5x margin; llama.cpp, which also keeps an f16 cache, is 0.4 to 0.9 away."""

REFERENCE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model1(model_path: Path) -> reprolm.Model:
    """The real model on one thread. Tests that run many short forward passes use it: on a
    machine whose cores are busy with other work, every phase barrier of a multi-threaded
    pass can wait a scheduler quantum for a descheduled worker. The thread-count tests load
    their own models."""
    return reprolm.Model.load(model_path, threads=1)


@pytest.fixture(scope="module")
def ids(generations: list[dict[str, Any]]) -> list[int]:
    """80 tokens of real text: the chat prompt of the reference set and its greedy answer."""
    out = generations[2]["prompt_ids"] + generations[2]["greedy_ids"]
    assert len(out) >= 80
    return out[:80]


@pytest.fixture(scope="module")
def full(model1: reprolm.Model, ids: list[int]) -> np.ndarray:
    """Logits at every position from one fresh forward pass."""
    return model1.logits(ids)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> reprolm.Model:
    """A 2-layer random Llama with SmolLM2's tokenizer and no EOS id; one thread keeps it
    fast on a loaded machine (its forward pass is far shorter than a scheduler quantum)."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_llama(path, model_path)
    return reprolm.Model.load(path, threads=1)


def chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


# 1. Correctness to the bit ----------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_chunked_prefill_is_bitwise_identical(
    model1: reprolm.Model, ids: list[int], full: np.ndarray, size: int
) -> None:
    session = model1.session(context_length=96)
    end = 0
    for part in chunks(ids, size):
        logits = session.prefill(part)
        end += len(part)
        assert np.array_equal(logits, full[end - 1]), f"chunk {size}, position {end - 1}"
    assert session.tokens == ids


def test_sessions_are_bitwise_identical_across_thread_counts(
    model_path: Path, ids: list[int], full: np.ndarray
) -> None:
    for threads in (1, 3):
        session = reprolm.Model.load(model_path, threads=threads).session(context_length=96)
        for part in chunks(ids, 7):
            last = session.prefill(part)
        assert np.array_equal(last, full[-1]), f"threads = {threads}"


def test_prefix_reuse_after_truncate(model1: reprolm.Model, ids: list[int], full: np.ndarray) -> None:
    session = model1.session(context_length=96)
    session.prefill(ids)
    session.truncate(50)
    assert session.tokens == ids[:50]
    assert np.array_equal(session.prefill(ids[50:]), full[-1])
    session.truncate(30)
    for t in range(30, 36):
        assert np.array_equal(session.step(ids[t]), full[t]), f"position {t}"
    session.truncate(1000)  # past the end: nothing to drop
    assert session.tokens == ids[:36]
    session.truncate(0)
    assert session.tokens == [] and session.kv_bytes == 0
    assert np.array_equal(session.prefill(ids), full[-1])


def test_generate_reuses_the_shared_prefix(model1: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    a, b = generations[0]["prompt_ids"], generations[3]["prompt_ids"]
    session = model1.session(context_length=256)
    first = session.generate(a, max_tokens=6)
    assert first.token_ids == model1.generate(a, max_tokens=6).token_ids
    assert session.tokens == a + first.token_ids[:-1]
    # A prompt extending the first: only the suffix is new, the result is a fresh run's.
    longer = a + first.token_ids + b
    second = session.generate(longer, max_tokens=6)
    assert second.token_ids == model1.generate(longer, max_tokens=6).token_ids
    # A prompt diverging inside the cached prefix: everything after the change is recomputed.
    edited = a[:3] + b
    third = session.generate(edited, max_tokens=6)
    assert third.token_ids == model1.generate(edited, max_tokens=6).token_ids
    assert session.tokens == edited + third.token_ids[:-1]


def test_session_generate_takes_model_generates_options(model1: reprolm.Model) -> None:
    prompt = "Write a short poem about the sea."
    session = model1.session(context_length=256)
    sampler = reprolm.Sampler(temperature=0.8, top_p=0.9, seed=5)
    for kwargs in [
        {"max_tokens": 12, "sampler": sampler},
        {"max_tokens": 40, "stop": ["\n", "sea"]},
        {"max_tokens": 6, "sampler": sampler, "logprobs": 3},
        {"max_tokens": 10, "stop_token_ids": [model1.tokenize(" the")[0]]},
        {"max_tokens": 0},
    ]:
        got = session.generate(prompt, **kwargs)
        assert got == model1.generate(prompt, **kwargs), kwargs
        assert got.steps == model1.generate(prompt, **kwargs).steps
    assert len(got.token_ids) == 0 and got.finish_reason == "length"
    # Statistics with stop strings: one StepInfo per token, up to the stop.
    got = session.generate(prompt, max_tokens=40, stop=["\n", "sea"], logprobs=2)
    assert got == model1.generate(prompt, max_tokens=40, stop=["\n", "sea"], logprobs=2)
    assert [s.token_id for s in got.steps] == got.token_ids


def test_session_generate_stops_on_ctrl_c_and_stays_usable(model1: reprolm.Model) -> None:
    import _thread
    import threading

    session = model1.session(context_length=512)
    prompt = model1.tokenize("Once upon a time")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        session.generate(prompt, max_tokens=400)
    timer.join()
    # Whatever was computed stays: the session holds the prompt and some generated tokens,
    # and continuing from them gives a fresh run's bits.
    held = session.tokens
    assert held[: len(prompt)] == prompt and len(held) < len(prompt) + 400
    assert np.array_equal(session.prefill([13]), model1.logits(held + [13])[-1])
    assert session.generate(prompt, max_tokens=5) == model1.generate(prompt, max_tokens=5)


def test_restored_session_continues_bitwise(
    model1: reprolm.Model, ids: list[int], full: np.ndarray, tmp_path: Path
) -> None:
    session = model1.session(context_length=96)
    session.prefill(ids[:45])
    session.save(tmp_path / "s.state")
    restored = reprolm.Session.load(model1, tmp_path / "s.state")
    assert restored.tokens == ids[:45]
    assert (restored.context_length, restored.kv_dtype, restored.overflow) == (96, "f32", "error")
    assert restored.kv_bytes == session.kv_bytes
    assert np.array_equal(restored.prefill(ids[45:]), full[-1])
    assert np.array_equal(session.prefill(ids[45:]), full[-1])


# 2. Cache size -----------------------------------------------------------------------


@pytest.mark.parametrize("kv_dtype,size", [("f32", 4), ("f16", 2)])
def test_kv_bytes_is_2_l_n_dkv_bytes(model1: reprolm.Model, ids: list[int], kv_dtype: Any, size: int) -> None:
    c = model1.config
    d_kv = c.d_model * c.n_kv_heads // c.n_heads
    session = model1.session(context_length=64, kv_dtype=kv_dtype, overflow="sliding_window", n_keep=4)
    assert session.kv_bytes == 0
    for n in (1, 17, 64):
        session.prefill(ids[len(session.tokens) : n])
        assert session.kv_bytes == 2 * c.n_layers * n * d_kv * size
    session.prefill(ids[64:70])  # past the capacity, the window holds 64 positions
    assert session.kv_bytes == 2 * c.n_layers * 64 * d_kv * size


def test_default_context_length_is_the_models(model1: reprolm.Model) -> None:
    session = model1.session()
    assert session.context_length == model1.config.context_length
    assert (session.kv_dtype, session.overflow, session.n_keep) == ("f32", "error", 0)


# 3. Sliding window ------------------------------------------------------------------------


def test_sliding_window_with_room_is_identical_to_no_window(
    model1: reprolm.Model, ids: list[int], full: np.ndarray
) -> None:
    session = model1.session(context_length=len(ids), overflow="sliding_window", n_keep=4)
    end = 0
    for part in chunks(ids, 7):
        end += len(part)
        assert np.array_equal(session.prefill(part), full[end - 1]), f"position {end - 1}"


@pytest.fixture(scope="module")
def wrapped(model1: reprolm.Model, ids: list[int]) -> tuple[list[int], np.ndarray]:
    """Steps through 40 tokens on a 24-position window with 4 sinks; logits at 23..39."""
    session = model1.session(context_length=24, overflow="sliding_window", n_keep=4)
    rows = [session.prefill(ids[:24])] + [session.step(t) for t in ids[24:40]]
    return ids[:40], np.stack(rows)


def test_sliding_window_matches_float64_reference(
    model_path: Path, wrapped: tuple[list[int], np.ndarray], full: np.ndarray
) -> None:
    seq, got = wrapped
    n, rows = len(seq), list(range(23, 40))
    reference = Float64Llama(model_path)
    expected = reference.logits(seq, sliding_window_mask(n, capacity=24, n_keep=4), rows=rows)
    diff = np.abs(got - expected).max(axis=1)
    assert diff.max() < REFERENCE_TOLERANCE, f"max |diff| per position: {diff}"
    # The window matters: attending to every position gives clearly different logits.
    assert np.abs(got[-1] - full[39]).max() > 100 * REFERENCE_TOLERANCE


def test_wrapped_window_is_bitwise_identical_across_chunking_threads_and_save(
    model1: reprolm.Model, model_path: Path, wrapped: tuple[list[int], np.ndarray], tmp_path: Path
) -> None:
    seq, got = wrapped  # computed one token at a time after a 24-token prefill, on one thread
    for m, size in [(model1, 40), (reprolm.Model.load(model_path, threads=2), 5)]:
        session = m.session(context_length=24, overflow="sliding_window", n_keep=4)
        end = 0
        for part in chunks(seq, size):
            end += len(part)
            logits = session.prefill(part)
            if end >= 24:  # got[i] holds position 23 + i
                assert np.array_equal(logits, got[end - 24]), f"threads {m.threads}, chunk {size}, position {end - 1}"
    # Save in the wrapped state, restore, continue.
    session = model1.session(context_length=24, overflow="sliding_window", n_keep=4)
    session.prefill(seq[:33])
    session.save(tmp_path / "w.state")
    restored = reprolm.Session.load(model1, tmp_path / "w.state")
    assert (restored.overflow, restored.n_keep, restored.context_length) == ("sliding_window", 4, 24)
    for t in range(33, 40):
        assert np.array_equal(restored.step(seq[t]), got[t - 23]), f"position {t}"
    # Truncating deeper than the window still holds: the prefix is recomputed, same bits.
    restored.truncate(30)
    assert restored.tokens == seq[:30]
    assert np.array_equal(restored.prefill(seq[30:36]), got[35 - 23])


# 4. f16 cache ----------------------------------------------------------------------------


def test_f16_cache_is_within_tolerance_of_f32(
    model1: reprolm.Model, generations: list[dict[str, Any]]
) -> None:
    for g in generations:
        ids = g["prompt_ids"] + g["greedy_ids"]
        f32 = model1.logits(ids)[-1]
        f16 = model1.session(context_length=len(ids), kv_dtype="f16").prefill(ids)
        diff = np.abs(f16 - f32).max()
        assert 0 < diff < F16_TOLERANCE, f"{g['prompt']!r}: max |diff| {diff}"


def test_f16_cache_is_bitwise_reproducible(model_path: Path, ids: list[int]) -> None:
    results = []
    for threads, size in [(1, 1), (2, 7)]:
        session = reprolm.Model.load(model_path, threads=threads).session(context_length=80, kv_dtype="f16")
        rows = {}
        end = 0
        for part in chunks(ids, size):
            end += len(part)
            rows[end - 1] = session.prefill(part)
        results.append(rows)
    for r in results[1:]:
        assert np.array_equal(r[79], results[0][79])
    assert np.array_equal(results[0][6], results[1][6])


# 5. Overflow -----------------------------------------------------------------------------


def test_error_policy_raises_before_any_work(model1: reprolm.Model, ids: list[int], full: np.ndarray) -> None:
    session = model1.session(context_length=32)
    session.prefill(ids[:20])
    with pytest.raises(reprolm.ContextOverflowError, match="33 tokens requested, at most 32"):
        session.prefill(ids[20:33])
    assert session.tokens == ids[:20]
    with pytest.raises(reprolm.ContextOverflowError, match="33 tokens requested, at most 32"):
        session.generate(ids[:20], max_tokens=13)
    assert session.tokens == ids[:20]
    # Refused at once: running 100,000 tokens would take minutes.
    start = time.perf_counter()
    with pytest.raises(reprolm.ContextOverflowError, match="100020 tokens requested"):
        session.prefill([ids[0]] * 100_000)
    assert time.perf_counter() - start < 1.0
    # The state is untouched: the next tokens give the one-pass logits, to the bit.
    assert np.array_equal(session.prefill(ids[20:32]), full[31])


def test_sliding_window_runs_10000_tokens_on_a_2048_cache(tiny_model: reprolm.Model, tmp_path: Path) -> None:
    prompt = tiny_model.tokenize("Once upon a time")
    with pytest.raises(reprolm.ContextOverflowError):
        tiny_model.session(context_length=2048).generate(prompt, max_tokens=10_000)
    session = tiny_model.session(context_length=2048, overflow="sliding_window", n_keep=4)
    completion = session.generate(prompt, max_tokens=10_000)
    assert completion.finish_reason == "length" and len(completion.token_ids) == 10_000
    assert session.tokens == prompt + completion.token_ids[:-1]
    c = tiny_model.config
    assert session.kv_bytes == 2 * c.n_layers * 2048 * c.head_dim * c.n_kv_heads * 4
    # A restored far-wrapped session continues identically.
    session.save(tmp_path / "long.state")
    restored = reprolm.Session.load(tiny_model, tmp_path / "long.state")
    last = completion.token_ids[-1]
    assert np.array_equal(restored.step(last), session.step(last))


# 6. Bad state files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def state_bytes(model1: reprolm.Model, ids: list[int], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("state") / "good.state"
    session = model1.session(context_length=48, kv_dtype="f16", overflow="sliding_window", n_keep=2)
    session.prefill(ids[:30])
    session.save(path)
    reprolm.Session.load(model1, path)  # the unaltered file loads
    return path.read_bytes()


def load_bytes(model: reprolm.Model, data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "bad.state"
    path.write_bytes(data)
    reprolm.Session.load(model, path)


@pytest.mark.parametrize("keep", [0, 5, 11, 40, 100, 0.5, -1])
def test_truncated_state_file_raises(
    model1: reprolm.Model, state_bytes: bytes, tmp_path: Path, keep: float
) -> None:
    n = int(len(state_bytes) * keep) if isinstance(keep, float) else keep % len(state_bytes)
    with pytest.raises(reprolm.StateFormatError):
        load_bytes(model1, state_bytes[:n], tmp_path)


@pytest.mark.parametrize("where", ["magic", "fingerprint", "counts", "tokens", "keys", "checksum"])
def test_flipped_byte_raises(model1: reprolm.Model, state_bytes: bytes, tmp_path: Path, where: str) -> None:
    offset = {"magic": 0, "fingerprint": 20, "counts": 70, "tokens": 100,
              "keys": len(state_bytes) // 2, "checksum": len(state_bytes) - 3}[where]
    data = bytearray(state_bytes)
    data[offset] ^= 0x10
    with pytest.raises(reprolm.StateFormatError):
        load_bytes(model1, bytes(data), tmp_path)


def test_other_version_raises(model1: reprolm.Model, state_bytes: bytes, tmp_path: Path) -> None:
    data = bytearray(state_bytes)
    data[8:12] = (2).to_bytes(4, "little")
    with pytest.raises(reprolm.StateVersionError, match="version 2"):
        load_bytes(model1, bytes(data), tmp_path)


def test_other_model_raises(
    model1: reprolm.Model, tiny_model: reprolm.Model, state_bytes: bytes, tmp_path: Path
) -> None:
    with pytest.raises(reprolm.StateModelMismatchError):
        load_bytes(tiny_model, state_bytes, tmp_path)
    tiny = tiny_model.session(context_length=16)
    tiny.prefill([1, 2, 3])
    tiny.save(tmp_path / "tiny.state")
    with pytest.raises(reprolm.StateModelMismatchError):
        reprolm.Session.load(model1, tmp_path / "tiny.state")


def test_state_errors_are_typed(model1: reprolm.Model, tmp_path: Path) -> None:
    for cls in (reprolm.StateFormatError, reprolm.StateVersionError, reprolm.StateModelMismatchError):
        assert issubclass(cls, reprolm.SessionStateError)
        assert issubclass(cls, reprolm.ReprolmError) and issubclass(cls, ValueError)
    with pytest.raises(FileNotFoundError):
        reprolm.Session.load(model1, tmp_path / "missing.state")
    with pytest.raises(reprolm.StateFormatError, match="not a reprolm session file"):
        load_bytes(model1, b"GGUF" + bytes(200), tmp_path)


# Arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kv_dtype": "f8"},
        {"overflow": "wrap"},
        {"context_length": 0},
        {"context_length": 8, "overflow": "sliding_window", "n_keep": 8},
        {"n_keep": -1},
        {"context_length": 2**60},
    ],
)
def test_bad_session_arguments_raise(model1: reprolm.Model, kwargs: dict[str, Any]) -> None:
    with pytest.raises(reprolm.InvalidArgumentError):
        model1.session(**kwargs)


def test_truncate_rejects_negative(model1: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError):
        model1.session(context_length=8).truncate(-1)
