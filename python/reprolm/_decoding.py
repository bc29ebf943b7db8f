"""Result types of decoding: :class:`StepInfo` (per-step statistics) and :class:`Beam`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


__all__ = ["StepInfo", "Beam"]

# What the extension returns for one step and one beam.
_StepTuple = tuple[int, float, float, float, list[tuple[int, float]]]
_BeamTuple = tuple[list[int], float, float, bool]


@dataclass(frozen=True)
class StepInfo:
    """Statistics of one decoding step, under the final distribution q the token was drawn
    from (after penalties, masks, temperature and truncation).

    For greedy decoding (temperature 0) q is the point mass on the chosen token: logprob 0,
    entropy 0, removed mass 0.
    """

    token_id: int
    """The chosen token."""
    logprob: float
    """ln q(token_id), natural log."""
    entropy: float
    """H(q) in nats."""
    removed_mass: float
    """1 - p(S): the post-temperature probability mass that top-k, top-p and min-p removed."""
    alternatives: list[tuple[int, float]]
    """The most probable tokens under q as ``(token_id, ln q)``, probability descending, ties
    by ascending id (as many as requested, fewer if q has fewer tokens)."""

    @classmethod
    def _from_core(cls, step: _StepTuple) -> "StepInfo":
        token, logprob, entropy, removed, alternatives = step
        return cls(token, logprob, entropy, removed, [(int(i), float(lp)) for i, lp in alternatives])


@dataclass(frozen=True)
class Beam:
    """One hypothesis of beam search."""

    token_ids: list[int]
    """The generated ids (ending with the end-of-sequence token when ``finished``)."""
    text: str
    """The text of ``token_ids`` (empty for a :class:`CallableModel`, which has no tokenizer)."""
    logprob: float
    """ln p(token_ids | prompt): the sum of the model's log-probabilities at temperature 1."""
    score: float
    """``logprob / len(token_ids) ** length_penalty`` (``logprob`` when the penalty is 0); the
    ranking key."""
    finished: bool
    """Whether the hypothesis ended with the end-of-sequence token."""

    @classmethod
    def _from_core(cls, beam: _BeamTuple, detokenize: Callable[[list[int]], str]) -> "Beam":
        ids, logprob, score, finished = beam
        return cls(list(ids), detokenize(ids), logprob, score, finished)
