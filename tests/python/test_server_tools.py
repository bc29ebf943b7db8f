"""Tool calling through ``reprolm serve`` with the real ``openai`` client and the frameworks
people drive it with (instructor, langchain-openai, the OpenAI Agents SDK): ``auto``,
``required`` and a named function, streamed and not, the streamed deltas assembling to the
non-streamed message, arguments matching the schema, conversations with tool results, the
same bytes under concurrent load, and 400s naming the field. One server (the session's)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from _serving import API_KEY, ServerProcess

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}
ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "b": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["a", "b"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather of a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "add", "description": "The sum of two integers",
                                      "parameters": ADD_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "add": ADD_PARAMS}
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
CHOICES: dict[str, Any] = {"auto": "auto", "required": "required",
                           "named": {"type": "function", "function": {"name": "add"}}}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _assemble(stream: Any) -> tuple[dict[str, Any], str]:
    """The message and finish reason that a stream's deltas add up to (OpenAI's rules:
    content concatenated, tool calls by index, arguments concatenated)."""
    content: Any = None
    calls: dict[int, dict[str, Any]] = {}
    reason = ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content is not None:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "type": None,
                                                  "function": {"name": "", "arguments": ""}})
            if call.id is not None:
                assert entry["id"] is None, "the id comes once"
                entry["id"] = call.id
            if call.type is not None:
                entry["type"] = call.type
            if call.function is not None:
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
        if choice.finish_reason is not None:
            reason = choice.finish_reason
    message: dict[str, Any] = {"content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, reason


def _message(out: Any) -> tuple[dict[str, Any], str]:
    m = out.choices[0].message
    message: dict[str, Any] = {"content": m.content}
    if m.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                                          "arguments": c.function.arguments}}
                                 for c in m.tool_calls]
    return message, out.choices[0].finish_reason


@pytest.mark.parametrize("mode", list(CHOICES))
def test_tool_calls_streamed_equal_non_streamed_and_match_the_schema(client: openai.OpenAI, mode: str) -> None:
    request = dict(model=MODEL_ID, messages=QUESTION, tools=TOOLS, tool_choice=CHOICES[mode], max_tokens=48,
                   seed=11)
    out = client.chat.completions.create(**request)  # type: ignore[call-overload]
    message, reason = _message(out)
    streamed = _assemble(client.chat.completions.create(**request, stream=True))  # type: ignore[call-overload]
    assert streamed == (message, reason)
    if mode != "auto" or "tool_calls" in message:
        assert reason == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 1
        call = message["tool_calls"][0]
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
        if mode == "named":
            assert call["function"]["name"] == "add"
    else:
        assert reason in ("stop", "length") and isinstance(message["content"], str)
    again = client.chat.completions.create(**request)  # type: ignore[call-overload]
    assert _message(again) == (message, reason)  # the same ids and arguments for the same request and seed
    other = client.chat.completions.create(**{**request, "seed": 12})  # type: ignore[call-overload]
    if "tool_calls" in message and other.choices[0].message.tool_calls:
        assert other.choices[0].message.tool_calls[0].id != message["tool_calls"][0]["id"]


def test_stream_deltas_follow_openai_shape(server: ServerProcess) -> None:
    """The first delta of a call carries index, id, type and name with empty arguments; the
    rest carry only index and argument fragments."""
    body = {"model": MODEL_ID, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 48,
            "stream": True, "seed": 3}
    with server.client() as http:
        text = http.post("/v1/chat/completions", json=body).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": None}
    first = deltas[1]["tool_calls"][0]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["arguments"] == "" and first["function"]["name"] in SCHEMAS
    fragments = [d["tool_calls"][0] for d in deltas[2:] if d]
    assert fragments and all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"}
                             for f in fragments)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls" and text.endswith("data: [DONE]\n\n")


def test_conversation_with_tool_results_continues(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                           max_tokens=48, seed=1)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history = [*QUESTION, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    out = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS, max_tokens=48, seed=1)
    message = out.choices[0].message
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert message.content or message.tool_calls
    plain = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS, tool_choice="none",
                                           max_tokens=8, seed=1)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content


def test_same_bytes_under_concurrent_load(server: ServerProcess) -> None:
    body = {"model": MODEL_ID, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 48,
            "seed": 5, "temperature": 1.0}
    noise = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24}

    def send(payload: dict[str, Any]) -> Any:
        with server.client() as http:
            r = http.post("/v1/chat/completions", json=payload)
            assert r.status_code == 200, r.text
            out = r.json()
            return json.dumps([out["choices"], out["usage"]])

    alone = send(body)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, [body, noise, {**body, "stream": False}, noise, body, noise, body, noise]))
    assert [results[i] for i in (0, 2, 4, 6)] == [alone] * 4


def test_response_format_and_tools_together(client: openai.OpenAI) -> None:
    """As OpenAI's: a call, or content that follows response_format; with tool_choice none,
    the content follows it."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"],
              "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}],
                                             tools=TOOLS, response_format=fmt, max_tokens=60, seed=seed)
        m = out.choices[0].message
        if m.tool_calls:
            for c in m.tool_calls:
                jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
        elif out.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(m.content or ""), schema)
    out = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, tools=TOOLS, tool_choice="none",
                                         response_format=fmt, max_tokens=60)
    assert out.choices[0].message.tool_calls is None
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)


