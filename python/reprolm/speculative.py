"""Speculative decoding settings: :class:`Speculative` (and its statistics,
:class:`SpeculationStats`, a result of generation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Union

from . import _core
from ._results import SpeculationStats

if TYPE_CHECKING:
    from ._callable import CallableModel
    from ._model import Model

__all__ = ["Speculative", "SpeculationStats", "Drafter"]

Drafter = Union[Literal["lookup"], "Model", "CallableModel"]
"""A drafter: ``"lookup"`` (prompt lookup), a :class:`Model` or a :class:`CallableModel` with the
target's vocabulary."""


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding: ``drafter`` proposes up to ``draft_tokens`` tokens, the target
    scores them in one multi-token pass and keeps the longest accepted prefix plus one token
    of its own.

    ``drafter`` is ``"lookup"`` (prompt lookup: what followed the most recent earlier
    occurrence of the context's last n tokens, n from ``ngram_max`` down to ``ngram_min``),
    or a draft :class:`Model` (or, for a :class:`CallableModel` target, a
    :class:`CallableModel`) with the same vocabulary. With ``adaptive=True`` the number of
    drafts per pass adapts to the acceptance (doubling after a fully accepted pass, falling
    to one more than the accepted count after a rejection), never above ``draft_tokens``, and
    point-mass drafts (prompt lookup, a greedy draft model) that keep failing at once are
    paused for a growing number of passes.

    Neither ``draft_tokens`` nor ``adaptive`` changes any result, only the speed: greedy
    output, and sampled output with prompt lookup, are the plain decoding's bits; sampled
    output with a draft model is distributed exactly as plain sampling's, and for a given
    seed and drafter it is the same tokens for every k.
    """

    drafter: Drafter
    draft_tokens: int = 8
    adaptive: bool = True
    ngram_min: int = 1
    ngram_max: int = 3

    def _core_settings(self) -> _core.Speculative:
        # A Model or CallableModel drafts through its extension object (`_drafter_core`);
        # the extension names anything else that is not "lookup".
        core = getattr(self.drafter, "_drafter_core", self.drafter)
        return _core.Speculative(core, draft_tokens=self.draft_tokens, adaptive=self.adaptive,
                                 ngram_min=self.ngram_min, ngram_max=self.ngram_max)
