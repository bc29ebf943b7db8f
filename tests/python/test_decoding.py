"""Decoding strategies from Python: greedy is not always the most probable sequence (CallableModel), beam search on
the real model, per-step statistics (logprobs=N), and CallableModel's contract."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reprolm
from reprolm import sampling

A, B, C = 0, 1, 2


def table_model(table: dict[tuple[int, ...], list[float]], vocab: int) -> reprolm.CallableModel:
    """The generated suffix (context after a one-token prompt) -> next-token distribution;
    the logits are ln p."""
    return reprolm.CallableModel(lambda prefix: np.log(table[tuple(prefix[1:])]), vocab)


# The toy models of docs/theory.md, "Greedy decoding and beam search".
# Greedy decoding misses the most probable sequence: V = {a, b}, n = 2.
GREEDY_COUNTEREXAMPLE = {(): [0.6, 0.4], (A,): [0.55, 0.45], (B,): [0.9, 0.1]}
# Beam width 2 misses the most probable sequence: V = {a, b, c}, n = 2, B = 2.
BEAM_COUNTEREXAMPLE = {
    (): [0.4, 0.35, 0.25],
    (A,): [0.4, 0.3, 0.3],
    (B,): [0.4, 0.3, 0.3],
    (C,): [0.9, 0.05, 0.05],
}


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float32).astype(np.float64)
    shifted: np.ndarray = z - z.max()
    logp: np.ndarray = shifted - math.log(np.exp(shifted).sum())
    return logp


def brute_force(fn: Callable[[list[int]], Any], vocab: int, prompt: list[int], n: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every sequence of length n with its log-probability, best first (ties: smaller sequence)."""
    scored = []
    for seq in itertools.product(range(vocab), repeat=n):
        logprob = 0.0
        for t in range(n):
            logprob += log_softmax(fn(prompt + list(seq[:t])))[seq[t]]
        scored.append((logprob, seq))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return scored


def test_greedy_returns_aa_not_ba() -> None:
    model = table_model(GREEDY_COUNTEREXAMPLE, 2)
    assert model.generate([0], max_tokens=2).token_ids == [A, A]
    best = brute_force(model.fn, 2, [0], 2)[0]
    assert best[1] == (B, A) and abs(math.exp(best[0]) - 0.36) < 1e-6
    beams = model.beam_search([0], beam_width=2, max_tokens=2)
    assert [b.token_ids for b in beams] == [[B, A], [A, A]]
    assert abs(math.exp(beams[0].logprob) - 0.36) < 1e-6 and abs(math.exp(beams[1].logprob) - 0.33) < 1e-6
    assert all(not b.finished and b.score == b.logprob and b.text == "" for b in beams)
    assert [b.token_ids for b in model.beam_search([0], beam_width=1, max_tokens=2)] == [[A, A]]


def test_beam_width_2_misses_ca() -> None:
    model = table_model(BEAM_COUNTEREXAMPLE, 3)
    narrow = model.beam_search([0], beam_width=2, max_tokens=2)
    assert narrow[0].token_ids == [A, A] and abs(math.exp(narrow[0].logprob) - 0.16) < 1e-6
    assert all(b.token_ids[0] != C for b in narrow), "c is pruned at step 1"
    best = brute_force(model.fn, 3, [0], 2)[0]
    assert best[1] == (C, A) and abs(math.exp(best[0]) - 0.225) < 1e-6
    # B = 3 = |V|^(n-1) finds it (an exhaustive width).
    assert model.beam_search([0], beam_width=3, max_tokens=2)[0].token_ids == [C, A]


