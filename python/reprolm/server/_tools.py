"""The OpenAI protocol side of tool calling in ``/v1/chat/completions``: the request's
messages, ``tools``, ``tool_choice`` and ``parallel_tool_calls`` turned into a prompt and a
grammar (:func:`reprolm.tools.plan`), and the generated text into ``message.tool_calls`` or
streamed ``delta.tool_calls``.

A call's id is ``call_`` and 24 hex digits of the SHA-256 of the request body (without its
``stream`` fields), the choice index and the call index, so the same request and seed give
the same ids, streamed or not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Optional

from .. import errors
from .._model import Model
from ..grammar import Grammar
from ..tools import (ToolCall, ToolPlan, history_message, plan, strict_schema, tool_choice_from_openai,
                     tools_from_openai)
from ._errors import ApiError
from ._schema import ChatBody

__all__ = ["ChatPrompt", "chat_prompt", "reply_message", "tool_deltas", "finish_reason", "request_key",
           "ARGUMENT_FRAGMENT"]

ARGUMENT_FRAGMENT = 16
"""Characters of a call's arguments per streamed delta."""


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt ids, the grammar of its reply, and its tool plan (None when
    the request offers no tools to call)."""

    ids: list[int]
    grammar: Optional[Grammar]
    tools: Optional[ToolPlan]
    key: bytes
    """Digest of the request without its stream fields: seeds the calls' ids."""

    def parse(self, text: str, choice_index: int) -> tuple[Optional[str], list[ToolCall]]:
        """The content and calls of choice ``choice_index``'s generated ``text``."""
        if self.tools is None or self.tools.choice == "none":
            return text, []
        return self.tools.parse(text, self.key + b"/" + str(choice_index).encode())


def _bad(e: errors.ToolError) -> ApiError:
    return ApiError(400, str(e), param=e.param,
                    code="invalid_value")


def _messages(body: ChatBody) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(body.messages):
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.name:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls is not None:
            message["tool_calls"] = m.tool_calls
        try:
            out.append(history_message(message, f"messages[{i}]"))
        except errors.ToolError as e:
            raise _bad(e) from None
    return out


def _response_schema(body: ChatBody) -> Optional[dict[str, Any]]:
    fmt = body.response_format
    if fmt is None or fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "object"}
    schema = fmt["json_schema"].get("schema", {})
    schema = schema if isinstance(schema, dict) else {}
    return strict_schema(schema) if fmt["json_schema"].get("strict") is True else schema


def request_key(data: dict[str, Any]) -> bytes:
    """The digest of a request body that the calls' ids derive from (stream fields left out)."""
    fields = {k: v for k, v in data.items() if k not in ("stream", "stream_options")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()).digest()


def chat_prompt(model: Model, body: ChatBody, data: dict[str, Any],
                response_grammar: Callable[[], Optional[Grammar]]) -> ChatPrompt:
    """The prompt and grammar of a chat request (``response_grammar`` gives
    ``response_format``'s when no tool grammar applies); 400s name the field at fault."""
    messages = _messages(body)
    try:
        tools = tools_from_openai(body.tools or [], "tools")
        choice = tool_choice_from_openai(body.tool_choice, tools, "tool_choice")
        tool_plan = plan(model.chat_template, messages, tools, choice, parallel=body.parallel_tool_calls,
                         response_schema=_response_schema(body))
    except errors.ToolError as e:
        raise _bad(e) from None
    try:
        text = model.apply_chat_template(tool_plan.messages, **tool_plan.variables) + tool_plan.prompt_suffix
        ids = model.chat_text_ids(text)
    except (errors.ChatTemplateError, errors.InvalidArgumentError) as e:
        raise ApiError(400, f"invalid value for 'messages': {e}", param="messages", code="invalid_value") from None
    grammar = tool_plan.grammar if tool_plan.grammar is not None else response_grammar()
    return ChatPrompt(ids, grammar, tool_plan if tools else None, request_key(data))


def finish_reason(calls: list[ToolCall], reason: Optional[str]) -> Optional[str]:
    """OpenAI's finish_reason: ``"tool_calls"`` when the reply made calls (and was complete)."""
    if reason is None:
        return None
    if calls and reason != "length":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def reply_message(content: Optional[str], calls: list[ToolCall]) -> dict[str, Any]:
    """The ``message`` of a non-streamed choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = [c.openai() for c in calls]
    return message


def tool_deltas(content: Optional[str], calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The ``delta`` s of a streamed choice that assemble to :func:`reply_message`: the role
    with the content (null when there is none), then per call its ``index``, ``id``, ``type``
    and name with empty arguments, then the arguments in fragments of
    :data:`ARGUMENT_FRAGMENT` characters."""
    out: list[dict[str, Any]] = [{"role": "assistant", "content": content}]
    for k, call in enumerate(calls):
        out.append({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                    "function": {"name": call.name, "arguments": ""}}]})
        for start in range(0, len(call.arguments), ARGUMENT_FRAGMENT):
            piece = call.arguments[start:start + ARGUMENT_FRAGMENT]
            out.append({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
    return out

