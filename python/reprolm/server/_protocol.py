"""Conversion between the OpenAI protocol and the engine: request bodies to token ids and
:class:`GenerationParams` (one per choice), engine errors to HTTP answers, and results to
OpenAI's log-probability and usage objects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from .. import errors
from .._decoding import StepInfo
from .._model import Model
from .._params import GenerationParams
from ..grammar import Grammar
from ..sampling import Sampler
from ..tools import strict_schema
from ._compat import repetition_of
from ._errors import ApiError
from ._schema import ChatBody, CompletionBody

if TYPE_CHECKING:
    from ._state import Choice

SEED_MODULUS = 2**64
# What JSON can carry for a log-probability of -inf (a token q gives no mass), as OpenAI does.
NEG_INF_LOGPROB = -9999.0


# ---- request -> engine ------------------------------------------------------------------------


def engine_error(e: errors.ReprolmError, prompt_param: str) -> ApiError:
    """The HTTP answer to an engine error raised by ``submit``."""
    if isinstance(e, errors.EngineOverloadedError):
        return ApiError(429, f"the engine's queue is full: {e}", code="server_overloaded",
                        headers={"Retry-After": "1"})
    if isinstance(e, errors.ContextOverflowError):
        return ApiError(400, f"the prompt plus max_tokens do not fit the context: {e}", param="max_tokens",
                        code="context_length_exceeded")
    if isinstance(e, (errors.TokenOutOfRangeError, errors.EmptyPromptError)):
        return ApiError(400, f"invalid value for '{prompt_param}': {e}", param=prompt_param, code="invalid_value")
    if isinstance(e, errors.EngineStoppedError):
        return ApiError(503, f"the engine stopped: {e}", code="engine_stopped")
    if isinstance(e, errors.GrammarError):
        return ApiError(400, f"invalid value for 'response_format': {e}", param="response_format", code="invalid_value")
    if isinstance(e, (errors.InvalidInputError, errors.ChatTemplateError)):
        return ApiError(400, str(e), code="invalid_value")
    return ApiError(500, f"{type(e).__name__}: {e}", code="internal_error")


def choice_seed(seed: Optional[int], i: int) -> int:
    """Choice i samples with ``(seed + i) mod 2**64`` (seed 0 when not given)."""
    return ((seed or 0) + i) % SEED_MODULUS


def response_grammar(body: Union[CompletionBody, ChatBody]) -> Optional[Grammar]:
    """The grammar of ``response_format``: none for text, any JSON object for
    ``json_object``, the given schema for ``json_schema`` (with ``"strict": true``, as
    OpenAI's strict mode, objects hold only their declared properties: :func:`strict_schema`)."""
    fmt = body.response_format
    if fmt is None or fmt["type"] == "text":
        return None
    schema = {"type": "object"} if fmt["type"] == "json_object" else fmt["json_schema"].get("schema", {})
    if fmt["type"] == "json_schema" and fmt["json_schema"].get("strict") is True:
        schema = strict_schema(schema)
    try:
        return Grammar.json_schema(schema)
    except errors.GrammarError as e:
        raise ApiError(400, f"invalid value for 'response_format': {e}", param="response_format",
                       code="invalid_value") from None


def _samplers(body: Union[CompletionBody, ChatBody], vocab_size: int) -> list[Sampler]:
    """The sampler of each of the ``n`` choices: the body's settings, choice i seeded with
    :func:`choice_seed`."""
    bias: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        token = int(key)
        if token >= vocab_size:
            raise ApiError(400, f"invalid value for 'logit_bias': token {token} is outside the vocabulary "
                                f"(0..{vocab_size - 1})", param="logit_bias", code="invalid_value")
        bias[token] = value
    repetition_penalty, penalty_window = repetition_of(body.repetition_penalty, body.repeat_penalty,
                                                       body.repeat_last_n)
    return [Sampler(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        min_p=body.min_p or 0.0,
        repetition_penalty=repetition_penalty,
        penalty_window=penalty_window,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=bias,
        seed=choice_seed(body.seed, i),
        logprobs_mode=body.logprobs_mode or "raw",
    ) for i in range(body.n)]


def generation_params(
    body: Union[CompletionBody, ChatBody], vocab_size: int, limits: Sequence[int], *, logprobs: Optional[int],
    grammar: Optional[Grammar],
) -> list[list[GenerationParams]]:
    """The settings of choice ``i`` of prompt ``p`` (``[p][i]``): the body's sampling
    settings, stop strings, ``logprobs`` and ``grammar``, with the prompt's token limit
    ``limits[p]``. A value the engine refuses is a 400 naming it."""
    try:
        samplers = _samplers(body, vocab_size)
        stop = stop_strings(body.stop)
        return [[GenerationParams(max_tokens=limit, sampler=sampler, stop=stop, logprobs=logprobs, grammar=grammar)
                 for sampler in samplers] for limit in limits]
    except errors.InvalidArgumentError as e:
        raise ApiError(400, str(e), code="invalid_value") from None


def stop_strings(stop: Optional[Union[str, list[str]]]) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def max_tokens_for(requested: Optional[int], prompt_len: int, context: int, prompt_param: str) -> int:
    """``requested``, or what is left of the context when it is None; 400 if it does not fit."""
    if prompt_len > context:
        raise ApiError(400, f"the prompt has {prompt_len} tokens but the context holds {context}",
                       param=prompt_param, code="context_length_exceeded")
    if requested is None:
        return context - prompt_len
    if prompt_len + requested > context:
        raise ApiError(400, f"the prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceed the context "
                            f"length ({context})", param="max_tokens", code="context_length_exceeded")
    return requested


def token_limit(requested: Optional[int], prompt_len: int, context: int, prompt_param: str, param: str) -> int:
    """:func:`max_tokens_for`, its errors naming ``param``, the field that set the limit."""
    try:
        return max_tokens_for(requested, prompt_len, context, prompt_param)
    except ApiError as e:
        if e.param == "max_tokens":
            e.param = param
            if param == "n_predict":
                e.message = e.message.replace("max_tokens", param)
        raise


def prompt_ids(model: Model, prompt: Union[str, list[str], list[int], list[list[int]]]) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of the prompt field's prompts."""
    if isinstance(prompt, str):
        items: list[Union[str, list[int]]] = [prompt]
    elif all(isinstance(p, int) for p in prompt):
        items = [[int(p) for p in prompt]]  # type: ignore[arg-type]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    ids: list[list[int]] = []
    texts: list[str] = []
    vocab = model.config.vocab_size
    for k, item in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{k}]"
        if isinstance(item, str):
            ids.append(model.tokenize(item, special=True))
            texts.append(item)
        else:
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"invalid value for '{param}': token id {bad} is outside the vocabulary "
                                    f"(0..{vocab - 1})", param=param, code="invalid_value")
            ids.append(item)
            texts.append(model.detokenize(item))
        if not ids[-1]:
            raise ApiError(400, f"invalid value for '{param}': the prompt is empty", param=param,
                           code="invalid_value")
    return ids, texts