def random_model(vocab: int, seed: int, scale: float, eos_id: Optional[int] = None) -> reprolm.CallableModel:
    """Logits a pseudo-random function of the whole context."""

    def fn(prefix: list[int]) -> np.ndarray:
        return np.random.default_rng([seed, *prefix]).normal(size=vocab) * scale

    return reprolm.CallableModel(fn, vocab, eos_id)


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 4),
    n=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    scale=st.floats(0.3, 3.0),
    extra=st.integers(0, 1),
)
def test_exhaustive_width_equals_brute_force(
    vocab: int, n: int, seed: int, scale: float, extra: int
) -> None:
    model = random_model(vocab, seed, scale)
    prompt = [seed % vocab]
    width = vocab ** (n - 1) + extra
    beams = model.beam_search(prompt, beam_width=width, max_tokens=n)
    ranked = brute_force(model.fn, vocab, prompt, n)
    assert len(beams) == min(width, vocab**n)
    best_logprob, best = ranked[0]
    if len(ranked) > 1 and ranked[0][0] - ranked[1][0] < 1e-9:
        # A near tie: the f64 sums of the two implementations may order it either way.
        assert tuple(beams[0].token_ids) in {ranked[0][1], ranked[1][1]}
    else:
        assert tuple(beams[0].token_ids) == best
    assert abs(beams[0].logprob - best_logprob) < 1e-9
    assert all(len(b.token_ids) == n and not b.finished for b in beams)
    assert [b.score for b in beams] == sorted((b.score for b in beams), reverse=True)


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 20),
    seed=st.integers(0, 2**32),
    scale=st.floats(0.2, 4.0),
    max_tokens=st.integers(0, 8),
    with_eos=st.booleans(),
)
def test_beam_width_1_is_greedy_on_random_models(
    vocab: int, seed: int, scale: float, max_tokens: int, with_eos: bool
) -> None:
    model = random_model(vocab, seed, scale, eos_id=seed % vocab if with_eos else None)
    prompt = [seed % 7 % vocab]
    greedy = model.generate(prompt, max_tokens=max_tokens)
    beams = model.beam_search(prompt, beam_width=1, max_tokens=max_tokens)
    assert len(beams) == 1
    assert beams[0].token_ids == greedy.token_ids
    assert beams[0].finished == (greedy.finish_reason == "eos")


def test_beam_width_1_is_greedy_on_the_real_model(model: reprolm.Model) -> None:
    prompt = "The three primary colors are"
    greedy = model.generate(prompt, max_tokens=12)
    beams = model.beam_search(prompt, beam_width=1, max_tokens=12)
    assert [b.token_ids for b in beams] == [greedy.token_ids]
    assert beams[0].text == greedy.text


def test_beam_search_on_the_real_model_ranks_true_log_probabilities(model: reprolm.Model) -> None:
    prompt = model.tokenize("The capital of France is")
    beams = model.beam_search(prompt, beam_width=3, max_tokens=5)
    assert len(beams) == 3
    assert [b.score for b in beams] == sorted((b.score for b in beams), reverse=True)
    assert len({tuple(b.token_ids) for b in beams}) == 3
    greedy = model.generate(prompt, max_tokens=5)
    for beam in beams:
        assert beam.text == model.detokenize(beam.token_ids)
        # log p(ids | prompt) from one fresh forward pass over prompt + ids.
        rows = model.logits(prompt + beam.token_ids)[len(prompt) - 1 : -1]
        logprob = sum(log_softmax(row)[t] for row, t in zip(rows, beam.token_ids))
        assert abs(beam.logprob - logprob) < 1e-9
        assert beam.finished == (beam.token_ids[-1] == model.config.eos_id)
    # The best beam is at least as probable as the greedy sequence.
    rows = model.logits(prompt + greedy.token_ids)[len(prompt) - 1 : -1]
    greedy_logprob = sum(log_softmax(row)[t] for row, t in zip(rows, greedy.token_ids))
    assert beams[0].logprob >= greedy_logprob - 1e-12


def test_beam_search_rejects_bad_arguments(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="'beam_width'"):
        model.beam_search("hi", beam_width=0, max_tokens=3)
    with pytest.raises(reprolm.InvalidArgumentError, match="'max_tokens'"):
        model.beam_search("hi", beam_width=2, max_tokens=-1)
    with pytest.raises(reprolm.InvalidArgumentError, match="'length_penalty'"):
        model.beam_search("hi", beam_width=2, max_tokens=3, length_penalty=math.nan)
    with pytest.raises(reprolm.EmptyPromptError):
        model.beam_search([], beam_width=2, max_tokens=3)
    with pytest.raises(reprolm.ContextOverflowError):
        model.beam_search("hi", beam_width=2, max_tokens=model.config.context_length)


# ---------------------------------------------------------------------------------------------
# Per-step statistics.


