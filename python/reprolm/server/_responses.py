"""The response bodies the server sends, as pydantic models: the source of the responses in
the OpenAPI schema (``/openapi.json``). The handlers build plain dicts for speed; the schema
test validates real answers against these models, so the two cannot drift apart."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ErrorResponse", "Health", "ModelCard", "ModelList", "TokenizeResponse", "DetokenizeResponse",
           "Completion", "CompletionChunk", "ChatCompletion", "ChatCompletionChunk"]


class _Out(BaseModel):
    # open to fields added later (as OpenAI's own schema is): clients ignore what they do
    # not know; every field listed here is required to be as described
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    """What went wrong, naming the field at fault where there is one."""
    type: str
    """``invalid_request_error``, ``authentication_error``, ``not_found_error``,
    ``rate_limit_error`` or ``server_error``."""
    param: Optional[str]
    """The request field at fault (``messages[0].content``), or null."""
    code: Optional[str]
    """A machine-readable reason (``invalid_value``, ``model_not_found``, ``server_overloaded``...)."""


class ErrorResponse(_Out):
    """Every error answer (4xx, 503), as OpenAI's API sends it."""

    error: ErrorDetail


class Health(_Out):
    status: Literal["ok", "loading", "error"]
    error: Optional[str] = None
    """Why the model failed to load (with ``status: error``)."""


class ModelCard(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(_Out):
    tokens: list[int]


class DetokenizeResponse(_Out):
    content: str


class Usage(_Out):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class CompletionLogprobs(_Out):
    """The legacy completions ``logprobs`` object: one entry per token, generated or (with
    ``echo``) of the prompt, whose first token has ``null`` entries (nothing precedes it)."""

    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int = Field(ge=0)
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Optional[Literal["stop", "length"]]


class _Generated(_Out):
    id: str
    created: int
    model: str
    system_fingerprint: str
    """``reprolm-<version>-<file hash>``: the same bits for the same fingerprint."""


class Completion(_Generated):
    """``POST /v1/completions`` without ``stream``."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(_Generated):
    """One server-sent event of ``POST /v1/completions`` with ``stream: true`` (the stream
    ends with ``data: [DONE]``)."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    """With ``stream_options.include_usage``: null on every chunk but the last (no choices)."""


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[TokenLogprob]
    refusal: None


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: str
    refusal: None


class ChatChoice(_Out):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[Literal["stop", "length"]]


class ChatCompletion(_Generated):
    """``POST /v1/chat/completions`` without ``stream``."""

    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Out):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(_Out):
    index: int = Field(ge=0)
    delta: Delta
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[Literal["stop", "length"]]


class ChatCompletionChunk(_Generated):
    """One server-sent event of ``POST /v1/chat/completions`` with ``stream: true`` (the
    stream ends with ``data: [DONE]``)."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
