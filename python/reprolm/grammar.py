"""Constrained decoding: :class:`Grammar` (what the generated text must be) and
:class:`GrammarMatcher` (one sequence's position in a grammar, for custom decoding loops).

At every step the grammar gives the set S of tokens that can continue the text; the sampler
restricts the model's distribution to S (truncation is conditioning: inside S the
probability ratios are kept) in its first stage, together with ``allowed_token_ids`` /
``banned_token_ids``, before temperature, top-k, top-p and min-p; the chosen token is fed
back to the grammar. The end-of-sequence token is in S exactly where the grammar accepts
the text so far. Grammars are compiled by llguidance over the model's own token bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence, Union

from . import _args, _core
from .errors import GrammarError, InvalidTypeError

if TYPE_CHECKING:
    from ._model import Model

__all__ = ["Grammar", "GrammarMatcher", "GrammarKind"]

GrammarKind = Literal["json_schema", "regex", "lark", "choice"]


def _schema_text(schema: Any) -> str:
    """A JSON Schema given as a dict, JSON text, or a pydantic model class, as JSON text."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # pydantic v2 model class
        schema = schema.model_json_schema()
    if isinstance(schema, (Mapping, bool)):
        try:
            return json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"grammar: the JSON Schema cannot be written as JSON: {e}") from None
    raise InvalidTypeError(
        f"schema must be a dict, JSON text or a pydantic model class, got {type(schema).__name__}"
    )


class Grammar:
    """What the generated text must be: a JSON value valid under a JSON Schema, a match of a
    regular expression, a derivation of a Lark grammar, or one of a list of strings. The
    whole generated text is constrained (a regular expression is matched against all of it).

    Make one with :meth:`json_schema`, :meth:`regex`, :meth:`lark` or :meth:`choice` (each
    checks the grammar at once and raises :class:`GrammarError` naming the problem), then pass
    it as ``grammar=`` to :meth:`Model.generate`, :meth:`Model.stream`, :meth:`Model.chat`,
    :meth:`Model.chat_stream`, :meth:`Model.submit`, :meth:`Session.generate` or
    :meth:`Session.stream`. A grammar no token of the model can start raises
    :class:`GrammarError` when the generation is requested, before any token is generated.

    Immutable, hashable and picklable (as its kind and source).
    """

    __slots__ = ("_kind", "_source", "_spec")

    def __init__(self, kind: GrammarKind, source: Union[str, Sequence[str]]) -> None:
        """Prefer the named constructors; ``source`` is JSON text for ``"json_schema"``, the
        pattern for ``"regex"``, the grammar for ``"lark"``, the strings for ``"choice"``."""
        if kind == "choice":
            if isinstance(source, str) or not all(isinstance(s, str) for s in source):
                raise InvalidTypeError("the options of a choice must be a list of str")
            source = tuple(source)
            for i, option in enumerate(source):
                _args.unicode(option, f"choice option {i}")
            spec = _core.GrammarSpec.choice(list(source))
        elif kind in ("json_schema", "regex", "lark"):
            if not isinstance(source, str):
                raise InvalidTypeError(f"the source of a {kind} grammar must be a str, got {type(source).__name__}")
            _args.unicode(source, f"the source of the {kind} grammar")
            spec = getattr(_core.GrammarSpec, kind)(source)
        else:
            raise GrammarError(f"grammar: unknown kind {kind!r} (json_schema, regex, lark or choice)")
        self._kind: GrammarKind = kind
        self._source: Union[str, tuple[str, ...]] = source
        self._spec: _core.GrammarSpec = spec

    @classmethod
    def json_schema(cls, schema: Any) -> "Grammar":
        """One JSON value valid under ``schema``: a dict, JSON text, or a pydantic model class
        (its ``model_json_schema()``). Supported: types, ``properties`` / ``required`` /
        ``additionalProperties``, ``items`` / ``prefixItems`` / ``minItems`` / ``maxItems``,
        ``enum`` / ``const``, numeric ranges, string ``pattern`` / ``minLength`` /
        ``maxLength`` / ``format``, ``anyOf`` / ``allOf``, local ``$ref`` (``#/...``); an
        unsupported keyword (such as ``oneOf`` or ``propertyNames``) raises
        :class:`GrammarError`. The JSON is written
        compactly, with ``", "`` between items and ``": "`` after keys (as ``json.dumps``)."""
        return cls("json_schema", _schema_text(schema))

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        """Text that matches ``pattern`` (Rust ``regex`` syntax) as a whole."""
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> "Grammar":
        """Text derived from the ``start`` rule of ``grammar``, in llguidance's Lark-like
        syntax (rules, ``"literals"``, ``/regexes/``, ``%json { schema }``, ...)."""
        return cls("lark", grammar)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Grammar":
        """Exactly one of the strings ``options`` (at least one)."""
        if isinstance(options, (str, bytes)) or not isinstance(options, Iterable):
            raise InvalidTypeError(f"the options of a choice must be a list of str, got {type(options).__name__}")
        return cls("choice", list(options))

    @property
    def kind(self) -> GrammarKind:
        return self._kind

    @property
    def source(self) -> Union[str, tuple[str, ...]]:
        """The JSON Schema as JSON text, the pattern, the Lark grammar, or the options."""
        return self._source

    def matcher(self, model: "Model") -> "GrammarMatcher":
        """A new :class:`GrammarMatcher` at the start of this grammar, compiled for ``model``."""
        return GrammarMatcher(_core.GrammarMatcher(model._loaded, self._spec))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._kind, self._source))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grammar) and (self._kind, self._source) == (other._kind, other._source)

    def __hash__(self) -> int:
        return hash((self._kind, self._source))

    def __repr__(self) -> str:
        return f"Grammar.{self._kind}({self._source!r})"


class GrammarMatcher:
    """One sequence's position in a grammar compiled for a model (:meth:`Grammar.matcher`):
    the set S of tokens the grammar allows next, and the tokens accepted so far. Generation
    runs one of these inside the engine; this one is for custom loops (such as
    :meth:`Session.step`) and inspection."""

    __slots__ = ("_core",)

    def __init__(self, core: _core.GrammarMatcher) -> None:
        self._core = core

    def allowed_token_ids(self) -> list[int]:
        """S: the ids allowed as the next token, ascending (the end-of-sequence token among
        them exactly when :attr:`is_accepting`)."""
        return self._core.allowed_token_ids()

    def allowed_count(self) -> int:
        """|S|: how many ids :meth:`allowed_token_ids` would list (computed without listing)."""
        return self._core.allowed_count()

    def accept(self, token_id: int) -> None:
        """Advances past ``token_id``; a token outside S raises :class:`GrammarError`."""
        self._core.accept(int(token_id))

    @property
    def is_accepting(self) -> bool:
        """Whether the text so far is complete under the grammar."""
        return self._core.is_accepting()
