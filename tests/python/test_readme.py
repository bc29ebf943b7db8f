"""Every Python example of the README runs and prints what its comments say (issue 17,
defect 5: the streaming example printed an empty haiku)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm
import reprolm.ray

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)


def run_block(marker: str) -> tuple[dict[str, Any], str]:
    """Runs the one README block containing `marker`: (its variables, what it printed)."""
    (code,) = [b for b in BLOCKS if marker in b]
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"README.md block with {marker!r}", "exec"), namespace)
    return namespace, printed.getvalue()


def test_the_blocks_are_found() -> None:
    assert len(BLOCKS) == 10
    for marker in ["Hello world", "Write a haiku", "model.submit", "model.chat(messages", "reprolm.ray.generate",
                   "logit_bias", "CallableModel", "running(config)", "Grammar.json_schema(person)",
                   'speculative="lookup"']:
        assert sum(marker in b for b in BLOCKS) == 1, marker


def test_quick_start() -> None:
    ns, printed = run_block("Hello world")
    out = ns["out"]
    # print(out.text, out.finish_reason)  # ' Paris.\n\nThe answer is: ...' 'length'
    assert "# ' Paris.\\n\\nThe answer is: ...' 'length'" in BLOCKS[0]
    assert out.text.startswith(" Paris.\n\nThe answer is: ") and out.finish_reason == "length"
    assert printed.startswith(out.text + " length\n")
    assert "# [19556, 905]" in BLOCKS[0] and ns["ids"] == [19556, 905]
    assert "shape (2, 49152)" in BLOCKS[0]
    assert ns["logits"].shape == (2, 49152) and ns["logits"].dtype == np.float32
    assert ns["nxt"].shape == (49152,)


def test_streaming_prints_a_haiku() -> None:
    ns, printed = run_block("Write a haiku")
    text, finished, rest = printed.partition("\n[eos]\n")
    assert finished, printed
    assert len(text.strip().splitlines()) >= 3, printed  # a poem, not an empty line
    assert "(The waves of the sea, ...)" in README and text.startswith("The waves of the sea, ")
    assert ns["out"].text == " Paris"
    assert rest == "[' 4, 5, 6', ' D, E, F, G,']\n"
    outs = ns["outs"]
    assert [o.text for o in outs] == [ns["model"].generate(p, max_tokens=8).text for p in ["1, 2, 3,", "A, B, C,"]]


def test_many_requests_at_once() -> None:
    ns, printed = run_block("model.submit")
    model = ns["model"]
    lines = printed.splitlines()
    texts = [r.result().text for r in ns["requests"]]
    assert lines[:8] == [repr(t) for t in texts]
    for n, text in enumerate(texts):
        alone = model.session().generate(f"{n} + {n} =", max_tokens=6, sampler=reprolm.Sampler(temperature=0.7, seed=n))
        assert text == alone.text
    with pytest.raises(reprolm.RequestCancelledError):
        ns["request"].result()  # cancelled when the with block was left
    assert lines[8] == repr([model.session().generate("A haiku:", max_tokens=12, sampler=reprolm.Sampler(seed=s)).text
                             for s in range(4)])
    assert lines[9].startswith("EngineStats(waiting=")


def test_chat() -> None:
    ns, printed = run_block("model.chat(messages")
    assert printed.startswith("<|im_start|>system\nYou are a helpful ")
    assert "# <|im_start|>system\\nYou are a helpful ..." in README
    assert "# 'The capital of France is Paris.'" in README
    assert ns["reply"].text == "The capital of France is Paris."
    assert [t["role"] for t in ns["turns"]] == ["user", "assistant"] * 2
    assert all(t["content"] for t in ns["turns"])


@pytest.mark.parametrize("marker", ["logit_bias", "CallableModel"])
def test_sampling_and_toy_models(marker: str) -> None:
    ns, _ = run_block(marker)
    if marker == "logit_bias":
        out = ns["out"]
        assert len(out.steps) == len(out.token_ids) and all(1 <= len(s.alternatives) <= 3 for s in out.steps)


def test_constrained_decoding() -> None:
    ns, printed = run_block("Grammar.json_schema(person)")
    lines = printed.splitlines()
    block = next(b for b in BLOCKS if "Grammar.json_schema(person)" in b)
    # Each comment shows what its line prints.
    assert lines == ['{"name": "John", "age": 30} eos', "2022-01-01", "positive", "4 + 2 = 6"]
    for line in lines:
        assert f"# {line}" in block, line
    assert json.loads(ns["out"].text) == {"name": "John", "age": 30}


def test_ray_example(model: reprolm.Model) -> None:
    """The Ray example (a local Ray instance: conftest sets RAY_ADDRESS=local) gives each row
    what generating it alone gives, with the seed derived from its id."""
    import ray

    try:
        ns, printed = run_block("reprolm.ray.generate")
    finally:
        ray.shutdown()
    rows = ns["rows"]
    assert [r["id"] for r in rows] == list(range(8))
    for row in rows:
        sampler = reprolm.Sampler(temperature=0.7, seed=reprolm.ray.row_seed(0, row["id"]))
        local = model.generate(row["prompt"], max_tokens=12, sampler=sampler)
        assert (row["text"], list(row["token_ids"]), row["finish_reason"], row["error"]) == (
            local.text, local.token_ids, local.finish_reason, None)
    third = rows[3]
    assert f"{third['text']} {third['finish_reason']} None" in printed.splitlines()
    assert f"# {third['text']!r} {third['finish_reason']!r} None" in README


def test_server_in_process() -> None:
    ns, printed = run_block("running(config)")
    reply, fingerprint, choices = printed.splitlines()
    assert "# The capital of France is Paris." in README and reply == "The capital of France is Paris."
    assert "# reprolm-0.1.0-b179c9523d0e (version, file hash)" in README
    assert fingerprint == ns["reply"].system_fingerprint and fingerprint.startswith(f"reprolm-{reprolm.__version__}-")
    model = reprolm.Model.default()
    expected = [model.generate("Once upon a time", max_tokens=16, sampler=reprolm.Sampler(temperature=0.8, seed=7 + i)).text
                for i in range(2)]
    assert choices == repr(expected)


def test_speculative_decoding() -> None:
    ns, printed = run_block('speculative="lookup"')
    first, second = printed.splitlines()
    assert first == "True True" and "# True True" in README
    assert second.startswith("True ") and second.endswith("%")
    stats = ns["stats"]
    assert second == f"True {stats.acceptance_rate:.0%}"
    assert ns["sampled"].speculation is not None and 0 < len(ns["sampled"].token_ids) <= 24
