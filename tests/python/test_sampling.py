"""Sampling as docs/theory.md defines it, through the public Python API.

Every function used here is a thin binding of the Rust code that generation runs, so these
tests check the generation path itself from Python.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reprolm
from reprolm import sampling

PROPERTY = settings(max_examples=150, deadline=None)

# ---------------------------------------------------------------------------------------------
# Temperature (docs/theory.md, "Temperature").


def test_temperature_table_for_logits_2_1_0_to_four_decimals() -> None:
    table = [
        (0.1, [1.0000, 0.0000, 0.0000], 0.0005),
        (0.5, [0.8668, 0.1173, 0.0159], 0.4411),
        (1.0, [0.6652, 0.2447, 0.0900], 0.8324),
        (2.0, [0.5065, 0.3072, 0.1863], 1.0202),
        (100.0, [0.3367, 0.3333, 0.3300], 1.0986),
    ]
    for tau, expected_p, expected_h in table:
        p = sampling.softmax([2.0, 1.0, 0.0], tau)
        assert p.dtype == np.float64
        assert [round(x, 4) for x in p] == expected_p, tau
        assert round(sampling.entropy(p), 4) == expected_h, tau
    assert round(math.log(3), 4) == 1.0986


def test_temperature_limits_and_temperature_zero() -> None:
    z = [1.0, 3.0, -2.0, 3.0, 0.5]
    assert sampling.softmax(z, 1e-3).tolist() == [0.0, 0.5, 0.0, 0.5, 0.0]
    np.testing.assert_allclose(sampling.softmax(z, 1e9), 0.2, rtol=1e-8)
    # Temperature 0 is the greedy branch, the lowest-id argmax: not a division.
    assert sampling.softmax(z, 0.0).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


logit_vectors = st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=40)


@PROPERTY
@given(z=logit_vectors)
def test_entropy_grows_with_temperature_at_rate_variance_over_tau_cubed(z: list[float]) -> None:
    zs = np.array(z)

    def entropy_and_variance(tau: float) -> tuple[float, float]:
        p = sampling.softmax(zs, tau)
        mean = float(p @ zs)
        return sampling.entropy(p), float(p @ (zs - mean) ** 2)

    previous, tau = 0.0, 0.05
    while tau < 200:
        h, variance = entropy_and_variance(tau)
        assert h >= previous - 1e-12, f"entropy fell from {previous} to {h} at tau {tau}"
        previous = h
        step = tau * 1e-4
        slope = (entropy_and_variance(tau + step)[0] - entropy_and_variance(tau - step)[0]) / (2 * step)
        expected = variance / tau**3
        assert abs(slope - expected) <= 1e-6 * max(expected, 1.0) + 1e-9, (tau, slope, expected)
        tau *= 1.3
    assert previous <= math.log(len(z)) + 1e-12


@PROPERTY
@given(
    z=st.lists(st.integers(-20, 20), min_size=2, max_size=30),
    tau=st.floats(0.1, 10.0),
)
def test_temperature_preserves_the_order(z: list[int], tau: float) -> None:
    zs = np.array(z, dtype=np.float64) / 8  # a grid: ties occur, distinct values are apart
    p = sampling.softmax(zs, tau)
    for i, j in itertools.product(range(len(z)), repeat=2):
        if zs[i] > zs[j]:
            assert p[i] > p[j]
        elif zs[i] == zs[j]:
            assert p[i] == p[j]


# ---------------------------------------------------------------------------------------------
# Ranking, top-k, top-p and restriction (docs/theory.md, "Ranking, top-k and top-p" and
# "Truncation is conditioning"), with their worked examples.


def test_top_p_compares_exact_cumulative_sums() -> None:
    p = [0.5, 0.2, 0.2, 0.1]
    # In floating point 0.5 + 0.2 + 0.2 < 0.9, but the exact c_3 reaches 0.9: k(0.9) = 3.
    assert 0.5 + 0.2 + 0.2 < 0.9
    assert sampling.top_p_set(p, 0.9) == [0, 1, 2]
    assert sampling.top_p_set(p, 0.6) == [0, 1]
    assert sampling.top_p_set(p, 0.3) == [0]
    assert sampling.top_p_set(p, 1.0) == [0, 1, 2, 3]
    assert [round(x, 3) for x in sampling.restrict(p, [0, 1])] == [0.714, 0.286, 0.0, 0.0]
    assert sampling.top_k_set(p, 2) == [0, 1]
    assert sampling.top_p_set([0.97, 0.01, 0.01, 0.01], 0.9) == [0]
    assert sampling.top_p_set([0.25] * 4, 0.9) == [0, 1, 2, 3]
    # The sampler agrees: top_p = 0.9 on these probabilities keeps exactly {0, 1, 2}.
    q = reprolm.Sampler(top_p=0.9).distribution(np.log(p))
    assert np.flatnonzero(q).tolist() == [0, 1, 2]


def test_two_token_temperature_for_probability_0_9() -> None:
    tau = 1 / math.log(9)
    p = sampling.softmax([1.0, 0.0], tau)
    assert abs(p[0] - 0.9) <= 1e-15
    assert abs(tau - 0.455) < 5e-4
    p1 = sampling.softmax([1.0, 0.0], 1.0)
    assert abs(p1[0] - 0.731) < 5e-4 and abs(p1[1] - 0.269) < 5e-4
    h1, h_tau = sampling.entropy(p1), sampling.entropy(p)
    assert abs(h1 - 0.582) < 5e-4 and abs(h_tau - 0.325) < 5e-4
    assert h_tau < h1


def test_top_p_sets_restriction_and_removed_mass_of_a_five_token_distribution() -> None:
    p = [0.4, 0.3, 0.15, 0.1, 0.05]
    assert sampling.top_p_set(p, 0.5) == [0, 1]
    assert sampling.top_p_set(p, 0.8) == [0, 1, 2]
    assert sampling.top_p_set(p, 0.95) == [0, 1, 2, 3]
    q = sampling.restrict(p, [0, 1, 2])
    np.testing.assert_allclose(q, [0.471, 0.353, 0.176, 0.0, 0.0], atol=5e-4)
    tv = sampling.total_variation(p, q)
    assert abs(tv - 0.15) <= 1e-15
    assert tv <= 1 - 0.8


def ranking(p: Sequence[float]) -> list[int]:
    """The ranking pi: probability descending, ties by ascending id."""
    return sorted(range(len(p)), key=lambda i: (-p[i], i))


@st.composite
def distributions_with_ties(draw: st.DrawFn) -> list[float]:
    """p = w / sum(w) for small integer weights: equal weights give equal (tied) floats."""
    weights = draw(st.lists(st.integers(0, 5), min_size=1, max_size=8))
    weights[draw(st.integers(0, len(weights) - 1))] += 1
    total = sum(weights)
    return [w / total for w in weights]


@PROPERTY
@given(p=distributions_with_ties(), extra=st.lists(st.floats(1e-9, 1.0), max_size=5))
def test_top_p_is_minimal_and_monotone_with_ties(p: list[float], extra: list[float]) -> None:
    n = len(p)
    pi = ranking(p)
    exact = [Fraction(x) for x in p]
    c = list(itertools.accumulate(exact[i] for i in pi))  # exact cumulative sums c_j
    subsets = [s for r in range(n + 1) for s in itertools.combinations(range(n), r)]

    # Top-k is the first k of pi.
    for k in range(1, n + 1):
        assert sampling.top_k_set(p, k) == pi[:k]

    # Thresholds: every c_j, its float neighbours, and random ones.
    rhos = set(extra)
    for cj in c:
        x = float(cj)
        rhos.update({x, math.nextafter(x, 0), min(math.nextafter(x, 2), 1.0)})
    previous: list[int] = []
    for rho in sorted(r for r in rhos if 0 < r <= 1):
        top = sampling.top_p_set(p, rho)
        # k(rho) = min{ j : c_j >= rho }, computed exactly; without one, the positive support.
        k_rho = next((j + 1 for j, cj in enumerate(c) if cj >= Fraction(rho)), None)
        if k_rho is None:
            assert top == [i for i in pi if p[i] > 0]
        else:
            assert top == pi[:k_rho], (p, rho)
            # Minimality: no set of exact mass >= rho is smaller.
            smallest = min(len(s) for s in subsets if sum((exact[i] for i in s), Fraction(0)) >= rho)
            assert smallest == k_rho
        # Monotonicity: thresholds ascend, the sets grow as prefixes of the ranking.
        assert top[: len(previous)] == previous
        previous = top
        # The low end: a threshold up to the largest probability keeps exactly the greedy token.
        if rho <= p[pi[0]]:
            assert top == [pi[0]]


@PROPERTY
@given(
    z=st.lists(st.floats(-6, 6, allow_nan=False), min_size=1, max_size=40),
    members=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_restriction_is_conditioning(z: list[float], members: list[bool]) -> None:
    p = sampling.softmax(z, 1.0)
    subset = [i for i in range(len(z)) if members[i]] or [0]
    q = sampling.restrict(p, subset)
    mass = float(sum(Fraction(p[i]) for i in subset))
    inside = np.zeros(len(z), dtype=bool)
    inside[subset] = True
    np.testing.assert_allclose(q[inside], p[inside] / mass, rtol=1e-15)
    assert (q[~inside] == 0).all()
    assert abs(q.sum() - 1) <= 1e-14
    # TV(p, p_S) = 1 - p(S), the removed mass.
    assert abs(sampling.total_variation(p, q) - (1 - mass)) <= 1e-14


# ---------------------------------------------------------------------------------------------
# Drawing a token is faithful: it is the inverse CDF over token ids.

# The logits of docs/theory.md, "The sampler on one example".
WORKED_EXAMPLE_LOGITS = np.array([3.0, 2.5, 1.0, 0.2, -1.0, -2.0], dtype=np.float32)
# Upper 0.001 quantiles of chi-square with 1..5 degrees of freedom.
CHI_SQUARE_999 = [10.828, 13.816, 16.266, 18.467, 20.515]


@pytest.mark.parametrize(
    "settings_",
    [{}, {"top_k": 2}, {"top_p": 0.95}, {"min_p": 0.03}],
    ids=["plain", "top-k", "top-p", "min-p"],
)
def test_generated_tokens_follow_q_by_chi_square(settings_: dict[str, Any]) -> None:
    """200,000 tokens generated on a model whose logits are always the same fixed vector: 200 seeded
    generations of 1,000 tokens (draws uniform(seed, t) for t < 1000), so the counts are
    deterministic. The counts must fit q at the 0.001 level."""
    sampler = reprolm.Sampler(temperature=0.8, seed=0, **settings_)
    q = sampler.distribution(WORKED_EXAMPLE_LOGITS)
    model = reprolm.CallableModel(lambda prefix: WORKED_EXAMPLE_LOGITS, vocab_size=6)
    counts = np.zeros(6, dtype=np.int64)
    for seed in range(200):
        out = model.generate([0], max_tokens=1000, sampler=reprolm.Sampler(temperature=0.8, seed=20261010 + seed, **settings_))
        counts += np.bincount(out.token_ids, minlength=6)
    support = np.flatnonzero(q)
    assert len(support) >= 2
    assert counts.sum() == 200_000
    assert (counts[q == 0] == 0).all(), "a token outside the support was drawn"
    expected = q[support] * 200_000
    chi_square = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi_square < CHI_SQUARE_999[len(support) - 2], (chi_square, counts.tolist(), q.tolist())


@PROPERTY
@given(
    z=st.lists(st.integers(-24, 24), min_size=2, max_size=50),
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 2**40),
    tau=st.sampled_from([0.5, 1.0, 1.7]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
)
def test_selection_is_the_inverse_cdf_of_q_over_token_ids(
    z: list[int], seed: int, step: int, tau: float, top_p: float
) -> None:
    logits = np.array(z, dtype=np.float32) / 4
    sampler = reprolm.Sampler(temperature=tau, top_p=top_p, seed=seed)
    q = sampler.distribution(logits)
    u = sampling.uniform(seed, step)
    cdf = np.cumsum(q)
    chosen = sampler.sample(logits, step=step).token_id
    # X = min{ j : C_j >= u } (the float cumsum decides unless u is within rounding of a C_j).
    if np.min(np.abs(cdf - u)) > 1e-12:
        assert chosen == int(np.searchsorted(cdf, u, side="left"))
    assert q[chosen] > 0


# ---------------------------------------------------------------------------------------------
# Reproducibility on the real model.

PROMPT = "Once upon a time, in a small village by the sea,"
SEED = 20261010
SEEDED: dict[str, Any] = dict(temperature=0.9, top_p=0.95, seed=SEED)


def seeded_ids(model: reprolm.Model, seed: Optional[int] = None) -> list[int]:
    sampler = reprolm.Sampler(**{**SEEDED, "seed": SEED if seed is None else seed})
    return model.generate(PROMPT, max_tokens=24, sampler=sampler).token_ids


def test_same_seed_same_ids_across_runs_threads_and_processes(model_path: Path) -> None:
    by_threads = {t: seeded_ids(reprolm.Model.load(model_path, threads=t)) for t in (1, 2, 4)}
    reference = by_threads[1]
    assert len(reference) == 24
    assert by_threads[2] == reference and by_threads[4] == reference
    model = reprolm.Model.load(model_path, threads=2)
    assert seeded_ids(model) == reference  # another run, same process
    script = (
        "import json, reprolm; m = reprolm.Model.load({path!r}, threads=1); "
        "s = reprolm.Sampler(**{settings!r}); "
        "print(json.dumps(m.generate({prompt!r}, max_tokens=24, sampler=s).token_ids))"
    ).format(path=str(model_path), settings=SEEDED, prompt=PROMPT)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == reference
    # Sampling really happens: another seed gives other ids, and so does greedy decoding.
    assert seeded_ids(model, seed=SEED + 1) != reference
    assert model.generate(PROMPT, max_tokens=24).token_ids != reference


# ---------------------------------------------------------------------------------------------
# Penalties, bias and masks against a NumPy reference of the documented semantics.


def reference_distribution(
    logits: np.ndarray, history: list[int], n_prompt: int, s: reprolm.Sampler
) -> np.ndarray:
    """The documented processors, written plainly in NumPy, then softmax(z / tau)."""
    z = logits.astype(np.float64)
    window = len(history) if s.penalty_window is None else min(s.penalty_window, len(history))
    for t in set(history[len(history) - window :]):  # repetition: each distinct token once
        z[t] = z[t] / s.repetition_penalty if z[t] > 0 else z[t] * s.repetition_penalty
    for t, count in Counter(history[n_prompt:]).items():  # OpenAI: generated tokens only
        z[t] = z[t] - count * s.frequency_penalty - s.presence_penalty
    for t, bias in s.logit_bias.items():
        z[t] += bias
    keep = np.ones(len(z), dtype=bool)
    if s.allowed_token_ids is not None:
        keep[:] = False
        keep[list(s.allowed_token_ids)] = True
    keep[list(s.banned_token_ids)] = False
    z[~keep] = -np.inf
    e: np.ndarray = np.exp((z - z[keep].max()) / s.temperature)
    q: np.ndarray = e / e.sum()
    return q


@pytest.mark.parametrize("case", range(300))
def test_penalties_and_bias_match_the_numpy_reference(case: int) -> None:
    rng = np.random.default_rng(case)
    vocab = 40
    logits = (rng.normal(size=vocab) * 3).astype(np.float32)
    history = rng.integers(0, vocab, size=rng.integers(1, 30)).tolist()
    n_prompt = int(rng.integers(0, len(history) + 1))
    biased = rng.choice(vocab, size=3, replace=False)
    sampler = reprolm.Sampler(
        temperature=float(rng.choice([0.7, 1.0, 1.6])),
        repetition_penalty=float(rng.choice([1.0, 1.3, 0.8, 2.5])),
        penalty_window=[None, 0, 3, 12, 1000][case % 5],
        presence_penalty=float(rng.choice([0.0, 0.4, -0.3])),
        frequency_penalty=float(rng.choice([0.0, 0.7, -0.2])),
        logit_bias={int(t): float(rng.normal() * 2) for t in biased},
        allowed_token_ids=sorted(rng.choice(vocab, size=25, replace=False).tolist()) if case % 4 == 0 else None,
        banned_token_ids=rng.choice(vocab, size=2, replace=False).tolist(),
        seed=case,
    )
    kept = np.ones(vocab, dtype=bool)
    if sampler.allowed_token_ids is not None:
        kept[:] = False
        kept[list(sampler.allowed_token_ids)] = True
    kept[list(sampler.banned_token_ids)] = False
    assert kept.any()  # 25 allowed, 2 banned: some token always survives the masks
    expected = reference_distribution(logits, history, n_prompt, sampler)
    q = sampler.distribution(logits, history, n_prompt)
    np.testing.assert_allclose(q, expected, rtol=1e-12, atol=0)
    assert (q[~kept] == 0).all()
    # The chosen token has positive probability and its reported log-probability is ln q.
    step = sampler.sample(logits, history, n_prompt, step=3)
    assert kept[step.token_id]
    assert abs(step.logprob - math.log(q[step.token_id])) <= 1e-12


def test_penalty_semantics_by_hand() -> None:
    # Logits (2, -1, 0.5, 1); history: prompt [0, 1], generated [2, 2, 0].
    z = np.array([2.0, -1.0, 0.5, 1.0], dtype=np.float32)
    sampler = reprolm.Sampler(
        repetition_penalty=2.0,
        penalty_window=4,  # [1, 2, 2, 0]
        presence_penalty=0.25,
        frequency_penalty=0.5,
        logit_bias={3: -1.5, 1: 0.75},
    )
    adjusted = [2.0 / 2 - 0.5 - 0.25, -1.0 * 2 + 0.75, 0.5 / 2 - 2 * 0.5 - 0.25, 1.0 - 1.5]
    q = sampler.distribution(z, [0, 1, 2, 2, 0], n_prompt=2)
    assert q.tolist() == sampling.softmax(adjusted, 1.0).tolist()


# ---------------------------------------------------------------------------------------------
# Validation.


@pytest.mark.parametrize(
    ("settings_", "name"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": math.nan}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"penalty_window": -2}, "penalty_window"),
        ({"presence_penalty": math.inf}, "presence_penalty"),
        ({"logit_bias": {1: math.nan}}, "logit_bias"),
        ({"banned_token_ids": [-1]}, "banned_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"top_logprobs": -1}, "top_logprobs"),
    ],
)
def test_invalid_settings_raise_naming_the_setting(settings_: dict[str, object], name: str) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match=f"'{name}'") as info:
        reprolm.Sampler(**settings_)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_ids_outside_the_vocabulary_raise_when_used() -> None:
    z = np.zeros(4, dtype=np.float32)
    with pytest.raises(reprolm.InvalidArgumentError, match="'banned_token_ids'"):
        reprolm.Sampler(banned_token_ids=[9]).distribution(z)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        reprolm.Sampler().distribution(z, history=[1, 4])
    with pytest.raises(reprolm.TokenOutOfRangeError):
        reprolm.Sampler().sample(z, history=[-1])
    with pytest.raises(reprolm.InvalidArgumentError, match="'step'"):
        reprolm.Sampler().sample(z, step=-1)
    with pytest.raises(reprolm.InvalidArgumentError, match="'logits'"):
        reprolm.Sampler().sample(np.array([0.0, np.nan], dtype=np.float32))
