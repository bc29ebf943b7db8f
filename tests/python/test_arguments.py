"""Wrong arguments raise typed errors that name them."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import reprolm


@pytest.mark.parametrize("huge", [2**63, 2**70, -(2**70), 10**40])
def test_token_ids_of_any_size_are_out_of_range(model: reprolm.Model, huge: int) -> None:
    session = model.session(context_length=16)
    calls: list[Callable[[], Any]] = [
        lambda: model.detokenize([huge]),
        lambda: model.detokenize([1, 2, huge]),
        lambda: model.token_bytes(huge),
        lambda: model.logits([1, huge]),
        lambda: model.generate([1, huge], max_tokens=1),
        lambda: model.generate([[1, 2], [huge]], max_tokens=1),
        lambda: list(model.stream([huge], max_tokens=1)),
        lambda: model.beam_search([huge], beam_width=2, max_tokens=1),
        lambda: session.prefill([huge]),
        lambda: session.step(huge),
        lambda: session.generate([huge], max_tokens=1),
        lambda: session.stream([huge], max_tokens=1),
    ]
    for call in calls:
        with pytest.raises(reprolm.TokenOutOfRangeError, match=f"token id {huge} is out of range"):
            call()
    assert session.tokens == []
    # Ids that fit in 64 bits were (and are) checked by the engine, with the same message.
    with pytest.raises(reprolm.TokenOutOfRangeError, match=f"token id {2**63 - 1} is out of range"):
        model.detokenize([2**63 - 1])


@pytest.mark.parametrize("bad", [None, 3.5, {"a": 1}, b"bytes", object()])
def test_prompts_of_the_wrong_type_name_the_argument(model: reprolm.Model, bad: Any) -> None:
    session = model.session(context_length=16)
    calls: list[Callable[[], Any]] = [
        lambda: model.generate(bad, max_tokens=1),
        lambda: model.stream(bad, max_tokens=1),
        lambda: model.beam_search(bad, beam_width=2, max_tokens=1),
        lambda: session.generate(bad, max_tokens=1),
        lambda: session.stream(bad, max_tokens=1),
    ]
    for call in calls:
        with pytest.raises(reprolm.InvalidTypeError, match="prompt must be text or a sequence of token ids"):
            call()
    with pytest.raises(reprolm.InvalidTypeError, match=r"prompt\[1\] must be text or a sequence of token ids"):
        model.generate(["a prompt", bad], max_tokens=1)
    # Typed: a TypeError, and a reprolm argument error.
    assert issubclass(reprolm.InvalidTypeError, TypeError)
    assert issubclass(reprolm.InvalidTypeError, reprolm.InvalidArgumentError)


def test_other_arguments_of_the_wrong_type_name_themselves(model: reprolm.Model) -> None:
    session = model.session(context_length=16)
    with pytest.raises(reprolm.InvalidTypeError, match="text must be a str, got None"):
        model.tokenize(None)  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidTypeError, match="text must be a str, got list"):
        model.tokenize([1, 2])  # type: ignore[arg-type]
    for call in (model.detokenize, model.logits, session.prefill):
        with pytest.raises(reprolm.InvalidTypeError, match="ids must be a sequence of token ids"):
            call(None)  # type: ignore[arg-type]
        with pytest.raises(reprolm.InvalidTypeError, match="ids must be a sequence of token ids"):
            call("hello")  # type: ignore[arg-type]
    for call in (model.token_bytes, session.step):
        with pytest.raises(reprolm.InvalidTypeError, match="token_id must be a token id"):
            call(None)  # type: ignore[arg-type]
    # What was accepted still is: NumPy arrays and integers, tuples, ranges.
    ids = model.tokenize("Hello world")
    assert model.detokenize(np.array(ids)) == model.detokenize(tuple(ids)) == "Hello world"
    assert model.token_bytes(np.int64(ids[0])) == model.token_bytes(ids[0])
    assert model.generate(np.array(ids), max_tokens=2) == model.generate(ids, max_tokens=2)
    assert np.array_equal(model.logits(range(1, 4)), model.logits([1, 2, 3]))


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "user"}], r"messages\[0\].*has no 'content'"),
        ([{"role": "system", "content": "Be brief."}, {"content": "Hi"}], r"messages\[1\].*has no 'role'"),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant"}], r"messages\[1\].*has no 'content'"),
    ],
)
def test_chat_messages_without_role_or_content(model: reprolm.Model, messages: list[dict[str, str]],
                                               match: str) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match=match):
        model.apply_chat_template(messages)
    with pytest.raises(reprolm.InvalidArgumentError, match=match):
        model.chat(messages, max_tokens=1)
    with pytest.raises(reprolm.InvalidArgumentError, match=match):
        model.chat_stream(messages, max_tokens=1)


def test_chat_messages_of_the_wrong_type(model: reprolm.Model) -> None:
    for bad in (None, "hello", {"role": "user", "content": "Hi"}, 3):
        with pytest.raises(reprolm.InvalidArgumentError, match="messages must be a list"):
            model.apply_chat_template(bad)  # type: ignore[arg-type]
        with pytest.raises(reprolm.InvalidArgumentError, match="messages must be a list"):
            model.chat(bad, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidArgumentError, match=r"messages\[1\]"):
        model.apply_chat_template([{"role": "user", "content": "Hi"}, None])  # type: ignore[list-item]
    # An assistant message that calls tools may leave out 'content'.
    calls = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]
    template = "{% for m in messages %}{{ m.role }}{% endfor %}"
    assert model.apply_chat_template(calls, template=template, add_generation_prompt=False) == "userassistant"


@pytest.mark.parametrize("settings", [
    {"banned_token_ids": [2**70]}, {"allowed_token_ids": [2**64]}, {"logit_bias": {2**70: 1.0}},
    {"top_k": 2**70}, {"penalty_window": 2**80}, {"top_logprobs": 2**70},
])
def test_sampler_settings_of_any_size_are_typed_errors(settings: dict[str, Any]) -> None:
    # These raised OverflowError (the noticed-but-left item of defect 6).
    with pytest.raises(reprolm.InvalidArgumentError, match=next(iter(settings))):
        reprolm.Sampler(**settings)


def test_callable_model_prompts_are_checked_like_the_model_s() -> None:
    toy = reprolm.CallableModel(lambda prefix: np.zeros(3), vocab_size=3)
    with pytest.raises(reprolm.TokenOutOfRangeError):
        toy.generate([2**70], max_tokens=1)  # was OverflowError
    with pytest.raises(reprolm.InvalidTypeError, match="prompt_ids"):
        toy.generate(None, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidTypeError, match="prompt_ids"):
        toy.beam_search(None, beam_width=2, max_tokens=1)  # type: ignore[arg-type]
