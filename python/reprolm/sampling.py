"""Sampling as docs/theory.md defines it.

Pipeline order, fixed: repetition / frequency / presence penalties and logit bias, then the
allowed / banned masks -> temperature (softmax in float64; temperature 0 is greedy: argmax,
lowest id on ties) -> top-k -> top-p -> min-p -> selection. Each truncation works on the
renormalized survivors of the previous one. Ranking is probability descending, ties by
ascending token id. top-p keeps the smallest ranked prefix whose *exactly computed*
cumulative mass reaches ``top_p``. Selection draws one uniform ``u_t = uniform(seed, t)`` per
step from a counter-based generator (Philox4x32-10) and takes the inverse CDF over token
ids of the final distribution. The functions below run the same Rust code as generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from collections.abc import Iterable
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np
import numpy.typing as npt

from . import _args, _core
from ._decoding import StepInfo
from .errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "LogprobsMode",
    "Sampler",
    "softmax",
    "entropy",
    "top_k_set",
    "top_p_set",
    "restrict",
    "total_variation",
    "uniform",
]


def _ids(value: Any, name: str) -> list[Any]:
    """The items of a token id list setting (each checked by :func:`_token_id`)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"{name} must be a sequence of token ids, got {type(value).__name__}")
    return list(value)


def _count(name: str, value: int) -> int:
    """A count setting as an int the engine takes (of any size: the engine names the setting
    when it is negative; beyond 64 bits it is refused here instead of overflowing)."""
    v = _args.integer(value, name)
    if not -(2**63) <= v < 2**63:
        raise InvalidArgumentError(f"invalid value for '{name}': {v} is out of range")
    return v


