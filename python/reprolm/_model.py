"""The user-facing model API: :class:`Model`, :class:`Session`, :class:`Completion` and
:class:`Chunk`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Optional, Sequence, Union, cast, overload

import numpy as np
import numpy.typing as npt

from . import _args, _core
from ._decoding import Beam, StepInfo
from ._download import fetch_default_model, resolve_model
from ._params import GenerationParams, resolve
from .errors import InvalidArgumentError, InvalidTypeError
from .grammar import Grammar
from ._request import Request, _Dispatcher
from ._results import Chunk, Completion, FinishReason, SpeculationStats
from ._score import Score
from .sampling import LogprobsMode, Sampler
from .speculative import Drafter, Speculative

__all__ = ["Model", "Session", "Request", "EngineStats", "Completion", "Chunk", "Prompt", "FinishReason", "Message", "KvDtype",
           "OverflowPolicy", "Precision"]

Prompt = Union[str, Sequence[int]]
"""A prompt: text, or token ids."""
KvDtype = Literal["f32", "f16"]
OverflowPolicy = Literal["error", "sliding_window"]
Precision = Literal["float32", "int8"]
Message = Mapping[str, Any]
"""A chat message, such as ``{"role": "user", "content": "Hi"}``."""


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """What a model's batch engine is doing (:meth:`Model.engine_stats`)."""

    waiting: int
    """Requests waiting for admission."""
    running: int
    """Sequences being computed."""
    kv_bytes: int
    """Bytes of the KV pool's blocks (16 positions each) the running sequences hold; a block
    several of them share counts once."""
    passes: int
    """Forward passes run so far."""
    prompt_tokens: int
    """Prompt tokens computed so far."""
    generated_tokens: int
    """Tokens generated so far."""
    prefix_cache_hits: int = 0
    """Prefix-cache blocks (16 positions each) that admitted prompts reused."""
    prefix_cache_misses: int = 0
    """Full prompt blocks that were not in the prefix cache (and were computed)."""
    prefix_cache_evictions: int = 0
    """Blocks the prefix cache evicted to stay within its bound or to give the pool room."""
    prefix_cache_bytes: int = 0
    """Bytes of the blocks the prefix cache indexes (they are in the KV pool)."""
    preemptions: int = 0
    """Running sequences preempted so far when the KV memory ran out (each was requeued and
    recomputed later, with the same results)."""
    kv_blocks_used: int = 0
    """Blocks of 16 positions of the KV pool the running sequences hold (a shared block once)."""
    kv_blocks_free: int = 0
    """Blocks of the KV pool no running sequence holds: free, or kept only by the prefix cache,
    which gives them back when the pool needs them."""


def _chunks(core: _core.Stream) -> Iterator[Chunk]:
    """A session stream's chunks; closing this generator (or dropping it) closes the stream.
    The last chunk of a speculative stream carries the speculation statistics."""
    try:
        for text, token_ids, reason, logprobs, _step in core:
            stats = SpeculationStats._from_core(core.speculation) if reason is not None else None
            yield Chunk(text, token_ids, reason, logprobs, speculation=stats)
    finally:
        core.close()


def _request_chunks(request: Request) -> Iterator[Chunk]:
    """A request's chunks; closing this generator (or dropping it) cancels the request."""
    with request:
        yield from request


def _is_batch(prompt: Union[Prompt, Sequence[Prompt]]) -> bool:
    """A batch is a non-empty sequence whose items are prompts rather than token ids."""
    if isinstance(prompt, str) or len(prompt) == 0:
        return False
    return not isinstance(prompt[0], (int, np.integer))


