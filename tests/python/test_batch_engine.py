"""The batch engine: requests submitted from several threads at staggered times run
together and each gives the bits of that request run alone; a bad request fails alone;
cancelling frees its cache at once and memory stays flat over thousands of requests."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import random
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

import reprolm

# Prompt lengths from 1 to 300 tokens, most of them short (prefill dominates the test's time).
LENGTHS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 19, 22, 26, 30, 35, 40, 46, 53, 61, 70, 80, 92, 105, 120,
           140, 160, 185, 210, 240, 270, 300]


@dataclasses.dataclass(frozen=True)
class Case:
    prompt: list[int]
    max_tokens: int
    sampler: reprolm.Sampler
    stop: tuple[str, ...] = ()
    logprobs: Optional[int] = None


def cases(vocab_size: int) -> list[Case]:
    rng = random.Random(1234)
    samplers = [
        reprolm.Sampler.greedy(),
        reprolm.Sampler(temperature=0.7, top_p=0.9),
        reprolm.Sampler(temperature=1.0, top_k=20, repetition_penalty=1.2),
        reprolm.Sampler(temperature=1.3, min_p=0.05, presence_penalty=0.5),
    ]
    out = []
    for i, n in enumerate(LENGTHS):
        sampler = dataclasses.replace(samplers[i % 4], seed=1000 + i)
        out.append(Case(
            prompt=[rng.randrange(vocab_size) for _ in range(n)],
            max_tokens=rng.choice([0, 1, 5, 12, 24]),
            sampler=sampler,
            stop=("e",) if i % 5 == 0 else (),
            logprobs=2 if i % 7 == 0 else None,
        ))
    return out


def run_alone(model: reprolm.Model, case: Case, kv_dtype: Any = "f32") -> reprolm.Completion:
    session = model.session(context_length=len(case.prompt) + case.max_tokens, kv_dtype=kv_dtype)
    return session.generate(case.prompt, max_tokens=case.max_tokens, sampler=case.sampler, stop=case.stop,
                            logprobs=case.logprobs)


def run_batched(model: reprolm.Model, all_cases: list[Case], n_threads: int = 4) -> list[reprolm.Completion]:
    """Submits the cases from `n_threads` threads, each with random pauses between its
    submissions, and collects every result."""
    results: dict[int, reprolm.Completion] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        rng = random.Random(k)
        try:
            mine = list(range(k, len(all_cases), n_threads))
            requests = []
            for i in mine:
                time.sleep(rng.uniform(0, 0.05))
                c = all_cases[i]
                requests.append((i, model.submit(c.prompt, max_tokens=c.max_tokens, sampler=c.sampler, stop=c.stop,
                                                 logprobs=c.logprobs)))
            for i, request in requests:
                results[i] = request.result()
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [results[i] for i in range(len(all_cases))]


def assert_same_bits(got: reprolm.Completion, expected: reprolm.Completion, what: str) -> None:
    assert got.token_ids == expected.token_ids, what
    assert got.finish_reason == expected.finish_reason, what
    assert got.text == expected.text, what
    assert np.array_equal(np.array(got.logprobs, dtype=np.float64).view(np.uint64),
                          np.array(expected.logprobs, dtype=np.float64).view(np.uint64)), what
    assert got.steps == expected.steps, what


@pytest.mark.parametrize("precision,kv_dtype", [("float32", "f32"), ("int8", "f32"), ("int8", "f16")])
def test_batch_invariance_across_threads_and_arrival(model_path: Path, precision: str, kv_dtype: Any) -> None:
    reference_model = reprolm.Model.load(model_path, threads=2, precision=precision)
    all_cases = cases(reference_model.config.vocab_size)
    alone = [run_alone(reference_model, c, kv_dtype) for c in all_cases]
    assert any(c.finish_reason == "stop" for c in alone) and any(c.finish_reason == "length" for c in alone)
    for threads in (1, 2, 3):
        # Small passes and few slots, so that prompts are split into chunks, requests wait for
        # admission, and every pass mixes prefill chunks with other sequences' decode rows.
        model = reprolm.Model.load(model_path, threads=threads, precision=precision, max_concurrent=6,
                                   max_batch_tokens=64, kv_dtype=kv_dtype)
        assert model.kv_dtype == kv_dtype
        for i, (got, expected) in enumerate(zip(run_batched(model, all_cases), alone)):
            assert_same_bits(got, expected, f"case {i} (prompt of {len(all_cases[i].prompt)}), {threads} threads")


def test_a_bad_request_fails_alone(model: reprolm.Model) -> None:
    vocab = model.config.vocab_size
    good = [model.submit("Once upon a time", max_tokens=12, sampler=reprolm.Sampler(seed=s, temperature=0.9))
            for s in range(3)]
    with pytest.raises(reprolm.EmptyPromptError):
        model.submit([], max_tokens=4)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.submit([1, vocab], max_tokens=4)
    with pytest.raises(reprolm.ContextOverflowError):
        model.submit([1, 2, 3], max_tokens=model.config.context_length)
    with pytest.raises(reprolm.InvalidArgumentError):
        model.submit([1, 2, 3], max_tokens=-1)
    with pytest.raises(reprolm.InvalidArgumentError):
        model.submit([1, 2, 3], max_tokens=4, sampler=reprolm.Sampler(allowed_token_ids=[vocab + 5]))
    # Fails while running, at its third token: the one allowed token, once generated twice, is
    # penalized to -inf (1e308 subtracted twice), so the sampler has nothing left to choose.
    doomed = model.submit([1, 2, 3], max_tokens=4,
                          sampler=reprolm.Sampler(allowed_token_ids=[7], frequency_penalty=1e308))
    chunks = iter(doomed)
    assert [next(chunks).token_ids for _ in range(2)] == [[7], [7]]
    with pytest.raises(reprolm.InvalidArgumentError, match="no token"):
        next(chunks)
    for s, request in enumerate(good):
        alone = model.generate("Once upon a time", max_tokens=12, sampler=reprolm.Sampler(seed=s, temperature=0.9))
        assert request.result() == alone


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_cancel_frees_the_cache_at_once(model_path: Path) -> None:
    model = reprolm.Model.load(model_path, threads=2)
    request = model.submit("Once upon a time", max_tokens=500)
    chunks = iter(request)
    next(chunks)
    stats = model.engine_stats()
    # Positions are granted in blocks of 16 as the sequence grows, not for all 500 at once.
    granted = stats.kv_bytes // model.kv_bytes_per_position
    assert stats.running == 1 and stats.kv_bytes == stats.kv_blocks_used * 16 * model.kv_bytes_per_position
    assert len(request.prompt_token_ids) < granted < len(request.prompt_token_ids) + 500
    request.cancel()
    wait_until(lambda: model.engine_stats().kv_bytes == 0)
    assert model.engine_stats().running == 0
    with pytest.raises(reprolm.RequestCancelledError):
        list(chunks)
    # A dropped request is cancelled too.
    dropped = model.submit("Once upon a time", max_tokens=500)
    wait_until(lambda: model.engine_stats().running == 1)
    del dropped
    wait_until(lambda: model.engine_stats().kv_bytes == 0)
    # A finished request is not disturbed by cancel().
    done = model.submit("Once upon a time", max_tokens=3)
    completion = done.result()
    done.cancel()
    assert done.result() == completion


def rss_bytes() -> int:
    """Resident memory after glibc has returned its free heap pages to the system (so that
    the allocator's caching of freed blocks, which comes and goes, is not counted)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_f16_caches_halve_the_bytes_on_every_path(model_path: Path, model: reprolm.Model) -> None:
    f16 = reprolm.Model.load(model_path, threads=2, kv_dtype="f16")
    assert (model.kv_dtype, f16.kv_dtype) == ("f32", "f16")
    assert 2 * f16.kv_bytes_per_position == model.kv_bytes_per_position == f16.config.n_layers * 2 * 4 * (
        f16.config.n_kv_heads * f16.config.head_dim)
    request = f16.submit("Once upon a time", max_tokens=200)
    chunks = iter(request)
    next(chunks)
    stats = f16.engine_stats()
    assert stats.kv_bytes == stats.kv_blocks_used * 16 * f16.kv_bytes_per_position > 0
    request.cancel()
    # Every path of the model uses its caches' type: batched, speculative and beam search
    # give the bits of an f16 session's (which differ from an f32 cache's).
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
    options: dict[str, Any] = {"max_tokens": 12, "logprobs": 1, "sampler": reprolm.Sampler(temperature=1.0, seed=3)}
    assert f16.session().kv_dtype == "f16" and f16.session(kv_dtype="f32").kv_dtype == "f32"
    alone = f16.session(kv_dtype="f16").generate(prompt, **options)
    assert alone.logprobs != model.session().generate(prompt, **options).logprobs
    assert f16.generate(prompt, **options) == alone
    assert f16.generate(prompt, **options, speculative="lookup").logprobs == alone.logprobs
    beams = [f16.beam_search(prompt, beam_width=2, max_tokens=6), model.beam_search(prompt, beam_width=2, max_tokens=6)]
    assert beams[0][0].logprob != beams[1][0].logprob
    with pytest.raises(reprolm.InvalidArgumentError, match="kv_dtype"):
        reprolm.Model.load(model_path, kv_dtype="f8")  # type: ignore[arg-type]


def test_memory_stays_flat_over_2000_requests(model_path: Path) -> None:
    model = reprolm.Model.load(model_path, threads=2, max_concurrent=32)
    prompts = [[1 + (i * 7919 + j) % 4000 for j in range(1 + i % 3)] for i in range(50)]
    no_eos = [model.config.eos_id] if model.config.eos_id is not None else []

    def wave(offset: int) -> None:
        requests = [model.submit(p, max_tokens=1 + (offset + k) % 2,
                                 sampler=reprolm.Sampler(seed=offset + k, banned_token_ids=no_eos))
                    for k, p in enumerate(prompts)]
        for k, r in enumerate(requests):
            if k % 5 == 0:
                r.cancel()
        for k, r in enumerate(requests):
            if k % 5 != 0:
                assert r.result().finish_reason == "length"

    for w in range(4):  # warm-up: allocator pools, scratch buffers at their largest
        wave(w * 50)
    before = rss_bytes()
    for w in range(4, 40):
        wave(w * 50)
    after = rss_bytes()
    wait_until(lambda: model.engine_stats().kv_bytes == 0 and model.engine_stats().running == 0)
    # A leak of 16 KB a request (a KV cache alone is over 90 KB here) would pass 24 MiB.
    assert after - before < 24 << 20, f"RSS grew by {(after - before) / 2**20:.1f} MiB over 1800 requests"


def test_asyncio_streams_many_requests(model: reprolm.Model) -> None:
    async def main() -> list[tuple[str, reprolm.Completion]]:
        async def one(seed: int) -> tuple[str, reprolm.Completion]:
            request = model.submit("Write a poem.", max_tokens=10, sampler=reprolm.Sampler(seed=seed))
            streamed = "".join([chunk.text async for chunk in request])
            again = model.submit("Write a poem.", max_tokens=10, sampler=reprolm.Sampler(seed=seed))
            return streamed, await again.aresult()
        return await asyncio.gather(*(one(s) for s in range(8)))

    for seed, (streamed, completion) in enumerate(asyncio.run(main())):
        alone = model.generate("Write a poem.", max_tokens=10, sampler=reprolm.Sampler(seed=seed))
        assert streamed == alone.text and completion == alone