BAD_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1,"}}]}
BAD = [
    ("schema the grammar cannot use", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "object", "propertyNames": {"pattern": "^a"}}}}}}]},
     "tools[0].function.parameters"),
    ("schema with an unknown type", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}}]}, "tools[0].function.parameters"),
    ("tool_choice naming an unknown function", {"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "delete_everything"}}}, "tool_choice.function.name"),
    ("tool_choice unknown", {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ("tool_choice required without tools", {"tool_choice": "required"}, "tool_choice"),
    ("tool of another type", {"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ("tool name with spaces", {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools[0].function.name"),
    ("tool_calls arguments not JSON", {"tools": TOOLS, "messages": [*QUESTION, BAD_CALL]},
     "messages[1].tool_calls[0].function.arguments"),
    ("tool_calls without a function", {"tools": TOOLS, "messages": [*QUESTION, {
        "role": "assistant", "tool_calls": [{"id": "x", "type": "function"}]}]}, "messages[1].tool_calls[0].function"),
    ("tool_calls on a user message", {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ("tool_calls not a list", {"messages": [*QUESTION, {"role": "assistant", "tool_calls": "add(1, 2)"}]},
     "messages[1].tool_calls"),
]


@pytest.mark.parametrize("name,changes,param", BAD, ids=[b[0] for b in BAD])
def test_bad_tool_requests_get_400_naming_the_field(server: ServerProcess, name: str, changes: dict[str, Any],
                                                    param: str) -> None:
    body = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 4, **changes}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in error["message"]


# ---- frameworks ---------------------------------------------------------------------------------


class Weather(pydantic.BaseModel):
    # no properties beyond these (additionalProperties: false in its schema)
    model_config = pydantic.ConfigDict(extra="forbid")

    city: Literal["Paris", "Tokyo", "Lima"]
    unit: Literal["celsius", "fahrenheit"]
    temperature: int = pydantic.Field(ge=-50, le=60)


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_a_validated_object(client: openai.OpenAI, mode: str) -> None:
    import instructor

    patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    out = patched.chat.completions.create(model=MODEL_ID, response_model=Weather, max_retries=0, max_tokens=60,
                                          messages=[{"role": "user", "content": "Weather in Paris: 18 C."}])
    assert isinstance(out, Weather)
    Weather.model_validate(out.model_dump())


def test_langchain_bind_tools_gets_tool_calls(server: ServerProcess) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        return a + b

    llm = ChatOpenAI(model=MODEL_ID, base_url=f"{server.url}/v1", api_key=API_KEY, max_tokens=48, max_retries=0,
                     temperature=0)
    out = llm.bind_tools([add], tool_choice="add").invoke("What is 2 plus 3?")
    assert [c["name"] for c in out.tool_calls] == ["add"]
    args = out.tool_calls[0]["args"]
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    assert add.invoke(args) == args["a"] + args["b"]


def test_openai_agents_sdk_calls_a_function_tool(server: ServerProcess) -> None:
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)
    calls: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo", "Lima"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The current weather of a city."""
        calls.append((city, unit))
        return f"18 degrees {unit} in {city}"

    async def run() -> Any:
        api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        try:
            agent = Agent(name="weather", instructions="Answer weather questions with the tool.",
                          tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                          model=OpenAIChatCompletionsModel(model=MODEL_ID, openai_client=api),
                          model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0))
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=3,
                                    run_config=RunConfig(tracing_disabled=True))
        finally:
            await api.close()

    result = asyncio.run(run())
    assert len(calls) == 1 and calls[0][0] in ("Paris", "Tokyo", "Lima")
    assert result.final_output == f"18 degrees {calls[0][1]} in {calls[0][0]}"
