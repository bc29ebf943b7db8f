"""Logits against the float32 reference and their determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprolm

TOLERANCE = 1e-3


def test_last_logits_match_reference(
    model: reprolm.Model, generations: list[dict[str, Any]], last_logits: np.ndarray
) -> None:
    assert last_logits.shape == (6, model.config.vocab_size)
    for i, g in enumerate(generations):
        logits = model.logits(g["prompt_ids"])
        assert logits.dtype == np.float32
        assert logits.shape == (len(g["prompt_ids"]), model.config.vocab_size)
        diff = np.abs(logits[-1] - last_logits[i]).max()
        assert diff < TOLERANCE, f"prompt {i}: max |diff| {diff}"


def test_every_position_matches_reference(
    model: reprolm.Model, generations: list[dict[str, Any]], all_positions_prompt2: np.ndarray
) -> None:
    logits = model.logits(generations[2]["prompt_ids"])
    assert logits.shape == all_positions_prompt2.shape
    assert np.abs(logits - all_positions_prompt2).max() < TOLERANCE


def test_bitwise_identical_across_thread_counts(model_path: Path, generations: list[dict[str, Any]]) -> None:
    ids = generations[2]["prompt_ids"]
    results = [reprolm.Model.load(model_path, threads=t).logits(ids) for t in (1, 2, 3, 4)]
    for r in results[1:]:
        assert np.array_equal(r, results[0])


def test_rows_equal_one_token_at_a_time_through_the_cache(
    model: reprolm.Model, generations: list[dict[str, Any]]
) -> None:
    ids = generations[0]["prompt_ids"] + generations[3]["prompt_ids"]
    full = model.logits(ids)
    session = model.session()
    for t, token in enumerate(ids):
        step = session.step(token)
        assert np.array_equal(step, full[t]), f"position {t}"


def test_config_is_read_from_metadata(model: reprolm.Model) -> None:
    c = model.config
    assert (c.architecture, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.head_dim, c.ffn_dim, c.vocab_size, c.context_length) == (64, 1536, 49152, 8192)
    assert (c.rope_base, c.bos_id, c.eos_id) == (100000.0, 1, 2)


@pytest.mark.parametrize("ids", [[], [49152], [-1], [0, 2**40]])
def test_bad_ids_raise(model: reprolm.Model, ids: list[int]) -> None:
    with pytest.raises(reprolm.InvalidInputError):
        model.logits(ids)
