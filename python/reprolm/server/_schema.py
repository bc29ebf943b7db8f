"""The request bodies the server accepts, validated by pydantic: OpenAI's field names, types
and ranges, plus reprolm's extras (``top_k``, ``min_p``, ``repetition_penalty``). Every
problem becomes a 400 :class:`ApiError` naming the field."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from ._compat import CompatFields
from ._errors import ApiError

__all__ = ["CompletionBody", "ChatBody", "TokenizeBody", "DetokenizeBody", "parse_json", "validate",
           "MAX_N", "MAX_STOP", "MAX_LOGPROBS"]

MAX_N = 16
"""The most choices one request may ask for."""
MAX_STOP = 16
"""The most stop strings one request may give."""
MAX_LOGPROBS = 20
"""The most alternatives per token (``logprobs`` / ``top_logprobs``)."""
_SEED_MIN = -(2**63)
_SEED_LIMIT = 2**64

PromptInput = Union[str, list[str], list[int], list[list[int]]]

# The published JSON Schemas (``/openapi.json``) of fields whose checks are validators: the
# shapes those validators accept, so a client (or a schema-driven tester) can know them.
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT_SCHEMA = WithJsonSchema({"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
    _TOKEN_IDS,
    {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
]})
_STOP_SCHEMA = WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP},
    {"type": "null"},
]})
_LOGIT_BIAS_SCHEMA = WithJsonSchema({"anyOf": [
    {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
     "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
     "description": "Token id (decimal) -> bias added to its logit."},
    {"type": "null"},
]})
_RESPONSE_FORMAT_SCHEMA = WithJsonSchema({"anyOf": [
    {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
    {"type": "object", "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "properties": {"name": {"type": "string"},
                                                         "schema": {"type": ["object", "boolean"]}}},
    }, "required": ["type", "json_schema"]},
    {"type": "null"},
]})


class _Body(BaseModel):
    # strict: a string is not a number, a bool is not an int; unknown fields are errors (a
    # misspelt "temprature" must not be ignored).
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body, CompatFields):
    """Fields common to both generation endpoints (with llama-server's and ``logprobs_mode``
    from :class:`CompatFields`)."""

    model: str
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Annotated[Optional[Union[str, list[str]]], _STOP_SCHEMA] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Annotated[Optional[dict[str, float]], _LOGIT_BIAS_SCHEMA] = None
    seed: Optional[int] = Field(default=None, ge=_SEED_MIN, lt=_SEED_LIMIT)
    user: Optional[str] = None
    response_format: Annotated[Optional[dict[str, Any]], _RESPONSE_FORMAT_SCHEMA] = None
    # reprolm's extras (extra_body in the openai client)
    top_k: Optional[int] = Field(default=None, ge=0, le=2**63 - 1)  # (the Sampler's i64)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0)
    # accepted and ignored, as they change nothing here
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        for key, bias in (v or {}).items():
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"keys must be token ids (decimal integers), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be between -100 and 100, got {bias} for token {key}")
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """``{"type": "text"}``, ``{"type": "json_object"}`` (any JSON object) or
        ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``; the schema
        itself is checked when the grammar is made (``_app._grammar``)."""
        if v is None or v.get("type") in ("text", "json_object"):
            return v
        if v.get("type") == "json_schema":
            spec = v.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
                raise ValueError("'json_schema' must be an object holding the JSON Schema under 'schema'")
            return v
        raise ValueError(f"type {v.get('type')!r} is not supported: use 'text', 'json_object' or 'json_schema'")


class CompletionBody(_Sampling):
    """``POST /v1/completions``."""

    prompt: Annotated[PromptInput, _PROMPT_SCHEMA]
    max_tokens: Optional[int] = Field(default=16, ge=0)
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: PromptInput) -> PromptInput:
        if isinstance(v, list) and len(v) == 0:
            raise ValueError("must not be an empty list")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: Optional[str]) -> Optional[str]:
        if v:
            raise ValueError("is not supported (the model has no fill-in-the-middle mode here)")
        return v


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[list[Any]] = None  # checked by _tools (400s name the call at fault)
    refusal: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(json_schema_extra={"minItems": 1})
    max_tokens: Optional[int] = Field(default=None, ge=0)
    max_completion_tokens: Optional[int] = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[Any]] = None  # checked by _tools, as tool_choice
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("must contain at least one message")
        return v



class TokenizeBody(_Body):
    """``POST /tokenize``: llama-server's shape (``content``), or vLLM's (``prompt``, whose
    ``add_special_tokens`` is llama-server's ``add_special``)."""

    content: Optional[str] = None
    prompt: Optional[str] = None
    add_special: bool = False
    add_special_tokens: bool = False
    parse_special: bool = True
    model: Optional[str] = None

    @pydantic.model_validator(mode="after")
    def _text(self) -> "TokenizeBody":
        if (self.content is None) == (self.prompt is None):
            raise ValueError("give the text as 'content' (llama-server) or 'prompt' (vLLM), one of them")
        return self

    def text(self) -> str:
        return self.content if self.content is not None else (self.prompt or "")


class DetokenizeBody(_Body):
    """``POST /detokenize``."""

    tokens: list[int]
    model: Optional[str] = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 ({e.reason} at byte {e.start})",
                       code="invalid_utf8") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_json_type(value)}", code="invalid_json")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter"}
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "is-instance", "literal"}


def _is_tag(item: Union[int, str]) -> bool:
    """Whether a location item names a union branch or a validator rather than a field."""
    return isinstance(item, str) and ("[" in item or item in _TYPE_NAMES
                                      or item.startswith(("function-", "lax-", "strict-")))


def _param(loc: tuple[Union[int, str], ...]) -> tuple[str, bool]:
    """``messages[0].content`` from pydantic's location, cut before the first union branch,
    and whether it was cut there."""
    out = ""
    for item in loc:
        if _is_tag(item):
            return out, True
        out += f"[{item}]" if isinstance(item, int) else ("." if out else "") + item
    return out, False


# What the fields that accept several shapes expect.
_EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids or a list of lists of token ids",
    "stop": "a string or a list of strings",
    "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts",
}


def validate(cls: type[pydantic.BaseModel], data: dict[str, Any]) -> Any:
    """``cls`` built from ``data``, or a 400 naming the first bad field."""
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as e:
        err = e.errors(include_url=False)[0]
        param, union = _param(tuple(err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        kind = str(err["type"])
        if union:
            field = param.rsplit(".", 1)[-1].split("[", 1)[0]
            msg = f"expected {_EXPECTED.get(field, 'another type')}"
        if kind == "missing":
            message = f"missing required field '{param}'"
        elif kind == "extra_forbidden":
            message = f"unknown field '{param}'"
        else:
            message = f"invalid value for '{param}': {msg}"
        code = _CODES.get(kind, "invalid_type" if kind.endswith("_type") or kind == "model_type" else "invalid_value")
        raise ApiError(400, message, param=param or None, code=code) from None
