"""Tool calling: OpenAI-style function tools offered to a chat model, and the calls it makes.

A chat template that knows tools renders them itself, and the model answers in its family's
format, which :func:`parse_reply` turns into :class:`ToolCall` s:

- ``"hermes"`` (Hermes, Qwen 2.5/3, SmolLM3, ...): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- ``"llama3"`` (Llama 3.1-3.3): ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``;
- ``"mistral"``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` or ``[TOOL_CALLS]name[ARGS]{...}``.

A template of no known family (such as SmolLM2's) gets the ``"generic"`` treatment: the tools
are listed in an instruction added to the system prompt (:func:`generic_instruction`) and the
reply is one JSON object generated under a grammar, ``{"tool_call": {"name": ..., "arguments":
{...}}}`` (``{"tool_calls": [...]}`` with parallel calls) or ``{"response": "..."}`` when the
model may answer instead.

``tool_choice``: ``"auto"`` lets the model choose (a family's reply is parsed from free text),
``"none"`` offers no tools, ``"required"`` forces at least one call and a named function forces
a call of that function. A forced call, and every generic reply, is generated under a grammar
built from the tools' JSON Schemas (:meth:`Grammar.json_schema`), so its arguments always
parse and match their schema.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from typing import Any, Literal, Mapping, Optional, Sequence, Union

from .errors import GrammarError, ToolError
from .grammar import Grammar

__all__ = ["Tool", "ToolCall", "ToolChoice", "Family", "ToolPlan", "tools_from_openai", "tool_choice_from_openai",
           "template_family", "generic_instruction", "plan", "strict_schema", "parse_reply", "call_id", "history_message"]

Family = Literal["hermes", "llama3", "mistral", "generic"]
ToolChoice = Union[Literal["auto", "none", "required"], str]
"""``"auto"``, ``"none"``, ``"required"``, or (any other string) the name of the function to call."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    """The JSON Schema of its arguments object."""

    def openai(self) -> dict[str, Any]:
        """As OpenAI's ``tools`` items: ``{"type": "function", "function": {...}}``."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call the model made: its id, the function's name and the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        """As an item of OpenAI's ``message.tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def tools_from_openai(tools: Sequence[Any], param: str = "tools") -> list[Tool]:
    """OpenAI's ``tools`` list as :class:`Tool` s, each schema checked by the grammar
    compiler; a bad item raises :class:`ToolError` naming it (``tools[1].function.parameters``)."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ToolError(f"'{param}' must be a list of function tools", param)
    out: list[Tool] = []
    for i, item in enumerate(tools):
        at = f"{param}[{i}]"
        if not isinstance(item, Mapping) or item.get("type") != "function":
            raise ToolError(f"'{at}' must be {{\"type\": \"function\", \"function\": {{...}}}}", f"{at}.type")
        extra = set(item) - {"type", "function"}
        if extra:
            raise ToolError(f"'{at}' has unknown field '{sorted(extra)[0]}'", f"{at}.{sorted(extra)[0]}")
        fn = item.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"'{at}.function' must be an object with 'name' and 'parameters'", f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(f"'{at}.function.name' must be 1 to 64 letters, digits, '_', '.' or '-'",
                            f"{at}.function.name")
        if any(t.name == name for t in out):
            raise ToolError(f"'{at}.function.name': another tool is also named {name!r}", f"{at}.function.name")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolError(f"'{at}.function.description' must be a string", f"{at}.function.description")
        parameters = fn.get("parameters", _EMPTY_PARAMETERS)
        if parameters is None:
            parameters = _EMPTY_PARAMETERS
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ToolError(f"'{at}.function.parameters' must be the JSON Schema of an object",
                            f"{at}.function.parameters")
        try:
            Grammar.json_schema(dict(parameters))
        except GrammarError as e:
            raise ToolError(f"'{at}.function.parameters' cannot be used: {e}", f"{at}.function.parameters") from None
        out.append(Tool(name, description, copy.deepcopy(dict(parameters))))
    return out