def test_logprobs_report_the_statistics_of_q(model: reprolm.Model) -> None:
    prompt = model.tokenize("Here is a short poem about the sea:")
    sampler = reprolm.Sampler(temperature=0.8, top_p=0.9, repetition_penalty=1.1, seed=3)
    out = model.generate(prompt, max_tokens=12, sampler=sampler, logprobs=4)
    assert len(out.steps) == len(out.token_ids) == 12
    # The same ids as without statistics: reporting does not change what is sampled.
    assert model.generate(prompt, max_tokens=12, sampler=sampler).token_ids == out.token_ids
    all_logits = model.logits(prompt + out.token_ids)
    for t, step in enumerate(out.steps):
        assert isinstance(step, reprolm.StepInfo)
        assert step.token_id == out.token_ids[t]
        history = prompt + out.token_ids[:t]
        logits = all_logits[len(history) - 1]
        q = sampler.distribution(logits, history, n_prompt=len(prompt))
        assert abs(step.logprob - math.log(q[step.token_id])) < 1e-12
        assert abs(step.entropy - sampling.entropy(q)) < 1e-9
        # Removed mass: 1 - p(S) with p the post-temperature distribution of the processed
        # logits, which is q's support renormalized.
        p = dataclasses.replace(sampler, top_p=1.0).distribution(logits, history, n_prompt=len(prompt))
        assert abs(step.removed_mass - (1 - p[q > 0].sum())) < 1e-12
        ranked = sampling.top_k_set(q, 4)
        assert [a[0] for a in step.alternatives] == [i for i in ranked if q[i] > 0]
        for token, logprob in step.alternatives:
            assert abs(logprob - math.log(q[token])) < 1e-12
        # Replaying the step with the single-step API gives the same selection.
        assert sampler.sample(logits, history, len(prompt), step=t) == dataclasses.replace(step, alternatives=[])


def test_logprobs_of_greedy_decoding_and_defaults(model: reprolm.Model) -> None:
    out = model.generate("Hello", max_tokens=4, logprobs=2)
    assert [s.token_id for s in out.steps] == out.token_ids
    assert all(s.logprob == 0.0 and s.entropy == 0.0 and s.removed_mass == 0.0 for s in out.steps)
    assert all(s.alternatives == [(s.token_id, 0.0)] for s in out.steps)
    assert model.generate("Hello", max_tokens=4).steps == []
    assert model.generate("Hello", max_tokens=4, logprobs=0).steps[0].alternatives == []
    with pytest.raises(reprolm.InvalidArgumentError, match="'logprobs'"):
        model.generate("Hello", max_tokens=4, logprobs=-1)


# ---------------------------------------------------------------------------------------------
# CallableModel.


def context_model(vocab: int = 7) -> Callable[[list[int]], np.ndarray]:
    """Logits depending on the whole context, with a record of the contexts seen."""
    seen: list[list[int]] = []

    def fn(prefix: list[int]) -> np.ndarray:
        seen.append(list(prefix))
        return np.random.default_rng([17, *prefix]).normal(size=vocab)

    fn.seen = seen  # type: ignore[attr-defined]
    return fn


def test_callable_generation_is_the_single_step_sampler_in_a_loop() -> None:
    fn = context_model()
    model = reprolm.CallableModel(fn, 7)
    sampler = reprolm.Sampler(temperature=1.2, top_k=5, presence_penalty=0.5, frequency_penalty=0.25, seed=11)
    prompt = [3, 1, 4]
    out = model.generate(prompt, max_tokens=30, sampler=sampler, logprobs=2)
    assert out.finish_reason == "length" and len(out.token_ids) == 30 and out.text == ""
    # The callable saw prompt + generated ids, one call per step.
    assert fn.seen == [prompt + out.token_ids[:t] for t in range(30)]  # type: ignore[attr-defined]
    for t, step in enumerate(out.steps):
        history = prompt + out.token_ids[:t]
        replay = dataclasses.replace(sampler, top_logprobs=2).sample(fn(history), history, len(prompt), step=t)
        assert replay == step
    # The same seed repeats, another seed differs.
    assert model.generate(prompt, max_tokens=30, sampler=sampler).token_ids == out.token_ids
    other = dataclasses.replace(sampler, seed=12)
    assert model.generate(prompt, max_tokens=30, sampler=other).token_ids != out.token_ids


@pytest.mark.parametrize(
    "convert",
    [lambda z: z, lambda z: z.astype(np.float32), lambda z: z.tolist(), tuple],
    ids=["float64", "float32", "list", "tuple"],
)
def test_callable_accepts_arrays_and_sequences(convert: Callable[[np.ndarray], Any]) -> None:
    fn = context_model()
    reference = reprolm.CallableModel(fn, 7).generate([1], max_tokens=10, sampler=reprolm.Sampler(seed=5))
    model = reprolm.CallableModel(lambda prefix: convert(fn(prefix)), 7)
    assert model.generate([1], max_tokens=10, sampler=reprolm.Sampler(seed=5)).token_ids == reference.token_ids


