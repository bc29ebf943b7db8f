"""Greedy generation against the reference continuations."""

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
        ends_with_eos = expected[-1] == model.config.eos_id
        # The end-of-sequence token that ends generation adds no text (its id stays).
        assert got.text == model.detokenize(expected[:-1] if ends_with_eos else expected)
        assert got.finish_reason == ("eos" if ends_with_eos else "length")


def test_the_ending_token_adds_no_text(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    # The text (and the stream) must not end with the ending token's text "<|im_end|>".
    g = next(g for g in generations if g["greedy_ids"][-1] == model.config.eos_id)
    for got in (model.generate(g["prompt_ids"], max_tokens=64),
                model.session().generate(g["prompt_ids"], max_tokens=64)):
        assert got.finish_reason == "eos" and got.token_ids[-1] == model.config.eos_id
        assert "<|im_end|>" not in got.text and got.text == model.detokenize(got.token_ids[:-1])
    chunks = list(model.stream(g["prompt_ids"], max_tokens=64))
    assert chunks[-1].finish_reason == "eos" and chunks[-1].token_ids == [model.config.eos_id]
    assert chunks[-1].text == "" and "".join(c.text for c in chunks) == got.text
    # A stop token likewise ends generation without adding its text.
    stop = g["greedy_ids"][2]
    stopped = model.generate(g["prompt_ids"], max_tokens=64, stop_token_ids=[stop])
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop
    assert stopped.text == model.detokenize(stopped.token_ids[:-1])


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
