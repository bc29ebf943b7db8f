"""Raw and processed log-probabilities in the library (``logprobs_mode``) and
:meth:`Model.score`, checked against a float64 log-softmax of :meth:`Model.logits`."""

from __future__ import annotations

import numpy as np
import pytest

import reprolm

PROMPT = "The three primary colors are"


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """log softmax of each row, in float64 (a reference independent of the engine's)."""
    z = logits.astype(np.float64)
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top(row: np.ndarray, n: int) -> list[int]:
    """The n largest entries' ids, value descending, ties by ascending id."""
    return sorted(range(len(row)), key=lambda i: (-row[i], i))[:n]


def test_raw_logprobs_are_the_models_log_softmax_whatever_the_sampler(model: reprolm.Model) -> None:
    sampler = reprolm.Sampler(temperature=0.7, top_k=5, repetition_penalty=1.3, seed=11)
    ids = model.tokenize(PROMPT)
    raw = model.generate(ids, max_tokens=6, sampler=sampler, logprobs=3, logprobs_mode="raw")
    processed = model.generate(ids, max_tokens=6, sampler=sampler, logprobs=3)
    # the mode never changes the tokens, only what is reported about them
    assert raw.token_ids == processed.token_ids and len(raw.steps) == 6
    reference = log_softmax64(model.logits(ids + raw.token_ids[:-1]))[len(ids) - 1:]
    for step, row in zip(raw.steps, reference):
        assert abs(step.logprob - row[step.token_id]) < 1e-9
        assert [i for i, _ in step.alternatives] == top(row, 3)
        assert all(abs(lp - row[i]) < 1e-9 for i, lp in step.alternatives)
    assert raw.logprobs == [s.logprob for s in raw.steps]
    # processed: ln q of the truncated, penalized distribution at temperature 0.7, not the model's
    assert all(abs(p.logprob - r.logprob) > 1e-6 for p, r in zip(processed.steps, raw.steps))
    assert all(len(p.alternatives) <= 3 for p in processed.steps)


def test_greedy_reports_the_point_mass_or_the_models_probability(model: reprolm.Model) -> None:
    processed = model.generate(PROMPT, max_tokens=3, logprobs=1)
    assert [s.logprob for s in processed.steps] == [0.0, 0.0, 0.0]
    raw = model.generate(PROMPT, max_tokens=3, logprobs=1, logprobs_mode="raw")
    assert raw.token_ids == processed.token_ids
    ids = model.tokenize(PROMPT)
    reference = log_softmax64(model.logits(ids + raw.token_ids[:-1]))[len(ids) - 1:]
    assert [s.alternatives[0][0] for s in raw.steps] == raw.token_ids  # greedy: the most probable
    assert np.allclose([s.logprob for s in raw.steps], [row[t] for row, t in zip(reference, raw.token_ids)],
                       atol=1e-9, rtol=0)
    assert all(s.logprob < 0 for s in raw.steps)


def test_every_entry_point_takes_the_mode(model: reprolm.Model) -> None:
    sampler = reprolm.Sampler(temperature=0.9, seed=5)
    want = model.generate(PROMPT, max_tokens=4, sampler=sampler, logprobs=0, logprobs_mode="raw").logprobs
    assert model.generate(PROMPT, max_tokens=4, sampler=reprolm.Sampler(temperature=0.9, seed=5,
                                                                        logprobs_mode="raw")).logprobs == want
    assert model.submit(PROMPT, max_tokens=4, sampler=sampler, logprobs_mode="raw").result().logprobs == want
    assert [lp for c in model.stream(PROMPT, max_tokens=4, sampler=sampler, logprobs_mode="raw")
            for lp in c.logprobs] == want
    assert model.session().generate(PROMPT, max_tokens=4, sampler=sampler, logprobs_mode="raw").logprobs == want
    assert [lp for c in model.session().stream(PROMPT, max_tokens=4, sampler=sampler, logprobs_mode="raw")
            for lp in c.logprobs] == want
    messages = [{"role": "user", "content": "Hi"}]
    chat = model.chat(messages, max_tokens=3, sampler=sampler, logprobs_mode="raw")
    assert chat.logprobs == model.generate(model.chat_ids(messages), max_tokens=3, sampler=sampler,
                                           logprobs_mode="raw").logprobs
    # the keyword overrides the sampler's own mode; the default keeps it
    assert model.generate(PROMPT, max_tokens=4, sampler=reprolm.Sampler(temperature=0.9, seed=5, logprobs_mode="raw"),
                          logprobs_mode="processed").logprobs != want


