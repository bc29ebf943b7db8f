"""Chat templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import reprolm

QUESTION = [{"role": "user", "content": "What is the boiling point of water?"}]


def test_template_reproduces_reference_prompt(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    # Prompt 2 is this one user message with the template's default system prompt.
    assert model.apply_chat_template(QUESTION) == generations[2]["prompt"]


def test_chat_reproduces_reference_reply(model: reprolm.Model, generations: list[dict[str, Any]]) -> None:
    g = generations[2]
    reply = model.chat(QUESTION, max_tokens=len(g["greedy_ids"]))
    assert reply.prompt_token_ids == g["prompt_ids"]
    assert reply.token_ids == g["greedy_ids"]
    assert reply.text == g["greedy_text"]
    streamed = list(model.chat_stream(QUESTION, max_tokens=len(g["greedy_ids"])))
    assert "".join(c.text for c in streamed) == reply.text


def test_chat_reply_leaves_out_the_end_of_turn_token(model: reprolm.Model) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = model.chat(messages, max_tokens=16)
    assert reply.finish_reason == "eos" and reply.token_ids[-1] == model.config.eos_id
    assert reply.text == "The capital of France is Paris."
    assert reply.text == model.detokenize(reply.token_ids[:-1])
    assert "".join(c.text for c in model.chat_stream(messages, max_tokens=16)) == reply.text


def test_template_variants(model: reprolm.Model) -> None:
    system = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert model.apply_chat_template(system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n"
    )
    template = "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m['content'].strip() }}\n{% endfor %}" \
               "{% if add_generation_prompt %}{{ greeting }}{% endif %}{{ eos_token }}"
    out = model.apply_chat_template([{"role": "user", "content": "  hi  "}], template=template, greeting="A:")
    assert out == "<|im_start|>[USER] hi\nA:<|im_end|>"
    assert model.chat_template is not None and "add_generation_prompt" in model.chat_template


def test_template_errors_are_typed(model: reprolm.Model) -> None:
    with pytest.raises(reprolm.ChatTemplateError, match="roles must alternate"):
        model.apply_chat_template(QUESTION, template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(reprolm.ChatTemplateError, match="syntax error"):
        model.apply_chat_template(QUESTION, template="{% for m in messages %}")
    with pytest.raises(reprolm.InvalidArgumentError, match=r"messages\[0\]"):
        model.apply_chat_template(["hello"])  # type: ignore[list-item]
    with pytest.raises(reprolm.InvalidArgumentError, match="unsupported type"):
        model.apply_chat_template([{"role": "user", "content": object()}])
    with pytest.raises(reprolm.InvalidArgumentError):
        model.chat(QUESTION, max_tokens=-1)


def test_model_without_template(tmp_path: Path, model_path: Path) -> None:
    data = model_path.read_bytes()
    key = b"tokenizer.chat_template"
    assert data.count(key) == 1
    path = tmp_path / "no-template.gguf"
    path.write_bytes(data.replace(key, b"tokenizer.chat_templatX"))
    bare = reprolm.Model.load(path)
    assert bare.chat_template is None
    with pytest.raises(reprolm.ChatTemplateError, match="no 'tokenizer.chat_template'.*pass a template"):
        bare.apply_chat_template(QUESTION)
    with pytest.raises(reprolm.ChatTemplateError):
        bare.chat(QUESTION, max_tokens=1)
    assert bare.apply_chat_template(QUESTION, template="{{ messages[0].content }}") == QUESTION[0]["content"]
