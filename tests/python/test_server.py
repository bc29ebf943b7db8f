"""``reprolm serve`` through the real ``openai`` client and raw HTTP: the endpoints
and fields work and match the library bit for bit, bad requests get 4xx naming the field and
the server keeps serving, a client that goes away frees its sequence, over capacity gets 429,
SIGTERM finishes in-flight requests. Every server runs in a subprocess on a free loopback port."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pytest
from _serving import API_KEY, ServerProcess

import reprolm

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_health_models_and_fingerprint(server: ServerProcess, client: openai.OpenAI, model_path: Path) -> None:
    health = httpx.get(f"{server.url}/health")  # no API key needed
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [model_path.name.removesuffix(".gguf")] and models[0].object == "model"
    assert client.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    out = client.completions.create(model=models[0].id, prompt="Hi", max_tokens=1, temperature=0)
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()[:12]
    assert out.system_fingerprint == f"reprolm-{reprolm.__version__}-{digest}"


def test_completion_matches_library_with_usage(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    prompt = "The capital of France is"
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
    ref = model.generate(prompt, max_tokens=8)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == model_id
    assert out.choices[0].text == ref.text and out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ref.prompt_token_ids), 8)
    assert out.usage.total_tokens == len(ref.prompt_token_ids) + 8
    # a list of prompts given as token ids: one choice each, usage over both
    ids = [model.tokenize("1, 2, 3,"), model.tokenize("Once upon a time")]
    out = client.completions.create(model=model_id, prompt=ids, max_tokens=5, temperature=0, echo=True)
    refs = [model.generate(p, max_tokens=5) for p in ids]
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [
        model.detokenize(p) + r.text for p, r in zip(ids, refs)]
    assert out.usage is not None and out.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def test_chat_matches_library(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0)
    ref = model.chat(QUESTION, max_tokens=40)
    assert ref.finish_reason == "eos"  # the model ends its turn, which OpenAI calls "stop"
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == ref.text and choice.finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    # max_completion_tokens is max_tokens' newer name
    short = client.chat.completions.create(model=model_id, messages=QUESTION, max_completion_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage is not None
    assert short.usage.completion_tokens == 3 and ref.text.startswith(short.choices[0].message.content or "?")


def test_streaming_deltas_join_to_the_whole_text(client: openai.OpenAI, model_id: str) -> None:
    kwargs: dict[str, Any] = dict(model=model_id, max_tokens=24, temperature=0.9, seed=11)
    # Puts the prompt in the prefix cache, so both requests below reuse the same blocks of it
    # and report the same usage, cached tokens included.
    client.chat.completions.create(messages=QUESTION, model=model_id, max_tokens=1)
    whole = client.chat.completions.create(messages=QUESTION, **kwargs)
    chunks = list(client.chat.completions.create(messages=QUESTION, stream=True,
                                                 stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"

    prompt = "Once upon a time"
    whole_c = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0.9, seed=11, n=2)
    streamed: dict[int, str] = {0: "", 1: ""}
    reasons: dict[int, str] = {}
    for chunk in client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0.9, seed=11,
                                           n=2, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert streamed == {c.index: c.text for c in whole_c.choices}
    assert reasons == {c.index: c.finish_reason for c in whole_c.choices}


def test_n_choices_use_seed_plus_index(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    prompt = "My favourite animal is"
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=10, temperature=1.0, seed=40, n=3)
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    refs = [model.generate(prompt, max_tokens=10, sampler=reprolm.Sampler(temperature=1.0, seed=40 + i))
            for i in range(3)]
    assert texts == [r.text for r in refs] and len(set(texts)) > 1
    assert out.usage is not None and out.usage.completion_tokens == sum(len(r.token_ids) for r in refs)
    assert out.usage.prompt_tokens == len(model.tokenize(prompt))
    # choice i of a request is choice 0 of the same request with seed + i
    one = client.completions.create(model=model_id, prompt=prompt, max_tokens=10, temperature=1.0, seed=42)
    assert one.choices[0].text == texts[2]


def test_seed_reproduces_and_changes_the_sample(client: openai.OpenAI, model_id: str) -> None:
    def sample(seed: int) -> str:
        out = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=16, temperature=1.5,
                                             seed=seed)
        return out.choices[0].message.content or ""

    first = sample(7)
    assert sample(7) == first
    assert any(sample(s) != first for s in (8, 9, 10))
    # a negative seed is taken modulo 2**64
    assert sample(-1) == sample(2**64 - 1)


def test_stop_strings(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    out = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=30,
                                    temperature=0, stop=["."])
    ref = model.generate("The capital of France is", max_tokens=30, stop=".")
    assert out.choices[0].text == ref.text == " Paris" and out.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=30, temperature=0,
                                          stop=" Paris")
    assert chat.choices[0].message.content == "The capital of France is"
    assert chat.choices[0].finish_reason == "stop"


def test_logprobs_match_the_sampler(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    prompt = "The weather today is"
    sampler = reprolm.Sampler(temperature=0.8, seed=3)
    # the server's default logprobs_mode is "raw"
    ref = model.generate(prompt, max_tokens=6, sampler=sampler, logprobs=3, logprobs_mode="raw")
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=6, temperature=0.8, seed=3, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert lp.token_logprobs == [s.logprob for s in ref.steps]
    assert "".join(lp.tokens) == ref.text and lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(6)]
    assert [sorted(d.values(), reverse=True) for d in lp.top_logprobs] == [
        sorted((l for _, l in s.alternatives), reverse=True) for s in ref.steps]

    chat = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=40, temperature=0.8, seed=3,
                                          logprobs=True, top_logprobs=2)
    ref_chat = model.chat(QUESTION, max_tokens=40, sampler=sampler)
    content = chat.choices[0].logprobs and chat.choices[0].logprobs.content
    assert content
    # every token of the reply (the end-of-turn token adds no text and is not listed)
    assert "".join(t.token for t in content) == chat.choices[0].message.content == ref_chat.text
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
    assert all(bytes(t.bytes or []).decode() == t.token for t in content)
    assert all(t.logprob <= 0 for t in content)


def test_logit_bias_and_extras(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    prompt = "The capital of France is"
    paris = model.generate(prompt, max_tokens=1).token_ids[0]
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=1, temperature=0,
                                    logit_bias={str(paris): -100})
    assert out.choices[0].text != model.detokenize([paris])
    forced = model.tokenize(" banana")[0]
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=3, temperature=0,
                                    logit_bias={str(forced): 100})
    assert out.choices[0].text == model.detokenize([forced]) * 3
    # reprolm's extras: top_k=1 at temperature 1.3 is greedy; min_p and repetition_penalty are accepted
    greedy = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
    top1 = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=1.3, seed=5,
                                     extra_body={"top_k": 1})
    assert top1.choices[0].text == greedy.choices[0].text
    sampler = reprolm.Sampler(temperature=1.0, min_p=0.1, repetition_penalty=1.3, presence_penalty=0.5,
                              frequency_penalty=0.25, top_p=0.9, seed=9)
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=1.0, top_p=0.9, seed=9,
                                    presence_penalty=0.5, frequency_penalty=0.25,
                                    extra_body={"min_p": 0.1, "repetition_penalty": 1.3})
    assert out.choices[0].text == model.generate(prompt, max_tokens=8, sampler=sampler).text


def test_response_format_is_the_json_schema_grammar(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=model_id, messages=QUESTION, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    text = out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop" and text is not None
    jsonschema.validate(json.loads(text), schema)
    assert text == model.chat(QUESTION, max_tokens=40, grammar=reprolm.Grammar.json_schema(schema)).text
    anything = client.completions.create(model=model_id, prompt="A JSON object:", max_tokens=40, temperature=0,
                                         extra_body={"response_format": {"type": "json_object"}})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].text), dict)
    else:
        assert anything.choices[0].text.startswith("{")


def test_tokenize_and_detokenize(server: ServerProcess, model: reprolm.Model) -> None:
    with server.client() as http:
        ids = http.post("/tokenize", json={"content": "Hello <|im_end|> world"}).json()["tokens"]
        assert ids == model.tokenize("Hello <|im_end|> world", special=True)
        plain = http.post("/tokenize", json={"content": "<|im_end|>", "parse_special": False}).json()["tokens"]
        assert plain == model.tokenize("<|im_end|>") and len(plain) > 1
        assert http.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello <|im_end|> world"}


def test_metrics(server: ServerProcess, client: openai.OpenAI, model_id: str) -> None:
    before = server.metrics()
    out = client.completions.create(model=model_id, prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage is not None
    after = server.metrics()
    key = 'reprolm_requests_total{endpoint="/v1/completions",status="200"}'
    assert after[key] == before.get(key, 0) + 1
    assert after["reprolm_prompt_tokens_total"] - before["reprolm_prompt_tokens_total"] == out.usage.prompt_tokens
    assert after["reprolm_completion_tokens_total"] - before["reprolm_completion_tokens_total"] == 4
    assert after["reprolm_time_to_first_token_seconds_count"] - before["reprolm_time_to_first_token_seconds_count"] == 1
    assert after["reprolm_inter_token_latency_seconds_count"] - before["reprolm_inter_token_latency_seconds_count"] == 3
    for name in ("reprolm_queue_depth", "reprolm_running_sequences", "reprolm_kv_cache_bytes",
                 "reprolm_kv_blocks_used", "reprolm_sequences_in_flight"):
        assert after[name] == 0, name
    assert after["reprolm_kv_blocks_free"] > 0 and after["reprolm_preemptions_total"] == 0


def test_api_key(server: ServerProcess, model_id: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(f"{server.url}/v1/completions", json={"model": model_id, "prompt": "x"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{server.url}/metrics", headers=headers).status_code == 401
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ---- bad requests ---------------------------------------------------------------------------------

COMPLETION = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 2}


def _with(base: dict[str, Any], **changes: Any) -> bytes:
    body = {**base, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


# (name, path, raw body, expected status, the field the error must name or None)
BAD_REQUESTS: list[tuple[str, str, bytes, int, Any]] = [
    ("malformed JSON", "/v1/completions", b'{"model": "x", "prompt": ', 400, None),
    ("not an object", "/v1/completions", b'["Hello"]', 400, None),
    ("invalid UTF-8", "/v1/completions", b'{"model": "' + MODEL_ID.encode() + b'", "prompt": "\xff\xfe"}', 400, None),
    ("NaN", "/v1/completions", _with(COMPLETION).replace(b'"max_tokens": 2', b'"temperature": NaN'), 400, None),
    ("missing model", "/v1/completions", _with(COMPLETION, model=...), 400, "model"),
    ("missing prompt", "/v1/completions", _with(COMPLETION, prompt=...), 400, "prompt"),
    ("missing messages", "/v1/chat/completions", _with(CHAT, messages=...), 400, "messages"),
    ("prompt of wrong type", "/v1/completions", _with(COMPLETION, prompt=12), 400, "prompt"),
    ("empty prompt", "/v1/completions", _with(COMPLETION, prompt=""), 400, "prompt"),
    ("negative max_tokens", "/v1/completions", _with(COMPLETION, max_tokens=-1), 400, "max_tokens"),
    ("max_tokens as a string", "/v1/completions", _with(COMPLETION, max_tokens="5"), 400, "max_tokens"),
    ("max_tokens past the context", "/v1/completions", _with(COMPLETION, max_tokens=10**6), 400, "max_tokens"),
    ("temperature -1", "/v1/completions", _with(COMPLETION, temperature=-1), 400, "temperature"),
    ("top_p 2", "/v1/chat/completions", _with(CHAT, top_p=2), 400, "top_p"),
    ("top_k past 2**63", "/v1/completions", _with(COMPLETION, top_k=10**30), 400, "top_k"),
    ("presence_penalty 5", "/v1/chat/completions", _with(CHAT, presence_penalty=5), 400, "presence_penalty"),
    ("unknown model", "/v1/completions", _with(COMPLETION, model="gpt-4o"), 404, "model"),
    ("empty messages", "/v1/chat/completions", _with(CHAT, messages=[]), 400, "messages"),
    ("message without role", "/v1/chat/completions", _with(CHAT, messages=[{"content": "hi"}]), 400,
     "messages[0].role"),
    ("unknown role", "/v1/chat/completions", _with(CHAT, messages=[{"role": "wizard", "content": "hi"}]), 400,
     "messages[0].role"),
    ("huge n", "/v1/completions", _with(COMPLETION, n=10**6), 400, "n"),
    ("n as a boolean", "/v1/completions", _with(COMPLETION, n=True), 400, "n"),
    ("token id out of range", "/v1/completions", _with(COMPLETION, prompt=[1, 10**12]), 400, "prompt"),
    ("negative token id", "/v1/completions", _with(COMPLETION, prompt=[[5], [-1]]), 400, "prompt[1]"),
    ("stop of wrong type", "/v1/completions", _with(COMPLETION, stop=5), 400, "stop"),
    ("logit_bias key not an id", "/v1/completions", _with(COMPLETION, logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit_bias outside the vocabulary", "/v1/completions", _with(COMPLETION, logit_bias={"999999": 1}), 400,
     "logit_bias"),
    ("logprobs 100", "/v1/completions", _with(COMPLETION, logprobs=100), 400, "logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", _with(CHAT, top_logprobs=2), 400, "top_logprobs"),
    ("seed past 2**64", "/v1/completions", _with(COMPLETION, seed=2**70), 400, "seed"),
    ("stream as a string", "/v1/completions", _with(COMPLETION, stream="yes"), 400, "stream"),
    ("misspelt field", "/v1/completions", _with(COMPLETION, temprature=0.5), 400, "temprature"),
    ("response_format xml", "/v1/chat/completions",
     _with(CHAT, response_format={"type": "xml"}), 400, "response_format"),
    ("response_format without a schema object", "/v1/chat/completions",
     _with(CHAT, response_format={"type": "json_schema", "json_schema": "{}"}), 400, "response_format"),
    ("response_format invalid schema", "/v1/completions",
     _with(COMPLETION, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
     400, "response_format"),
    ("tool without a function", "/v1/chat/completions", _with(CHAT, tools=[{"type": "function"}]), 400,
     "tools[0].function"),
    ("detokenize out of range", "/detokenize", json.dumps({"tokens": [10**9]}).encode(), 400, "tokens"),
    ("oversize body", "/v1/completions", _with(COMPLETION, prompt="x" * (3 * 1024 * 1024)), 413, None),
]


@pytest.mark.parametrize("name,path,body,status,param", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_a_clear_4xx(server: ServerProcess, name: str, path: str, body: bytes, status: int,
                                      param: Any) -> None:
    r = httpx.post(f"{server.url}{path}", content=body, timeout=60,
                   headers={**server.headers, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert len(error["message"]) > 10 and error["param"] == param
    if param is not None:
        assert param.split("[")[0] in error["message"]


def test_server_keeps_serving_after_bad_requests(server: ServerProcess, client: openai.OpenAI, model_id: str) -> None:
    with server.client() as http:
        assert http.get("/v1/nowhere").status_code == 404
        assert http.get("/v1/completions").status_code == 405
        assert http.post("/v1/completions", content=b"\x00" * 100).status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=QUESTION, temperature=-1)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=2,
                                       response_format={"type": "xml"})  # type: ignore[typeddict-item]
    assert "not supported" in str(e.value)
    out = client.completions.create(model=model_id, prompt="Hello", max_tokens=2, temperature=0)
    assert out.choices[0].finish_reason == "length"
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert server.metrics()['reprolm_requests_total{endpoint="/v1/completions",status="400"}'] >= 10


# ---- the client goes away, capacity, loading, SIGTERM ---------------------------------------------

EOS_BANNED = {"2": -100}  # SmolLM2's end-of-sequence token: long generations that really are long


def _wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not streaming"])
def test_disconnect_cancels_the_sequence(server: ServerProcess, stream: bool) -> None:
    before = server.metrics()
    body = json.dumps({"model": MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 3000, "stream": stream,
                       "logit_bias": EOS_BANNED}).encode()
    # A raw connection: the client sends its request, sees generation start, and hangs up.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            received = b""
            while received.count(b"data: ") < 5:
                received += conn.recv(65536)
            assert received.startswith(b"HTTP/1.1 200")
        assert _wait_for(lambda: server.metrics()["reprolm_running_sequences"] == 1)
    # the connection is closed: the sequence leaves the engine and generation stops
    assert _wait_for(lambda: server.metrics()["reprolm_running_sequences"] == 0, timeout=5)
    m = server.metrics()
    assert m["reprolm_sequences_in_flight"] == 0
    assert m["reprolm_cancelled_sequences_total"] == before["reprolm_cancelled_sequences_total"] + 1
    generated = m["reprolm_engine_generated_tokens_total"] - before["reprolm_engine_generated_tokens_total"]
    assert 0 < generated < 1000
    time.sleep(0.5)
    assert server.metrics()["reprolm_engine_generated_tokens_total"] == m["reprolm_engine_generated_tokens_total"]


@pytest.fixture(scope="module")
def small_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(model_path, tmp_path_factory.mktemp("small") / "server.log", "--max-concurrent", "1",
                         "--max-queue", "1", "--max-body-bytes", "1000", "--grace-period", "1",
                         "--context-length", "3500", "--alias", "tiny", "--kv-dtype", "f16", api_key=None)
    try:
        yield proc
    finally:
        proc.stop()


def test_over_capacity_gets_429_with_retry_after(small_server: ServerProcess) -> None:
    body = {"model": "tiny", "prompt": "1, 2, 3,", "max_tokens": 3000, "stream": True, "logit_bias": EOS_BANNED}
    with small_server.client() as http:
        with http.stream("POST", "/v1/completions", json=body) as first, \
                http.stream("POST", "/v1/completions", json=body) as second:
            assert first.status_code == second.status_code == 200  # one running, one queued
            r = http.post("/v1/completions", json={**body, "stream": False})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert http.post("/v1/completions", json={**body, "n": 2}).status_code == 429
            # more sequences than the server could ever hold is the request's fault: 400
            r = http.post("/v1/completions", json={**body, "n": 3})
            assert r.status_code == 400 and "at most 2" in r.json()["error"]["message"]
            client = openai.OpenAI(base_url=f"{small_server.url}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.completions.create(model="tiny", prompt="Hi", max_tokens=1)
        # both streams closed: capacity is back
        assert _wait_for(lambda: small_server.metrics()["reprolm_sequences_in_flight"] == 0, timeout=5)
        ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["model"] == "tiny"
        # the body limit and the context length are the server's options
        assert http.post("/v1/completions", json={"model": "tiny", "prompt": "x" * 2000}).status_code == 413
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4000})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "max_tokens" and "3500" in r.json()["error"]["message"]


def test_the_kv_dtype_option_reaches_the_engine(small_server: ServerProcess, model: reprolm.Model) -> None:
    prompt = "The weather today is"
    sampler = reprolm.Sampler(temperature=0.8, seed=3)
    f16 = model.session(kv_dtype="f16").generate(prompt, max_tokens=6, sampler=sampler, logprobs=1, logprobs_mode="raw")
    f32 = model.generate(prompt, max_tokens=6, sampler=sampler, logprobs=1, logprobs_mode="raw")
    client = openai.OpenAI(base_url=f"{small_server.url}/v1", api_key="none", max_retries=0)
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0.8, seed=3, logprobs=1)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == [s.logprob for s in f16.steps] != [s.logprob for s in f32.steps]


def test_health_is_503_while_loading_and_a_failed_load_exits(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # reading it blocks until we write: the server stays in its loading state
    proc = ServerProcess(fifo, tmp_path / "server.log", api_key=None, wait=False)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"{proc.url}/health", timeout=2).status_code == 503
            except httpx.TransportError:
                return False

        assert _wait_for(answers, timeout=60), proc.log()
        assert httpx.get(f"{proc.url}/health").json() == {"status": "loading"}
        r = httpx.post(f"{proc.url}/v1/completions", json={"model": "model", "prompt": "Hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading" and "Retry-After" in r.headers

        # Feed the file to whoever opens it to read (the fingerprint, then the loader) until the
        # server gives up on it; a non-blocking open fails at once while nobody reads.
        deadline = time.monotonic() + 60
        while proc.proc.poll() is None and time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.02)
                continue
            try:
                os.write(fd, b"this is not a GGUF file")
            except OSError:
                pass
            finally:
                os.close(fd)
            time.sleep(0.05)
        assert proc.proc.wait(timeout=60) == 1, proc.log()
        assert "could not load" in proc.log()
    finally:
        proc.stop()


def _read_stream(lines: Iterator[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
        elif line == "data: [DONE]":
            events.append({"done": True})
    return events


def test_sigterm_finishes_in_flight_requests_then_exits(model_path: Path, tmp_path: Path) -> None:
    proc = ServerProcess(model_path, tmp_path / "server.log", "--grace-period", "30", api_key=None)
    try:
        body = {"model": MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 60, "stream": True, "temperature": 0,
                "logit_bias": EOS_BANNED}
        with httpx.Client(base_url=proc.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                first = next(lines)
                assert first.startswith("data: ")
                proc.signal(signal.SIGTERM)
                # no new connections once it is stopping
                assert _wait_for(lambda: _refused(proc.url), timeout=10)
                rest = _read_stream(lines)
        events = [json.loads(first[6:])] + rest
        assert events[-1] == {"done": True}
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) != ""
        assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.stop()


def test_sigterm_cancels_what_outlives_the_grace_period(model_path: Path, tmp_path: Path) -> None:
    proc = ServerProcess(model_path, tmp_path / "server.log", "--grace-period", "1", api_key=None)
    try:
        body = {"model": MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 5000, "stream": True,
                "logit_bias": EOS_BANNED}
        with httpx.Client(base_url=proc.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                start = time.monotonic()
                proc.signal(signal.SIGTERM)
                try:
                    events = _read_stream(lines)
                except httpx.TransportError:
                    events = []
        assert proc.proc.wait(timeout=30) == 0
        assert time.monotonic() - start < 15
        assert {"done": True} not in events  # cut short, not finished
    finally:
        proc.stop()


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:
        return False
    return False
