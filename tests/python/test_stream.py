"""Streaming and stop strings."""

from __future__ import annotations

from typing import Any

import pytest

import reprolm

# Japanese and emoji replies whose characters span several tokens, and code.
PROMPTS = [
    "<|im_start|>user\n日本語で挨拶してください。<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nReply with three emojis.<|im_end|>\n<|im_start|>assistant\n",
    "def quicksort(arr):\n",
]


def splits_a_character(model: reprolm.Model, ids: list[int]) -> bool:
    """Whether some token of ``ids`` is not whole UTF-8 on its own."""
    for i in ids:
        try:
            model.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            return True
    return False


@pytest.mark.parametrize("sampler", [None, reprolm.Sampler(temperature=0.9, top_p=0.95, seed=3)],
                         ids=["greedy", "sampled"])
def test_stream_deltas_join_to_generate_text(model: reprolm.Model, sampler: reprolm.Sampler | None) -> None:
    split_seen = False
    for prompt in PROMPTS:
        full = model.generate(prompt, max_tokens=20, sampler=sampler)
        chunks = list(model.stream(prompt, max_tokens=20, sampler=sampler))
        assert "".join(c.text for c in chunks) == full.text
        assert [i for c in chunks for i in c.token_ids] == full.token_ids
        assert [lp for c in chunks for lp in c.logprobs] == full.logprobs
        assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [full.finish_reason]
        for c in chunks:
            assert len(c.token_ids) == 1
            c.text.encode("utf-8")  # strict: no lone surrogates
        # A delta never ends inside a character: no replacement characters unless the
        # generation itself ended inside one.
        body = "".join(c.text for c in chunks[:-1])
        assert "\ufffd" not in body
        split_seen |= splits_a_character(model, full.token_ids)
    assert split_seen, "no prompt exercised a character split across tokens"


def test_split_character_is_emitted_once_complete(model: reprolm.Model) -> None:
    chunks = list(model.stream(PROMPTS[1], max_tokens=12))
    for c in chunks:
        raw = model.token_bytes(c.token_ids[0])
        if c.text == "":
            with pytest.raises(UnicodeDecodeError):
                raw.decode("utf-8")
    assert any(c.text == "" for c in chunks) and any(len(c.text.encode()) > 1 for c in chunks)


def test_stream_with_zero_tokens_reports_length(model: reprolm.Model) -> None:
    assert [(c.text, c.token_ids, c.finish_reason) for c in model.stream("Hi", max_tokens=0)] == [("", [], "length")]


def test_stream_checks_arguments_when_called(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.EmptyPromptError):
        model.stream("")
    with pytest.raises(reprolm.InvalidArgumentError, match="max_tokens"):
        model.stream("hi", max_tokens=-1)
    with pytest.raises(reprolm.InvalidArgumentError, match="stop"):
        model.stream("hi", stop=[""])


# --- stop strings -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paris(model: reprolm.Model, generations: list[dict[str, Any]]) -> dict[str, Any]:
    """Prompt 0: ' Paris.' (7042, 30) '\\n' '\\n' 'The' (504) ' answer' ..."""
    g = generations[0]
    assert model.detokenize(g["greedy_ids"][:5]) == " Paris.\n\nThe"
    return g


@pytest.mark.parametrize(
    ("stop", "text", "n_ids"),
    [
        (["s.\n\nTh"], " Pari", 5),         # spans 5 tokens, starts and ends inside tokens
        (["ari"], " P", 1),                 # inside the first token
        (["\n\n"], " Paris.", 4),           # exactly two tokens
        (["answer", ".\n"], " Paris", 3),   # the earliest match wins
        ("The answer", " Paris.\n\n", 6),   # a single string is one stop string
    ],
)
def test_stop_strings_across_token_boundaries(
    model: reprolm.Model, paris: dict[str, Any], stop: list[str] | str, text: str, n_ids: int
) -> None:
    got = model.generate(paris["prompt_ids"], max_tokens=30, stop=stop)
    assert (got.text, got.finish_reason) == (text, "stop")
    assert got.token_ids == paris["greedy_ids"][:n_ids]
    chunks = list(model.stream(paris["prompt_ids"], max_tokens=30, stop=stop))
    assert "".join(c.text for c in chunks) == text
    assert [i for c in chunks for i in c.token_ids] == got.token_ids
    assert chunks[-1].finish_reason == "stop"