def tool_choice_from_openai(choice: Any, tools: Sequence[Tool], param: str = "tool_choice") -> ToolChoice:
    """``"auto"`` (the default), ``"none"``, ``"required"`` or ``{"type": "function",
    "function": {"name": ...}}`` (returned as the name); anything else, or a name no tool
    has, raises :class:`ToolError`."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise ToolError(f"'{param}' is 'required' but no tools are given", param)
        return str(choice)
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        if not any(t.name == name for t in tools):
            known = ", ".join(repr(t.name) for t in tools) or "none"
            raise ToolError(f"'{param}.function.name': no tool is named {name!r} (tools: {known})",
                            f"{param}.function.name")
        return str(name)
    raise ToolError(f"'{param}' must be 'auto', 'none', 'required' or {{\"type\": \"function\", \"function\": "
                    f"{{\"name\": ...}}}}", param)


def template_family(template: Optional[str]) -> Family:
    """The tool-call format a chat template's text shows: ``<tool_call>`` is Hermes/Qwen,
    ``[TOOL_CALLS]`` Mistral, ``<|python_tag|>`` or the ``ipython`` role Llama 3.x; anything
    else (no template, or one that never renders tools) is generic."""
    if not template or "tools" not in template:
        return "generic"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "generic"


# ---- the generic format --------------------------------------------------------------------------


def generic_instruction(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> str:
    """The text added to the system prompt for a template of no known family: the tools, one
    JSON object a line, and the reply format the grammar then enforces."""
    offered = [t for t in tools if choice in ("auto", "required") or t.name == choice]
    lines = "\n".join(json.dumps(t.openai()["function"], ensure_ascii=False) for t in offered)
    call = ('{"tool_calls": [{"name": <tool name>, "arguments": <arguments object>}, ...]}' if parallel
            else '{"tool_call": {"name": <tool name>, "arguments": <arguments object>}}')
    text = f"You can call these tools:\n{lines}\n\nReply with one JSON object and nothing else: {call} to call "
    text += "a tool" if not parallel else "one or more tools"
    if choice == "auto":
        text += ', or {"response": <your answer>} to answer directly.'
    else:
        text += "."
    return text


def _rename_refs(node: Any, prefix: str) -> Any:
    """``node`` with its local ``$ref`` s to ``#/$defs/X`` or ``#/definitions/X`` pointing at
    ``#/$defs/<prefix>X`` (a tool's definitions moved to the root of the combined schema)."""
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for root in ("#/$defs/", "#/definitions/"):
                    if value.startswith(root):
                        value = "#/$defs/" + prefix + value[len(root):]
                out[key] = value
            elif key in ("$defs", "definitions"):
                continue
            else:
                out[key] = _rename_refs(value, prefix)
        return out
    if isinstance(node, list):
        return [_rename_refs(v, prefix) for v in node]
    return node


def strict_schema(node: Any) -> Any:
    """``node`` with ``"additionalProperties": false`` on every object schema that declares
    ``properties`` and leaves it unset: OpenAI's ``strict`` structured outputs, where an
    object holds its declared properties only."""
    if isinstance(node, Mapping):
        out = {k: strict_schema(v) for k, v in node.items()}
        if isinstance(node.get("properties"), Mapping) and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict_schema(v) for v in node]
    return node


def _call_schemas(tools: Sequence[Tool], arguments_key: str, defs: dict[str, Any]) -> list[dict[str, Any]]:
    """One object schema per tool, ``{"name": <const>, arguments_key: <its parameters>}``; the
    tools' own definitions are gathered into ``defs``."""
    out = []
    for i, tool in enumerate(tools):
        prefix = f"tool{i}_"
        for root in ("$defs", "definitions"):
            for key, sub in dict(tool.parameters.get(root, {})).items():
                defs[prefix + key] = _rename_refs(sub, prefix)
        parameters = _rename_refs(tool.parameters, prefix)
        if "properties" in parameters and "additionalProperties" not in parameters:
            # the declared arguments only (a small model otherwise invents more, forever)
            parameters["additionalProperties"] = False
        out.append({"type": "object", "properties": {"name": {"const": tool.name}, arguments_key: parameters},
                    "required": ["name", arguments_key], "additionalProperties": False})
    return out


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _with_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "$defs": defs} if defs else schema


