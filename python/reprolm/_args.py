"""Checks of the public API's arguments, run before any work: a wrong type raises
:class:`InvalidTypeError` naming the argument (rather than an error from deep inside, such as
``object of type 'NoneType' has no len()``), and a token id of any size outside the
vocabulary :class:`TokenOutOfRangeError` (the engine takes 64-bit ids; larger Python ints
would otherwise raise ``OverflowError``). Everything else is checked by the engine."""

from __future__ import annotations

import numbers
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .errors import InvalidArgumentError, InvalidTypeError, TokenOutOfRangeError

__all__ = ["text", "unicode", "path", "token_id", "token_ids", "prompt", "messages", "number", "integer", "optional_integer",
           "one_of", "flag"]

_INT64 = 2**63


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _is_id_sequence(value: Any) -> bool:
    """A sequence (with a length) that may hold token ids: not text, bytes or a mapping."""
    return (isinstance(value, (Sequence, np.ndarray))
            and not isinstance(value, (str, bytes, bytearray, Mapping)))


def _check_range(ids: Any, vocab_size: int) -> None:
    """Raises TokenOutOfRangeError for an int id that does not fit in 64 bits; the engine
    checks the rest (and reports items that are not ints)."""
    if len(ids) == 0:
        return
    try:
        extremes = (int(np.min(ids)), int(np.max(ids))) if isinstance(ids, np.ndarray) else (min(ids), max(ids))
    except (TypeError, ValueError):
        return
    for id in extremes:
        if isinstance(id, (int, np.integer)) and not -_INT64 <= int(id) < _INT64:
            raise TokenOutOfRangeError(f"token id {int(id)} is out of range for a vocabulary of {vocab_size}")


def text(value: Any, name: str) -> None:
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a str, got {_kind(value)}")
    unicode(value, name)


def unicode(value: str, name: str) -> None:
    """Checks that a str is text the engine can take as UTF-8: a Python str may hold lone
    surrogates (from ``surrogateescape`` decoding, or escapes such as ``"\\ud800"``), which
    have no UTF-8 form."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{name} is not valid Unicode text: {e.reason} "
                                   f"(character {e.start}, {value[e.start]!a})") from None


def path(value: Any, name: str) -> Path:
    """``value``, a str or an :class:`os.PathLike`, as a :class:`Path` the file system can
    take."""
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidTypeError(f"{name} must be a path (a str or an os.PathLike), got {_kind(value)}")
    try:
        os.fsencode(value)
        return Path(value)
    except TypeError as e:
        raise InvalidTypeError(f"{name} must be a path (a str or an os.PathLike): {e}") from None
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{name} is not a file name this system can encode: {e.reason} "
                                   f"(character {e.start})") from None


def token_id(value: Any, name: str, vocab_size: int) -> int:
    """``value`` as an int (anything with ``__index__``, such as a NumPy integer)."""
    id = _index(value, name, "a token id (an int)")
    _check_range([id], vocab_size)
    return id


def token_ids(value: Any, name: str, vocab_size: int) -> list[int]:
    """``value`` (any iterable of ints but text, bytes or a mapping) as a list."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"{name} must be a sequence of token ids (ints), got {_kind(value)}")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise InvalidTypeError(f"{name} must hold token ids (ints), got an array of {value.dtype}")
        ids = value.tolist()
    else:
        ids = list(value)
    ids = [_index(item, f"{name}[{i}]", "a token id (an int)") for i, item in enumerate(ids)]
    _check_range(ids, vocab_size)
    return ids


def _index(value: Any, name: str, what: str) -> int:
    """``value`` as an int through ``__index__`` (ints, NumPy integers), or InvalidTypeError."""
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidTypeError(f"{name} must be {what}, got {_kind(value)}") from None


def flag(value: Any, name: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be a bool, got {_kind(value)}")


def number(value: Any, name: str) -> float:
    """``value`` (any real number, NumPy's included) as a float."""
    if not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"{name} must be a number, got {_kind(value)}")
    return float(value)


def integer(value: Any, name: str) -> int:
    """``value`` (anything with ``__index__``, such as a NumPy integer) as an int."""
    return _index(value, name, "an int")


def optional_integer(value: Any, name: str) -> Optional[int]:
    return None if value is None else integer(value, f"{name} (an int or None)")


def one_of(value: Any, name: str, choices: Sequence[str]) -> None:
    """Checks that ``value`` is a str (the engine names the valid choices when it is not one)."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be one of {', '.join(map(repr, choices))}, got {_kind(value)}")


def prompt(value: Any, name: str, vocab_size: int, *, batch: bool = False) -> None:
    """Checks a prompt: text or a sequence of token ids; with ``batch``, also a non-empty list
    of prompts (whose first item is not an int)."""
    if isinstance(value, str):
        unicode(value, name)
        return
    what = "text or a sequence of token ids" + (", or a list of prompts" if batch else "")
    if not _is_id_sequence(value):
        raise InvalidTypeError(f"{name} must be {what}, got {_kind(value)}")
    if batch and len(value) > 0 and not isinstance(value[0], (int, np.integer)):
        for i, item in enumerate(value):
            prompt(item, f"{name}[{i}]", vocab_size)
        return
    token_ids(value, name, vocab_size)


def messages(value: Any, name: str = "messages") -> None:
    """Checks that chat messages are a list (the engine checks each message)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"{name} must be a list of {{'role': ..., 'content': ...}} dicts, got {_kind(value)}")
