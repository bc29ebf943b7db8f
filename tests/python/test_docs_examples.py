"""Every Python example of the README and of the documentation pages (docs/) runs, and prints
what its comments say. The examples with a marker below get a test of their own that checks
their output; every other example is run as it is by test_every_other_example_runs."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm
import reprolm.ray
from _doc_blocks import ROOT, Block, blocks

BLOCKS = blocks()

# Each marker names the one example (on the page given) that a test below runs and checks.
MARKERS = {
    'model.stream("Once upon a time"': "README.md",
    "Hello world": "docs/quickstart.md",
    "Write a haiku": "docs/quickstart.md",
    "model.submit": "docs/quickstart.md",
    "model.chat(messages": "docs/quickstart.md",
    "logit_bias": "docs/generation.md",
    "CallableModel": "docs/generation.md",
    "running(config)": "docs/server.md",
    "Grammar.json_schema(person)": "docs/constrained-decoding.md",
    'speculative="lookup"': "docs/speculative-decoding.md",
    "reprolm.ray.generate": "docs/ray.md",
}


def page(name: str) -> str:
    return (ROOT / name).read_text()


def block(marker: str) -> Block:
    (found,) = [b for b in BLOCKS if marker in b.code]
    return found


def run_block(marker: str) -> tuple[dict[str, Any], str]:
    """Runs the one example containing `marker`: (its variables, what it printed)."""
    code = block(marker)
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.code, f"{code.page} block with {marker!r}", "exec"), namespace)
    return namespace, printed.getvalue()


def test_the_marked_blocks_are_found() -> None:
    for marker, where in MARKERS.items():
        assert sum(marker in b.code for b in BLOCKS) == 1, marker
        assert block(marker).page == where, marker


OTHER_BLOCKS = [b for b in BLOCKS if not any(marker in b.code for marker in MARKERS)]


@pytest.mark.parametrize("example", OTHER_BLOCKS, ids=[f"{b.page}:{i}" for i, b in enumerate(OTHER_BLOCKS)])
def test_every_other_example_runs(example: Block) -> None:
    exec(compile(example.code, example.page, "exec"), {})


def test_readme_quick_start() -> None:
    ns, printed = run_block('model.stream("Once upon a time"')
    code = block('model.stream("Once upon a time"').code
    out = ns["out"]
    # print(out.text, out.finish_reason)  # ' Paris.\n\nThe answer is: ...' 'length'
    assert "# ' Paris.\\n\\nThe answer is: ...' 'length'" in code
    assert out.text.startswith(" Paris.\n\nThe answer is: ") and out.finish_reason == "length"
    first, story = printed.split(" length\n", 1)
    assert first == out.text
    model, sampler = ns["model"], ns["sampler"]
    assert story == model.generate("Once upon a time", sampler=sampler, max_tokens=32).text + "\n"


def test_quick_start() -> None:
    ns, printed = run_block("Hello world")
    code = block("Hello world").code
    out = ns["out"]
    # print(out.text, out.finish_reason)  # ' Paris.\n\nThe answer is: ...' 'length'
    assert "# ' Paris.\\n\\nThe answer is: ...' 'length'" in code
    assert out.text.startswith(" Paris.\n\nThe answer is: ") and out.finish_reason == "length"
    assert printed.startswith(out.text + " length\n")
    assert "# [19556, 905]" in code and ns["ids"] == [19556, 905]
    assert "shape (2, 49152)" in code
    assert ns["logits"].shape == (2, 49152) and ns["logits"].dtype == np.float32
    assert ns["nxt"].shape == (49152,)


def test_streaming_prints_a_haiku() -> None:
    ns, printed = run_block("Write a haiku")
    text, finished, rest = printed.partition("\n[eos]\n")
    assert finished, printed
    assert len(text.strip().splitlines()) >= 3, printed  # a poem, not an empty line
    assert "(The waves of the sea, ...)" in page("docs/quickstart.md") and text.startswith("The waves of the sea, ")
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
    text = page("docs/quickstart.md")
    assert printed.startswith("<|im_start|>system\nYou are a helpful ")
    assert "# <|im_start|>system\\nYou are a helpful ..." in text
    assert "# 'The capital of France is Paris.'" in text
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
    code = block("Grammar.json_schema(person)").code
    # Each comment shows what its line prints.
    assert lines == ['{"name": "John", "age": 30} eos', "2022-01-01", "positive", "4 + 2 = 6"]
    for line in lines:
        assert f"# {line}" in code, line
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
    assert f"# {third['text']!r} {third['finish_reason']!r} None" in page("docs/ray.md")


def test_server_in_process() -> None:
    ns, printed = run_block("running(config)")
    text = page("docs/server.md")
    reply, fingerprint, choices = printed.splitlines()
    assert "# The capital of France is Paris." in text and reply == "The capital of France is Paris."
    assert "# reprolm-0.1.0-b179c9523d0e (version, file hash)" in text
    assert fingerprint == ns["reply"].system_fingerprint and fingerprint.startswith(f"reprolm-{reprolm.__version__}-")
    model = reprolm.Model.default()
    expected = [model.generate("Once upon a time", max_tokens=16, sampler=reprolm.Sampler(temperature=0.8, seed=7 + i)).text
                for i in range(2)]
    assert choices == repr(expected)


def test_speculative_decoding() -> None:
    ns, printed = run_block('speculative="lookup"')
    first, second = printed.splitlines()
    assert first == "True True" and "# True True" in page("docs/speculative-decoding.md")
    assert second.startswith("True ") and second.endswith("%")
    stats = ns["stats"]
    assert second == f"True {stats.acceptance_rate:.0%}"
    assert ns["sampled"].speculation is not None and 0 < len(ns["sampled"].token_ids) <= 24
