"""Tool calling in the library (``reprolm.tools`` and ``Model.chat(tools=...)``): each family's
parser reads the calls its real chat template renders and the shapes its models write; the
generic fallback and forced calls run end to end on the real default model, and their
arguments always match the tool's JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import reprolm
from reprolm import tools as T

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "The sum of two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
CALL = {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": '{"city": "Paris", "unit": "celsius"}'}}

FAMILIES = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("Qwen-Qwen3-0.6B", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("google-gemma-2-2b-it", "generic"),
]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def _check(calls: list[T.ToolCall]) -> None:
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("name,family", FAMILIES)
def test_family_from_template_text(name: str, family: str) -> None:
    assert T.template_family(_template(name)) == family


def test_default_model_template_is_generic(model: reprolm.Model) -> None:
    assert T.template_family(model.chat_template) == "generic"
    assert T.template_family(None) == "generic"


@pytest.mark.parametrize("name,family", [f for f in FAMILIES if f[1] != "generic"])
def test_parser_reads_the_call_its_template_renders(model: reprolm.Model, name: str, family: str) -> None:
    """The assistant turn a family's template renders for a call, parsed back: the same call."""
    template = _template(name)
    tools = T.tools_from_openai(TOOLS)
    history = [T.history_message(m, "m") for m in [*QUESTION, {"role": "assistant", "content": None,
                                                                "tool_calls": [CALL]}]]
    plan = T.plan(template, history, tools, "auto")
    assert plan.family == family and plan.grammar is None
    opening = model.apply_chat_template(plan.messages[:-1], template=template, **plan.variables)
    full = model.apply_chat_template(plan.messages, template=template, add_generation_prompt=False, **plan.variables)
    assert full.startswith(opening)
    turn = full[len(opening):]
    for end in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>"):
        turn = turn.split(end)[0]
    content, calls = T.parse_reply(turn, family, tools, key=b"k")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert not content
    assert calls[0].id == T.call_id(b"k", 0, family)


MODEL_LIKE = [
    # Hermes / Qwen: text around calls, two calls, arguments given as a JSON string
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Tokyo", "unit": "celsius"}), ("add", {"a": 2, "b": 3})]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}', None, [("add", {"a": 1, "b": 1})]),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 4, "b": 5}}', None, [("add", {"a": 4, "b": 5})]),
    ("llama3", '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}',
     None, [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 7, "b": 8}, "id": "abcDEF123"}]', None,
     [("add", {"a": 7, "b": 8})]),
    ("mistral", 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]get_weather[ARGS]{"city": "Lima", '
                '"unit": "fahrenheit"}', "Sure.", [("add", {"a": 1, "b": 2}),
                                                   ("get_weather", {"city": "Lima", "unit": "fahrenheit"})]),
    ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}', None, [("add", {"a": 1, "b": 2})]),
    ("generic", '{"response": "It is sunny."}', "It is sunny.", []),
]


@pytest.mark.parametrize("family,text,content,calls", MODEL_LIKE)
def test_parser_reads_model_like_replies(family: Any, text: str, content: Any, calls: list[Any]) -> None:
    got_content, got = T.parse_reply(text, family, T.tools_from_openai(TOOLS), key=b"req")
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert [c.id for c in got] == [T.call_id(b"req", i, family) for i in range(len(calls))]
    assert len({c.id for c in got}) == len(got)


@pytest.mark.parametrize("family,text", [
    ("hermes", "The weather is fine."),
    ("hermes", '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'),  # unknown function
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'),  # broken JSON
    ("llama3", 'I would call {"name": "add"} here'),
    ("mistral", "[TOOL_CALLS]not json"),
    ("generic", '{"tool_call": {"name": "add", "arguments": {"a": 1'),  # cut by max_tokens
])
def test_text_without_a_wellformed_call_is_content(family: Any, text: str) -> None:
    assert T.parse_reply(text, family, T.tools_from_openai(TOOLS)) == (text, [])


def test_history_is_rendered_in_the_generic_format(model: reprolm.Model) -> None:
    history = [T.history_message(m, f"messages[{i}]") for i, m in enumerate([
        *QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "content": "18 C"}])]
    plan = T.plan(model.chat_template, history, T.tools_from_openai(TOOLS), "auto")
    assert [m["role"] for m in plan.messages] == ["system", "user", "assistant", "user"]
    assert plan.messages[0]["content"] == T.generic_instruction(T.tools_from_openai(TOOLS), "auto", False)
    assert json.loads(plan.messages[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {
        "city": "Paris", "unit": "celsius"}}}
    assert json.loads(plan.messages[3]["content"]) == {"tool_response": {"name": "get_weather", "content": "18 C"}}
    model.apply_chat_template(plan.messages)  # renders


