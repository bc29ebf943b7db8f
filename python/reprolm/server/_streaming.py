"""Server-sent events: the event stream of a streamed completion or chat (its chunks, usage and
``[DONE]``), and cancelling a request's engine work as soon as its client disconnects."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncGenerator, Awaitable, Callable, Iterator, Optional, Sequence, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .. import errors
from .._decoding import StepInfo
from .._model import Model
from ._errors import error_body
from ._protocol import chat_logprobs, completion_logprobs, openai_finish_reason, reported_steps, usage
from ._state import Choice, Server
from ._tools import ChatPrompt, tool_deltas
from ._tools import finish_reason as tool_finish_reason

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled (and with it
    its engine requests) and :class:`ClientGone` raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class EventStream(Response):
    """A server-sent event stream whose body stops (and so cancels its engine requests) as
    soon as the client disconnects, whether or not a token is being sent."""

    _HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]

    def __init__(self, body: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        super().__init__(status_code=200)
        self._events = body
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self._HEADERS})
            async for data in self._events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await unless_disconnected(receive, stream())
        except (ClientGone, OSError):
            pass
        finally:
            await self._events.aclose()
            self._on_close()


def stream_end(server: Server, head: dict[str, Any], prompts: Sequence[list[int]], generated: int,
                choices: Sequence[Choice], include_usage: bool) -> Iterator[bytes]:
    """The events after a stream's last chunk: its usage if asked for, then [DONE] (its tokens
    counted in the metrics)."""
    server.count_tokens(prompts, generated)
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(prompts, generated, choices)})
    yield b"data: [DONE]\n\n"


def stream_completion(
    server: Server, model: Model, head: dict[str, Any], choices: list[Choice], prompts: list[list[int]],
    logprobs: Optional[int], include_usage: bool, echoed: list[Optional[dict[str, Any]]],
) -> AsyncGenerator[bytes, None]:
    offsets = {id(c): len(c.prefix) for c in choices}
    echo = any(e is not None for e in echoed)

    def piece(c: Choice, text: str, steps: list[StepInfo]) -> dict[str, Any]:
        lp = None if logprobs is None else completion_logprobs(model, steps, offsets[id(c)])
        offsets[id(c)] += len(text)
        return {"text": text, "logprobs": lp}

    return stream_choices(server, head, choices, prompts, include_usage,
                           opening=lambda c: {"text": c.prefix, "logprobs": echoed[c.prompt_index]} if c.prefix else None,
                           piece=piece, ending={"text": "", "logprobs": None}, keep_eos=echo)


def stream_chat(
    server: Server, model: Model, head: dict[str, Any], choices: list[Choice], prompts: list[list[int]],
    logprobs: bool, include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    def piece(c: Choice, text: str, steps: list[StepInfo]) -> dict[str, Any]:
        return {"delta": {"content": text}, "logprobs": chat_logprobs(model, steps) if logprobs else None}

    return stream_choices(server, head, choices, prompts, include_usage,
                           opening=lambda c: {"delta": {"role": "assistant", "content": ""}, "logprobs": None},
                           piece=piece, ending={"delta": {}, "logprobs": None})


async def stream_tool_chat(
    server: Server, head: dict[str, Any], choices: list[Choice], prompts: list[list[int]], prompt: ChatPrompt,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a chat offering tools: each choice's reply is parsed when it
    ends (a call is known to be one only once complete), then sent as its deltas
    (:func:`_tools.tool_deltas`) and its finish reason; then the usage and [DONE]."""
    def chunk(index: int, delta: dict[str, Any], reason: Optional[str]) -> bytes:
        data = {**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        if include_usage:
            data["usage"] = None
        return sse(data)

    generated = 0
    texts: dict[int, list[str]] = {}
    merged = server.merged(choices)
    try:
        async for c, event in merged:
            generated += len(event.token_ids)
            texts.setdefault(c.index, []).append(event.text)
            if event.finish_reason is None:
                continue
            content, calls = prompt.parse("".join(texts.pop(c.index)), c.index)
            for delta in tool_deltas(content, calls):
                yield chunk(c.index, delta, None)
            yield chunk(c.index, {}, tool_finish_reason(calls, event.finish_reason))
    except errors.ReprolmError as e:
        yield sse(error_body(f"{type(e).__name__}: {e}", type="server_error", code="engine_error"))
        return
    finally:
        await merged.aclose()
    for end in stream_end(server, head, prompts, generated, choices, include_usage):
        yield end


async def stream_choices(
    server: Server, head: dict[str, Any], choices: list[Choice], prompts: list[list[int]], include_usage: bool,
    *,
    opening: Callable[[Choice], Optional[dict[str, Any]]],
    piece: Callable[[Choice, str, list[StepInfo]], dict[str, Any]],
    ending: dict[str, Any],
    keep_eos: bool = False,
) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a streamed completion or chat: each choice's `opening`
    fields (if any), a `piece` per chunk with text or statistics, the `ending` fields with
    the finish reason, then the usage (if asked for) and [DONE]."""
    def chunk(index: int, fields: dict[str, Any], reason: Optional[str]) -> bytes:
        data = {**head, "choices": [{"index": index, **fields, "finish_reason": reason}]}
        if include_usage:
            data["usage"] = None
        return sse(data)

    generated = 0
    merged = server.merged(choices)
    try:
        for c in choices:
            first = opening(c)
            if first is not None:
                yield chunk(c.index, first, None)
        async for c, event in merged:
            generated += len(event.token_ids)
            steps = [] if event.step is None else (
                [event.step] if keep_eos else reported_steps([event.step], event.finish_reason))
            if event.text or steps:
                yield chunk(c.index, piece(c, event.text, steps), None)
            if event.finish_reason is not None:
                yield chunk(c.index, ending, openai_finish_reason(event.finish_reason))
    except errors.ReprolmError as e:
        yield sse(error_body(f"{type(e).__name__}: {e}", type="server_error", code="engine_error"))
        return
    finally:
        await merged.aclose()
    for end in stream_end(server, head, prompts, generated, choices, include_usage):
        yield end
