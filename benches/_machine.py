"""What the benchmark scripts print about the machine they ran on."""

from __future__ import annotations

import functools
import platform
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _first_cpu() -> dict[str, str]:
    """The fields of the first processor in ``/proc/cpuinfo`` (empty where there is none),
    read once per process: the name, the model and the vector instructions all come from it."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name() -> str:
    """The CPU's model name (every benchmark number is quoted with it)."""
    return _first_cpu().get("model name") or platform.processor() or "unknown CPU"


def cpu_model() -> str:
    """The CPU's family and model numbers (``family 6 model 167``): a virtual machine's
    generic model name can stand for several generations, which these tell apart."""
    fields = _first_cpu()
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}"
    return "unknown"


def simd() -> str:
    """The widest vector instructions of the CPU that the kernels use: ``avx512_vnni``,
    ``avx512``, ``avx2`` or ``none`` (a virtual machine often hides the CPU's generation from
    its name, and the kernel path decides the speed)."""
    fields = _first_cpu()
    if not fields:
        return "unknown"
    flags = set(fields.get("flags", "").split())
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return "avx512_vnni"
    if {"avx512f", "avx512bw"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "none"


def machine() -> str:
    """The CPU's name, model and vector instructions, as benchmark output names the machine."""
    return f"{cpu_name()} ({cpu_model()}, {simd()})"