@pytest.mark.parametrize("choice", ["required", "add", "get_weather", "auto"])
def test_generic_calls_end_to_end_match_the_schema(model: reprolm.Model, choice: str) -> None:
    tool_choice = choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}
    out = model.chat(QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=60)
    if choice != "auto" or out.tool_calls:
        assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1 and out.text == ""
        _check(out.tool_calls)
        if choice not in ("auto", "required"):
            assert out.tool_calls[0].name == choice
    else:
        assert out.finish_reason in ("eos", "length") and out.text
    again = model.chat(QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=60)
    assert again == out  # same ids, same bits


def test_generic_parallel_calls_are_a_list(model: reprolm.Model) -> None:
    out = model.chat(QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=True, max_tokens=120)
    raw = model.generate(model.chat_text_ids(model.apply_chat_template(
        T.plan(model.chat_template, QUESTION, T.tools_from_openai(TOOLS), "required", parallel=True).messages)),
        max_tokens=120, grammar=T.plan(model.chat_template, QUESTION, T.tools_from_openai(TOOLS), "required",
                                       parallel=True).grammar)
    assert raw.text.startswith('{"tool_calls": [{"name": ')
    if out.finish_reason == "tool_calls":
        assert len(out.tool_calls) >= 1
        _check(out.tool_calls)


@pytest.mark.parametrize("name,family", [("Qwen-Qwen2.5-7B-Instruct", "hermes"), ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
                                         ("mistralai-Mistral-Nemo-Instruct-2407", "mistral")])
def test_forced_call_on_a_family_template_matches_the_schema(model: reprolm.Model, name: str, family: str) -> None:
    """A forced call is generated under the family's grammar (here by the default model
    through another family's template) and parses to a call of the named function."""
    template = _template(name)
    out = model.chat(QUESTION, template=template, tools=TOOLS,
                     tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=40)
    assert out.finish_reason == "tool_calls" and [c.name for c in out.tool_calls] == ["add"]
    _check(out.tool_calls)
    call_id = out.tool_calls[0].id
    assert (len(call_id), call_id.isalnum()) == (9, True) if family == "mistral" else call_id.startswith("call_")


def test_tool_choice_none_is_a_plain_chat(model: reprolm.Model) -> None:
    out = model.chat(QUESTION, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert out == model.chat(QUESTION, max_tokens=8)


@pytest.mark.parametrize("tools,choice,param", [
    ([{"type": "function"}], None, "tools[0].function"),
    ([{"type": "retrieval"}], None, "tools[0].type"),
    ([{"type": "function", "function": {"name": "bad name!"}}], None, "tools[0].function.name"),
    ([ADD, ADD], None, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "object", "propertyNames": {"pattern": "^a"}}}}}}], None, "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None,
     "tools[0].function.parameters"),
    (TOOLS, {"type": "function", "function": {"name": "nowhere"}}, "tool_choice.function.name"),
    (TOOLS, "sometimes", "tool_choice"),
    ([], "required", "tool_choice"),
])
def test_bad_tools_raise_tool_error_naming_the_field(model: reprolm.Model, tools: Any, choice: Any,
                                                     param: str) -> None:
    with pytest.raises(reprolm.ToolError) as e:
        model.chat(QUESTION, tools=tools, tool_choice=choice, max_tokens=1)
    assert e.value.param == param and param.split("[")[0].split(".")[0] in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("call,param", [
    ({"type": "function", "function": {"name": "add", "arguments": "{not json"}}, "messages[1].tool_calls[0].function.arguments"),
    ({"type": "function", "function": {"name": "add", "arguments": "[1, 2]"}}, "messages[1].tool_calls[0].function.arguments"),
    ({"type": "function"}, "messages[1].tool_calls[0].function"),
    ({"type": "code", "function": {"name": "add", "arguments": "{}"}}, "messages[1].tool_calls[0].type"),
    ({"type": "function", "function": {"arguments": "{}"}}, "messages[1].tool_calls[0].function.name"),
])
def test_malformed_tool_calls_in_history_raise(model: reprolm.Model, call: Any, param: str) -> None:
    with pytest.raises(reprolm.ToolError) as e:
        model.chat([*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}], tools=TOOLS,
                   max_tokens=1)
    assert e.value.param == param


def test_generic_schema_holds_nested_definitions(model: reprolm.Model) -> None:
    """A tool whose parameters use ``$defs`` (as pydantic writes them) keeps them working
    inside the combined schema."""
    tool = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"],
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                             "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["x", "y"], "additionalProperties": False}}}}}
    out = model.chat([{"role": "user", "content": "Move to 3, 4."}], tools=[tool], tool_choice="required",
                     max_tokens=60)
    assert out.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(out.tool_calls[0].arguments), tool["function"]["parameters"])