def test_an_unknown_mode_is_refused_naming_it(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="logprobs_mode"):
        reprolm.Sampler(logprobs_mode="softmax")  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidArgumentError, match="logprobs_mode"):
        model.generate(PROMPT, max_tokens=1, logprobs_mode="RAW")  # type: ignore[arg-type]


def test_score_is_the_float64_log_softmax_of_one_forward_pass(model: reprolm.Model) -> None:
    context, continuation = "The capital of France is", " Paris, a city of light."
    score = model.score(continuation, context=context, top_logprobs=2)
    ids = model.tokenize(context + continuation)
    start = len(model.tokenize(context))
    assert score.context_ids == ids[:start] and score.token_ids == ids[start:]
    reference = log_softmax64(model.logits(ids))[start - 1:-1]
    expected = [row[t] for row, t in zip(reference, score.token_ids)]
    assert np.allclose(score.logprobs, expected, atol=1e-9, rtol=0)
    assert score.is_greedy == [top(row, 1)[0] == t for row, t in zip(reference, score.token_ids)]
    assert [[i for i, _ in alts] for alts in score.top_logprobs] == [top(row, 2) for row in reference]
    assert abs(score.logprob - float(np.sum(expected))) < 1e-9
    # ids give the same numbers; without a context the first token is the context
    by_ids = model.score(ids[start:], context=ids[:start])
    assert by_ids.logprobs == score.logprobs and by_ids.is_greedy == score.is_greedy
    whole = model.score(ids)
    assert whole.context_ids == ids[:1] and whole.logprobs[start - 1:] == score.logprobs


def test_a_greedy_continuation_scores_as_greedy_with_the_generations_raw_logprobs(model: reprolm.Model) -> None:
    generated = model.generate(PROMPT, max_tokens=8, logprobs=0, logprobs_mode="raw")
    score = model.score(generated.token_ids, context=PROMPT)
    assert score.greedy and all(score.is_greedy)
    # one forward pass gives each position the bits of the generation's steps
    assert score.logprobs == generated.logprobs
    nudged = list(generated.token_ids)
    nudged[3] = top(log_softmax64(model.logits(model.tokenize(PROMPT) + nudged[:3]))[-1], 2)[1]
    assert not model.score(nudged, context=PROMPT).greedy


def test_score_refuses_what_it_cannot_score(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="continuation"):
        model.score("", context="Hello")
    with pytest.raises(reprolm.InvalidArgumentError, match="continuation"):
        model.score([model.tokenize("Hi")[0]])
    with pytest.raises(reprolm.InvalidTypeError):
        model.score(" world", context=model.tokenize("Hello"))
    with pytest.raises(reprolm.InvalidArgumentError, match="top_logprobs"):
        model.score(" world", context="Hello", top_logprobs=-1)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.score([model.config.vocab_size], context="Hello")


def test_score_gives_the_same_bits_however_the_pass_is_split(model: reprolm.Model) -> None:
    # The pass runs in blocks of 256 tokens: here the context without logits takes two blocks,
    # and the longer continuation's rows with logits cross a block boundary.
    ids = model.tokenize(" ".join(f"item{i}" for i in range(120)))[:290]
    assert len(ids) == 290
    short = model.score(ids[270:], context=ids[:270])
    long = model.score(ids[10:], context=ids[:10])
    assert len(short.logprobs) == 20 and long.logprobs[260:] == short.logprobs
    assert long.is_greedy[260:] == short.is_greedy
