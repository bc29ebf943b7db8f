"""Several prompts at once: each result is the same bits as alone."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import reprolm


def test_batch_equals_single(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    # Text and id prompts mixed; two share a long prefix (the cache is reused across prompts),
    # one repeats. Sampling at temperature 1 makes ln q(token) a function of every logit's bits.
    chat = generations[2]["prompt"]
    prompts: list[reprolm.Prompt] = [
        chat,
        chat.replace("boiling", "freezing"),
        generations[3]["prompt_ids"],
        "1, 2, 3,",
        chat,
    ]
    sampler = reprolm.Sampler(temperature=1.0, seed=11)
    batch = model.generate(prompts, max_tokens=10, sampler=sampler, stop=["\n\n"])
    assert isinstance(batch, list) and len(batch) == len(prompts)
    for prompt, got in zip(prompts, batch):
        alone = model.generate(prompt, max_tokens=10, sampler=sampler, stop=["\n\n"])
        assert got == alone  # text, ids, finish reason, prompt ids
        assert np.array_equal(np.array(got.logprobs).view(np.uint64), np.array(alone.logprobs).view(np.uint64))
        assert all(lp < 0 for lp in got.logprobs)
    assert batch[0] == batch[4]
    # With per-step statistics: the same completions, one StepInfo per token.
    with_steps = model.generate(prompts, max_tokens=10, sampler=sampler, stop=["\n\n"], logprobs=3)
    assert isinstance(with_steps, list)
    for got, plain in zip(with_steps, batch):
        assert dataclasses.replace(got, steps=[]) == plain and [s.token_id for s in got.steps] == got.token_ids
        assert [s.logprob for s in got.steps] == got.logprobs and all(len(s.alternatives) == 3 for s in got.steps)


def test_batch_greedy_matches_reference(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    batch = model.generate([g["prompt_ids"] for g in generations[:4]], max_tokens=12)
    for g, got in zip(generations, batch):
        assert got.token_ids == g["greedy_ids"][:12]


def test_batch_validates_every_prompt_first(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.EmptyPromptError):
        model.generate(["fine", ""], max_tokens=2)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate([[1, 2], [model.config.vocab_size]], max_tokens=2)
    with pytest.raises(reprolm.EmptyPromptError):
        model.generate([])  # an empty list is an empty prompt, not an empty batch
