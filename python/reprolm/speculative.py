"""Speculative decoding settings and statistics: :class:`Speculative`, :class:`SpeculationStats`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional, Union

from . import _core

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
        from ._callable import CallableModel
        from ._model import Model

        drafter = self.drafter
        if isinstance(drafter, Model):
            core: object = drafter._engine
        elif isinstance(drafter, CallableModel):
            core = drafter._core
        else:
            core = drafter
        return _core.Speculative(core, draft_tokens=self.draft_tokens, adaptive=self.adaptive,
                                 ngram_min=self.ngram_min, ngram_max=self.ngram_max)


def _settings(speculative: Union[Drafter, Speculative, None]) -> Optional[_core.Speculative]:
    """The core settings of a ``speculative=`` argument (a drafter, or :class:`Speculative`)."""
    if speculative is None:
        return None
    if not isinstance(speculative, Speculative):
        speculative = Speculative(speculative)
    return speculative._core_settings()


@dataclass(frozen=True)
class SpeculationStats:
    """What speculative decoding did for one generation."""

    drafted: int
    """Tokens the drafter proposed (verified, or discarded after a rejection or the end)."""
    accepted: int
    """Drafted tokens kept."""
    passes: int
    """Target forward passes that produced tokens (each yields the accepted drafts plus one)."""
    drafting_passes: int
    """Passes that verified at least one draft."""

    @property
    def acceptance_rate(self) -> float:
        """``accepted / drafted`` (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Drafts accepted per pass that had drafts (0.0 when none had)."""
        return self.accepted / self.drafting_passes if self.drafting_passes else 0.0

    @classmethod
    def _from_core(cls, stats: Optional[tuple[int, int, int, int]]) -> Optional["SpeculationStats"]:
        return None if stats is None else cls(*stats)