def _mode(value: object) -> str:
    """A ``logprobs_mode`` as the engine takes it (the engine names any other string)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"invalid value for 'logprobs_mode': must be 'raw' or 'processed', got {value!r}")
    return value


def _token_id(name: str, value: int) -> int:
    """A token id of a setting: 0 <= id < 2^32 (the engine checks it against the vocabulary)."""
    v = _args.integer(value, f"{name} (a token id)")
    if not 0 <= v < 2**32:
        raise InvalidArgumentError(f"invalid value for '{name}': token id {v} is outside any vocabulary")
    return v


def _hashable(value: Any) -> Any:
    """A setting as a hashable value: a mapping as the set of its items, a sequence as a tuple."""
    if isinstance(value, Mapping):
        return frozenset(value.items())
    if isinstance(value, (list, np.ndarray)):
        return tuple(value.tolist() if isinstance(value, np.ndarray) else value)
    return value


LogprobsMode = Literal["processed", "raw"]
"""Which distribution reported log-probabilities come from: ``"processed"``, the final
distribution q the token was drawn from (after penalties, bias, masks, temperature and
truncation; the point mass for greedy decoding), or ``"raw"``, the model's own softmax of the
logits before any processing."""


@dataclass(frozen=True)
class Sampler:
    """Immutable sampling settings; invalid values raise :class:`reprolm.InvalidArgumentError`
    (a ``ValueError``) naming the setting.

    The defaults are plain sampling from softmax(z): temperature 1, nothing truncated, no
    penalties, seed 0. :meth:`greedy` is temperature 0.
    """

    temperature: float = 1.0
    """tau >= 0; 0 selects the greedy branch."""
    top_k: int = 0
    """Keep the k most probable tokens; 0 = off."""
    top_p: float = 1.0
    """Keep the smallest ranked prefix with mass >= top_p, in (0, 1]; 1 = off."""
    min_p: float = 0.0
    """Keep tokens with probability >= min_p times the largest, in [0, 1]; 0 = off."""
    repetition_penalty: float = 1.0
    """transformers semantics: positive logits of seen tokens divided, negative multiplied."""
    penalty_window: Optional[int] = None
    """The repetition penalty looks at the last n tokens (prompt included); None = all."""
    presence_penalty: float = 0.0
    """OpenAI semantics: subtracted once from every token generated so far."""
    frequency_penalty: float = 0.0
    """OpenAI semantics: subtracted per occurrence of every token generated so far."""
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    """Added to the given tokens' logits (in float64)."""
    allowed_token_ids: Optional[Sequence[int]] = None
    """Restrict the choice to these tokens (the conditional distribution given them)."""
    banned_token_ids: Sequence[int] = ()
    """Never choose these tokens."""
    seed: int = 0
    """Step t draws uniform(seed, t); no global random state."""
    top_logprobs: int = 0
    """How many most probable alternatives :meth:`sample` reports (``generate(logprobs=N)``
    sets it to N); does not change what is sampled."""
    logprobs_mode: LogprobsMode = "processed"
    """The distribution of the reported log-probabilities (see :data:`LogprobsMode`;
    ``generate(logprobs_mode=...)`` sets it); does not change what is sampled."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_config", self._make_config())

    def _make_config(self) -> _core.SamplerConfig:
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidTypeError(f"logit_bias must be a mapping of token id to bias, got "
                                   f"{type(self.logit_bias).__name__}")
        return _core.SamplerConfig(
            temperature=_args.number(self.temperature, "temperature"),
            top_k=_count("top_k", self.top_k),
            top_p=_args.number(self.top_p, "top_p"),
            min_p=_args.number(self.min_p, "min_p"),
            repetition_penalty=_args.number(self.repetition_penalty, "repetition_penalty"),
            penalty_window=None if self.penalty_window is None else _count("penalty_window", self.penalty_window),
            presence_penalty=_args.number(self.presence_penalty, "presence_penalty"),
            frequency_penalty=_args.number(self.frequency_penalty, "frequency_penalty"),
            logit_bias=[(_token_id("logit_bias", k), _args.number(v, f"logit_bias[{k}]"))
                        for k, v in self.logit_bias.items()],
            allowed_token_ids=(None if self.allowed_token_ids is None
                               else [_token_id("allowed_token_ids", i) for i in _ids(self.allowed_token_ids,
                                                                                    "allowed_token_ids")]),
            banned_token_ids=[_token_id("banned_token_ids", i) for i in _ids(self.banned_token_ids,
                                                                             "banned_token_ids")],
            seed=_args.integer(self.seed, "seed"),
            top_logprobs=_count("top_logprobs", self.top_logprobs),
            logprobs_mode=_mode(self.logprobs_mode),
        )

    def __hash__(self) -> int:
        """The hash of its settings (``logit_bias`` and the id lists taken as their items)."""
        return hash(tuple(_hashable(getattr(self, f.name)) for f in fields(self)))

    def __reduce__(self) -> tuple[type["Sampler"], tuple[Any, ...]]:
        """Pickles as its settings (the validated engine object is rebuilt when loaded), so a
        sampler can be sent to other processes, such as Ray actors."""
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def greedy(cls) -> "Sampler":
        """Temperature 0: argmax, lowest id on ties."""
        return cls(temperature=0.0)

    @property
    def _core(self) -> _core.SamplerConfig:
        config: _core.SamplerConfig = self.__dict__["_config"]
        return config

    def distribution(
        self, logits: npt.ArrayLike, history: Sequence[int] = (), n_prompt: Optional[int] = None
    ) -> npt.NDArray[np.float64]:
        """The final distribution q (float64 over the vocabulary) this sampler draws from.

        ``history`` is the context (prompt then generated ids); the first ``n_prompt`` of them
        (default: all) are the prompt, which the presence and frequency penalties ignore.
        """
        z = np.ascontiguousarray(logits, dtype=np.float32)
        hist = [int(i) for i in history]
        return self._core.distribution(z, hist, len(hist) if n_prompt is None else n_prompt)

    def sample(
        self,
        logits: npt.ArrayLike,
        history: Sequence[int] = (),
        n_prompt: Optional[int] = None,
        *,
        step: int = 0,
    ) -> StepInfo:
        """The token that decoding step ``step`` chooses for these logits (one draw
        ``uniform(seed, step)`` from :meth:`distribution`), with the statistics of q.

        This is one step of generation: a generation with this sampler picks token t with
        ``sample(logits_t, prompt + generated[:t], len(prompt), step=t)``. Arguments as for
        :meth:`distribution`.
        """
        z = np.ascontiguousarray(logits, dtype=np.float32)
        hist = [int(i) for i in history]
        n = len(hist) if n_prompt is None else n_prompt
        return StepInfo._from_core(self._core.sample(z, hist, n, int(step)))


def _f64(p: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return np.ascontiguousarray(p, dtype=np.float64)


def softmax(z: npt.ArrayLike, temperature: float = 1.0) -> npt.NDArray[np.float64]:
    """softmax(z / temperature) in float64; temperature 0 is the point mass
    on the argmax (lowest index on ties)."""
    return _core.softmax(_f64(z), float(temperature))


def entropy(p: npt.ArrayLike) -> float:
    """Shannon entropy in nats."""
    return _core.entropy(_f64(p))


def top_k_set(p: npt.ArrayLike, k: int) -> list[int]:
    """The k most probable indices, in ranked order (probability descending, ties by index)."""
    return _core.top_k_set(_f64(p), int(k))


def top_p_set(p: npt.ArrayLike, top_p: float) -> list[int]:
    """The smallest ranked prefix with exact cumulative mass >= top_p."""
    return _core.top_p_set(_f64(p), float(top_p))


def restrict(p: npt.ArrayLike, subset: Sequence[int]) -> npt.NDArray[np.float64]:
    """p conditioned on the subset: p_S(i) = p_i / p(S) inside S, 0 outside."""
    return _core.restrict(_f64(p), [int(i) for i in subset])


def total_variation(p: npt.ArrayLike, q: npt.ArrayLike) -> float:
    """(1/2) sum_i |p_i - q_i|."""
    return _core.total_variation(_f64(p), _f64(q))


def uniform(seed: int, step: int) -> float:
    """The uniform draw in [0, 1) of decoding step ``step`` under ``seed``."""
    return _core.uniform(int(seed), int(step))
