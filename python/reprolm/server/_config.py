"""The server's configuration: :class:`ServerConfig` (the ``reprolm serve`` options, checked
when built) and :func:`model_fingerprint`."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path
from typing import Any, Optional, Union

from .. import errors
from .._core import __version__
from .._model import KvDtype, Precision

__all__ = ["ServerConfig", "model_fingerprint"]


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """How ``reprolm serve`` runs (the command's options)."""

    model_path: Path
    """The GGUF file (a ``str`` or any ``os.PathLike`` is accepted and stored as a
    :class:`~pathlib.Path`)."""
    host: str = "127.0.0.1"
    """Loopback by default: other machines cannot connect unless told (``0.0.0.0``)."""
    port: int = 8000
    threads: Optional[int] = None
    """Engine worker threads (default: all cores)."""
    precision: Precision = "float32"
    kv_dtype: KvDtype = "f32"
    """The number type of the engine's KV caches (``"f16"`` halves their memory)."""
    prefix_cache_bytes: Optional[int] = None
    """Bound of the prefix cache shared by requests (default: the engine's; 0: off)."""
    max_concurrent: int = 64
    """Sequences computed together by the batch engine (each choice of a request is one)."""
    max_queue: int = 256
    """Sequences waiting for the engine; beyond ``max_concurrent + max_queue`` the server answers 429."""
    context_length: Optional[int] = None
    """Most positions (prompt + generated) per sequence (default: the model's)."""
    max_batch_tokens: Optional[int] = None
    """Rows per forward pass (the engine's default, 512, if None): smaller keeps long prompts
    from stalling the other sequences' next tokens, at some cost in prefill speed."""
    api_key: Optional[str] = None
    """When set, every endpoint but ``/health`` and the chat page asks for ``Authorization: Bearer <api_key>``."""
    alias: Optional[str] = None
    """The model id clients name (default: the file name without ``.gguf``)."""
    max_body_bytes: int = 2 * 1024 * 1024
    """Larger request bodies are answered 413."""
    grace_period: float = 30.0
    """Seconds in-flight requests get to finish after SIGTERM."""
    webui: bool = True
    """Serve the chat page at ``/`` (without the API key: the page asks for it); False answers 404 there."""

    def __post_init__(self) -> None:
        """Checks every field when the config is built, so a bad value is an
        :class:`~reprolm.errors.InvalidArgumentError` (or :class:`~reprolm.errors.InvalidTypeError`)
        naming the field here, never a failure of the serving threads later."""
        path: Any = self.model_path
        if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
            raise errors.InvalidTypeError(f"ServerConfig.model_path must be a str or os.PathLike, "
                                          f"got {type(path).__name__}")
        try:
            resolved = Path(os.fspath(path))
        except TypeError as e:  # an os.PathLike whose __fspath__ gives bytes
            raise errors.InvalidTypeError(f"ServerConfig.model_path must name a file as text: {e}") from None
        object.__setattr__(self, "model_path", resolved)
        _check_text("host", self.host, optional=False)
        _check_int("port", self.port, 0, 65535)
        _check_int("threads", self.threads, 1, None, optional=True)
        _check_choice("precision", self.precision, ("float32", "int8"))
        _check_choice("kv_dtype", self.kv_dtype, ("f32", "f16"))
        _check_int("max_concurrent", self.max_concurrent, 1, None)
        _check_int("max_queue", self.max_queue, 0, None)
        _check_int("context_length", self.context_length, 1, None, optional=True)
        _check_int("max_batch_tokens", self.max_batch_tokens, 1, None, optional=True)
        _check_text("api_key", self.api_key, optional=True)
        _check_text("alias", self.alias, optional=True)
        _check_int("max_body_bytes", self.max_body_bytes, 0, None)
        _check_int("prefix_cache_bytes", self.prefix_cache_bytes, 0, None, optional=True)
        if not isinstance(self.webui, bool):
            raise errors.InvalidTypeError(f"ServerConfig.webui must be a bool, got {type(self.webui).__name__}")
        grace: Any = self.grace_period
        if isinstance(grace, bool) or not isinstance(grace, (int, float)):
            raise errors.InvalidTypeError(f"ServerConfig.grace_period must be a number of seconds, "
                                          f"got {type(grace).__name__}")
        if not (math.isfinite(grace) and grace >= 0):
            raise errors.InvalidArgumentError(f"ServerConfig.grace_period must be finite and >= 0, got {grace}")

    @property
    def model_id(self) -> str:
        return self.alias or self.model_path.name.removesuffix(".gguf")


def _check_int(name: str, value: Any, least: int, most: Optional[int], *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidTypeError(f"ServerConfig.{name} must be an int{' or None' if optional else ''}, "
                                      f"got {type(value).__name__}")
    if value < least or (most is not None and value > most):
        bound = f">= {least}" if most is None else f"between {least} and {most}"
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must be {bound}, got {value}")


def _check_text(name: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise errors.InvalidTypeError(f"ServerConfig.{name} must be a str{' or None' if optional else ''}, "
                                      f"got {type(value).__name__}")
    if not value:
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must not be empty")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices or not isinstance(value, str):
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must be one of {', '.join(map(repr, choices))}, "
                                          f"got {value!r}")


def model_fingerprint(path: Union[str, "os.PathLike[str]"]) -> str:
    """``reprolm-<version>-<first 12 hex digits of the file's SHA-256>``: the same bits are
    promised for the same fingerprint."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return f"reprolm-{__version__}-{digest.hexdigest()[:12]}"