class Model:
    """A Llama-family model loaded from a GGUF file.

    Every result is bitwise reproducible: the same file, inputs and settings give the same
    logits and tokens for any thread count and any split of the prompt into chunks.
    """

    def __init__(self, loaded: _core.LoadedModel) -> None:
        self._loaded = loaded
        self._dispatcher = _Dispatcher(loaded.wait_ready)

    @property
    def _drafter_core(self) -> _core.LoadedModel:
        """What the extension takes as this model drafting (:class:`Speculative`)."""
        return self._loaded

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike[str]],
        *,
        threads: Optional[int] = None,
        isa: Optional[str] = None,
        precision: Precision = "float32",
        max_concurrent: Optional[int] = None,
        max_queue: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        kv_memory: Optional[int] = None,
        kv_dtype: KvDtype = "f32",
        prefix_cache_bytes: Optional[int] = None,
    ) -> "Model":
        """Loads a GGUF file, or a known model by name (``"smollm2-135m"``,
        ``"gemma3-270m"``: see :func:`reprolm.known_models`), fetched into the cache on first
        use (an existing file of that name is loaded instead).

        ``threads``: worker threads (default: all cores). ``isa``: force a kernel path,
        ``"scalar"``, ``"avx2"`` or ``"avx512"`` (default: ``REPROLM_ISA``, else the best
        the CPU has); the results are the same bits on every path. ``precision``:
        ``"float32"`` (default: float32 activations, reference-exact logits) or ``"int8"``
        (activations of quantized matmuls quantized to int8 per group of 32, faster;
        deterministic like float32, but not reference-exact). Other values raise
        :class:`InvalidArgumentError`.

        The batch engine that runs :meth:`generate`, :meth:`stream`, :meth:`chat` and
        :meth:`submit` takes these limits: ``max_concurrent`` sequences computed together
        (default 64), ``max_queue`` requests waiting for them (default: no limit; beyond it
        :class:`EngineOverloadedError`), ``max_batch_tokens`` rows per forward pass (default
        512), ``kv_memory`` bytes of the one pool of KV blocks (16 positions each) that all
        running sequences take theirs from as they grow (default: a quarter of the memory
        available at load time). None of them changes any result. ``kv_dtype``: the
        number type of the engine's KV caches, ``"f32"`` (default) or ``"f16"`` (half the
        memory and memory traffic, as for :meth:`session`; every result is then a
        :meth:`session` with ``kv_dtype="f16"``'s, bit for bit). ``prefix_cache_bytes``: the
        bound of the prefix cache, which keeps the pool's blocks of computed prompts (and
        generated text) so that later prompts with the same start share them instead of
        computing them (default: all of ``kv_memory``, whose blocks it gives back when running
        sequences need them; ``0`` turns it off). It changes no result either: a shared block
        has the bits of a computed one
        (:attr:`Completion.cached_tokens` tells how many prompt tokens were reused).
        """
        loaded = _core.LoadedModel(
            resolve_model(path), threads=threads, isa=isa, precision=precision, max_concurrent=max_concurrent,
            max_queue=max_queue, max_batch_tokens=max_batch_tokens, kv_memory=kv_memory,
            kv_dtype=kv_dtype, prefix_cache_bytes=prefix_cache_bytes,
        )
        return cls(loaded)

    @classmethod
    def default(cls, **options: Any) -> "Model":
        """Loads SmolLM2-135M-Instruct (Q4_1), fetching it into the cache on first use (with
        progress bars on stderr if it is a terminal); the options are :meth:`load`'s."""
        return cls.load(fetch_default_model(), **options)

    @property
    def config(self) -> _core.ModelConfig:
        """Hyper-parameters read from the file's metadata."""
        return self._loaded.config

    @property
    def path(self) -> Path:
        return self._loaded.path

    @property
    def threads(self) -> int:
        return self._loaded.threads

    @property
    def isa(self) -> str:
        """The kernel path in use."""
        return self._loaded.isa

    @property
    def kv_bytes_per_position(self) -> int:
        """Bytes of keys and values one position of a sequence takes in the batch engine's
        caches (:attr:`kv_dtype`)."""
        return self._loaded.kv_bytes_per_position

    @property
    def kv_dtype(self) -> KvDtype:
        """The number type of the batch engine's KV caches: ``"f32"`` or ``"f16"``."""
        return cast(KvDtype, self._loaded.kv_dtype)

    def engine_stats(self) -> EngineStats:
        """What the batch engine is doing now (all zeros before the first request)."""
        counts, kv_memory = self._loaded.engine_stats()
        return EngineStats(*counts, *kv_memory)

    @property
    def precision(self) -> Precision:
        """The matmul arithmetic: ``"float32"`` or ``"int8"``."""
        return cast(Precision, self._loaded.precision)

    def __repr__(self) -> str:
        return (f"Model({str(self.path)!r}, threads={self.threads}, isa={self.isa!r}, "
                f"precision={self.precision!r}, kv_dtype={self.kv_dtype!r})")

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text``. With ``special=True``, special-token strings such as
        ``<|im_start|>`` become their single ids; otherwise they are tokenized as text."""
        _args.text(text, "text")
        _args.flag(special, "special")
        return self._loaded.tokenize(text, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids``: their bytes joined, then decoded as UTF-8."""
        return self._loaded.detokenize(_args.token_ids(ids, "ids", self.config.vocab_size))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (possibly part of a UTF-8 character)."""
        return self._loaded.token_bytes(_args.token_id(token_id, "token_id", self.config.vocab_size))

    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits at every position of one fresh forward pass, shape ``(len(ids), vocab_size)``.
        The GIL is released while it computes; Ctrl-C (KeyboardInterrupt) stops it within a
        block of 256 tokens."""
        return self._loaded.logits(_args.token_ids(ids, "ids", self.config.vocab_size))

    def score(
        self,
        continuation: Prompt,
        *,
        context: Optional[Prompt] = None,
        top_logprobs: int = 0,
        special: bool = True,
    ) -> Score:
        """The log-probability of each token of ``continuation`` given ``context`` and the
        tokens before it: one fresh forward pass over context + continuation, raw
        log-probabilities (the model's softmax, no sampling settings; see :class:`Score`).

        - ``context`` and ``continuation`` both text: the pair is split as
          lm-evaluation-harness splits it, so that tokens may merge across the boundary as in
          the whole text: the ids of ``context + continuation`` after the first
          ``len(tokenize(context))`` are the continuation.
        - ``continuation`` as token ids: they follow ``context`` (its ids, or its text
          tokenized) as given.
        - no ``context``: the continuation's first token (usually the beginning-of-sequence
          token a text is tokenized with) is the context and the rest is scored.

        ``top_logprobs=N`` also lists the N most probable tokens at each position.
        ``special`` is as in :meth:`generate`. The GIL is released while it computes.
        """
        vocab = self.config.vocab_size
        _args.prompt(continuation, "continuation", vocab)
        if context is not None:
            _args.prompt(context, "context", vocab)
        if not hasattr(type(top_logprobs), "__index__"):
            raise InvalidTypeError(f"top_logprobs must be an int, got {type(top_logprobs).__name__}")
        top = int(top_logprobs)
        if not 0 <= top < 2**63:
            raise InvalidArgumentError(f"invalid value for 'top_logprobs': must be >= 0, got {top}")
        if context is None:
            ids = self._prompt_ids(continuation, special)
            start = 1
        elif isinstance(continuation, str):
            if not isinstance(context, str):
                raise InvalidTypeError("continuation must be token ids when context is token ids")
            ids = self.tokenize(context + continuation, special=special)
            start = len(self.tokenize(context, special=special))
        else:
            context_ids = self._prompt_ids(context, special)
            ids = context_ids + list(continuation)
            start = len(context_ids)
        if start < 1 or start >= len(ids):
            raise InvalidArgumentError(
                f"invalid value for 'continuation': nothing to score ({start} context and "
                f"{len(ids) - start} continuation tokens; both must be at least 1)")
        scored = _core.score(self._loaded, ids, start=start, top=top)
        return Score(ids[:start], [t for t, _, _, _ in scored], [lp for _, lp, _, _ in scored],
                     [g for _, _, g, _ in scored], [[(int(i), float(p)) for i, p in alt] for _, _, _, alt in scored])

    def session(
        self,
        *,
        context_length: Optional[int] = None,
        kv_dtype: Optional[KvDtype] = None,
        overflow: OverflowPolicy = "error",
        n_keep: int = 4,
    ) -> "Session":
        """A new session: one sequence with its own KV cache, a ring buffer allocated once.

        ``context_length``: positions the cache holds (default: the model's context length,
        capped so the cache takes at most half of the available memory). ``kv_dtype``:
        ``"f32"`` (logits match the float32 reference) or ``"f16"`` (half the
        memory and memory traffic; on SmolLM2-135M the logits stay within 0.1 of the f32
        cache's, measured at most 0.04, and are still bitwise reproducible; keys and values
        are rounded to nearest even when written); default: the model's :attr:`kv_dtype`
        (``"f32"`` unless it was loaded with another). ``overflow``: what happens when the
        sequence outgrows the cache: ``"error"`` raises :class:`ContextOverflowError` before
        any work; ``"sliding_window"`` keeps attending to the first ``n_keep`` positions
        (attention sinks) and to the most recent ones that fit, as a rolling buffer with
        absolute positions and no recomputation. (Once such a window is full, a forward pass
        writes every key before any query reads, so longer inputs run one token per pass.)
        """
        _args.optional_integer(context_length, "context_length")
        if kv_dtype is not None:
            _args.one_of(kv_dtype, "kv_dtype", ("f32", "f16"))
        _args.one_of(overflow, "overflow", ("error", "sliding_window"))
        _args.integer(n_keep, "n_keep")
        core = _core.Session(
            self._loaded, context_length=context_length, kv_dtype=self.kv_dtype if kv_dtype is None else kv_dtype,
            overflow=overflow, n_keep=n_keep,
        )
        return Session(self, core)

    def _prompt_ids(self, prompt: Prompt, special: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, special=special)
        return list(prompt)

    # A str is also a Sequence[str]; the first overload, a single prompt, is the one that
    # applies to it (as at run time), which is what mypy resolves too.
    @overload
    def generate(  # type: ignore[overload-overlap]
        self,
        prompt: Prompt,
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Completion: ...

    @overload
    def generate(
        self,
        prompt: Sequence[Prompt],
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> list[Completion]: ...

    def generate(
        self,
        prompt: Union[Prompt, Sequence[Prompt]],
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Union[Completion, list[Completion]]:
        """Generates a continuation of ``prompt`` (text, or token ids), or of each prompt of a
        list of prompts (returning a list of completions, each the same as generating that
        prompt alone).

        The settings are one :class:`GenerationParams` given as ``params``, or its fields
        given as keyword arguments (not both); they are checked before any work.

        Decoding is greedy unless a :class:`Sampler` is given. Generation stops at the
        model's end-of-sequence token, at a token of ``stop_token_ids``, once the text
        contains a string of ``stop`` (matched across token boundaries and left out of the
        text), or after ``max_tokens`` tokens. With ``special=True`` (the default)
        special-token strings in a text prompt are parsed as special tokens.

        The GIL is released while each token is computed; Ctrl-C (KeyboardInterrupt) stops
        generation within one token and leaves the model usable.

        With ``logprobs=N`` (N >= 0) the completion's ``steps`` report, for every token, its
        log-probability, the entropy and removed mass of the distribution it was drawn from,
        and the N most probable alternatives (see :class:`StepInfo`).
        ``logprobs_mode`` chooses the distribution of every reported log-probability (the
        steps' and :attr:`Completion.logprobs`): ``"processed"`` (the sampler's own setting,
        by default ``"processed"``), the final distribution the token was drawn from, or
        ``"raw"``, the model's softmax of the logits before any penalty, mask, temperature or
        truncation (see :data:`reprolm.sampling.LogprobsMode`). It never changes the tokens.

        With a :class:`Grammar`, the text follows it: each step chooses among the tokens the
        grammar allows there (the restriction of the distribution, before temperature and
        truncation), and the end-of-sequence token only where the text is complete. A
        generation stopped by ``max_tokens`` (``finish_reason == "length"``) or by a stop
        string may be incomplete.

        With ``speculative`` (``"lookup"``, a draft :class:`Model`, or :class:`Speculative`
        settings) each prompt is decoded speculatively on a session of its own rather than on
        the batch engine: greedy output is the same bits, sampled output the same
        distribution (see :class:`Speculative`), and ``Completion.speculation`` reports the
        acceptance.
        """
        _args.prompt(prompt, "prompt", self.config.vocab_size, batch=True)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs=logprobs, logprobs_mode=logprobs_mode, grammar=grammar, speculative=speculative)
        batch = _is_batch(prompt)
        prompts = ([self._prompt_ids(p, special) for p in cast(Sequence[Prompt], prompt)] if batch
                   else [self._prompt_ids(cast(Prompt, prompt), special)])
        if settings.speculative is not None:
            completions = [self._solo_session(ids, settings)._generate(ids, settings) for ids in prompts]
            return completions if batch else completions[0]
        requests: list[Request] = []
        try:
            for ids in prompts:
                requests.append(self._submit(ids, settings))
            completions = [r.result() for r in requests]
        finally:
            for r in requests:
                r.cancel()
        return completions if batch else completions[0]

    def submit(
        self,
        prompt: Prompt,
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
    ) -> Request:
        """Queues a generation on the model's batch engine and returns at once with its
        :class:`Request` (iterate it for chunks, or call ``result()``; in asyncio, ``async
        for`` and ``await request.aresult()``). Safe to call from any thread. The options are
        :meth:`generate`'s; they are checked here, so a bad request raises at once and alone.
        The batch engine does not decode speculatively: ``params`` with ``speculative``
        raises :class:`InvalidArgumentError`.

        Requests from every thread run together, one forward pass computing a token of every
        running sequence, and each gives the same bits as if it ran alone.
        """
        _args.prompt(prompt, "prompt", self.config.vocab_size)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs=logprobs, logprobs_mode=logprobs_mode, grammar=grammar)
        return self._submit(self._prompt_ids(prompt, special), settings)

    def _solo_session(self, ids: list[int], params: GenerationParams) -> "Session":
        """A session for one generation of ``ids`` (speculative decoding runs on it)."""
        return Session(self, _core.solo_session(self._loaded, len(ids), params._core))

    def _submit(self, ids: list[int], params: GenerationParams) -> Request:
        return Request(_core.submit(self._loaded, ids, params._core), ids, self._dispatcher)

    def beam_search(
        self,
        prompt: Prompt,
        *,
        beam_width: int,
        max_tokens: int,
        length_penalty: float = 0.0,
        special: bool = True,
    ) -> list[Beam]:
        """Beam search of width ``beam_width`` over at most ``max_tokens``
        tokens: up to ``beam_width`` hypotheses ranked by score, best first.

        Scores are log-probabilities at temperature 1 divided by ``len ** length_penalty``.
        Ties between candidates go to the lexicographically smaller token sequence; a
        hypothesis ending with the end-of-sequence token is set aside as finished if it ranks
        among the first ``beam_width`` candidates, as in transformers. Width 1 is greedy
        decoding.
        """
        _args.prompt(prompt, "prompt", self.config.vocab_size)
        ids = self._prompt_ids(prompt, special)
        beams = _core.engine_beam_search(
            self._loaded, ids, beam_width=beam_width, max_tokens=max_tokens, length_penalty=float(length_penalty)
        )
        return [Beam._from_core(b, self.detokenize) for b in beams]

    def stream(
        self,
        prompt: Prompt,
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Iterator[Chunk]:
        """Like :meth:`generate` for one prompt, but yields :class:`Chunk` s as tokens are
        generated: the text deltas (always whole UTF-8 characters), the token ids, and the
        finish reason on the last chunk. Arguments are checked when this is called. With
        ``speculative``, the chunks are those of a plain stream (greedy or with prompt
        lookup; the same distribution with a sampling draft model) and the last one carries
        the speculation statistics."""
        _args.prompt(prompt, "prompt", self.config.vocab_size)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs_mode=logprobs_mode, grammar=grammar, speculative=speculative)
        ids = self._prompt_ids(prompt, special)
        if settings.speculative is not None:
            return self._solo_session(ids, settings)._stream(ids, settings)
        return _request_chunks(self._submit(ids, settings))

    @property
    def chat_template(self) -> Optional[str]:
        """The file's ``tokenizer.chat_template`` (a Jinja template), or None."""
        return _core.chat_template(self._loaded)

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        template: Optional[str] = None,
        **variables: Any,
    ) -> str:
        """Renders chat ``messages`` into prompt text with the model's chat template (or
        ``template``), as transformers' ``apply_chat_template(..., tokenize=False)`` does.

        The template (Jinja, rendered by minijinja) sees ``messages``,
        ``add_generation_prompt`` (open an assistant turn at the end), ``bos_token``,
        ``eos_token`` and ``variables`` (such as ``tools=[...]``); values must be dicts,
        lists, strings, numbers, booleans or None. Raises :class:`reprolm.ChatTemplateError`
        if the model has no template and none is given, or if the template fails (including
        its own ``raise_exception``). Messages that are not dicts, or lack ``role`` or
        ``content`` (an assistant message may give ``tool_calls`` instead), raise
        :class:`InvalidArgumentError` naming the message.
        """
        _args.messages(messages)
        return _core.apply_chat_template(
            self._loaded, [dict(m) if isinstance(m, Mapping) else m for m in messages], add_generation_prompt=add_generation_prompt,
            template=template, variables=variables,
        )

    def chat_ids(self, messages: Sequence[Message], *, template: Optional[str] = None) -> list[int]:
        """The prompt :meth:`chat` generates from: ``messages`` rendered by
        :meth:`apply_chat_template` (with the generation prompt), tokenized with special
        tokens parsed."""
        return self.chat_text_ids(self.apply_chat_template(messages, template=template))

    def chat_text_ids(self, text: str) -> list[int]:
        """The ids of a rendered chat prompt ``text``: tokenized with special tokens parsed,
        without a doubled beginning-of-sequence token."""
        ids = self.tokenize(text, special=True)
        # A template that writes bos_token itself, for a tokenizer that also prepends it.
        bos = self.config.bos_id
        if bos is not None and ids[:2] == [bos, bos] and self.tokenize("") == [bos]:
            ids = ids[1:]
        return ids

    def chat(
        self,
        messages: Sequence[Message],
        *,
        template: Optional[str] = None,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        tool_choice: Any = None,
        parallel_tool_calls: Optional[bool] = None,
    ) -> Completion:
        """The assistant's reply to ``messages``: the chat rendered by
        :meth:`apply_chat_template` (special tokens parsed), then :meth:`generate` with the
        settings of ``params`` or the keyword arguments. The reply's text leaves out the
        end-of-turn token.

        With ``tools`` (OpenAI's function tools: ``{"type": "function", "function": {"name":
        ..., "description": ..., "parameters": <JSON Schema>}}``), the model may call them
        (:mod:`reprolm.tools` describes the formats): the calls are in
        :attr:`Completion.tool_calls`, ``text`` is the rest of the reply (the content), and
        ``finish_reason`` is ``"tool_calls"``. ``tool_choice``: ``"auto"`` (the default),
        ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``;
        ``parallel_tool_calls`` as in :func:`reprolm.tools.plan`. ``messages`` may hold
        assistant messages with ``tool_calls`` and ``tool`` messages. A forced call (and a
        template that knows no tools) is generated under a grammar, so ``grammar`` can then
        not be given too. Bad tools raise :class:`ToolError` naming the field."""
        def requested() -> GenerationParams:
            return resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs_mode=logprobs_mode, grammar=grammar, speculative=speculative)

        if tools is None:
            return self.generate(self.chat_ids(messages, template=template), params=requested())
        from . import tools as _tools

        _args.messages(messages)
        offered = _tools.tools_from_openai(tools)
        choice = _tools.tool_choice_from_openai(tool_choice, offered)
        history = [_tools.history_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        plan = _tools.plan(template or self.chat_template, history, offered, choice, parallel=parallel_tool_calls)
        settings = requested()
        if plan.grammar is not None and settings.grammar is not None:
            raise InvalidArgumentError("grammar cannot be given with tools whose call is generated under a grammar "
                                       "(tool_choice 'required' or a function, or a template that knows no tools)")
        text = self.apply_chat_template(plan.messages, template=template, **plan.variables) + plan.prompt_suffix
        ids = self.chat_text_ids(text)
        if plan.grammar is not None:
            settings = dataclasses.replace(settings, grammar=plan.grammar)
        out = self.generate(ids, params=settings)
        seed = 0 if settings.sampler is None else settings.sampler.seed
        key = hashlib.sha256(json.dumps([ids, seed], separators=(",", ":")).encode()).digest()
        content, calls = plan.parse(out.text, key)
        if not calls:
            return out
        reason: FinishReason = "length" if out.finish_reason == "length" else "tool_calls"
        return dataclasses.replace(out, text=content or "", finish_reason=reason, tool_calls=calls)

    def chat_stream(
        self,
        messages: Sequence[Message],
        *,
        template: Optional[str] = None,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Iterator[Chunk]:
        """:meth:`chat`, streamed as :meth:`stream` does."""
        ids = self.chat_ids(messages, template=template)
        return self.stream(ids, params=resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop,
                                               stop_token_ids=stop_token_ids, logprobs_mode=logprobs_mode,
                                               grammar=grammar, speculative=speculative))


class Session:
    """One sequence and its KV cache , fed incrementally.

    Whatever path a sequence takes here (one prefill, prefills in chunks, steps, prefix
    reuse after :meth:`truncate` or :meth:`generate`, :meth:`save` then :meth:`load`), the
    logits for the same tokens are bitwise identical (docs/theory.md, "The KV cache").
    """

    def __init__(self, model: Model, core: _core.Session) -> None:
        self._model = model
        self._core = core

    @classmethod
    def load(cls, model: Model, path: Union[str, os.PathLike[str]]) -> "Session":
        """Restores a session written by :meth:`save`. A file saved with another model file
        raises :class:`StateModelMismatchError`, a damaged or truncated one
        :class:`StateFormatError`, one of another format version :class:`StateVersionError`."""
        return cls(model, _core.Session.load(model._loaded, _args.path(path, "path")))

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the tokens and the KV cache to ``path`` (a versioned, checksummed file tied
        to this model file)."""
        self._core.save(_args.path(path, "path"))

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
        """Appends ``ids``; returns the logits after the last of them. The GIL is released
        while it computes; Ctrl-C (KeyboardInterrupt) stops it within a block of 256 tokens,
        and the session keeps the blocks computed so far (they are in :attr:`tokens`)."""
        return self._core.feed(_args.token_ids(ids, "ids", self._model.config.vocab_size))

    def step(self, token_id: int) -> npt.NDArray[np.float32]:
        """Appends one token; returns the logits after it."""
        return self._core.feed([_args.token_id(token_id, "token_id", self._model.config.vocab_size)])

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` tokens (their cache stays valid) and drops the rest. (If a
        full sliding window has already overwritten keys the kept prefix needs, the prefix is
        recomputed on the next call, with the same result.)"""
        self._core.truncate(_args.integer(n, "n"))

    def generate(
        self,
        prompt: Prompt,
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Completion:
        """:meth:`Model.generate` for one prompt, on this session's cache: ``prompt`` is the
        whole context; the prefix it shares with :attr:`tokens` is reused and only the rest is
        computed (the result is the same bits as a fresh generation). Afterwards
        :attr:`tokens` holds the prompt and the generated ids (but the last, which was never
        fed). With ``overflow="error"``, ``len(prompt) + max_tokens`` must fit in
        :attr:`context_length` (checked before any work); a sliding window generates past it.

        The options are :meth:`Model.generate`'s; Ctrl-C stops generation within one token
        and leaves the session usable (holding what was computed). ``speculative`` needs
        ``overflow="error"``."""
        _args.prompt(prompt, "prompt", self._model.config.vocab_size)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs=logprobs, logprobs_mode=logprobs_mode, grammar=grammar, speculative=speculative)
        return self._generate(self._model._prompt_ids(prompt, special), settings)

    def _generate(self, ids: list[int], params: GenerationParams) -> Completion:
        out_ids, text, reason, lps, steps, stats = self._core.generate(ids, params._core)
        infos = [StepInfo._from_core(s) for s in steps]
        return Completion(text, out_ids, reason, ids, lps, infos, SpeculationStats._from_core(stats))

    def stream(
        self,
        prompt: Prompt,
        *,
        params: Optional[GenerationParams] = None,
        max_tokens: int = 256,
        sampler: Optional[Sampler] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs_mode: Optional[LogprobsMode] = None,
        grammar: Optional[Grammar] = None,
        speculative: Union[Drafter, Speculative, None] = None,
    ) -> Iterator[Chunk]:
        """:meth:`generate` on this session, yielding :class:`Chunk` s as :meth:`Model.stream`
        does (the same chunks as a fresh stream of the same prompt). The session is busy (its
        other methods raise RuntimeError) until the last chunk has been returned or the
        iterator is closed (``close()``) or dropped. Arguments are checked when this is called."""
        _args.prompt(prompt, "prompt", self._model.config.vocab_size)
        settings = resolve(params, max_tokens=max_tokens, sampler=sampler, stop=stop, stop_token_ids=stop_token_ids,
                           logprobs_mode=logprobs_mode, grammar=grammar, speculative=speculative)
        return self._stream(self._model._prompt_ids(prompt, special), settings)

    def _stream(self, ids: list[int], params: GenerationParams) -> Iterator[Chunk]:
        return _chunks(self._core.stream(ids, params._core))

    def __repr__(self) -> str:
        return (f"Session(tokens={len(self.tokens)}, context_length={self.context_length}, "
                f"kv_dtype={self.kv_dtype!r}, overflow={self.overflow!r})")
