"""The user-facing model API: :class:`Model`, :class:`Session` and :class:`Completion`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _core
from ._decoding import Beam, StepInfo, _alternatives_count
from ._download import default_model_path
from .sampling import Sampler

__all__ = ["Model", "Session", "Completion", "Prompt", "FinishReason"]

Prompt = Union[str, Sequence[int]]
FinishReason = Literal["eos", "length", "stop"]


@dataclass(frozen=True)
class Completion:
    """The result of :meth:`Model.generate`."""

    text: str
    """The generated text (special tokens rendered as text)."""
    token_ids: list[int]
    """The generated ids, including the end-of-sequence or stop token that ended generation."""
    finish_reason: FinishReason
    """``"eos"`` (end-of-sequence token), ``"stop"`` (a stop token), or ``"length"`` (max_tokens)."""
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)
    """The prompt as token ids."""
    steps: list[StepInfo] = field(repr=False, default_factory=list)
    """Per-step statistics, one per generated token, when requested with ``logprobs=N``
    (else empty)."""


class Model:
    """A Llama-family model loaded from a GGUF file.

    Every result is bitwise reproducible: the same file, inputs and settings give the same
    logits and tokens for any thread count and any split of the prompt into chunks.
    """

    def __init__(self, engine: _core.Engine) -> None:
        self._engine = engine

    @classmethod
    def load(cls, path: Union[str, os.PathLike[str]], *, threads: Optional[int] = None,
             isa: Optional[str] = None) -> "Model":
        """Loads a GGUF file.

        ``threads``: worker threads (default: all cores). ``isa``: force a kernel path,
        ``"scalar"``, ``"avx2"`` or ``"avx512"`` (default: ``REPROLM_ISA``, else the best
        the CPU has); the results are the same bits on every path.
        """
        return cls(_core.Engine(Path(path), threads=threads, isa=isa))

    @classmethod
    def default(cls, *, threads: Optional[int] = None, isa: Optional[str] = None) -> "Model":
        """Loads SmolLM2-135M-Instruct (Q4_1), fetching it into the cache on first use."""
        return cls.load(default_model_path(), threads=threads, isa=isa)

    @property
    def config(self) -> _core.ModelConfig:
        """Hyper-parameters read from the file's metadata."""
        return self._engine.config

    @property
    def path(self) -> Path:
        return self._engine.path

    @property
    def threads(self) -> int:
        return self._engine.threads

    @property
    def isa(self) -> str:
        """The kernel path in use."""
        return self._engine.isa

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, threads={self.threads}, isa={self.isa!r})"

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text``. With ``special=True``, special-token strings such as
        ``<|im_start|>`` become their single ids; otherwise they are tokenized as text."""
        return self._engine.tokenize(text, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids``: their bytes joined, then decoded as UTF-8."""
        return self._engine.detokenize(list(ids))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (possibly part of a UTF-8 character)."""
        return self._engine.token_bytes(token_id)

    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits at every position of one fresh forward pass, shape ``(len(ids), vocab_size)``."""
        return self._engine.logits(list(ids))

    def session(self, *, context_length: Optional[int] = None) -> "Session":
        """A new session: one sequence with its own KV cache (default capacity: the model's
        context length)."""
        return Session(_core.Session(self._engine, context_length=context_length))

    def _prompt_ids(self, prompt: Prompt, special: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, special=special)
        return list(prompt)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
    ) -> Completion:
        """Generates a continuation of ``prompt`` (text, or token ids).

        Decoding is greedy unless a :class:`Sampler` is given. Generation stops at the
        model's end-of-sequence token, at a token of ``stop_token_ids``, or after
        ``max_tokens`` tokens. With ``special=True`` (the default) special-token strings in
        a text prompt are parsed as special tokens. With ``logprobs=N`` (N >= 0) the
        completion's ``steps`` report, for every token, its log-probability, the entropy and
        removed mass of the distribution it was drawn from, and the N most probable
        alternatives (see :class:`StepInfo`).
        """
        ids = self._prompt_ids(prompt, special)
        sampler = sampler or Sampler.greedy()
        alternatives = _alternatives_count(logprobs)
        if alternatives is not None:
            sampler = dataclasses.replace(sampler, top_logprobs=alternatives)
        out_ids, reason, steps = _core.engine_generate(
            self._engine, ids, max_tokens=max_tokens, sampler=sampler._core,
            stop_token_ids=list(stop_token_ids), steps=alternatives is not None,
        )
        return Completion(self.detokenize(out_ids), out_ids, reason, ids, [StepInfo._from_core(s) for s in steps])

    def beam_search(
        self,
        prompt: Prompt,
        *,
        beam_width: int,
        max_tokens: int,
        length_penalty: float = 0.0,
        special: bool = True,
    ) -> list[Beam]:
        """Beam search (definition 3.2) of width ``beam_width`` over at most ``max_tokens``
        tokens: up to ``beam_width`` hypotheses ranked by score, best first.

        Scores are log-probabilities at temperature 1 divided by ``len ** length_penalty``.
        Ties between candidates go to the lexicographically smaller token sequence; a
        hypothesis ending with the end-of-sequence token is set aside as finished if it ranks
        among the first ``beam_width`` candidates, as in transformers. Width 1 is greedy
        decoding.
        """
        ids = self._prompt_ids(prompt, special)
        beams = _core.engine_beam_search(
            self._engine, ids, beam_width=beam_width, max_tokens=max_tokens, length_penalty=float(length_penalty)
        )
        return [Beam._from_core(b, self.detokenize) for b in beams]


class Session:
    """One sequence and its KV cache, fed incrementally."""

    def __init__(self, core: _core.Session) -> None:
        self._core = core

    @property
    def tokens(self) -> list[int]:
        """The ids processed so far."""
        return self._core.tokens

    @property
    def context_length(self) -> int:
        """How many positions the cache holds."""
        return self._core.context_length

    def prefill(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Appends ``ids``; returns the logits after the last of them."""
        return self._core.feed(list(ids))

    def step(self, token_id: int) -> npt.NDArray[np.float32]:
        """Appends one token; returns the logits after it."""
        return self._core.feed([token_id])

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` tokens (their cache stays valid) and drops the rest."""
        self._core.truncate(n)
