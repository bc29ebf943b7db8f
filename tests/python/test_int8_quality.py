"""int8 quality per file against llama.cpp's: the mean KL divergence of reprolm's
``precision="int8"`` next-token distribution from its ``precision="float32"`` one (exactly
dequantized weights, float32 activations) at every position of tests/data/kl_prompts.json's
texts is at most llama.cpp's on the same file and token ids, as recorded by
``scripts/kl_reference.py`` in tests/data/kl_llamacpp.json (llama.cpp itself is not needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm

from _llama_f64 import next_token_kl

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "tests" / "data" / "kl_llamacpp.json").read_text())
FILES = {Path(row["file"]).name: row for row in RECORD["files"]}
# Files on which reprolm's int8 is measured further from float32 than llama.cpp is: the
# requirement is not met there. Their test checks that it still is not (so the entry has to go
# once it is) and reports both values as an expected failure.
NOT_MET = {"SmolLM2-135M-Instruct.Q4_1.gguf", "tiny.Q8_0.gguf"}


def resolve(row: dict[str, Any]) -> Path:
    """The recorded file on this machine (the cached models are fetched on first use; a skip
    when that cannot be done), checked to be the very file llama.cpp was measured on."""
    name = row["file"]
    known = {"SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2-135m", "gemma-3-270m-q4_k_m.gguf": "gemma3-270m"}
    if name.startswith("~"):
        try:
            path = reprolm.model_path(known[Path(name).name])
        except reprolm.ModelDownloadError as e:  # no network: the only reason to skip
            pytest.skip(f"{name} cannot be fetched: {e}")
    else:
        path = ROOT / name
    assert path.stat().st_size == row["bytes"], f"{path} is not the file llama.cpp was measured on"
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    assert h.hexdigest() == row["sha256"], f"{path} is not the file llama.cpp was measured on"
    return path


@pytest.mark.parametrize("name", sorted(FILES))
def test_int8_is_no_worse_than_llamacpp(name: str) -> None:
    row = FILES[name]
    path = resolve(row)
    reference = reprolm.Model.load(path, precision="float32")
    int8 = reprolm.Model.load(path, precision="int8")
    kls, zeros = [], []
    for ids in row["ids"]:
        want = reference.logits(ids)  # [positions][vocab]
        kls.append(next_token_kl(want, int8.logits(ids)))
        zeros.append(next_token_kl(want, want))
    ours = float(np.concatenate(kls).mean())
    theirs = row["llama_cpp_mean_kl"]
    report = (f"{name} ({sum(map(len, row['ids']))} positions): mean KL from float32: reprolm int8 {ours:.4e}, "
              f"llama.cpp {theirs:.4e} (f32 KV cache: {row['engines']['llama.cpp f32 KV']['mean_kl']:.4e})")
    print(report)
    assert float(np.concatenate(zeros).max()) == 0.0
    assert ours > 0.0, report
    if name in NOT_MET:
        assert ours > theirs, f"met now: take {name} out of NOT_MET. {report}"
        pytest.xfail(report)
    assert ours <= theirs, report


def test_the_record_covers_the_types_it_claims() -> None:
    """The Gemma 3 file brings Q4_K, Q6_K, Q5_0 and Q8_0, SmolLM2 Q4_1 and Q8_0, and the tiny
    fixtures add Q2_K, Q3_K, Q5_K and Q4_0 (as docs/precision.md states)."""
    covered = set().union(*(row["tensor_types"] for row in RECORD["files"])) - {"F32", "F16"}
    assert covered >= {"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}, covered
    for row in RECORD["files"]:
        assert row["llama_cpp_tokenizes_the_same"], row["file"]
