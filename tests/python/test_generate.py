"""Greedy generation against the reference continuations (issue 2, item 3)."""

from __future__ import annotations

from typing import Any

import pytest

import reprolm


def test_greedy_reproduces_reference(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    for i, g in enumerate(generations):
        expected = g["greedy_ids"]
        got = model.generate(g["prompt_ids"], max_tokens=len(expected))
        first = next((t for t, (a, b) in enumerate(zip(got.token_ids, expected)) if a != b), None)
        assert got.token_ids == expected, f"prompt {i}: first divergence at token {first}"
        assert got.text == model.detokenize(expected)
        eos = model.config.eos_id
        assert got.finish_reason == ("eos" if expected[-1] == eos else "length")


def test_text_prompt_parses_special_tokens(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    chat = generations[2]
    assert model.tokenize(chat["prompt"], special=True) == chat["prompt_ids"]
    got = model.generate(chat["prompt"], max_tokens=8)
    assert got.token_ids == chat["greedy_ids"][:8]


def test_stop_token_ids_end_generation(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    g = generations[4]
    stop = g["greedy_ids"][3]
    got = model.generate(g["prompt_ids"], max_tokens=20, stop_token_ids=[stop])
    assert got.token_ids == g["greedy_ids"][: g["greedy_ids"].index(stop) + 1]
    assert got.finish_reason == "stop"


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt_raises(model: reprolm.Model, prompt: reprolm.Prompt) -> None:
    with pytest.raises(reprolm.EmptyPromptError):
        model.generate(prompt)


def test_bad_settings_raise(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="max_tokens"):
        model.generate("hi", max_tokens=-1)
    with pytest.raises(reprolm.ContextOverflowError):
        model.generate("hi", max_tokens=model.config.context_length)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate([1, 2, model.config.vocab_size])
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate("hi", stop_token_ids=[-3])
