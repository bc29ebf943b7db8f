"""Reading GGUF files without loading a model: header summary and dequantization."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

import numpy as np
import numpy.typing as npt

from . import _args, _core

__all__ = ["GgufInfo", "TensorEntry", "inspect", "dequantize"]


@dataclass(frozen=True)
class TensorEntry:
    name: str
    type: str
    """ggml type name, e.g. ``"Q4_1"``."""
    shape: tuple[int, ...]
    """Dimensions as GGUF lists them: the contiguous (row) axis first."""
    n_bytes: int


@dataclass(frozen=True)
class GgufInfo:
    version: int
    metadata: dict[str, str]
    """Each key with a short rendering of its value (arrays summarised by length)."""
    tensors: list[TensorEntry]


def inspect(path: Union[str, os.PathLike[str]]) -> GgufInfo:
    """The metadata and tensor table of a GGUF file (the data is not read). Tensors of types
    reprolm cannot compute with (K-quants, ...) are listed too, under ggml's type names."""
    version, metadata, tensors = _core.gguf_info(_args.path(path, "path"))
    return GgufInfo(version, dict(metadata), [TensorEntry(n, t, tuple(s), b) for n, t, s, b in tensors])


def dequantize(ggml_type: int, data: bytes) -> npt.NDArray[np.float32]:
    """Dequantizes raw ggml blocks of type ``ggml_type`` (ggml's numbering: 0 F32, 1 F16,
    2 Q4_0, 3 Q4_1, 8 Q8_0, 30 BF16) to float32, bit-exact with ggml's reference."""
    return _core.dequantize(ggml_type, data)
