"""Request bodies read for the engine: each endpoint's JSON validated, checked against the
server (model ready, model name) and converted once into what its handler submits. The
handlers in ``_app`` and the request fuzz target both build requests here."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._model import Model
from .._params import GenerationParams
from ._compat import max_tokens_of
from ._errors import ApiError
from ._protocol import generation_params, prompt_ids, response_grammar, token_limit
from ._schema import ChatBody, CompletionBody, DetokenizeBody, TokenizeBody, validate
from ._state import Server
from ._tools import ChatPrompt, chat_prompt


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A ``POST /v1/completions`` body for the engine: its prompts as token ids and as text,
    and the settings of choice ``i`` of prompt ``p`` (``params[p][i]``)."""

    model: Model
    body: CompletionBody
    prompts: list[list[int]]
    texts: list[str]
    params: list[list[GenerationParams]]


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A ``POST /v1/chat/completions`` body for the engine: the rendered prompt (with its
    tools and grammar) and the settings of each choice (``params[0][i]``)."""

    model: Model
    body: ChatBody
    prompt: ChatPrompt
    params: list[list[GenerationParams]]


def completion_request(server: Server, data: Any) -> CompletionRequest:
    model = server.ready_model()
    body: CompletionBody = validate(CompletionBody, data)
    server.check_model_name(body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise ApiError(400, "invalid value for 'best_of': only best_of = n is supported", param="best_of",
                       code="invalid_value")
    prompts, texts = prompt_ids(model, body.prompt)
    requested, param = max_tokens_of(body.max_tokens, body.model_fields_set, body.n_predict)
    limits = [token_limit(requested, len(p), server.context_length, "prompt", param) for p in prompts]
    params = generation_params(body, model.config.vocab_size, limits, logprobs=body.logprobs,
                               grammar=response_grammar(body))
    return CompletionRequest(model, body, prompts, texts, params)


def chat_request(server: Server, data: Any) -> ChatRequest:
    model = server.ready_model()
    body: ChatBody = validate(ChatBody, data)
    server.check_model_name(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "invalid value for 'top_logprobs': it needs 'logprobs': true", param="top_logprobs",
                       code="invalid_value")
    prompt = chat_prompt(model, body, data, lambda: response_grammar(body))
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    requested, param = max_tokens_of(requested, body.model_fields_set, body.n_predict, param)
    limit = token_limit(requested, len(prompt.ids), server.context_length, "messages", param)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = generation_params(body, model.config.vocab_size, [limit], logprobs=logprobs, grammar=prompt.grammar)
    return ChatRequest(model, body, prompt, params)


def tokenize_request(server: Server, data: Any) -> list[int]:
    """A ``POST /tokenize`` body's text as token ids."""
    model = server.ready_model()
    body: TokenizeBody = validate(TokenizeBody, data)
    server.check_model_name(body.model)
    return model.tokenize(body.text(), special=body.parse_special)


def detokenize_request(server: Server, data: Any) -> tuple[Model, list[int]]:
    """A ``POST /detokenize`` body's token ids, each checked to be in the vocabulary."""
    model = server.ready_model()
    body: DetokenizeBody = validate(DetokenizeBody, data)
    server.check_model_name(body.model)
    vocab = model.config.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"invalid value for 'tokens': token id {bad} is outside the vocabulary "
                            f"(0..{vocab - 1})", param="tokens", code="invalid_value")
    return model, body.tokens
