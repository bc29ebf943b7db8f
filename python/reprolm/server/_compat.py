"""Compatibility with other servers' clients: request fields of llama-server (llama.cpp's HTTP server) whose meaning maps exactly onto
reprolm's, so that clients written for it work unchanged, and the ``logprobs_mode`` field
(vLLM's name). Fields that would mean something else here are not accepted: they stay
unknown fields, answered with a 400 naming them. Also vLLM's ``GET /tokenizer_info``, through which
evaluation harnesses tokenize with the server's own tokenizer.

==================  ==================================================================
``cache_prompt``    accepted and ignored: answers never depend on caching here.
``n_predict``       ``max_tokens``; -1 (llama-server's "no limit") is the rest of the
                    context, as an absent ``max_tokens`` on chat.
``repeat_penalty``  ``repetition_penalty`` (both divide positive and multiply negative
                    logits of every distinct token of the window once), over the last
                    ``repeat_last_n`` tokens, prompt included, as llama-server feeds the
                    prompt to its penalty stage; llama-server's default window is 64.
``repeat_last_n``   that window (also of ``repetition_penalty``, whose default window is
                    the whole history): -1 is the whole context, 0 turns the penalty off.
``top_k``, ``min_p`` the same definitions (already reprolm's fields).
==================  ==================================================================
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .._model import Model
from ._errors import ApiError

__all__ = ["CompatFields", "LLAMA_SERVER_REPEAT_LAST_N", "max_tokens_of", "repetition_of", "tokenizer_info_of"]

LLAMA_SERVER_REPEAT_LAST_N = 64
"""llama-server's default ``repeat_last_n``: the window ``repeat_penalty`` looks at."""


class CompatFields(BaseModel):
    """The fields, mixed into both generation endpoints' bodies (which forbid unknown fields
    and validate strictly)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    logprobs_mode: Optional[Literal["raw", "processed"]] = None
    """``raw`` (the default): log-probabilities of the model's softmax before any
    processing, as OpenAI and vLLM report them; ``processed``: of the distribution the token
    was drawn from (after penalties, temperature and truncation)."""
    cache_prompt: Optional[bool] = None
    n_predict: Optional[int] = Field(default=None, ge=-1)
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)
    repeat_last_n: Optional[int] = Field(default=None, ge=-1)


def max_tokens_of(max_tokens: Optional[int], fields_set: set[str], n_predict: Optional[int],
                  param: str = "max_tokens") -> tuple[Optional[int], str]:
    """The requested token limit (None: the rest of the context) and the field that set it,
    from ``max_tokens`` (named ``param``) or llama-server's ``n_predict``; 400 if both are
    given and differ."""
    if n_predict is None:
        return max_tokens, param
    limit = None if n_predict == -1 else n_predict
    if param in fields_set and max_tokens != limit:
        raise ApiError(400, f"invalid value for 'n_predict': it is llama-server's name for '{param}'; give one "
                            f"of them (or equal values)", param="n_predict", code="invalid_value")
    return limit, "n_predict"


def repetition_of(repetition_penalty: Optional[float], repeat_penalty: Optional[float],
                  repeat_last_n: Optional[int]) -> tuple[float, Optional[int]]:
    """(repetition penalty, penalty window or None for the whole history) from reprolm's
    ``repetition_penalty`` or llama-server's ``repeat_penalty``, windowed by
    ``repeat_last_n`` (default: the whole history for ``repetition_penalty``, llama-server's
    64 for ``repeat_penalty``; without a penalty the window changes nothing)."""
    if repeat_penalty is not None and repetition_penalty is not None:
        raise ApiError(400, "invalid value for 'repeat_penalty': it is llama-server's name for "
                            "'repetition_penalty'; give one of them", param="repeat_penalty", code="invalid_value")
    if repeat_penalty is not None:
        penalty, default_window = repeat_penalty, LLAMA_SERVER_REPEAT_LAST_N
    else:
        penalty, default_window = (1.0 if repetition_penalty is None else repetition_penalty), None
    window = default_window if repeat_last_n is None else repeat_last_n
    return penalty, (None if window == -1 else window)


def tokenizer_info_of(model: Model, context_length: int) -> dict[str, Any]:
    """``GET /tokenizer_info`` (vLLM's endpoint, which evaluation harnesses use to tokenize
    through the server): the special tokens' texts (None when the model has none), the chat
    template and the context length."""
    def text(token: Optional[int]) -> Optional[str]:
        return None if token is None else model.token_bytes(token).decode("utf-8", errors="replace")

    return {"bos_token": text(model.config.bos_id), "eos_token": text(model.config.eos_id),
            "chat_template": model.chat_template, "model_max_length": context_length}
