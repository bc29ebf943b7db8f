"""Determinism under load: 200 requests from 32 concurrent client threads, mixed
greedy and seeded sampling, completions and chat, streamed and not, several choices, stop
strings and logprobs; every answer equals, byte for byte, the same request sent alone to the
idle server, and none fails. Loopback only; the loops are bounded."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
from _serving import API_KEY, ServerProcess

N_CASES = 50
N_REQUESTS = 200
N_CLIENTS = 32

# Short prompts: on 2 cores the prompt tokens are most of the test's time.
TEXTS = [
    "The capital of France is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "Three fruits:",
    "def fibonacci(n):",
    "The quick brown fox",
    "In 1969,",
    "Q: Is water wet?\nA:",
    "Dear friend,",
    "Science is",
]
QUESTIONS = [
    "What is the capital of Italy?",
    "Name a planet.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Say hello in French.",
]


def make_cases(model_id: str) -> list[dict[str, Any]]:
    rng = random.Random(12)
    cases = []
    for i in range(N_CASES):
        chat = i % 3 == 1
        body: dict[str, Any] = {"model": model_id, "max_tokens": rng.choice([3, 4, 6, 8])}
        if chat:
            # a short system message replaces the template's default one (fewer prompt tokens)
            body["messages"] = [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": rng.choice(QUESTIONS)}]
        else:
            body["prompt"] = rng.choice(TEXTS)
        if i % 3 == 0:
            body["temperature"] = 0
        else:
            body["temperature"] = rng.choice([0.7, 1.0, 1.3])
            body["seed"] = 1000 + i
            body["top_p"] = rng.choice([1.0, 0.9])
        if i % 5 == 2:
            body["n"] = 2
        if i % 7 == 3:
            body["stop"] = [" the", "\n"]
        if i % 4 == 1:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if i % 6 == 4:
            if chat:
                body["logprobs"], body["top_logprobs"] = True, 2
            else:
                body["logprobs"] = 2
        if i % 9 == 5:
            body["extra_body"] = {"top_k": 20, "repetition_penalty": 1.2}
        cases.append(body)
    return cases


def _usage(usage: Any) -> dict[str, Any]:
    """The usage without ``prompt_tokens_details``: how many prompt tokens came from the prefix
    cache depends on what ran before (checked here to be whole blocks of the prompt)."""
    out = dict(usage.model_dump())
    cached = out.pop("prompt_tokens_details")["cached_tokens"]
    assert cached % 16 == 0 and 0 <= cached < out["prompt_tokens"], out
    return out


def answer(client: openai.OpenAI, body: dict[str, Any]) -> str:
    """What the response says, as canonical JSON: per choice its text, finish reason and
    logprobs, and the usage (not the id, the creation time or the cached prompt tokens)."""
    kwargs = dict(body)
    endpoint = client.chat.completions if "messages" in kwargs else client.completions
    if kwargs.get("stream"):
        texts: dict[int, str] = {}
        reasons: dict[int, Any] = {}
        logprobs: dict[int, list[Any]] = {}
        usage = None
        for chunk in endpoint.create(**kwargs):
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for c in chunk.choices:
                text = c.delta.content if hasattr(c, "delta") else c.text
                texts[c.index] = texts.get(c.index, "") + (text or "")
                if c.finish_reason is not None:
                    reasons[c.index] = c.finish_reason
                if c.logprobs is not None:
                    logprobs.setdefault(c.index, []).append(c.logprobs.model_dump())
        choices = [{"index": i, "text": texts[i], "finish_reason": reasons.get(i), "logprobs": logprobs.get(i)}
                   for i in sorted(texts)]
        return json.dumps({"choices": choices, "usage": usage}, sort_keys=True)
    out = endpoint.create(**kwargs)
    choices = []
    for c in sorted(out.choices, key=lambda c: c.index):
        text = c.message.content if hasattr(c, "message") else c.text
        lp = None if c.logprobs is None else c.logprobs.model_dump()
        choices.append({"index": c.index, "text": text, "finish_reason": c.finish_reason, "logprobs": lp})
    usage = None if out.usage is None else _usage(out.usage)
    return json.dumps({"choices": choices, "usage": usage}, sort_keys=True)


def test_answers_under_load_equal_answers_alone(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    model_id = client.models.list().data[0].id
    cases = make_cases(model_id)

    # each request alone, one at a time, on the idle server
    assert server.metrics()["reprolm_sequences_in_flight"] == 0
    alone = [answer(client, case) for case in cases]
    assert len(set(alone)) > N_CASES * 0.8  # the cases really differ

    # 200 requests (each case 4 times, shuffled) from 32 client threads at once
    order = [i % N_CASES for i in range(N_REQUESTS)]
    random.Random(5).shuffle(order)
    passes_before = server.metrics()["reprolm_engine_passes_total"]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=N_CLIENTS) as pool:
        loaded = list(pool.map(lambda i: answer(client, cases[i]), order))
    elapsed = time.monotonic() - start
    assert elapsed < 300

    mismatches = [(i, alone[i], got) for i, got in zip(order, loaded) if got != alone[i]]
    assert not mismatches, f"{len(mismatches)} of {N_REQUESTS} differ; first: {mismatches[0]}"
    # the requests did run together: far fewer forward passes than tokens generated one by one
    m = server.metrics()
    generated = sum(json.loads(a)["usage"]["completion_tokens"] for a in (alone[i] for i in order))
    assert m["reprolm_engine_passes_total"] - passes_before < generated / 3
    assert m["reprolm_sequences_in_flight"] == 0 and m["reprolm_running_sequences"] == 0