# ---- engine -> response -----------------------------------------------------------------------


def json_logprob(x: float) -> float:
    return x if x > NEG_INF_LOGPROB else NEG_INF_LOGPROB


def token_text(model: Model, token: int) -> str:
    return model.token_bytes(token).decode("utf-8", errors="replace")


def reported_steps(steps: list[StepInfo], finish_reason: Optional[str]) -> list[StepInfo]:
    """The steps whose tokens are reported: all but the end-of-sequence token, which adds no text."""
    return steps[:-1] if finish_reason == "eos" and steps else steps


def openai_finish_reason(reason: Optional[str]) -> Optional[str]:
    """OpenAI's finish_reason: the engine's "eos" and "stop" are both "stop"."""
    return None if reason is None else ("length" if reason == "length" else "stop")


def completion_logprobs(model: Model, steps: list[StepInfo], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object for ``steps``, text offsets from ``offset``."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for s in steps:
        text = token_text(model, s.token_id)
        tokens.append(text)
        token_logprobs.append(json_logprob(s.logprob))
        top.append({token_text(model, t): json_logprob(lp) for t, lp in s.alternatives})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(model: Model, steps: list[StepInfo]) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        raw = model.token_bytes(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": json_logprob(logprob), "bytes": list(raw)}

    return {"content": [{**entry(s.token_id, s.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in s.alternatives]} for s in steps],
            "refusal": None}


def usage(prompts: Sequence[list[int]], completion_tokens: int, choices: Sequence[Choice]) -> dict[str, Any]:
    prompt_tokens = sum(len(p) for p in prompts)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens(choices)}}


def cached_tokens(choices: Sequence[Choice]) -> int:
    """Prompt tokens read from the prefix cache, counted like ``prompt_tokens`` (once per
    prompt): those of each prompt's first choice."""
    first: dict[int, int] = {}
    for c in choices:
        first.setdefault(c.prompt_index, c.request.cached_tokens)
    return sum(first.values())
