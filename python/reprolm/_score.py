"""Scoring a given continuation: :class:`Score`, the result of :meth:`reprolm.Model.score`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Score"]


@dataclass(frozen=True)
class Score:
    """The model's log-probabilities of a continuation given its context, from one forward
    pass over context + continuation.

    Every log-probability is *raw*: ln softmax(z) of the model's logits at the position before
    the token, with no temperature, penalty or truncation (natural log). The i-th entry of each
    list belongs to ``token_ids[i]``.
    """

    context_ids: list[int]
    """The ids the continuation is conditioned on (never empty)."""
    token_ids: list[int]
    """The scored continuation's ids."""
    logprobs: list[float]
    """ln p(token_ids[i] | context_ids + token_ids[:i])."""
    is_greedy: list[bool]
    """Whether greedy decoding would have chosen ``token_ids[i]`` there (it is the argmax of
    the logits; on ties the lowest id is the greedy choice)."""
    top_logprobs: list[list[tuple[int, float]]] = field(repr=False, default_factory=list)
    """At each position, the ``top_logprobs`` most probable tokens as ``(id, ln p)``,
    probability descending, ties by ascending id (empty lists unless requested)."""

    @property
    def logprob(self) -> float:
        """ln p(continuation | context): the sum of :attr:`logprobs` (correctly rounded,
        ``math.fsum``)."""
        return math.fsum(self.logprobs)

    @property
    def greedy(self) -> bool:
        """Whether greedy decoding would generate exactly the continuation (every token is
        the greedy choice), as lm-evaluation-harness's ``is_greedy``."""
        return all(self.is_greedy)