def test_callable_stops_at_eos_and_stop_tokens() -> None:
    # Token 2 is certain after two generated tokens; -inf logits are probability 0.
    def fn(prefix: list[int]) -> list[float]:
        return [0.0, 0.0, -math.inf] if len(prefix) < 3 else [-math.inf, -math.inf, 0.0]

    model = reprolm.CallableModel(fn, 3, eos_id=2)
    out = model.generate([0], max_tokens=10, sampler=reprolm.Sampler(seed=1))
    assert out.finish_reason == "eos" and out.token_ids[-1] == 2 and len(out.token_ids) == 3
    stop = model.generate([0], max_tokens=10, sampler=reprolm.Sampler(seed=1), stop_token_ids=[out.token_ids[0]])
    assert stop.finish_reason == "stop" and stop.token_ids == out.token_ids[:1]
    beams = model.beam_search([0], beam_width=2, max_tokens=10)
    assert all(b.finished and b.token_ids[-1] == 2 and len(b.token_ids) == 3 for b in beams)


class ModelFailure(Exception):
    pass


def test_exceptions_from_the_callable_propagate() -> None:
    def fn(prefix: list[int]) -> list[float]:
        if len(prefix) > 3:
            raise ModelFailure(f"boom at {len(prefix)}")
        return [0.0, 1.0, 2.0]

    model = reprolm.CallableModel(fn, 3)
    with pytest.raises(ModelFailure, match="boom at 4"):
        model.generate([0], max_tokens=10, sampler=reprolm.Sampler(seed=0))
    with pytest.raises(ModelFailure, match="boom at 4"):
        model.beam_search([0], beam_width=2, max_tokens=10)
    assert len(model.generate([0], max_tokens=3).token_ids) == 3


@pytest.mark.parametrize(
    ("returned", "error", "match"),
    [
        ([0.0, 1.0], reprolm.InvalidArgumentError, "returned 2 logits for a vocabulary of 3"),
        (np.zeros(4), reprolm.InvalidArgumentError, "returned 4 logits"),
        ([0.0, math.nan, 1.0], reprolm.InvalidArgumentError, "entry 1 .* NaN"),
        ([0.0, math.inf, 1.0], reprolm.InvalidArgumentError, "entry 1 .* inf"),
        (np.array([0.0, 1e39, 1.0]), reprolm.InvalidArgumentError, "outside the float32 range"),
        ([-math.inf] * 3, reprolm.InvalidArgumentError, "logits"),
        ("abc", TypeError, "sequence of floats"),
        (None, TypeError, "sequence of floats"),
        (np.zeros((3, 2)), TypeError, "shape"),
    ],
)
def test_bad_logits_raise_typed_errors(returned: Any, error: type[Exception], match: str) -> None:
    model = reprolm.CallableModel(lambda prefix: returned, 3)
    with pytest.raises(error, match=match):
        model.generate([0], max_tokens=2, sampler=reprolm.Sampler(seed=0))
    with pytest.raises(error, match=match):
        model.beam_search([0], beam_width=2, max_tokens=2)


def test_callable_model_rejects_bad_arguments() -> None:
    fn = context_model()
    with pytest.raises(TypeError, match="callable"):
        reprolm.CallableModel(42, 7)  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidArgumentError, match="'vocab_size'"):
        reprolm.CallableModel(fn, 0)
    with pytest.raises(reprolm.InvalidArgumentError, match="'eos_id'"):
        reprolm.CallableModel(fn, 7, eos_id=7)
    model = reprolm.CallableModel(fn, 7, eos_id=6)
    assert (model.vocab_size, model.eos_id, model.fn) == (7, 6, fn)
    with pytest.raises(reprolm.EmptyPromptError):
        model.generate([], max_tokens=2)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate([7], max_tokens=2)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate([1], max_tokens=2, stop_token_ids=[-1])
    with pytest.raises(reprolm.InvalidArgumentError, match="'max_tokens'"):
        model.generate([1], max_tokens=-2)
    with pytest.raises(reprolm.InvalidArgumentError, match="'banned_token_ids'"):
        model.generate([1], max_tokens=2, sampler=reprolm.Sampler(banned_token_ids=[8]))
    with pytest.raises(reprolm.InvalidArgumentError, match="'beam_width'"):
        model.beam_search([1], beam_width=0, max_tokens=2)
    assert fn.seen == []  # type: ignore[attr-defined]
