"""The results of generation: :class:`Completion`, :class:`Chunk` and
:class:`SpeculationStats`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional

from ._decoding import StepInfo

if TYPE_CHECKING:
    from .tools import ToolCall

__all__ = ["Completion", "Chunk", "FinishReason", "SpeculationStats"]

FinishReason = Literal["eos", "length", "stop", "tool_calls"]


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


@dataclass(frozen=True)
class Completion:
    """The result of :meth:`Model.generate` and :meth:`Model.chat`."""

    text: str
    """The generated text (special tokens rendered as text), cut before the first stop string.
    The end-of-sequence or stop token that ended generation adds no text."""
    token_ids: list[int]
    """The generated ids, including the end-of-sequence or stop token that ended generation."""
    finish_reason: FinishReason
    """``"eos"`` (end-of-sequence token), ``"stop"`` (a stop token or stop string),
    ``"length"`` (max_tokens), or ``"tool_calls"`` (a chat reply that called tools)."""
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)
    """The prompt as token ids."""
    logprobs: list[float] = field(repr=False, default_factory=list)
    """ln q(token) for each generated id under the sampler's final distribution q (0.0 when
    decoding greedily, where q is a point mass)."""
    steps: list[StepInfo] = field(repr=False, default_factory=list)
    """Per-step statistics, one per generated token, when requested with ``logprobs=N``
    (else empty)."""
    speculation: Optional[SpeculationStats] = field(repr=False, default=None)
    """What speculative decoding did, for a generation with ``speculative=`` (else None)."""
    tool_calls: "list[ToolCall]" = field(default_factory=list)
    """The tools the model called (:meth:`Model.chat` with ``tools``; else empty)."""
    cached_tokens: int = field(repr=False, compare=False, default=0)
    """Prompt tokens whose keys and values came from the batch engine's prefix cache rather
    than being computed (0 for sessions and speculative decoding). The results are the same
    bits either way, so completions that differ only here compare equal."""


@dataclass(frozen=True)
class Chunk:
    """One piece of a streamed generation (:meth:`Model.stream`): usually one token.

    ``text`` is always valid UTF-8 and may be empty: a character split across tokens is
    emitted once complete, and text that may be the start of a stop string is held back until
    that is decided. Joined, the texts of all chunks are the :class:`Completion` text.
    """

    text: str
    """The text that became final with this chunk."""
    token_ids: list[int]
    """The ids generated in this chunk (one, or none in the final chunk of ``max_tokens=0``)."""
    finish_reason: Optional[FinishReason]
    """Set on the last chunk only."""
    logprobs: list[float] = field(repr=False, default_factory=list)
    """ln q(token) for each id of the chunk, as in :attr:`Completion.logprobs`."""
    step: Optional[StepInfo] = field(repr=False, default=None)
    """The token's statistics (as in :attr:`Completion.steps`), when the request asked for
    them with ``logprobs=N``."""
    speculation: Optional[SpeculationStats] = field(repr=False, default=None)
    """On the last chunk of a speculative stream: what speculative decoding did."""
