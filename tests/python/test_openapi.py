"""The server's OpenAPI 3.1 description (``/openapi.json``): valid OpenAPI 3.1, every real
answer (success and error) conforms to it, and schemathesis drives every endpoint of a real
``reprolm serve`` on a loopback port with generated requests, a fixed seed and bounded
counts, checking that no answer is a 5xx, that every status code and content type is
documented and that every body conforms to the schema. Stateful links (models list ->
retrieve, tokenize -> detokenize) are followed too."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import httpx
import jsonschema
import pytest
import schemathesis
from _serving import ServerProcess
from hypothesis import HealthCheck, Phase, given, settings
from openapi_spec_validator import OpenAPIV31SpecValidator
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from reprolm.server import _responses as out

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
# Generated requests per operation in the fuzzing run (8 operations); the seed fixes them.
EXAMPLES = 100
# Generated sequences of linked calls in the stateful run.
STATEFUL_EXAMPLES = 30


@pytest.fixture(scope="module")
def api(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module: a 64-position context keeps every generation tiny (the
    prompt plus max_tokens must fit it), and a small queue makes 429 reachable."""
    proc = ServerProcess(model_path, tmp_path_factory.mktemp("openapi") / "server.log", "--context-length", "64",
                         "--max-concurrent", "4", "--max-queue", "60", "--max-body-bytes", "65536",
                         "--grace-period", "2")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def document(api: ServerProcess) -> dict[str, Any]:
    r = httpx.get(f"{api.url}/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    return dict(r.json())


def test_schema_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    OpenAPIV31SpecValidator(document).validate()
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    assert set(paths) == {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{model}",
                          "/tokenize", "/detokenize", "/health", "/metrics", "/openapi.json"}
    for path, item in paths.items():
        for method, op in item.items():
            codes = set(op["responses"])
            if path not in ("/health", "/openapi.json"):
                assert "401" in codes, (path, method)  # the server has an API key
            if path not in ("/health", "/openapi.json", "/metrics"):
                assert "503" in codes, (path, method)  # the model may be loading
            if method == "post":
                assert {"400", "413"} <= codes, (path, method)


def test_schema_follows_the_request_models(document: dict[str, Any]) -> None:
    """A field of a request model is a property of its schema, with its limits."""
    from reprolm.server._schema import MAX_N, ChatBody, CompletionBody

    schemas = document["components"]["schemas"]
    for model in (CompletionBody, ChatBody):
        props = schemas[model.__name__]["properties"]
        assert set(props) == set(model.model_fields)
        assert props["n"]["maximum"] == MAX_N and props["n"]["minimum"] == 1
        assert schemas[model.__name__]["additionalProperties"] is False
        assert props["model"]["enum"][0] == "SmolLM2-135M-Instruct.Q4_1"


def _validator(document: dict[str, Any], name: str) -> jsonschema.protocols.Validator:
    """A JSON Schema validator of component ``name``, resolving refs inside the document."""
    schema = {**document["components"]["schemas"][name], "components": document["components"]}
    cls = jsonschema.validators.validator_for({"$schema": "https://json-schema.org/draft/2020-12/schema"})
    return cls(schema)


def _sse(text: str) -> list[dict[str, Any]]:
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_real_answers_conform(api: ServerProcess, document: dict[str, Any]) -> None:
    """Answers of every kind validate against the schema the server publishes."""
    model = "SmolLM2-135M-Instruct.Q4_1"
    with api.client() as c:
        cases: list[tuple[httpx.Response, str, int]] = [
            (c.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 3, "n": 2,
                                             "logprobs": 2, "echo": True}), "Completion", 200),
            (c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 3, "logprobs": True, "top_logprobs": 2}),
             "ChatCompletion", 200),
            (c.get("/v1/models"), "ModelList", 200),
            (c.get(f"/v1/models/{model}"), "ModelCard", 200),
            (c.post("/tokenize", json={"content": "Hello"}), "TokenizeResponse", 200),
            (c.post("/detokenize", json={"tokens": [19556]}), "DetokenizeResponse", 200),
            (c.get("/health"), "Health", 200),
            (c.post("/v1/completions", json={"model": model, "prompt": "Hi", "temprature": 1}), "ErrorResponse",
             400),
            (c.post("/v1/completions", content=b"{", headers={"content-type": "application/json"}),
             "ErrorResponse", 400),
            (c.post("/v1/completions", json={"model": "other", "prompt": "Hi"}), "ErrorResponse", 404),
            (c.get("/v1/models/other"), "ErrorResponse", 404),
            (c.post("/tokenize", content=b" " * 70000), "ErrorResponse", 413),
            (httpx.get(f"{api.url}/v1/models", timeout=10), "ErrorResponse", 401),
        ]
        for r, name, status in cases:
            assert r.status_code == status, (r.request.url, r.text)
            _validator(document, name).validate(r.json())
            getattr(out, name).model_validate(r.json())
            if status >= 400:
                assert str(status) in document["paths"][_template(r.request.url.path)][r.request.method.lower()][
                    "responses"]
        streamed = [
            (c.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 3, "stream": True,
                                             "logprobs": 1, "stream_options": {"include_usage": True}}),
             "CompletionChunk"),
            (c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 3, "stream": True, "n": 2, "logprobs": True,
                                                  "stream_options": {"include_usage": True}}),
             "ChatCompletionChunk"),
        ]
        for r, name in streamed:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for event in _sse(r.text):
                _validator(document, name).validate(event)
                getattr(out, name).model_validate(event)