def _generic_schema(tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
                    response_schema: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    offered = [t for t in tools if choice in ("auto", "required") or t.name == choice]
    call = _one_of(_call_schemas(offered, "arguments", defs))
    if parallel:
        reply = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                 "required": ["tool_calls"], "additionalProperties": False}
    else:
        reply = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
                 "additionalProperties": False}
    if choice == "auto":
        answer = {"type": "string"} if response_schema is None else _rename_refs(response_schema, "response_")
        for root in ("$defs", "definitions"):
            for key, sub in dict((response_schema or {}).get(root, {})).items():
                defs["response_" + key] = _rename_refs(sub, "response_")
        direct = {"type": "object", "properties": {"response": answer}, "required": ["response"],
                  "additionalProperties": False}
        return _with_defs({"anyOf": [reply, direct]}, defs)
    return _with_defs(reply, defs)


# ---- planning a request ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """How one chat request with tools is generated: the messages and template variables to
    render, text appended to the rendered prompt, the grammar, and how to read the reply."""

    family: Family
    """The format the reply is parsed as (``"generic"`` also when a family's template is
    bypassed, see :func:`plan`)."""
    messages: list[dict[str, Any]]
    variables: dict[str, Any]
    prompt_suffix: str
    """Appended to the rendered prompt: the opening of a forced call in the family's format."""
    grammar: Optional[Grammar]
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool

    def parse(self, text: str, key: bytes) -> tuple[Optional[str], list[ToolCall]]:
        """The content and the calls of generated ``text`` (ids derived from ``key``)."""
        return parse_reply(self.prompt_suffix + text, self.family, self.tools, key=key,
                           generic_response_raw=True)


def plan(template: Optional[str], messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool],
         choice: ToolChoice, *, parallel: Optional[bool] = None,
         response_schema: Optional[Mapping[str, Any]] = None) -> ToolPlan:
    """The :class:`ToolPlan` for a chat of ``messages`` offering ``tools`` to a model whose
    chat template is ``template``. ``messages`` may hold assistant messages with OpenAI
    ``tool_calls`` (arguments as JSON text or objects) and ``tool`` messages; they are
    rendered as the family's template expects, or (generic) as the JSON the generic format
    uses, tool results then becoming a user message. ``parallel``: whether several calls may
    be made (None: yes for a family's format, one call for the generic format).
    ``response_schema``: the JSON Schema a
    direct answer must follow (``response_format``); with it, ``"auto"`` takes the generic
    path even on a family's template, as its grammar is the one that can hold both."""
    family = template_family(template)
    if choice == "none" or not tools:
        return ToolPlan(family, _history(messages, family, tools=tools), {}, "", None, tuple(tools), "none",
                        False)
    if family != "generic" and choice == "auto" and response_schema is not None:
        family = "generic"
    # A family's format holds any number of calls, read in full unless parallel calls are
    # turned off; the generic format asks for a list of calls only when they are turned on
    # (small models given a list tend to repeat one call until the token limit).
    many = parallel is True if family == "generic" else parallel is not False
    if family == "generic":
        msgs = _history(messages, "generic", tools=tools)
        instruction = generic_instruction(tools, choice, many)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{instruction}"}
        else:
            msgs.insert(0, {"role": "system", "content": instruction})
        schema = _generic_schema(tools, choice, many, response_schema)
        return ToolPlan("generic", msgs, {}, "", _grammar(schema), tuple(tools), choice, many)
    msgs = _history(messages, family, tools=tools)
    variables = {"tools": [t.openai() for t in tools]}
    if choice == "auto":
        return ToolPlan(family, msgs, variables, "", None, tuple(tools), choice, many)
    offered = [t for t in tools if choice == "required" or t.name == choice]
    defs: dict[str, Any] = {}
    if family == "hermes":
        schema = _with_defs(_one_of(_call_schemas(offered, "arguments", defs)), defs)
        return ToolPlan(family, msgs, variables, "<tool_call>\n", _grammar(schema), tuple(tools), choice, many)
    if family == "llama3":
        schema = _with_defs(_one_of(_call_schemas(offered, "parameters", defs)), defs)
        return ToolPlan(family, msgs, variables, "", _grammar(schema), tuple(tools), choice, many)
    items = _one_of(_call_schemas(offered, "arguments", defs))
    # a list generated under a grammar holds several calls only when asked (as the generic format)
    schema = _with_defs({"type": "array", "items": items, "minItems": 1,
                         **({} if parallel is True else {"maxItems": 1})}, defs)
    return ToolPlan(family, msgs, variables, "[TOOL_CALLS]", _grammar(schema), tuple(tools), choice, many)


