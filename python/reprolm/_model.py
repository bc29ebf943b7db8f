"""The user-facing model API: :class:`Model`, :class:`Session` and :class:`Completion`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _core
from ._download import default_model_path
from .sampling import Sampler

__all__ = ["Model", "Session", "Completion", "Prompt", "FinishReason", "KvDtype", "OverflowPolicy"]

Prompt = Union[str, Sequence[int]]
FinishReason = Literal["eos", "length", "stop"]
KvDtype = Literal["f32", "f16"]
OverflowPolicy = Literal["error", "sliding_window"]


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

    def session(
        self,
        *,
        context_length: Optional[int] = None,
        kv_dtype: KvDtype = "f32",
        overflow: OverflowPolicy = "error",
        n_keep: int = 4,
    ) -> "Session":
        """A new session: one sequence with its own KV cache, a ring buffer allocated once.

        ``context_length``: positions the cache holds (default: the model's context length,
        capped so the cache takes at most half of the available memory). ``kv_dtype``:
        ``"f32"`` (default; logits match the float32 reference) or ``"f16"`` (half the
        memory and memory traffic; on SmolLM2-135M the logits stay within 0.1 of the f32
        cache's, measured at most 0.04, and are still bitwise reproducible; keys and values
        are rounded to nearest even when written). ``overflow``: what happens when the
        sequence outgrows the cache: ``"error"`` raises :class:`ContextOverflowError` before
        any work; ``"sliding_window"`` keeps attending to the first ``n_keep`` positions
        (attention sinks) and to the most recent ones that fit, as a rolling buffer with
        absolute positions and no recomputation. (Once such a window is full, a forward pass
        writes every key before any query reads, so longer inputs run one token per pass.)
        """
        core = _core.Session(
            self._engine, context_length=context_length, kv_dtype=kv_dtype, overflow=overflow, n_keep=n_keep
        )
        return Session(self, core)

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
    ) -> Completion:
        """Generates a continuation of ``prompt`` (text, or token ids).

        Decoding is greedy unless a :class:`Sampler` is given. Generation stops at the
        model's end-of-sequence token, at a token of ``stop_token_ids``, or after
        ``max_tokens`` tokens. With ``special=True`` (the default) special-token strings in
        a text prompt are parsed as special tokens.
        """
        ids = self._prompt_ids(prompt, special)
        out_ids, reason = self._engine.generate(
            ids, max_tokens=max_tokens, sampler=(sampler or Sampler.greedy())._core,
            stop_token_ids=list(stop_token_ids),
        )
        return Completion(self.detokenize(out_ids), out_ids, reason, ids)


class Session:
    """One sequence and its KV cache (the chapter's definition 7.1), fed incrementally.

    Whatever path a sequence takes here (one prefill, prefills in chunks, steps, prefix
    reuse after :meth:`truncate` or :meth:`generate`, :meth:`save` then :meth:`load`), the
    logits for the same tokens are bitwise identical (theorem 7.2).
    """

    def __init__(self, model: Model, core: _core.Session) -> None:
        self._model = model
        self._core = core

    @classmethod
    def load(cls, model: Model, path: Union[str, os.PathLike[str]]) -> "Session":
        """Restores a session written by :meth:`save`. A file saved with another model file
        raises :class:`StateModelMismatchError`, a damaged or truncated one
        :class:`StateFormatError`, one of another format version :class:`StateVersionError`."""
        return cls(model, _core.Session.load(model._engine, Path(path)))

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the tokens and the KV cache to ``path`` (a versioned, checksummed file tied
        to this model file)."""
        self._core.save(Path(path))

    @property
    def model(self) -> Model:
        return self._model

    @property
    def tokens(self) -> list[int]:
        """The ids of the sequence so far (with a sliding window, including those no longer
        attended to)."""
        return self._core.tokens

    @property
    def context_length(self) -> int:
        """How many positions the cache holds."""
        return self._core.context_length

    @property
    def kv_dtype(self) -> KvDtype:
        return self._core.kv_dtype  # type: ignore[return-value]

    @property
    def overflow(self) -> OverflowPolicy:
        return self._core.overflow  # type: ignore[return-value]

    @property
    def n_keep(self) -> int:
        """Positions pinned by the sliding window (0 with ``overflow="error"``)."""
        return self._core.n_keep

    @property
    def kv_bytes(self) -> int:
        """Bytes of keys and values held: ``2 * n_layers * n * d_kv * bytes_per_number`` for
        the ``n = min(len(tokens), context_length)`` positions in the cache."""
        return self._core.kv_bytes

    def prefill(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Appends ``ids``; returns the logits after the last of them."""
        return self._core.feed(list(ids))

    def step(self, token_id: int) -> npt.NDArray[np.float32]:
        """Appends one token; returns the logits after it."""
        return self._core.feed([token_id])

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` tokens (their cache stays valid) and drops the rest. (If a
        full sliding window has already overwritten keys the kept prefix needs, the prefix is
        recomputed on the next call, with the same result.)"""
        self._core.truncate(n)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
    ) -> Completion:
        """Like :meth:`Model.generate`, on this session's cache: ``prompt`` is the whole
        context; the prefix it shares with :attr:`tokens` is reused and only the rest is
        computed. Afterwards :attr:`tokens` holds the prompt and the generated ids (but the
        last, which was never fed). With ``overflow="error"``, ``len(prompt) + max_tokens``
        must fit in :attr:`context_length` (checked before any work)."""
        ids = self._model._prompt_ids(prompt, special)
        out_ids, reason = self._core.generate(
            ids, max_tokens=max_tokens, sampler=(sampler or Sampler.greedy())._core,
            stop_token_ids=list(stop_token_ids),
        )
        return Completion(self._model.detokenize(out_ids), out_ids, reason, ids)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"Session(tokens={len(self.tokens)}, context_length={self.context_length}, "
                f"kv_dtype={self.kv_dtype!r}, overflow={self.overflow!r})")
