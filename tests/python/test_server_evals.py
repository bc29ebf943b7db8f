"""What evaluation harnesses and llama-server clients need from ``reprolm serve``, through the
real ``openai`` client and raw HTTP against a real server on a loopback port: raw
log-probabilities by default (``logprobs_mode``), the prompt's log-probabilities with
``echo`` (also with ``max_tokens: 0``), llama-server's request fields, vLLM's tokenizer
endpoints, and lm-evaluation-harness's ``local-completions`` model on a local task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _serving import API_KEY, ServerProcess

import reprolm

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Any:
    with server.client() as c:
        yield c


def test_logprobs_are_raw_by_default_and_processed_on_request(client: openai.OpenAI, model_id: str,
                                                              model: reprolm.Model) -> None:
    sampler = reprolm.Sampler(temperature=0.8, top_k=10, seed=3)
    raw = model.generate(PROMPT, max_tokens=5, sampler=sampler, logprobs=2, logprobs_mode="raw")
    processed = model.generate(PROMPT, max_tokens=5, sampler=sampler, logprobs=2)
    out = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=5, temperature=0.8, seed=3, logprobs=2,
                                    extra_body={"top_k": 10})
    lp = out.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == [s.logprob for s in raw.steps]
    assert lp.top_logprobs == [{model.token_bytes(t).decode(errors="replace"): l for t, l in s.alternatives}
                               for s in raw.steps]
    out = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=5, temperature=0.8, seed=3, logprobs=2,
                                    extra_body={"top_k": 10, "logprobs_mode": "processed"})
    assert out.choices[0].logprobs is not None
    assert out.choices[0].logprobs.token_logprobs == [s.logprob for s in processed.steps]
    # greedy chat: the model's probabilities, not the point mass (0.0 with one alternative)
    messages = [{"role": "user", "content": "Name a color."}]
    chat = client.chat.completions.create(model=model_id, messages=messages, max_tokens=4, temperature=0,  # type: ignore[arg-type]
                                          logprobs=True, top_logprobs=3)
    ref = model.chat(messages, max_tokens=4, logprobs_mode="raw")
    content = chat.choices[0].logprobs and chat.choices[0].logprobs.content
    assert content and [t.logprob for t in content] == ref.logprobs[:len(content)]
    assert all(t.logprob < 0 and len(t.top_logprobs) == 3 for t in content)


def test_echo_returns_the_prompts_logprobs(client: openai.OpenAI, model_id: str, model: reprolm.Model) -> None:
    ids = model.tokenize(PROMPT)
    score = model.score(ids, top_logprobs=1)
    for max_tokens in (0, 3):
        out = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=max_tokens, temperature=0, echo=True,
                                        logprobs=1)
        choice = out.choices[0]
        lp = choice.logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
        assert lp.top_logprobs is not None and lp.text_offset is not None
        n = len(ids)
        assert lp.tokens[:n] == [model.token_bytes(t).decode() for t in ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:n] == score.logprobs
        assert [list(d) for d in lp.top_logprobs[1:n]] == [[model.token_bytes(alts[0][0]).decode()]
                                                            for alts in score.top_logprobs]
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
        assert choice.text == "".join(lp.tokens) and choice.text.startswith(PROMPT)
        assert len(lp.tokens) == n + max_tokens
        if max_tokens:
            # the generated tokens' raw logprobs are the scores of the whole sequence
            generated = model.generate(ids, max_tokens=max_tokens).token_ids
            assert lp.token_logprobs[n:] == model.score(ids + generated).logprobs[n - 1:]
        else:
            assert choice.text == PROMPT and out.usage is not None and out.usage.completion_tokens == 0


def test_echo_streams_the_prompts_logprobs_first(http: httpx.Client, model_id: str, model: reprolm.Model) -> None:
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 0,
            "stream": True}
    events = []
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    first = events[0]["choices"][0]
    assert first["text"] == PROMPT
    assert first["logprobs"]["token_logprobs"] == [None, *model.score(PROMPT).logprobs]
    generated = [lp for e in events[1:] if (c := e["choices"][0])["logprobs"] for lp in c["logprobs"]["token_logprobs"]]
    assert len(generated) == 2


def test_llama_server_fields_map_onto_reprolms(client: openai.OpenAI, http: httpx.Client, model_id: str,
                                               model: reprolm.Model) -> None:
    base = {"model": model_id, "prompt": PROMPT, "temperature": 0}
    same = http.post("/v1/completions", json={**base, "max_tokens": 6}).json()["choices"][0]["text"]
    r = http.post("/v1/completions", json={**base, "n_predict": 6, "cache_prompt": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == same and r.json()["usage"]["completion_tokens"] == 6
    # repeat_penalty over llama-server's window of 64 tokens, prompt included
    prompt = "one two one two one two one two"
    sampler = reprolm.Sampler(temperature=0.0, repetition_penalty=1.8, penalty_window=64)
    want = model.generate(prompt, max_tokens=8, sampler=sampler).text
    assert model.generate(prompt, max_tokens=8).text != want  # the penalty matters here
    r = http.post("/v1/completions", json={**base, "prompt": prompt, "max_tokens": 8, "repeat_penalty": 1.8})
    assert r.json()["choices"][0]["text"] == want
    windowed = reprolm.Sampler(temperature=0.0, repetition_penalty=1.8, penalty_window=2)
    r = http.post("/v1/completions", json={**base, "prompt": prompt, "max_tokens": 8, "repeat_penalty": 1.8,
                                            "repeat_last_n": 2})
    assert r.json()["choices"][0]["text"] == model.generate(prompt, max_tokens=8, sampler=windowed).text
    messages = [{"role": "user", "content": "Say hi."}]
    chat = http.post("/v1/chat/completions", json={"model": model_id, "messages": messages, "temperature": 0,
                                                   "n_predict": 3, "top_k": 1, "min_p": 0.5, "cache_prompt": False})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 3
    assert chat.json()["choices"][0]["message"]["content"] == model.chat(messages, max_tokens=3).text


@pytest.mark.parametrize(("extra", "param"), [
    ({"logprobs_mode": "softmax"}, "logprobs_mode"),
    ({"logprobs_mode": 1}, "logprobs_mode"),
    ({"n_predict": 4, "max_tokens": 5}, "n_predict"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repeat_penalty"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"n_predict": -2}, "n_predict"),
    ({"n_predict": 100000}, "n_predict"),
    ({"mirostat": 2}, "mirostat"),
])
def test_bad_fields_get_400_naming_them(http: httpx.Client, model_id: str, extra: dict[str, Any], param: str) -> None:
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        r = http.post(path, json={"model": model_id, **body, **extra})
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == param and param in error["message"], (path, error)


def test_vllm_tokenizer_endpoints(http: httpx.Client, model: reprolm.Model) -> None:
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == model.token_bytes(model.config.eos_id).decode()  # type: ignore[arg-type]
    assert info["chat_template"] == model.chat_template
    text = "Hello <|im_end|> world"
    vllm = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert vllm == http.post("/tokenize", json={"content": text}).json()["tokens"] == model.tokenize(text, special=True)
    assert http.post("/tokenize", json={"content": text, "prompt": text}).status_code == 400


CAPITALS = [
    {"question": "The capital of France is", "choices": ["Paris", "London", "a small banana"], "answer": 0},
    {"question": "The capital of Japan is", "choices": ["Berlin", "Tokyo"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Fahrenheit"], "answer": 0},
]


def test_lm_evaluation_harness_loglikelihoods_are_sums_of_scores(
        server: ServerProcess, model_id: str, model: reprolm.Model, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-evaluation-harness's ``local-completions`` model runs a multiple-choice task read
    from a local file (no network: its tokenizer is the server's, through ``/tokenizer_info``
    and ``/tokenize``) and gets, for every (context, choice), the sum of Model.score's
    log-probabilities."""
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("OPENAI_API_KEY", API_KEY),
                        ("HF_DATASETS_CACHE", str(tmp_path / "datasets")), ("HF_HOME", str(tmp_path / "hf"))):
        monkeypatch.setenv(name, value)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in CAPITALS))
    task = {"task": "reprolm_capitals", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{question}}",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    results = simple_evaluate(
        model="local-completions",
        model_args={"base_url": f"{server.url}/v1/completions", "model": model_id, "tokenizer_backend": "remote",
                    "auth_token": API_KEY, "num_concurrent": 1, "max_retries": 1},
        tasks=[task], task_manager=TaskManager(), log_samples=True)
    assert results is not None
    samples = sorted(results["samples"]["reprolm_capitals"], key=lambda s: s["doc_id"])
    assert len(samples) == len(CAPITALS)
    correct = 0
    for sample, row in zip(samples, CAPITALS):
        assert len(sample["filtered_resps"]) == len(row["choices"])
        scores = [model.score(" " + choice, context=row["question"]) for choice in row["choices"]]
        for (loglikelihood, is_greedy), score, choice in zip(sample["filtered_resps"], scores, row["choices"]):
            assert abs(float(loglikelihood) - score.logprob) < 1e-4, (row["question"], choice)
            assert bool(is_greedy) == score.greedy
        best = max(range(len(scores)), key=lambda i: scores[i].logprob)
        correct += best == row["answer"]
    assert results["results"]["reprolm_capitals"]["acc,none"] == pytest.approx(correct / len(CAPITALS))
