"""Decoding on a model given as a Python callable: :class:`CallableModel`."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy.typing as npt

from . import _args, _core
from ._decoding import Beam, StepInfo
from ._params import GenerationParams, resolve
from ._results import Completion, SpeculationStats
from .sampling import LogprobsMode, Sampler
from .speculative import Drafter, Speculative

__all__ = ["CallableModel"]


def _no_text(ids: list[int]) -> str:
    return ""


class CallableModel:
    """A language model given as a function from the context to the next-token logits, for
    running every decoding strategy on toy models (greedy decoding missing the most probable
    sequence, for one: docs/theory.md, "Greedy decoding and beam search").

    ``fn(prefix)`` receives the context so far as a ``list[int]`` (the prompt, then the
    generated ids) and returns the ``vocab_size`` logits of the next token: a 1-D NumPy array
    or a sequence of floats. The logits are rounded to float32, the precision of a real
    model's logits; ``-inf`` gives a token probability 0, while NaN, ``+inf``, values outside
    the float32 range and a wrong length raise :class:`reprolm.InvalidArgumentError`, and a
    return value that is not a sequence of floats raises :class:`TypeError`. An exception
    raised by ``fn`` propagates unchanged.

    The token loop, the sampler and beam search run in Rust, exactly the code :class:`Model`
    uses; the GIL is held only while ``fn`` runs. Results have no text: a callable model has
    no tokenizer, so ``Completion.text`` and ``Beam.text`` are empty.
    """

    def __init__(
        self, fn: Callable[[list[int]], npt.ArrayLike], vocab_size: int, eos_id: Optional[int] = None
    ) -> None:
        self._core = _core.CallableModel(fn, vocab_size, eos_id)

    @property
    def fn(self) -> Callable[[list[int]], npt.ArrayLike]:
        """The model function."""
        return self._core.function

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def eos_id(self) -> Optional[int]:
        """The end-of-sequence token (generation and beam search stop at it), or None."""
        return self._core.eos_id

    def __repr__(self) -> str:
        return f"CallableModel({self.fn!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"

    @property
    def _drafter_core(self) -> _core.CallableModel:
        """What the extension takes as this model drafting (:class:`Speculative`)."""
        return self._core

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop_token_ids: Sequence[int] = (),
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Completion:
        """Autoregressive generation from ``prompt_ids``, as :meth:`Model.generate`: greedy
        unless a :class:`Sampler` is given; stops at ``eos_id``, at a token of
        ``stop_token_ids`` or after ``max_tokens`` tokens; ``logprobs=N`` fills
        ``Completion.steps``. ``speculative`` decodes speculatively, as in
        :meth:`Model.generate`, with ``"lookup"`` or a draft :class:`CallableModel` (or
        :class:`Model`) of the same vocabulary; the drafts are scored one prefix at a time.
        ``params`` gives these settings as one :class:`GenerationParams` instead (stop strings
        and grammars need text, which a callable model does not have)."""
        ids = _args.token_ids(prompt_ids, "prompt_ids", self.vocab_size)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop_token_ids=stop_token_ids,
                           logprobs=logprobs, logprobs_mode=logprobs_mode, speculative=speculative)
        _args.token_ids(settings.stop_token_ids, "stop_token_ids", self.vocab_size)
        out_ids, reason, steps, stats = self._core.generate(ids, settings._core)
        infos = [StepInfo._from_core(s) for s in steps]
        return Completion("", out_ids, reason, ids, [i.logprob for i in infos], infos, SpeculationStats._from_core(stats))

    def beam_search(
        self,
        prompt_ids: Sequence[int],
        *,
        beam_width: int,
        max_tokens: int,
        length_penalty: float = 0.0,
    ) -> list[Beam]:
        """Beam search as :meth:`Model.beam_search`: up to ``beam_width`` hypotheses ranked
        by score."""
        beams = self._core.beam_search(
            _args.token_ids(prompt_ids, "prompt_ids", self.vocab_size), beam_width=beam_width, max_tokens=max_tokens, length_penalty=float(length_penalty)
        )
        return [Beam._from_core(b, _no_text) for b in beams]
