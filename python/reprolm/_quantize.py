"""Quantizing and dequantizing GGUF models, with an error report against the uniform quantizer's bounds (docs/theory.md).

>>> report = reprolm.quantize("model.gguf", "model.q8_0.gguf", type="q8_0", report_text="Hello")
>>> print(report.table())
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Optional, Union

import numpy as np
import numpy.typing as npt

from . import _args, _core

__all__ = ["QuantizeReport", "TensorReport", "quantize", "convert", "quantize_row", "SAMPLE_TEXT"]

PathLike = Union[str, "os.PathLike[str]"]
QuantType = Literal["q4_0", "q4_1", "q8_0"]
Scheme = Literal["minmax", "uniform"]

SAMPLE_TEXT = (
    "The history of mathematics spans thousands of years. Early civilizations used numbers for "
    "trade and astronomy, and the Greeks introduced proofs. Today, mathematics underpins science, "
    "engineering and computing, from the algorithms in our phones to the models that forecast the "
    "weather."
)
"""The text ``reprolm quantize --report`` measures the KL divergence on by default."""


@dataclass(frozen=True)
class TensorReport:
    """One quantized tensor's error against the uniform quantizer's bounds (docs/theory.md,
    "Uniform quantization").

    Every block of 32 values has its own step Δ_i (the stored scale |d|). ``step`` is their
    root mean square, so that ``frobenius_bound = step/2 · sqrt(mn)`` and
    ``frobenius_estimate = step · sqrt(mn/12)`` are exactly the per-block bounds and
    uniform-model estimates summed over the blocks.
    """

    name: str
    type: str
    """ggml type written, e.g. ``"Q4_1"``."""
    shape: tuple[int, ...]
    """Dimensions as GGUF lists them: the contiguous (row) axis first."""
    n_values: int
    step: float
    """Root mean square of the block steps Δ_i."""
    max_step: float
    max_abs_error: float
    """Largest |w - Q(w)| over the tensor (clipped values included)."""
    bound_ratio: float
    """Largest max|e| / (Δ_i/2) over the blocks, for values inside the block's level range:
    <= 1 where the bound |e| <= Δ/2 holds."""
    n_over_bound: int
    """Values inside their block's level range with |e| > Δ_i/2."""
    n_outside: int
    """Values outside their block's level range (clipped by the format, e.g. Q4_0's opposite
    extreme, or by f16 rounding of the scales)."""
    n_clipped: int
    """Values clipped to ±a by ``clip`` (uniform scheme)."""
    frobenius_error: float
    frobenius_bound: float
    """(step/2)·sqrt(mn), the Frobenius bound summed over the blocks."""
    frobenius_estimate: float
    """step·sqrt(mn/12), the Frobenius error when errors are uniform on [-Δ/2, Δ/2]."""

    @property
    def max_error_bound(self) -> float:
        """max_step/2: the largest per-block bound Δ_i/2."""
        return self.max_step / 2


@dataclass(frozen=True)
class QuantizeReport:
    """What :func:`quantize` measured."""

    tensors: list[TensorReport]
    """Every tensor written in a block-quantized type, in file order."""
    kl: Optional[float]
    """Mean KL(source ‖ quantized) of the next-token distributions over the positions of
    ``report_text`` (None without a text)."""
    kl_max: Optional[float]
    kl_positions: int
    """Number of positions (tokens of the text) averaged over."""

    def table(self) -> str:
        """The report as a text table (what ``reprolm quantize --report`` prints)."""
        head = (
            f"{'tensor':<28} {'type':<5} {'step':>10} {'max|e|':>10} {'step/2':>10} {'ratio':>6} "
            f"{'outside':>8} {'‖E‖_F':>10} {'bound':>10} {'estimate':>10}"
        )
        lines = [head]
        for t in self.tensors:
            lines.append(
                f"{t.name:<28} {t.type:<5} {t.step:>10.3e} {t.max_abs_error:>10.3e} "
                f"{t.max_error_bound:>10.3e} {t.bound_ratio:>6.3f} {t.n_outside:>8} "
                f"{t.frobenius_error:>10.3e} {t.frobenius_bound:>10.3e} {t.frobenius_estimate:>10.3e}"
            )
        lines.append(
            "step: RMS of the block steps; ratio: worst max|e|/(Δ/2) over blocks (values inside the "
            "levels); outside: values beyond a block's end levels"
        )
        if self.kl is not None:
            lines.append(
                f"mean KL(source ‖ quantized) of next-token distributions: {self.kl:.6e} "
                f"(max {self.kl_max:.6e}, {self.kl_positions} positions)"
            )
        return "\n".join(lines)


