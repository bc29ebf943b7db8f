"""Golden hashes of the default model's logits: `python scripts/golden_logits.py` prints them
for every kernel path this CPU has, `--write` stores them in tests/data/golden_logits.json.

tests/python/test_golden.py checks every machine against the stored hashes, so "the same
bits on every machine at the same version" is a checked promise. A deliberate change of
numerics rewrites the file in its own commit that says why."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import reprolm

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden_logits.json"
PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]
PRECISIONS = ["float32", "int8"]
ISAS = ["scalar", "avx2", "avx512"]


def logits_hash(model: reprolm.Model, prompt: str) -> str:
    """SHA-256 of the float32 logits at every position of the prompt (little-endian bytes)."""
    ids = model.tokenize(prompt, special=True)
    return hashlib.sha256(model.logits(ids).astype("<f4").tobytes()).hexdigest()


def hashes(precision: str, isa: str) -> list[str]:
    model = reprolm.Model.default(threads=2, precision=precision, isa=isa)
    return [logits_hash(model, p) for p in PROMPTS]


def available_isas() -> list[str]:
    out = []
    for isa in ISAS:
        try:
            reprolm.Model.default(threads=1, isa=isa)
        except reprolm.UnsupportedError:
            continue
        out.append(isa)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="store the hashes in tests/data/golden_logits.json")
    args = parser.parse_args()
    table = {p: hashes(p, "scalar") for p in PRECISIONS}
    for isa in available_isas():
        for p in PRECISIONS:
            got = hashes(p, isa)
            print(f"{p:8s} {isa:7s} {'same' if got == table[p] else 'DIFFERENT'}")
    print(json.dumps(table, indent=2))
    if args.write:
        GOLDEN.write_text(json.dumps({"version": reprolm.__version__, "prompts": PROMPTS, "sha256": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