def _grammar(schema: Mapping[str, Any]) -> Grammar:
    try:
        return Grammar.json_schema(dict(schema))
    except GrammarError as e:
        raise ToolError(f"'tools' cannot be combined into one grammar: {e}", "tools") from None


# ---- history ---------------------------------------------------------------------------------------


def history_message(message: Mapping[str, Any], param: str) -> dict[str, Any]:
    """A message with its OpenAI ``tool_calls`` checked and their arguments parsed into
    objects (as chat templates expect); malformed calls raise :class:`ToolError` naming them."""
    out = dict(message)
    calls = message.get("tool_calls")
    if calls is None:
        out.pop("tool_calls", None)
        return out
    if message.get("role") != "assistant":
        raise ToolError(f"'{param}.tool_calls' is only allowed on assistant messages", f"{param}.tool_calls")
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise ToolError(f"'{param}.tool_calls' must be a list of calls", f"{param}.tool_calls")
    parsed = []
    for j, call in enumerate(calls):
        at = f"{param}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise ToolError(f"'{at}' must be an object", at)
        if call.get("type", "function") != "function":
            raise ToolError(f"'{at}.type' must be 'function'", f"{at}.type")
        cid = call.get("id", "")
        if not isinstance(cid, str):
            raise ToolError(f"'{at}.id' must be a string", f"{at}.id")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"'{at}.function' must be an object with 'name' and 'arguments'", f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"'{at}.function.name' must be a non-empty string", f"{at}.function.name")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as e:
                raise ToolError(f"'{at}.function.arguments' is not valid JSON: {e}", f"{at}.function.arguments") from None
        if not isinstance(arguments, Mapping):
            raise ToolError(f"'{at}.function.arguments' must be a JSON object", f"{at}.function.arguments")
        parsed.append({"id": cid, "type": "function", "function": {"name": name, "arguments": dict(arguments)}})
    out["tool_calls"] = parsed
    if out.get("content") is None:
        out["content"] = ""
    return out


def _generic_call_text(calls: Sequence[Mapping[str, Any]]) -> str:
    items = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    reply = {"tool_call": items[0]} if len(items) == 1 else {"tool_calls": items}
    return json.dumps(reply, ensure_ascii=False)


