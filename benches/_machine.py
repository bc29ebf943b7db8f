"""What the benchmark scripts print about the machine they ran on."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (every benchmark number is quoted with it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_model() -> str:
    """The CPU's family and model numbers (``family 6 model 167``): a virtual machine's
    generic model name can stand for several generations, which these tell apart."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model") and key not in fields:
                fields[key] = value.strip()
            if not line.strip():
                break
    except OSError:
        pass
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}"
    return "unknown"


def simd() -> str:
    """The widest vector instructions of the CPU that the kernels use: ``avx512_vnni``,
    ``avx512``, ``avx2`` or ``none`` (a virtual machine often hides the CPU's generation from
    its name, and the kernel path decides the speed)."""
    try:
        flags: set[str] = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "unknown"
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
