"""Every Python example of the README runs and prints what its comments say (issue 17,
defect 5: the streaming example printed an empty haiku)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm

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
    assert len(BLOCKS) == 6
    for marker in ["Hello world", "Write a haiku", "model.chat(messages", "logit_bias", "CallableModel",
                   "running(config)"]:
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