def test_partial_stop_match_is_released(model: reprolm.Model, paris: dict[str, Any]) -> None:
    # "s.\n\nX" matches up to "s.\n\n", then fails: the held-back text must come out.
    plain = model.generate(paris["prompt_ids"], max_tokens=12)
    got = model.generate(paris["prompt_ids"], max_tokens=12, stop=["s.\n\nX", "zzz"])
    assert (got.text, got.token_ids, got.finish_reason) == (plain.text, plain.token_ids, plain.finish_reason)
    chunks = list(model.stream(paris["prompt_ids"], max_tokens=12, stop=["s.\n\nX"]))
    texts = [c.text for c in chunks]
    assert "".join(texts) == plain.text
    assert texts[1:4] == ["", "", ""] and texts[4] == "s.\n\nThe"  # held, then released together


def test_stop_string_in_multibyte_text(model: reprolm.Model) -> None:
    full = model.generate(PROMPTS[0], max_tokens=20)
    cut = full.text.index("挨")
    got = model.generate(PROMPTS[0], max_tokens=20, stop=["挨拶"])
    assert (got.text, got.finish_reason) == (full.text[:cut], "stop")
    assert full.token_ids[: len(got.token_ids)] == got.token_ids
    assert model.detokenize(got.token_ids).startswith(full.text[:cut] + "挨拶")


def test_stop_token_ids_report_stop(model: reprolm.Model, paris: dict[str, Any]) -> None:
    got = model.generate(paris["prompt_ids"], max_tokens=30, stop_token_ids=[504])
    # The stop token ("The") ends generation; its id is kept, its text is not.
    assert (got.token_ids, got.text, got.finish_reason) == (paris["greedy_ids"][:5], " Paris.\n\n", "stop")
    chunks = list(model.stream(paris["prompt_ids"], max_tokens=30, stop_token_ids=[504]))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].token_ids == [504]


# Streaming on a session ------------------------------------------------------------------


def test_session_stream_gives_the_chunks_of_a_fresh_stream_and_keeps_the_cache(model: reprolm.Model) -> None:
    sampler = reprolm.Sampler(temperature=0.9, top_p=0.95, seed=5)
    prompt = model.tokenize(PROMPTS[0], special=True)
    fresh = list(model.stream(prompt, max_tokens=12, sampler=sampler))
    session = model.session(context_length=256)
    session.prefill(prompt[:5])  # a cached prefix, reused
    chunks = list(session.stream(prompt, max_tokens=12, sampler=sampler))
    assert chunks == fresh
    generated = [i for c in chunks for i in c.token_ids]
    assert session.tokens == prompt + generated[:-1]
    # The next turn reuses the whole cache and continues like a fresh generation.
    turn2 = prompt + generated + model.tokenize("\nMore:")
    assert session.generate(turn2, max_tokens=6).token_ids == model.generate(turn2, max_tokens=6).token_ids


def test_session_is_busy_while_a_stream_is_open(model: reprolm.Model) -> None:
    prompt = model.tokenize("The capital of France is")
    session = model.session(context_length=64)
    stream = session.stream(prompt, max_tokens=8)
    first = next(stream)
    with pytest.raises(RuntimeError, match="generating"):
        session.step(1)
    with pytest.raises(RuntimeError, match="generating"):
        session.stream(prompt, max_tokens=2)
    stream.close()  # closing mid-way gives the session back, holding what was computed
    assert session.tokens == prompt + first.token_ids[:-1]  # the last id was never fed
    session.truncate(len(prompt))
    assert [c.token_ids for c in session.stream(prompt, max_tokens=3)][0] == first.token_ids[:1]
    abandoned = session.stream(prompt, max_tokens=3)
    del abandoned  # dropping an unstarted stream also gives the session back
    assert session.generate(prompt, max_tokens=1).token_ids == first.token_ids[:1]


def test_session_stream_checks_arguments_when_called(model: reprolm.Model) -> None:
    session = model.session(context_length=16)
    with pytest.raises(reprolm.EmptyPromptError):
        session.stream([], max_tokens=2)
    with pytest.raises(reprolm.InvalidArgumentError):
        session.stream([1, 2], max_tokens=-1)
    assert session.generate([1, 2], max_tokens=1).finish_reason in ("length", "eos")
