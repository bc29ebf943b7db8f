"""Constrained decoding: a grammar restricts the next-token distribution to its allowed set
(docs/theory.md, "Truncation is conditioning").

- JSON Schemas: every completed output parses and validates (``jsonschema``);
- restriction: with a grammar mask S the final distribution is the unconstrained one
  restricted to S and renormalized, and temperature / top-k / top-p act on the restricted one;
- regular expressions and choices: outputs match fully; a grammar of one string forces it;
- bad grammars raise GrammarError before any token; the bits do not depend on the thread
  count, on the driver, or on what else runs in the batch engine.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
from typing import Any

import jsonschema
import numpy as np
import pytest

import reprolm
from reprolm import Grammar, GrammarError, InvalidTypeError, Sampler
from reprolm.sampling import restrict, softmax, top_k_set, top_p_set

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["score"]},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": -5.5, "maximum": 40}}, "required": ["t"]},
    {"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
     "required": ["p"]},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 6}}, "required": ["word"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object",
     "properties": {"person": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 10},
                                                                "last": {"type": "string", "maxLength": 10}},
                               "required": ["first", "last"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "object",
     "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
         "c": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["c"]}}, "required": ["b"]}},
     "required": ["a"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "nickname": {"type": "string", "maxLength": 10}},
     "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}, "z": {"type": "integer"}},
     "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 5}]},
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["id"]},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
     "required": ["start", "end"], "additionalProperties": False},
    {"definitions": {"tag": {"type": "string", "enum": ["x", "y"]}},
     "type": "array", "items": {"$ref": "#/definitions/tag"}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"answer": {"const": "yes"}}, "required": ["answer"]},
    {"type": "string", "maxLength": 20},
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "boolean"},
    {"type": "null"},
    {"enum": [1, "two", 3.5, None, True]},
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 6}, {"type": "integer"}], "items": False, "minItems": 2},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"}}, "required": ["date"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email", "maxLength": 30}}, "required": ["email"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "qty"], "additionalProperties": False}, "minItems": 1, "maxItems": 2}},
     "required": ["items"], "additionalProperties": False},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]},
                                      "label": {"type": "string", "minLength": 1, "maxLength": 8}},
     "required": ["level", "label"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                                                           "minItems": 2, "maxItems": 2},
                                                 "minItems": 2, "maxItems": 2}}, "required": ["matrix"]},
]


def test_json_schemas_parse_and_validate(model: reprolm.Model) -> None:
    """At least 30 schemas, greedy and seeded sampling, all running together in the batch
    engine: every output that ended (not cut by max_tokens) parses and validates."""
    assert len(SCHEMAS) >= 30
    samplers = [Sampler.greedy(), Sampler(temperature=0.9, top_p=0.95, seed=7)]
    # Short prompts: the 68 requests run together, and their prefill would dominate.
    requests = [(schema, sampler, model.submit("An example in JSON:\n", max_tokens=48, sampler=sampler,
                                               grammar=Grammar.json_schema(schema)))
                for schema in SCHEMAS for sampler in samplers]
    completed = 0
    for schema, sampler, request in requests:
        c = request.result()
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "eos", (schema, c)
        value = json.loads(c.text)
        jsonschema.validate(value, schema)
        completed += 1
    # The test says something only if most outputs are complete.
    assert completed >= 0.8 * len(requests), completed


def test_pydantic_model_class_as_schema(model: reprolm.Model) -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false
        name: str = pydantic.Field(max_length=12)
        population: int = pydantic.Field(ge=0, le=10**8)

    grammar = Grammar.json_schema(City)
    assert json.loads(str(grammar.source)) == City.model_json_schema()
    c = model.chat([{"role": "user", "content": "Describe Paris as JSON."}], max_tokens=40, grammar=grammar)
    assert c.finish_reason == "eos"
    City.model_validate_json(c.text)


def _distribution_from_steps(step: reprolm.StepInfo, vocab_size: int) -> np.ndarray:
    q = np.zeros(vocab_size)
    for token, lp in step.alternatives:
        q[token] = math.exp(lp)
    return q


@pytest.mark.parametrize("sampler", [Sampler(temperature=1.0, seed=3), Sampler(temperature=0.7, top_k=40, top_p=0.9, seed=11)],
                         ids=["plain", "tau-topk-topp"])
def test_the_grammar_restricts_the_distribution(model: reprolm.Model, sampler: Sampler) -> None:
    """At each step with grammar mask S, the distribution the token was drawn from is
    softmax(z / tau) restricted to S and renormalized, then top-k and top-p on that
    restricted distribution (the definitions of docs/theory.md, through the reference functions)."""
    vocab = model.config.vocab_size
    grammar = Grammar.json_schema({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                                    "n": {"type": "integer"}}, "required": ["name", "n"]})
    prompt = model.chat_ids([{"role": "user", "content": "A JSON object please."}])
    c = model.generate(prompt, max_tokens=14, sampler=sampler, grammar=grammar, logprobs=vocab)
    ids = c.token_ids
    logits = model.logits(prompt + ids[:-1])[len(prompt) - 1:]
    matcher = grammar.matcher(model)
    sizes = []
    for t, step in enumerate(c.steps):
        allowed = matcher.allowed_token_ids()
        sizes.append(len(allowed))
        assert (model.config.eos_id in allowed) == matcher.is_accepting
        p = softmax(logits[t].astype(np.float64), sampler.temperature)
        reference = restrict(p, allowed)
        if sampler.top_k:
            reference = restrict(reference, [i for i in top_k_set(reference, sampler.top_k) if reference[i] > 0])
        if sampler.top_p < 1:
            reference = restrict(reference, top_p_set(reference, sampler.top_p))
        q = _distribution_from_steps(step, vocab)
        assert set(np.flatnonzero(q)) == set(np.flatnonzero(reference)), t
        assert np.max(np.abs(q - reference)) <= 1e-12, t
        # The same restriction as allowed_token_ids (the grammar joins the sampler's masks).
        as_allowed = Sampler(**{**_settings(sampler), "allowed_token_ids": allowed}).distribution(logits[t])
        assert np.max(np.abs(q - as_allowed)) <= 1e-12, t
        assert ids[t] in allowed and q[ids[t]] > 0
        if ids[t] != model.config.eos_id:
            matcher.accept(ids[t])
    # Forced steps (|S| = 1) and free steps (a string's characters: most of the vocabulary).
    assert min(sizes) == 1 and max(sizes) > vocab // 2, sizes


def _settings(sampler: Sampler) -> dict[str, Any]:
    return {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p, "seed": sampler.seed}


REGEXES = [
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"\+?[0-9]{1,3} [0-9]{3} [0-9]{4}",
    r"(?:[0-9]{1,3}\.){3}[0-9]{1,3}",
    r"[a-z_][a-z0-9_]{0,11}",
    r"(?:yes|no|maybe)\.",
    r"[A-Z][a-z]{1,9}(?: [A-Z][a-z]{1,9}){0,2}",
]


@pytest.mark.parametrize("sampler", [Sampler.greedy(), Sampler(temperature=1.0, seed=5)], ids=["greedy", "sampled"])
def test_regex_outputs_match_fully(model: reprolm.Model, sampler: Sampler) -> None:
    requests = [(pattern, model.submit("Answer: ", max_tokens=24, sampler=sampler, grammar=Grammar.regex(pattern)))
                for pattern in REGEXES]
    for pattern, request in requests:
        c = request.result()
        assert c.finish_reason == "eos", (pattern, c)
        assert re.fullmatch(pattern, c.text), (pattern, c.text)


def test_choice_outputs_are_one_of_the_options(model: reprolm.Model) -> None:
    options = ["positive", "negative", "neutral", "I cannot tell"]
    grammar = Grammar.choice(options)
    for sampler in [Sampler.greedy(), Sampler(temperature=1.5, seed=1), Sampler(temperature=1.5, seed=2)]:
        c = model.chat([{"role": "user", "content": "Sentiment of 'what a lovely day'?"}], sampler=sampler,
                       max_tokens=10, grammar=grammar)
        assert c.finish_reason == "eos" and c.text in options, c


@pytest.mark.parametrize("grammar", [Grammar.choice(["Zebra crossings glow at 3 a.m. (really)!"]),
                                     Grammar.regex(re.escape("Zebra crossings glow at 3 a.m. (really)!"))],
                         ids=["choice", "regex"])
def test_a_grammar_of_one_string_generates_exactly_it(model: reprolm.Model, grammar: Grammar) -> None:
    for sampler in [Sampler.greedy(), Sampler(temperature=2.0, seed=9)]:
        c = model.generate("Once upon a time", max_tokens=40, sampler=sampler, grammar=grammar)
        assert (c.text, c.finish_reason) == ("Zebra crossings glow at 3 a.m. (really)!", "eos")
        assert c.token_ids[-1] == model.config.eos_id


def test_lark_grammar(model: reprolm.Model) -> None:
    grammar = Grammar.lark('start: sum " = " NUMBER\nsum: NUMBER | sum OP NUMBER\nNUMBER: /[0-9]{1,3}/\nOP: " + " | " - "\n')
    for sampler in [Sampler.greedy(), Sampler(temperature=1.0, seed=8)]:
        c = model.generate("Some sums:\n2 + 2 = 4\n", max_tokens=30, sampler=sampler, grammar=grammar)
        assert c.finish_reason == "eos", c
        assert re.fullmatch(r"[0-9]{1,3}(?: [+-] [0-9]{1,3})* = [0-9]{1,3}", c.text), c.text


def test_max_tokens_ends_with_length_and_a_prefix(model: reprolm.Model) -> None:
    grammar = Grammar.regex(r"[a-z ]{30,40}")
    c = model.generate("Write lower case words: ", max_tokens=3, grammar=grammar)
    assert c.finish_reason == "length" and len(c.token_ids) == 3
    assert re.fullmatch(r"[a-z ]*", c.text) and len(c.text) < 30


def test_the_grammar_intersects_with_banned_and_allowed_ids(model: reprolm.Model) -> None:
    grammar = Grammar.choice(["yes", "no"])
    prompt = "Is the sky blue? Answer: "
    free = model.generate(prompt, max_tokens=4, grammar=grammar)
    first = free.token_ids[0]
    banned = model.generate(prompt, max_tokens=4, grammar=grammar, sampler=Sampler(temperature=0.0, banned_token_ids=[first]))
    assert banned.text in ("yes", "no") and banned.text != free.text
    assert first not in banned.token_ids
    # allowed_token_ids disjoint from every way to start the grammar: nothing is left.
    with pytest.raises(reprolm.InvalidArgumentError, match="no token"):
        model.generate(prompt, max_tokens=4, grammar=grammar,
                       sampler=Sampler(temperature=0.0, allowed_token_ids=model.tokenize(" maybe")))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
        (lambda: Grammar.json_schema({"type": "strin"}), "strin"),
        (lambda: Grammar.json_schema({"type": "object", "propertyNames": {"pattern": "^a"}}), "propertyNames"),
        (lambda: Grammar.json_schema({"type": "integer", "minimum": 5, "maximum": 1}), "Unsatisfiable schema"),
        (lambda: Grammar.json_schema({"$ref": "#/$defs/missing"}), "missing"),
        (lambda: Grammar.regex("a(b"), "unclosed group"),
        (lambda: Grammar.regex("[z-a]"), "invalid"),
        (lambda: Grammar.lark("start: undefined_rule"), "undefined_rule"),
        (lambda: Grammar.lark("start: ("), "Expected token"),
        (lambda: Grammar.choice([]), "at least one"),
    ],
)
def test_bad_grammars_raise_grammar_error(make: Any, message: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        make()


def test_grammar_errors_come_before_any_token(model: reprolm.Model) -> None:
    # Byte 0x04 is no token of SmolLM2's vocabulary, so no token can start this grammar: the
    # request fails when made, in every driver.
    grammar = Grammar.regex(r"\x04+")
    assert issubclass(GrammarError, reprolm.InvalidInputError) and issubclass(GrammarError, ValueError)
    with pytest.raises(GrammarError, match="no token"):
        model.generate("Hi", max_tokens=5, grammar=grammar)
    with pytest.raises(GrammarError, match="no token"):
        model.submit("Hi", max_tokens=5, grammar=grammar)
    with pytest.raises(GrammarError, match="no token"):
        model.stream("Hi", max_tokens=5, grammar=grammar)
    session = model.session(context_length=64)
    with pytest.raises(GrammarError, match="no token"):
        session.generate("Hi", max_tokens=5, grammar=grammar)
    assert session.tokens == []
    with pytest.raises(InvalidTypeError, match="grammar"):
        model.generate("Hi", max_tokens=5, grammar="[0-9]+")  # type: ignore[arg-type]


def test_matcher_refuses_a_token_outside_the_allowed_set(model: reprolm.Model) -> None:
    matcher = Grammar.choice(["cat"]).matcher(model)
    allowed = matcher.allowed_token_ids()
    assert not matcher.is_accepting
    outside = next(i for i in range(model.config.vocab_size) if i not in allowed)
    with pytest.raises(GrammarError):
        matcher.accept(outside)


def test_grammars_are_values() -> None:
    g = Grammar.json_schema({"type": "integer"})
    assert pickle.loads(pickle.dumps(g)) == g and hash(g) == hash(Grammar.json_schema('{"type": "integer"}'))
    assert Grammar.choice(["a", "b"]).source == ("a", "b") and Grammar.regex("x").kind == "regex"


_DET_GRAMMAR = Grammar.json_schema({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                                     "tags": {"type": "array", "items": {"type": "string"},
                                                                              "maxItems": 3}},
                                    "required": ["name", "tags"]})
_DET_PROMPT = "Describe a cat as JSON: "


def _run(model: reprolm.Model, sampler: Sampler) -> tuple[list[int], list[float], str]:
    c = model.generate(_DET_PROMPT, max_tokens=32, sampler=sampler, grammar=_DET_GRAMMAR)
    return c.token_ids, c.logprobs, c.finish_reason


@pytest.mark.parametrize("sampler", [Sampler.greedy(), Sampler(temperature=1.0, top_p=0.9, seed=21)], ids=["greedy", "sampled"])
def test_same_bits_on_any_thread_count_and_driver(model_path: Any, model: reprolm.Model, sampler: Sampler) -> None:
    expected = _run(model, sampler)
    for threads in (1, 2):
        assert _run(reprolm.Model.load(model_path, threads=threads), sampler) == expected
    # The session driver (its own token loop, not the batch engine) and the stream.
    session = model.session(context_length=128)
    c = session.generate(_DET_PROMPT, max_tokens=32, sampler=sampler, grammar=_DET_GRAMMAR)
    assert (c.token_ids, c.logprobs, c.finish_reason) == expected
    chunks = list(model.stream(_DET_PROMPT, max_tokens=32, sampler=sampler, grammar=_DET_GRAMMAR))
    assert [i for ch in chunks for i in ch.token_ids] == expected[0]


def test_same_bits_in_another_process(model: reprolm.Model) -> None:
    """The grammar engine's hash maps are seeded at random per process: S must not depend on it."""
    code = ("import json, sys, reprolm\n"
            "from reprolm import Grammar, Sampler\n"
            "g = Grammar.json_schema(json.loads(sys.argv[1]))\n"
            "c = reprolm.Model.default().generate(sys.argv[2], max_tokens=32, grammar=g, sampler=Sampler(temperature=1.0, seed=5))\n"
            "print(json.dumps([c.token_ids, c.logprobs]))\n")
    schema = json.loads(str(_DET_GRAMMAR.source))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(schema), _DET_PROMPT], capture_output=True, text=True,
                         check=True, timeout=120)
    here = model.generate(_DET_PROMPT, max_tokens=32, grammar=_DET_GRAMMAR, sampler=Sampler(temperature=1.0, seed=5))
    assert json.loads(out.stdout) == [here.token_ids, here.logprobs]


def test_same_bits_alongside_other_requests(model: reprolm.Model) -> None:
    sampler = Sampler(temperature=0.8, seed=4)
    alone = _run(model, sampler)
    others = [model.submit(p, max_tokens=n, sampler=Sampler(temperature=1.0, seed=n), grammar=g)
              for p, n, g in [("Tell me a story", 40, None), ("1, 2, 3,", 7, Grammar.regex("[0-9, ]+")),
                              ("JSON: ", 25, Grammar.json_schema({"type": "array", "items": {"type": "integer"}}))]]
    request = model.submit(_DET_PROMPT, max_tokens=32, sampler=sampler, grammar=_DET_GRAMMAR)
    more = model.submit("Another one joining late", max_tokens=20)
    c = request.result()
    assert (c.token_ids, c.logprobs, c.finish_reason) == alone
    for r in [*others, more]:
        r.result()
