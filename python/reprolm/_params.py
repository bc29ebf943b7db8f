"""Every per-request setting of a generation in one immutable object: :class:`GenerationParams`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence, Union

from . import _args, _core
from .errors import InvalidArgumentError, InvalidTypeError
from .grammar import Grammar
from .sampling import LogprobsMode, Sampler
from .speculative import Drafter, Speculative

__all__ = ["GenerationParams"]

_INT64 = 2**63


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if isinstance(stop, str):
        _args.unicode(stop, "stop")
        return (stop,)
    if isinstance(stop, (bytes, bytearray, Mapping)) or not isinstance(stop, Iterable):
        raise InvalidTypeError(f"stop must be a str or a sequence of str, got {_args._kind(stop)}")
    bad = next((s for s in stop if not isinstance(s, str)), None) if isinstance(stop, Sequence) else None
    if bad is not None or not isinstance(stop, Sequence):
        raise InvalidTypeError(f"stop must be a str or a sequence of str, got an item of type {_args._kind(bad)}")
    for i, s in enumerate(stop):
        _args.unicode(s, f"stop[{i}]")
    return tuple(stop)


def _in_int64(value: int, name: str) -> int:
    if not -_INT64 <= value < _INT64:  # (the engine names any other bad value)
        raise InvalidArgumentError(f"invalid value for '{name}': {value} is out of range")
    return value


@dataclass(frozen=True)
class GenerationParams:
    """Every per-request setting of a generation, checked once when it is made: an invalid
    value raises :class:`reprolm.InvalidArgumentError` (a wrong type
    :class:`reprolm.InvalidTypeError`) naming the setting. Settings that depend on the model
    (token ids inside its vocabulary, a grammar some token can start) are checked when the
    generation is requested.

    Pass it as ``params=`` to :meth:`Model.generate`, :meth:`Model.stream`, :meth:`Model.chat`,
    :meth:`Model.chat_stream`, :meth:`Model.submit`, :meth:`Session.generate`,
    :meth:`Session.stream` and :meth:`CallableModel.generate`; their keyword arguments of the
    same names build one. The result is the same either way.

    Immutable and hashable (with a hashable drafter); :func:`dataclasses.replace` makes a
    changed copy, checked again. ``stop`` and ``stop_token_ids`` are kept as tuples (a single
    stop string as a tuple of one), and ``speculative`` as :class:`Speculative` settings.
    """

    max_tokens: int = 256
    """Most tokens to generate (>= 0)."""
    sampler: Optional[Sampler] = None
    """The sampling settings; None is greedy decoding (:meth:`Sampler.greedy`)."""
    stop: Sequence[str] = ()
    """Generation stops once the text contains one of these strings (non-empty), which is left
    out of the text."""
    stop_token_ids: Sequence[int] = ()
    """Generation stops after one of these tokens."""
    logprobs: Optional[int] = None
    """With N >= 0, every step reports its statistics and the N most probable alternatives
    (:attr:`Completion.steps`, :attr:`Chunk.step`)."""
    logprobs_mode: Optional[LogprobsMode] = None
    """The distribution of the reported log-probabilities, ``"processed"`` or ``"raw"`` (see
    :data:`reprolm.sampling.LogprobsMode`); None keeps the sampler's own."""
    grammar: Optional[Grammar] = None
    """What the generated text must be (constrained decoding)."""
    speculative: Union[Drafter, Speculative, None] = None
    """Speculative decoding: a drafter (``"lookup"``, a draft model) or :class:`Speculative`
    settings; None decodes one token per pass."""

    def __post_init__(self) -> None:
        max_tokens = _in_int64(_args.integer(self.max_tokens, "max_tokens"), "max_tokens")
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise InvalidTypeError(f"sampler must be a reprolm.Sampler or None, got {_args._kind(self.sampler)}")
        stop = _stop_strings(self.stop)
        stop_token_ids = tuple(_args.token_ids(self.stop_token_ids, "stop_token_ids", 2**32))
        logprobs = _args.optional_integer(self.logprobs, "logprobs")
        if logprobs is not None:
            _in_int64(logprobs, "logprobs")
        mode = self.logprobs_mode
        if mode is not None and not isinstance(mode, str):
            raise InvalidArgumentError(f"invalid value for 'logprobs_mode': must be 'raw' or 'processed', got {mode!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidTypeError(f"grammar must be a reprolm.Grammar or None, got {_args._kind(self.grammar)}")
        speculative = self.speculative
        if speculative is not None and not isinstance(speculative, Speculative):
            speculative = Speculative(speculative)
        for name, value in (("max_tokens", max_tokens), ("stop", stop), ("stop_token_ids", stop_token_ids),
                            ("logprobs", logprobs), ("speculative", speculative)):
            object.__setattr__(self, name, value)
        core = _core.GenerationParams(
            max_tokens=max_tokens, sampler=(self.sampler or Sampler.greedy())._core, stop=list(stop),
            stop_token_ids=list(stop_token_ids), logprobs=logprobs, logprobs_mode=mode,
            grammar=None if self.grammar is None else self.grammar._spec,
            speculative=None if speculative is None else speculative._core_settings(),
        )
        object.__setattr__(self, "_params", core)

    @property
    def _core(self) -> _core.GenerationParams:
        params: _core.GenerationParams = self.__dict__["_params"]
        return params

    def __reduce__(self) -> tuple[type["GenerationParams"], tuple[Any, ...]]:
        """Pickles as its settings (checked again when loaded), so that params can be sent to
        other processes, such as Ray actors."""
        return type(self), tuple(getattr(self, f.name) for f in fields(self))


_DEFAULTS = {f.name: f.default for f in fields(GenerationParams)}


def _is_default(name: str, value: Any) -> bool:
    default = _DEFAULTS[name]
    if value is default:
        return True
    if isinstance(default, tuple):
        return isinstance(value, (list, tuple)) and len(value) == 0
    return type(value) is type(default) and bool(value == default)


def resolve(params: Optional[GenerationParams], **keywords: Any) -> GenerationParams:
    """The settings of a call: ``params``, or the keyword arguments (the same names as the
    fields) made into :class:`GenerationParams`. Keywords given with ``params`` raise
    :class:`InvalidArgumentError` naming the first of them."""
    if params is None:
        return GenerationParams(**keywords)
    if not isinstance(params, GenerationParams):
        raise InvalidTypeError(f"params must be a reprolm.GenerationParams or None, got {_args._kind(params)}")
    given = [name for name, value in keywords.items() if not _is_default(name, value)]
    if given:
        raise InvalidArgumentError(f"invalid value for '{given[0]}': give it in params=, or leave params out")
    return params
