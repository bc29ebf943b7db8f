"""The prompt's log-probabilities that ``/v1/completions`` returns with ``echo``, in OpenAI's
legacy ``logprobs`` shape: one entry per prompt token, the first ``null`` (nothing comes
before it), the others the model's raw log-probability of the token given the tokens before
it (:meth:`reprolm.Model.score`), whatever ``logprobs_mode`` the generated tokens use."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._model import Model

__all__ = ["prompt_logprobs", "joined"]


def prompt_logprobs(model: Model, ids: list[int], top: int, logprob: Callable[[float], float]) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` of the prompt ``ids``
    with the ``top`` most probable tokens at each position (offsets from 0, each token's text
    its bytes decoded; ``logprob`` makes a log-probability JSON-safe)."""
    texts = [model.token_bytes(t).decode("utf-8", errors="replace") for t in ids]
    token_logprobs: list[Optional[float]] = [None]
    top_logprobs: list[Optional[dict[str, float]]] = [None]
    if len(ids) > 1:
        score = model.score(ids, top_logprobs=top)
        token_logprobs += [logprob(lp) for lp in score.logprobs]
        top_logprobs += [{_text(model, t): logprob(lp) for t, lp in alternatives}
                         for alternatives in score.top_logprobs]
    offsets, offset = [], 0
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": texts, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def joined(prompt: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
    """The prompt's entries followed by the generated tokens' (same keys)."""
    return {key: prompt[key] + generated[key] for key in prompt}


def _text(model: Model, token: int) -> str:
    return model.token_bytes(token).decode("utf-8", errors="replace")

