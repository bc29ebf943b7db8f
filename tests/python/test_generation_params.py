"""GenerationParams: one object for every per-request setting. Built once and passed as
``params=``, it gives the same bits as the keyword arguments at every entry point; an invalid
value raises the typed error naming the setting wherever it is given; it is immutable,
hashable, replaceable and picklable."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import reprolm
from reprolm import GenerationParams, Sampler
from reprolm import cli

PROMPT = "The three primary colours are"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def sampled(**extra: Any) -> dict[str, Any]:
    """Settings that exercise every field the batch engine takes."""
    return dict(max_tokens=12, sampler=Sampler(temperature=0.9, top_k=40, seed=11), stop=["\n\n"],
                stop_token_ids=[2], logprobs=3, logprobs_mode="raw", **extra)


def bits(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def same_completion(a: reprolm.Completion, b: reprolm.Completion) -> None:
    assert a == b
    assert bits(a.logprobs) == bits(b.logprobs)
    assert [bits([s.logprob, s.entropy, s.removed_mass]) for s in a.steps] == \
           [bits([s.logprob, s.entropy, s.removed_mass]) for s in b.steps]


def joined(chunks: Any) -> tuple[str, list[int], list[bytes], Any]:
    parts = list(chunks)
    return ("".join(c.text for c in parts), [t for c in parts for t in c.token_ids],
            [bits(c.logprobs) for c in parts], parts[-1].finish_reason)


def test_params_give_the_keywords_bits_at_every_entry_point(model: reprolm.Model) -> None:
    kw = sampled()
    params = GenerationParams(**kw)
    same_completion(model.generate(PROMPT, **kw), model.generate(PROMPT, params=params))
    batch = model.generate([PROMPT, "Once upon a time"], params=params)
    same_completion(batch[0], model.generate(PROMPT, **kw))
    same_completion(model.submit(PROMPT, **kw).result(), model.submit(PROMPT, params=params).result())
    no_steps = {k: v for k, v in kw.items() if k != "logprobs"}
    stream_params = dataclasses.replace(params, logprobs=None)
    assert joined(model.stream(PROMPT, **no_steps)) == joined(model.stream(PROMPT, params=stream_params))
    chat_kw = {k: v for k, v in no_steps.items()}
    same_completion(model.chat(MESSAGES, **chat_kw), model.chat(MESSAGES, params=stream_params))
    assert joined(model.chat_stream(MESSAGES, **chat_kw)) == joined(model.chat_stream(MESSAGES, params=stream_params))
    session = model.session(context_length=128)
    same_completion(session.generate(PROMPT, **kw), session.generate(PROMPT, params=params))
    assert joined(session.stream(PROMPT, **no_steps)) == joined(session.stream(PROMPT, params=stream_params))
    # And the session's bits are the batch engine's.
    same_completion(session.generate(PROMPT, params=params), model.generate(PROMPT, params=params))


def test_speculative_params_give_the_keywords_bits(model: reprolm.Model) -> None:
    kw = dict(max_tokens=16, speculative=reprolm.Speculative("lookup", draft_tokens=4))
    params = GenerationParams(**kw)
    same_completion(model.generate(PROMPT, **kw), model.generate(PROMPT, params=params))
    assert joined(model.stream(PROMPT, **kw)) == joined(model.stream(PROMPT, params=params))
    # A drafter given alone is kept as Speculative settings.
    assert GenerationParams(speculative="lookup").speculative == reprolm.Speculative("lookup")


def test_callable_model_takes_params() -> None:
    vocab = 7

    def fn(prefix: list[int]) -> np.ndarray:
        return np.random.default_rng([3, *prefix]).normal(size=vocab)

    toy = reprolm.CallableModel(fn, vocab, eos_id=0)
    kw = dict(max_tokens=9, sampler=Sampler(temperature=1.3, seed=5), stop_token_ids=[6], logprobs=2)
    same_completion(toy.generate([1, 2], **kw), toy.generate([1, 2], params=GenerationParams(**kw)))
    with pytest.raises(reprolm.InvalidArgumentError, match="'stop'"):
        toy.generate([1, 2], params=GenerationParams(stop=["x"]))


def test_immutable_hashable_replaceable_picklable() -> None:
    a = GenerationParams(max_tokens=5, sampler=Sampler(logit_bias={3: 1.5}, seed=2), stop="end", stop_token_ids=[4])
    b = GenerationParams(max_tokens=5, sampler=Sampler(logit_bias={3: 1.5}, seed=2), stop=("end",),
                         stop_token_ids=(4,))
    assert a == b and hash(a) == hash(b)
    assert a.stop == ("end",) and a.stop_token_ids == (4,)
    assert len({a, b, GenerationParams()}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.max_tokens = 6  # type: ignore[misc]
    c = dataclasses.replace(a, max_tokens=6)
    assert c.max_tokens == 6 and c.sampler == a.sampler and a.max_tokens == 5
    with pytest.raises(reprolm.InvalidArgumentError, match="'max_tokens'"):
        dataclasses.replace(a, max_tokens=-1)  # a copy is checked again
    assert pickle.loads(pickle.dumps(a)) == a
    assert hash(Sampler()) == hash(Sampler(logit_bias={}))


def test_params_and_keywords_together_name_the_keyword(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="'max_tokens'"):
        model.generate(PROMPT, params=GenerationParams(), max_tokens=3)
    with pytest.raises(reprolm.InvalidTypeError, match="params"):
        model.generate(PROMPT, params={"max_tokens": 3})  # type: ignore[arg-type]


# (field, bad value, error class, the name the message gives)
BAD = [
    ("max_tokens", -1, reprolm.InvalidArgumentError, "'max_tokens'"),
    ("max_tokens", "8", reprolm.InvalidTypeError, "max_tokens"),
    ("max_tokens", 2**70, reprolm.InvalidArgumentError, "'max_tokens'"),
    ("logprobs", -2, reprolm.InvalidArgumentError, "'logprobs'"),
    ("logprobs_mode", "cooked", reprolm.InvalidArgumentError, "logprobs_mode"),
    ("stop", [""], reprolm.InvalidArgumentError, "'stop'"),
    ("stop", [b"x"], reprolm.InvalidTypeError, "stop"),
    ("stop_token_ids", [2**70], reprolm.TokenOutOfRangeError, "out of range"),
    ("sampler", "greedy", reprolm.InvalidTypeError, "sampler"),
    ("grammar", "[a-z]+", reprolm.InvalidTypeError, "grammar"),
    ("speculative", "guess", reprolm.InvalidArgumentError, "'speculative'"),
]


def entry_points(model: reprolm.Model) -> dict[str, Callable[..., Any]]:
    session = model.session(context_length=64)
    return {
        "GenerationParams": lambda **kw: GenerationParams(**kw),
        "Model.generate": lambda **kw: model.generate(PROMPT, **kw),
        "Model.stream": lambda **kw: model.stream(PROMPT, **kw),
        "Model.submit": lambda **kw: model.submit(PROMPT, **kw),
        "Model.chat": lambda **kw: model.chat(MESSAGES, **kw),
        "Model.chat_stream": lambda **kw: model.chat_stream(MESSAGES, **kw),
        "Session.generate": lambda **kw: session.generate(PROMPT, **kw),
        "Session.stream": lambda **kw: session.stream(PROMPT, **kw),
    }


@pytest.mark.parametrize("field,value,error,name", BAD)
def test_invalid_values_raise_the_typed_error_naming_the_field(
    model: reprolm.Model, field: str, value: Any, error: type[Exception], name: str
) -> None:
    takes = {"Model.stream": "logprobs", "Model.chat": "logprobs", "Model.chat_stream": "logprobs",
             "Session.stream": "logprobs", "Model.submit": "speculative"}
    for where, call in entry_points(model).items():
        if takes.get(where) == field:
            continue  # (not one of this entry point's keywords)
        with pytest.raises(error, match=name):
            call(**{field: value})
    if field in ("max_tokens", "logprobs", "sampler", "stop_token_ids"):
        toy = reprolm.CallableModel(lambda prefix: np.zeros(4), 4)
        with pytest.raises(error, match=name):
            toy.generate([1], **{field: value})


def test_vocabulary_checks_happen_at_the_model(model: reprolm.Model) -> None:
    params = GenerationParams(stop_token_ids=[model.config.vocab_size])  # valid until it meets a vocabulary
    with pytest.raises(reprolm.TokenOutOfRangeError):
        model.generate(PROMPT, params=params)
    with pytest.raises(reprolm.InvalidArgumentError, match="'speculative'"):
        model.submit(PROMPT, params=GenerationParams(speculative="lookup"))  # the batch engine does not speculate


def test_cli_checks_the_settings_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # (the model path does not exist: the settings are refused before it is looked for)
    missing = str(tmp_path / "absent.gguf")
    assert cli.main(["generate", "hi", "--model", missing, "-n", "-1"]) == 1
    assert "'max_tokens'" in capsys.readouterr().err
    assert cli.main(["generate", "hi", "--model", missing, "--stop", ""]) == 1
    assert "'stop'" in capsys.readouterr().err


def test_server_builds_one_params_per_choice() -> None:
    from reprolm.server._protocol import generation_params
    from reprolm.server._schema import CompletionBody

    body = CompletionBody.model_validate({"model": "m", "prompt": "x", "n": 2, "temperature": 0.5, "seed": 9, "stop": "end",
                                          "top_k": 3})
    params = generation_params(body, 100, [7, 8], logprobs=2, grammar=None)
    expected = [[GenerationParams(max_tokens=limit, stop="end", logprobs=2,
                                  sampler=Sampler(temperature=0.5, top_k=3, seed=9 + i, logprobs_mode="raw"))
                 for i in range(2)] for limit in (7, 8)]
    assert params == expected


def test_ray_checks_the_settings_before_any_actor_or_model(tmp_path: Path) -> None:
    rray = pytest.importorskip("reprolm.ray")
    for field, value, error, name in BAD:
        if field not in ("max_tokens", "stop", "stop_token_ids"):
            continue  # (not one of Ray's settings)
        with pytest.raises(error, match=name):
            rray.generate(None, **{field: value})
        with pytest.raises(error, match=name):  # (the model path does not exist: it is not looked for)
            rray.Predictor(tmp_path / "absent.gguf", **{field: value})
