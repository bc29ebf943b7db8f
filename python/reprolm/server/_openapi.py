"""The server's OpenAPI 3.1 description (``GET /openapi.json``), generated from the pydantic
request models (:mod:`._schema`) and response models (:mod:`._responses`), so a field added to
a model appears here without another edit. Error answers are listed per endpoint with the
status codes the server really sends: 400 (a bad body, naming the field), 401 (a missing or
wrong API key, when one is set), 404 (an unknown model), 413 (a body over ``max_body_bytes``),
429 (at capacity, with ``Retry-After``) and 503 (the model loading, or failed to load)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .._core import __version__
from . import _responses as out
from ._schema import ChatBody, CompletionBody, DetokenizeBody, TokenizeBody

__all__ = ["openapi_schema", "model_ids"]

_REF = "#/components/schemas/{model}"

# (model, "validation" for what clients send or "serialization" for what the server sends)
_MODELS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (CompletionBody, "validation"), (ChatBody, "validation"), (TokenizeBody, "validation"),
    (DetokenizeBody, "validation"),
    (out.ErrorResponse, "serialization"), (out.Health, "serialization"), (out.ModelCard, "serialization"),
    (out.ModelList, "serialization"), (out.TokenizeResponse, "serialization"),
    (out.DetokenizeResponse, "serialization"), (out.Completion, "serialization"),
    (out.CompletionChunk, "serialization"), (out.ChatCompletion, "serialization"),
    (out.ChatCompletionChunk, "serialization"),
]

_ERRORS = {
    400: "The request is malformed: not JSON, an unknown or missing field, a value out of range "
         "(the error's `param` names the field).",
    401: "The API key is missing or wrong (`Authorization: Bearer <key>`).",
    404: "The named model is not the one this server serves.",
    413: "The request body is larger than the server's `max_body_bytes`.",
    429: "The server is at capacity (`max_concurrent + max_queue` sequences); retry after `Retry-After` seconds.",
    503: "The model is still loading (with `Retry-After`) or failed to load (`code: model_load_failed`).",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for status in statuses:
        answer = _json(out.ErrorResponse, _ERRORS[status])
        if status in (429, 503):
            answer["headers"] = _RETRY_AFTER
        answers[str(status)] = answer
    return answers


def _event(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event of a stream (OpenAPI 3.1: the schema of a ``text/event-stream``
    is that of each event): ``data`` is a ``chunk`` as JSON, an error object if the engine
    fails mid-stream, or ``[DONE]`` at the end."""
    return {"type": "object", "required": ["data"], "properties": {
        "event": {"type": "string"},
        "data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"anyOf": [_ref(chunk), _ref(out.ErrorResponse)]}},
        ]},
    }}


def _generation(summary: str, body: type[BaseModel], answer: type[BaseModel], chunk: type[BaseModel],
                auth: list[int]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "operationId": body.__name__.removesuffix("Body").lower() + "_create",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(body)}}},
        "responses": {
            "200": {"description": f"The answer; with `stream: true` a stream of server-sent events, each "
                                   f"`data: <{chunk.__name__}>`, ending with `data: [DONE]`.",
                    "content": {"application/json": {"schema": _ref(answer)},
                                "text/event-stream": {"schema": _event(chunk)}}},
            **_errors(400, *auth, 404, 413, 429, 503),
        },
    }}


def openapi_schema(*, model_ids: list[str], api_key: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server serving ``model_ids`` (the names a request's
    ``model`` may take), asking for a bearer key if ``api_key``."""
    _, defs = models_json_schema(_MODELS, ref_template=_REF)
    schemas: dict[str, Any] = defs["$defs"]
    for name in (CompletionBody.__name__, ChatBody.__name__):
        schemas[name]["properties"]["model"]["enum"] = list(model_ids)
    auth = [401] if api_key else []
    paths: dict[str, Any] = {
        "/v1/completions": _generation("Complete prompts", CompletionBody, out.Completion, out.CompletionChunk, auth),
        "/v1/chat/completions": _generation("Answer a chat", ChatBody, out.ChatCompletion, out.ChatCompletionChunk,
                                            auth),
        "/v1/models": {"get": {
            "summary": "List the served model", "operationId": "models_list",
            "responses": {"200": {**_json(out.ModelList, "The model this server serves."), "links": {
                "RetrieveModel": {"operationId": "models_retrieve",
                                  "parameters": {"model": "$response.body#/data/0/id"}}}},
                          **_errors(*auth, 503)},
        }},
        "/v1/models/{model}": {"get": {
            "summary": "Describe a model", "operationId": "models_retrieve",
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string", "enum": list(model_ids)}}],
            "responses": {"200": _json(out.ModelCard, "The model."), **_errors(*auth, 404, 503)},
        }},
        "/tokenize": {"post": {
            "summary": "Text to token ids", "operationId": "tokenize",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(TokenizeBody)}}},
            "responses": {"200": {**_json(out.TokenizeResponse, "The token ids."), "links": {
                "Detokenize": {"operationId": "detokenize",
                               "requestBody": {"tokens": "$response.body#/tokens"}}}},
                          **_errors(400, *auth, 404, 413, 503)},
        }},
        "/detokenize": {"post": {
            "summary": "Token ids to text", "operationId": "detokenize",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(DetokenizeBody)}}},
            "responses": {"200": _json(out.DetokenizeResponse, "The text."), **_errors(400, *auth, 404, 413, 503)},
        }},
        "/health": {"get": {
            "summary": "Whether the model is loaded", "operationId": "health", "security": [],
            "responses": {"200": _json(out.Health, "The model is loaded (`status: ok`)."),
                          "503": {**_json(out.Health, "The model is loading (`status: loading`, with "
                                                      "`Retry-After`) or failed to load (`status: error`)."),
                                  "headers": {"Retry-After": {**_RETRY_AFTER["Retry-After"], "required": False}}}},
        }},
        "/metrics": {"get": {
            "summary": "Prometheus metrics", "operationId": "metrics",
            "responses": {"200": {"description": "Prometheus' text exposition format.",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **_errors(*auth)},
        }},
        "/openapi.json": {"get": {
            "summary": "This document", "operationId": "openapi", "security": [],
            "responses": {"200": {"description": "The OpenAPI 3.1 description of this server.",
                                  "content": {"application/json": {"schema": {"type": "object"}}}}},
        }},
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "reprolm", "version": __version__,
                 "description": "An OpenAI-compatible server with bitwise-reproducible answers."},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if api_key:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document


def model_ids(model_id: str, file_name: str) -> list[str]:
    """The names a request's ``model`` field may take: the id, and the file's name."""
    return list(dict.fromkeys([model_id, file_name]))