def _history(messages: Sequence[Mapping[str, Any]], family: Family, *, tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """``messages`` (already checked by :func:`history_message`) as the template renders them:
    as they are for a family's template (tool messages given the called function's ``name``);
    for the generic format, calls written as the generic JSON and tool results as user turns."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # generic: consecutive tool results, one user turn
    for m in messages:
        for call in m.get("tool_calls") or ():
            names[call.get("id", "")] = call["function"]["name"]
        if m.get("role") == "tool":
            name = m.get("name") or names.get(str(m.get("tool_call_id", "")), "")
            if family == "generic":
                pending.append(json.dumps({"tool_response": {"name": name, "content": m.get("content", "")}},
                                          ensure_ascii=False))
                continue
            out.append({**m, "name": name} if name else dict(m))
            continue
        if pending:
            out.append({"role": "user", "content": "\n".join(pending)})
            pending = []
        if family == "generic" and m.get("tool_calls"):
            text = _generic_call_text(m["tool_calls"])
            content = m.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        else:
            out.append(dict(m))
    if pending:
        out.append({"role": "user", "content": "\n".join(pending)})
    return out


# ---- reading replies -------------------------------------------------------------------------------


def call_id(key: bytes, index: int, family: Family = "generic") -> str:
    """The id of call ``index`` of a reply, from ``key`` (a digest of the request, its seed
    and the choice): ``call_`` and 24 hex digits, or 9 letters and digits for Mistral's
    templates (which accept no other)."""
    digest = hashlib.sha256(key + b"/" + str(index).encode()).hexdigest()
    return digest[:9] if family == "mistral" else f"call_{digest[:24]}"


def _arguments_text(value: Any) -> Optional[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    return json.dumps(value, ensure_ascii=False)


def _calls(items: Sequence[Any], arguments_keys: Sequence[str], tools: Sequence[Tool]) -> Optional[list[tuple[str, str]]]:
    """``(name, arguments text)`` of each item, or None if one is not a call of a known tool."""
    known = {t.name for t in tools}
    out = []
    for item in items:
        if not isinstance(item, Mapping) or item.get("name") not in known:
            return None
        key = next((k for k in arguments_keys if k in item), None)
        args = _arguments_text(item[key]) if key is not None else "{}"
        if args is None:
            return None
        out.append((str(item["name"]), args))
    return out


def _json_values(text: str) -> Optional[list[Any]]:
    """The JSON values ``text`` holds, separated by whitespace or ``;`` (None if it holds other text)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return values or None
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>")
_MISTRAL_NAMED = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")


def _hermes(text: str, tools: Sequence[Tool]) -> Optional[tuple[str, list[tuple[str, str]]]]:
    if "<tool_call>" not in text:
        return None
    items: list[Any] = []
    for body in _HERMES.findall(text):
        values = _json_values(body)
        if values is None or len(values) != 1:
            return None
        items.append(values[0])
    found = _calls(items, ("arguments", "parameters"), tools)
    return None if found is None else (_EMPTY_THINK.sub("", _HERMES.sub("", text)).strip(), found)


def _llama3(text: str, tools: Sequence[Tool]) -> Optional[tuple[str, list[tuple[str, str]]]]:
    values = _json_values(text.strip().removeprefix("<|python_tag|>"))
    found = None if values is None else _calls(values, ("parameters", "arguments"), tools)
    return None if found is None else ("", found)


def _mistral(text: str, tools: Sequence[Tool]) -> Optional[tuple[str, list[tuple[str, str]]]]:
    if "[TOOL_CALLS]" not in text:
        return None
    before, _, after = text.partition("[TOOL_CALLS]")
    after = after.strip()
    values = _json_values(after)
    found: Optional[list[tuple[str, str]]] = None
    if values is not None and len(values) == 1 and isinstance(values[0], list):
        found = _calls(values[0], ("arguments", "parameters"), tools)
    elif _MISTRAL_NAMED.match(after):
        items: list[Any] = []
        for part in after.split("[TOOL_CALLS]"):
            match = _MISTRAL_NAMED.match(part.strip())
            args = _json_values(part.strip()[match.end():]) if match else None
            if match is None or args is None or len(args) != 1:
                return None
            items.append({"name": match.group(1), "arguments": args[0]})
        found = _calls(items, ("arguments",), tools)
    return None if found is None else (before.strip(), found)


_PARSERS = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral}


def parse_reply(text: str, family: Family, tools: Sequence[Tool], *, key: bytes = b"",
                generic_response_raw: bool = False) -> tuple[Optional[str], list[ToolCall]]:
    """The content and the tool calls of a reply ``text`` in ``family``'s format. Text that
    does not hold well-formed calls of known tools is all content (no calls). ``key`` seeds
    the calls' ids (:func:`call_id`)."""
    if family == "generic":
        return _parse_generic(text, tools, key, generic_response_raw)
    parsed = _PARSERS[family](text, tools)
    if not parsed or not parsed[1]:
        return text, []
    content, found = parsed
    return (content or None), [ToolCall(call_id(key, i, family), n, a) for i, (n, a) in enumerate(found)]


_RESPONSE_OPENING = '{"response": '


def _parse_generic(text: str, tools: Sequence[Tool], key: bytes, raw: bool) -> tuple[Optional[str], list[ToolCall]]:
    try:
        value = json.loads(text)
    except ValueError:
        return text, []
    if not isinstance(value, dict) or len(value) != 1:
        return text, []
    if "response" in value:
        answer = value["response"]
        if isinstance(answer, str):
            return answer, []
        # a structured answer (response_format): its text as generated
        if raw and text.startswith(_RESPONSE_OPENING) and text.endswith("}"):
            return text[len(_RESPONSE_OPENING):-1], []
        return json.dumps(answer, ensure_ascii=False), []
    items = [value["tool_call"]] if "tool_call" in value else value.get("tool_calls")
    if not isinstance(items, list):
        return text, []
    found = _calls(items, ("arguments",), tools)
    if not found:
        return text, []
    return None, [ToolCall(call_id(key, i, "generic"), n, a) for i, (n, a) in enumerate(found)]