def _template(path: str) -> str:
    return "/v1/models/{model}" if path.startswith("/v1/models/") else path


def test_method_not_allowed_names_the_allowed_methods(api: ServerProcess) -> None:
    r = httpx.put(f"{api.url}/v1/completions", headers=api.headers, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


@pytest.fixture(scope="module")
def api_schema(api: ServerProcess) -> Any:
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    schema.config.update(base_url=api.url, headers=api.headers, request_timeout=60)
    return schema


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def test_schemathesis_fuzz(api_schema: Any) -> None:
    """EXAMPLES generated requests per operation (derandomized: the same every run), every
    answer through the checks."""
    operations = _operations(api_schema)
    statuses: dict[str, Counter[int]] = defaultdict(Counter)
    # (schemathesis leaves out the operation serving the schema itself)
    assert sorted(o.label for o in operations) == [
        "GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{model}", "POST /detokenize",
        "POST /tokenize", "POST /v1/chat/completions", "POST /v1/completions"]
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        def run(case: Any) -> None:
            response = case.call_and_validate(checks=CHECKS)
            statuses[operation.label][response.status_code] += 1

        run()
    print({label: dict(counts) for label, counts in statuses.items()})
    # the generated requests reached the model, not only the validation (a 2xx per operation)
    for label, counts in statuses.items():
        assert sum(n for status, n in counts.items() if status < 300) > 0, (label, dict(counts))


def test_schemathesis_stateful(api_schema: Any) -> None:
    """Sequences following the schema's links: the listed model id retrieves the model, the
    ids /tokenize gives detokenize to text."""
    machine = api_schema.as_state_machine()
    calls: Counter[str] = Counter()

    class Checked(machine):  # type: ignore[misc, valid-type]
        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            calls[case.operation.label] += 1
            case.validate_response(response, checks=CHECKS)

    Checked.run(settings=settings(max_examples=STATEFUL_EXAMPLES, deadline=None, derandomize=True, database=None,
                                  stateful_step_count=4, suppress_health_check=list(HealthCheck)))
    print(dict(calls))
    # the linked operations were reached through their links
    assert calls["GET /v1/models/{model}"] > 0 and calls["POST /detokenize"] > 0, dict(calls)
