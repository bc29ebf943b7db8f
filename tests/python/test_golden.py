"""Same bits on every machine: the default model's logits on a few prompts hash to
the values committed in tests/data/golden_logits.json, for float32 and int8, on every kernel
path this CPU has. (The sessions that build reprolm run on different CPUs: AMD Zen 4, Intel
Xeon.) A deliberate change of numerics rewrites the file (`python scripts/golden_logits.py
--write`) in its own commit that says why."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import reprolm

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "data" / "golden_logits.json").read_text())


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_logits_hash_to_the_committed_values(model_path: Path, precision: str, isa: str) -> None:
    try:
        model = reprolm.Model.load(model_path, threads=2, precision=precision, isa=isa)
    except reprolm.UnsupportedError:
        pytest.skip(f"this CPU has no {isa} {precision} kernels")
    # The scalar twin is slow: its first prompt only (the cargo tests check every path against
    # the others, bit for bit, on each machine).
    n = 1 if isa == "scalar" else len(GOLDEN["prompts"])
    for prompt, expected in zip(GOLDEN["prompts"][:n], GOLDEN["sha256"][precision][:n]):
        logits = model.logits(model.tokenize(prompt, special=True))
        assert hashlib.sha256(logits.astype("<f4").tobytes()).hexdigest() == expected, (precision, isa, prompt)
