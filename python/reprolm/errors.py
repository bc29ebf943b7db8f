"""The exceptions reprolm raises.

Every error from the engine is a :class:`ReprolmError`; the ones caused by bad arguments are
also :class:`ValueError`. A missing model file raises the builtin :class:`FileNotFoundError`
(and other I/O failures :class:`OSError`), and an interrupted generation
:class:`KeyboardInterrupt`. The mapping from the Rust error enum lives in one place,
``src/python/errors.rs``.
"""

from __future__ import annotations

__all__ = [
    "ReprolmError",
    "GgufFormatError",
    "UnsupportedError",
    "UnknownTensorTypeError",
    "InvalidModelError",
    "TokenizerError",
    "InvalidInputError",
    "TokenOutOfRangeError",
    "EmptyPromptError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "ContextOverflowError",
    "SessionStateError",
    "StateFormatError",
    "StateVersionError",
    "StateModelMismatchError",
    "ChatTemplateError",
    "GrammarError",
    "ToolError",
    "ModelDownloadError",
    "RequestCancelledError",
    "EngineOverloadedError",
    "EngineStoppedError",
    "InternalError",
]


class ReprolmError(Exception):
    """Base class of every reprolm error."""


class GgufFormatError(ReprolmError, ValueError):
    """The file is not a well-formed GGUF file (bad magic, truncated, impossible sizes)."""


class UnsupportedError(ReprolmError):
    """A well-formed file or request using something reprolm does not implement."""


class UnknownTensorTypeError(UnsupportedError):
    """A tensor of a ggml type reprolm cannot read; the message names the tensor."""


class InvalidModelError(ReprolmError, ValueError):
    """Metadata or tensors needed to run the model are missing or inconsistent."""


class TokenizerError(ReprolmError):
    """The tokenizer could not be built or could not encode/decode."""


class InvalidInputError(ReprolmError, ValueError):
    """An argument outside what the model or setting accepts."""


class TokenOutOfRangeError(InvalidInputError):
    """A token id outside ``0..vocab_size``."""


class EmptyPromptError(InvalidInputError):
    """A prompt with no tokens."""


class InvalidArgumentError(InvalidInputError):
    """A setting outside its allowed range; the message names the setting."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type, such as ``None`` for a prompt; the message names it.
    Also a :class:`TypeError`."""


class ContextOverflowError(ReprolmError):
    """The sequence would not fit in the model's context (KV cache)."""


class SessionStateError(ReprolmError, ValueError):
    """A session state file could not be restored (:meth:`reprolm.Session.load`)."""


class StateFormatError(SessionStateError):
    """Not a session state file, or a damaged one (truncated, altered: checksum mismatch)."""


class StateVersionError(SessionStateError):
    """A session state file in a format version this reprolm does not read."""


class StateModelMismatchError(SessionStateError):
    """A session state file saved with another model file."""


class ChatTemplateError(ReprolmError, ValueError):
    """A chat template is missing (the model has none and none was given), malformed, or
    refused the messages (its ``raise_exception``); the message says which."""


class GrammarError(InvalidInputError):
    """A grammar for constrained decoding (:class:`reprolm.Grammar`) that cannot be used: an
    invalid JSON Schema, an unsupported keyword, a regular expression or Lark syntax error, or
    a grammar that no token of the model's vocabulary can start. Raised before any token is
    generated; the message names the problem."""


class ToolError(InvalidArgumentError):
    """A tool-calling argument that cannot be used: a malformed tool, a schema the grammar
    cannot compile, a ``tool_choice`` naming no tool, a malformed ``tool_calls`` in the
    history. :attr:`param` names the field at fault (``tools[0].function.parameters``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ModelDownloadError(ReprolmError):
    """The default model could not be fetched or failed its integrity check."""


class RequestCancelledError(ReprolmError):
    """The request was cancelled (:meth:`reprolm.Request.cancel`) before it finished."""


class EngineOverloadedError(ReprolmError):
    """The batch engine's queue of waiting requests is full (``max_queue``); try again later."""


class EngineStoppedError(ReprolmError):
    """The batch engine stopped before the request finished (the model was closed, or an
    internal failure, which the message describes)."""


class InternalError(ReprolmError):
    """A failure inside reprolm itself, a bug to report: a panic caught in a computation, or
    worker threads that could not be started. The model stays usable; a session whose
    forward pass failed recomputes its context on its next call."""
