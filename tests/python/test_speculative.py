"""Speculative decoding through the Python API: the same completions and chunks as
plain decoding, statistics on the results, the CLI flags, typed errors, and an end-to-end
chi-square check of speculative sampling on CallableModels over 50,000 runs (the 200,000-run tests
are in Rust, tests/speculative_exact.rs, on the same acceptance code)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest

import reprolm
from reprolm import CallableModel, InvalidArgumentError, Model, Sampler, Speculative, SpeculationStats

COPY = ("<|im_start|>user\nRepeat this sentence exactly: The quick brown fox jumps over the lazy dog, "
        "and the lazy dog sleeps.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def drafter(model_path: object) -> Model:
    return Model.load(model_path, precision="int8")  # type: ignore[arg-type]


def test_greedy_completions_are_plain_greedy_with_statistics(model: Model, drafter: Model) -> None:
    plain = model.generate(COPY, max_tokens=24, logprobs=2)
    for speculative in ["lookup", drafter, Speculative("lookup", draft_tokens=2, adaptive=False),
                        Speculative(drafter, draft_tokens=4)]:
        fast = model.generate(COPY, max_tokens=24, logprobs=2, speculative=speculative)
        assert (fast.text, fast.token_ids, fast.finish_reason, fast.logprobs) == (
            plain.text, plain.token_ids, plain.finish_reason, plain.logprobs)
        assert fast.steps == plain.steps
        stats = fast.speculation
        assert isinstance(stats, SpeculationStats)
        assert 0 < stats.accepted <= stats.drafted
        assert stats.passes < len(fast.token_ids)
        assert stats.acceptance_rate == stats.accepted / stats.drafted
        assert stats.mean_accepted_length == stats.accepted / stats.drafting_passes
    assert plain.speculation is None
    # A list of prompts: each as if alone.
    prompts = [COPY, "The capital of France is"]
    assert [c.token_ids for c in model.generate(prompts, max_tokens=8, speculative="lookup")] == [
        c.token_ids for c in model.generate(prompts, max_tokens=8)]


def test_streams_chat_and_sessions(model: Model, drafter: Model) -> None:
    sampler = Sampler(temperature=0.8, top_p=0.9, seed=3)
    plain = list(model.stream(COPY, max_tokens=20, sampler=sampler, stop=["lazy dog"]))
    fast = list(model.stream(COPY, max_tokens=20, sampler=sampler, stop=["lazy dog"], speculative="lookup"))
    assert [(c.text, c.token_ids, c.finish_reason) for c in fast] == [
        (c.text, c.token_ids, c.finish_reason) for c in plain]
    assert fast[-1].speculation is not None and all(c.speculation is None for c in fast[:-1])

    messages = [{"role": "user", "content": "Repeat: one two three four five six seven."}]
    assert model.chat(messages, max_tokens=16, speculative=drafter).text == model.chat(messages, max_tokens=16).text
    assert "".join(c.text for c in model.chat_stream(messages, max_tokens=16, speculative="lookup")) == \
        model.chat(messages, max_tokens=16).text

    session = model.session(context_length=256)
    first = session.generate(COPY, max_tokens=12, speculative="lookup")
    assert first.token_ids == model.generate(COPY, max_tokens=12).token_ids
    assert first.speculation is not None
    assert session.tokens == model.tokenize(COPY, special=True) + first.token_ids[:-1]
    chunks = list(session.stream(COPY, max_tokens=12, speculative=drafter))
    assert [t for c in chunks for t in c.token_ids] == first.token_ids

    window = model.session(context_length=128, overflow="sliding_window")
    with pytest.raises(InvalidArgumentError, match="overflow"):
        window.generate(COPY, max_tokens=4, speculative="lookup")
    assert window.generate(COPY, max_tokens=4).token_ids == first.token_ids[:4]  # the session is usable


def test_sampling_with_a_draft_model_is_reproducible_whatever_k(model: Model, drafter: Model) -> None:
    sampler = Sampler(temperature=0.7, seed=5)
    runs = [model.generate(COPY, max_tokens=16, sampler=sampler, speculative=Speculative(drafter, draft_tokens=k,
                                                                                         adaptive=adaptive))
            for k, adaptive in [(1, False), (3, False), (8, True)]]
    assert all(r.token_ids == runs[0].token_ids and r.logprobs == runs[0].logprobs for r in runs)
    # The same bits on one thread (target and drafter).
    one = Model.load(model.path, threads=1)
    one_drafter = Model.load(model.path, threads=1, precision="int8")
    single = one.generate(COPY, max_tokens=16, sampler=sampler, speculative=Speculative(one_drafter, draft_tokens=3))
    assert (single.token_ids, single.logprobs) == (runs[0].token_ids, runs[0].logprobs)


def test_bad_settings_raise_typed_errors(model: Model) -> None:
    with pytest.raises(InvalidArgumentError, match="draft_tokens"):
        model.generate("Hi", max_tokens=2, speculative=Speculative("lookup", draft_tokens=0))
    with pytest.raises(InvalidArgumentError, match="ngram"):
        model.generate("Hi", max_tokens=2, speculative=Speculative("lookup", ngram_min=3, ngram_max=2))
    with pytest.raises(InvalidArgumentError, match="drafter"):
        model.generate("Hi", max_tokens=2, speculative="ngram")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drafter"):
        model.generate("Hi", max_tokens=2, speculative=3)  # type: ignore[arg-type]
    toy = CallableModel(lambda ids: np.zeros(model.config.vocab_size), model.config.vocab_size)
    with pytest.raises(InvalidArgumentError, match="CallableModel"):
        model.generate("Hi", max_tokens=2, speculative=toy)
    with pytest.raises(reprolm.ContextOverflowError):
        model.generate("Hi", max_tokens=10**6, speculative="lookup")


# A toy target and drafter over 3 tokens whose next-token logits depend on the last token.
TARGET = np.log(np.array([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.45, 0.1, 0.45]]))
DRAFT = np.log(np.array([[0.1, 0.1, 0.8], [0.3, 0.6, 0.1], [0.05, 0.9, 0.05]]))


def _chain(table: np.ndarray) -> CallableModel:
    return CallableModel(lambda ids: table[ids[-1]], 3)


def _exact(sampler: Sampler, length: int) -> dict[tuple[int, ...], float]:
    """The probability of every sequence under plain sampling of TARGET with ``sampler``."""
    probs = {}
    for seq in itertools.product(range(3), repeat=length):
        p, context = 1.0, [0]
        for t in seq:
            p *= sampler.distribution(TARGET[context[-1]].astype(np.float32), context, 1)[t]
            context.append(t)
        probs[seq] = p
    return probs


@pytest.mark.parametrize("sampler", [Sampler(temperature=1.0), Sampler(temperature=0.9, top_k=2)])
def test_callable_speculative_sampling_matches_the_target_distribution(sampler: Sampler) -> None:
    runs, length = 50_000, 2
    target, draft = _chain(TARGET), _chain(DRAFT)
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(runs):
        s = Sampler(temperature=sampler.temperature, top_k=sampler.top_k, seed=seed)
        ids = tuple(target.generate([0], max_tokens=length, sampler=s, speculative=Speculative(draft, draft_tokens=2))
                    .token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    exact = _exact(sampler, length)
    assert all(exact[seq] > 0 for seq in counts), "a sequence the target cannot produce"
    cells = [seq for seq, p in exact.items() if p > 0]
    chi2 = sum((counts.get(seq, 0) - runs * exact[seq]) ** 2 / (runs * exact[seq]) for seq in cells)
    dof = len(cells) - 1
    # The 1 - 1e-4 quantile (Wilson-Hilferty): a fixed seed range, so the verdict is fixed too.
    h = 2 / (9 * dof)
    assert chi2 < dof * (1 - h + 3.719 * h ** 0.5) ** 3, (chi2, counts)


def test_callable_drafter_errors_propagate_and_lookup_is_plain() -> None:
    target = _chain(TARGET)

    def broken(ids: list[int]) -> np.ndarray:
        raise RuntimeError("drafter failed")

    with pytest.raises(RuntimeError, match="drafter failed"):
        target.generate([0], max_tokens=3, sampler=Sampler(temperature=1.0),
                        speculative=CallableModel(broken, 3))
    with pytest.raises(InvalidArgumentError, match="vocabulary"):
        target.generate([0], max_tokens=3, speculative=CallableModel(lambda ids: np.zeros(4), 4))
    prompt = [0, 1, 2, 0, 1, 2, 0]
    for seed in range(20):
        s = Sampler(temperature=1.0, seed=seed)
        plain = target.generate(prompt, max_tokens=6, sampler=s, logprobs=1)
        fast = target.generate(prompt, max_tokens=6, sampler=s, logprobs=1, speculative="lookup")
        assert (fast.token_ids, fast.steps) == (plain.token_ids, plain.steps)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reprolm", *args], capture_output=True, text=True, timeout=300)


def test_cli_speculative_flags(model_path: object) -> None:
    plain = _cli("generate", COPY, "-n", "16", "--no-echo")
    fast = _cli("generate", COPY, "-n", "16", "--no-echo", "--speculative", "lookup", "--draft-tokens", "4")
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == plain.stdout
    assert "accepted (acceptance rate" in fast.stderr and "mean accepted length" in fast.stderr
    drafted = _cli("generate", COPY, "-n", "8", "--no-echo", "--speculative", str(model_path))
    assert drafted.stdout == _cli("generate", COPY, "-n", "8", "--no-echo").stdout
    bad: Optional[subprocess.CompletedProcess[str]] = _cli("generate", "Hi", "--draft-tokens", "4")
    assert bad is not None and bad.returncode == 1 and "--draft-tokens needs --speculative" in bad.stderr
