"""The batch engine's prefix cache: conversations sharing a system prompt give the same token
ids, log-probabilities and text with the cache on and off and alone on a session, the reuse is
reported (``Completion.cached_tokens``, ``EngineStats``, the server's
``usage.prompt_tokens_details.cached_tokens`` read by the real ``openai`` client, ``/metrics``),
and bad bounds are refused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Optional

import openai
import pytest

import reprolm
from _serving import API_KEY, ServerProcess

BLOCK = 16  # positions per prefix-cache block

SYSTEM = ("You are the help desk of the Lindenhof bakery in a small town. Answer in one short sentence, "
          "mention prices in euros, never promise delivery, and recommend the rye bread when unsure. "
          "Opening hours are seven to six on weekdays and seven to noon on Saturdays.")
QUESTIONS = [
    ["What bread is best for toast?", "And for sandwiches?", "How long does it keep?"],
    ["Do you sell cakes?", "Which one has chocolate?", "Can I order one for Friday?"],
    ["Are you open on Sunday?", "What about holidays?", "Is there parking?"],
]
SAMPLERS: list[Optional[reprolm.Sampler]] = [None, reprolm.Sampler(temperature=0.8, top_p=0.9, seed=4),
                                             reprolm.Sampler(temperature=1.2, top_k=50, seed=9)]
MAX_TOKENS = 10


def _bits(c: reprolm.Completion) -> tuple[list[int], list[str], str, str]:
    return c.token_ids, [x.hex() for x in c.logprobs], c.text, c.finish_reason


def _converse(model: reprolm.Model) -> list[reprolm.Completion]:
    """Every conversation's turns, the conversations' turns submitted together; returns the
    completions turn by turn."""
    histories: list[list[reprolm.Message]] = [[{"role": "system", "content": SYSTEM}] for _ in QUESTIONS]
    out = []
    for turn in range(len(QUESTIONS[0])):
        requests = []
        for history, questions, sampler in zip(histories, QUESTIONS, SAMPLERS):
            history.append({"role": "user", "content": questions[turn]})
            requests.append(model.submit(model.chat_ids(history), max_tokens=MAX_TOKENS, sampler=sampler))
        for history, request in zip(histories, requests):
            done = request.result()
            history.append({"role": "assistant", "content": done.text})
            out.append(done)
    return out


@pytest.mark.parametrize("precision, kv_dtype, threads_on, threads_off",
                         [("float32", "f32", 2, 1), ("int8", "f16", 3, 2)])
def test_conversations_are_the_same_bits_with_the_cache_on_off_and_alone(
        model_path: Path, precision: reprolm.Precision, kv_dtype: reprolm.KvDtype, threads_on: int,
        threads_off: int) -> None:
    on = reprolm.Model.load(model_path, threads=threads_on, precision=precision, kv_dtype=kv_dtype,
                            max_concurrent=4, max_batch_tokens=40)
    off = reprolm.Model.load(model_path, threads=threads_off, precision=precision, kv_dtype=kv_dtype,
                             prefix_cache_bytes=0)
    cached, plain = _converse(on), _converse(off)
    for i, (a, b) in enumerate(zip(cached, plain)):
        assert a.prompt_token_ids == b.prompt_token_ids, i
        assert _bits(a) == _bits(b), f"request {i}: cache on vs off"
        sampler = SAMPLERS[i % len(QUESTIONS)]
        session = off.session(context_length=len(a.prompt_token_ids) + MAX_TOKENS, kv_dtype=kv_dtype)
        alone = session.generate(a.prompt_token_ids, max_tokens=MAX_TOKENS, sampler=sampler)
        assert _bits(a) == _bits(alone), f"request {i}: cache on vs alone"
        assert b.cached_tokens == 0
        n = len(a.prompt_token_ids)
        assert a.cached_tokens % BLOCK == 0 and a.cached_tokens <= (n - 1) // BLOCK * BLOCK
    # From the second turn on, at least the system prompt's whole blocks come from the cache.
    system_blocks = len(on.chat_ids([{"role": "system", "content": SYSTEM}])) // BLOCK
    assert system_blocks >= 3
    later = cached[len(QUESTIONS):]
    assert all(c.cached_tokens >= system_blocks * BLOCK for c in later), [c.cached_tokens for c in later]
    stats, none = _idle_stats(on), _idle_stats(off)
    assert stats.prefix_cache_hits * BLOCK == sum(c.cached_tokens for c in cached)
    assert stats.prefix_cache_misses > 0 and stats.prefix_cache_bytes > 0 and stats.prefix_cache_evictions == 0
    assert stats.prefix_cache_bytes % (BLOCK * on.kv_bytes_per_position) == 0
    assert (none.prefix_cache_hits, none.prefix_cache_misses, none.prefix_cache_bytes) == (0, 0, 0)
    # The cache saved exactly the prompt tokens it reports.
    assert none.prompt_tokens - stats.prompt_tokens == sum(c.cached_tokens for c in cached)


def _idle_stats(model: reprolm.Model) -> reprolm.EngineStats:
    """The engine's statistics once it has published those of its last pass."""
    deadline = time.monotonic() + 30
    while (stats := model.engine_stats()).running or stats.waiting:
        assert time.monotonic() < deadline, stats
        time.sleep(0.01)
    return stats


def test_bad_bounds_are_refused(model_path: Path) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="prefix_cache_bytes"):
        reprolm.Model.load(model_path, prefix_cache_bytes=-1)


@pytest.fixture(scope="module")
def off_model(model_path: Path) -> Iterator[reprolm.Model]:
    yield reprolm.Model.load(model_path, threads=1, prefix_cache_bytes=0)


def test_server_reports_cached_tokens_and_metrics(server: ServerProcess, off_model: reprolm.Model) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    model_id = client.models.list().data[0].id
    messages: list[Any] = [{"role": "system", "content": "Ticket 5821. " + SYSTEM},
                                       {"role": "user", "content": "Do you bake pretzels?"}]
    n = len(off_model.chat_ids(messages))
    reusable = (n - 1) // BLOCK * BLOCK
    before = server.metrics()
    outs = [client.chat.completions.create(model=model_id, messages=messages,
                                           max_tokens=8, temperature=0, logprobs=True) for _ in range(2)]
    usages = [o.usage for o in outs]
    details = [u.prompt_tokens_details if u is not None else None for u in usages]
    assert [d.cached_tokens if d is not None else None for d in details] == [0, reusable]
    assert all(u is not None and u.prompt_tokens == n for u in usages)
    ref = off_model.chat(messages, max_tokens=8)
    assert [o.choices[0].message.content for o in outs] == [ref.text, ref.text]
    lps = [[t.logprob for t in (o.choices[0].logprobs.content or [])] for o in outs if o.choices[0].logprobs]
    assert len(lps) == 2 and lps[0] == lps[1]
    # Streamed, the usage chunk reports it too.
    stream = client.chat.completions.create(model=model_id, messages=messages,
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == reusable
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    after = server.metrics()
    assert after["reprolm_prefix_cache_hits_total"] - before.get("reprolm_prefix_cache_hits_total", 0) == \
        2 * reusable // BLOCK
    assert after["reprolm_prefix_cache_misses_total"] - before.get("reprolm_prefix_cache_misses_total", 0) == \
        reusable // BLOCK
    assert after["reprolm_prefix_cache_bytes"] > 0 and "reprolm_prefix_cache_evictions_total" in after