def quantize(
    src: PathLike,
    dst: PathLike,
    *,
    type: QuantType = "q4_1",
    scheme: Scheme = "minmax",
    clip: Optional[float] = None,
    output_type: Optional[str] = None,
    report_text: Optional[str] = None,
) -> QuantizeReport:
    """Writes ``src`` with its matrices quantized to ``type`` (``"q4_0"``, ``"q4_1"`` or
    ``"q8_0"``) at ``dst``; vectors (norm weights) stay F32, metadata is kept (with
    ``general.file_type`` updated).

    ``scheme="minmax"`` uses ggml's reference rules, bit-exact with ``llama-quantize``.
    ``scheme="uniform"`` (``type="q4_1"`` only) is the b-bit uniform quantizer per block of 32:
    levels evenly spaced on [-a, a] with a = max|w|, or the ``clip``-th percentile of |w|
    (0 < clip <= 100) with the values beyond ±a clipped. ``output_type`` is the type of the
    embedding/output matrix (default ``"q8_0"``; also ``"f16"``, ``"bf16"``, ``"f32"``).
    With ``report_text``, the report includes the mean KL divergence of the next-token
    distributions of the quantized model against ``src`` over that text.

    Raises :class:`InvalidArgumentError` for bad settings, ``OSError`` subclasses when ``dst``
    cannot be written, and the reader's errors for a bad ``src``.
    """
    tensors, kl = _core.quantize(
        _args.path(src, "src"),
        _args.path(dst, "dst"),
        weight_type=type,
        scheme=scheme,
        clip=clip,
        output_type=output_type,
        report_text=report_text,
    )
    return QuantizeReport(
        tensors=[
            TensorReport(
                name=name,
                type=ty,
                shape=tuple(dims),
                n_values=counts[0],
                n_over_bound=counts[1],
                n_outside=counts[2],
                n_clipped=counts[3],
                step=measures[0],
                max_step=measures[1],
                max_abs_error=measures[2],
                bound_ratio=measures[3],
                frobenius_error=measures[4],
                frobenius_bound=measures[5],
                frobenius_estimate=measures[6],
            )
            for name, ty, dims, counts, measures in tensors
        ],
        kl=kl[0] if kl is not None else None,
        kl_max=kl[1] if kl is not None else None,
        kl_positions=kl[2] if kl is not None else 0,
    )


def convert(src: PathLike, dst: PathLike, *, to: Literal["f32", "f16"] = "f32") -> None:
    """Writes ``src`` dequantized at ``dst``: matrices as ``to`` (``"f32"`` or ``"f16"``),
    vectors as F32, bit-exact with ggml's dequantization."""
    _core.convert(_args.path(src, "src"), _args.path(dst, "dst"), to=to)


def quantize_row(
    values: npt.ArrayLike, type: QuantType = "q4_1", *, scheme: Scheme = "minmax", clip: Optional[float] = None
) -> bytes:
    """Encodes float32 values (a multiple of 32) as raw ggml blocks of ``type``, by the same
    rules as :func:`quantize`; :func:`reprolm.dequantize` decodes them."""
    array = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    return _core.quantize_row(array, weight_type=type, scheme=scheme, clip=clip)
