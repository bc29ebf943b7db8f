"""The OpenAI-compatible HTTP server: a Starlette application over a model's batch engine,
its routes and middleware.

The web layer only validates, queues and streams: each choice of a request is one
:meth:`Model.submit`, awaited on the event loop (``async for`` over the request, woken by the
engine's dispatcher thread), so the engine's results, and so the server's, are the same bits
whatever else runs. The jobs live in their own modules: configuration (``_config``), state
and admission (``_state``), request bodies read for the engine (``_requests``), protocol
conversion (``_protocol``), streaming (``_streaming``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import errors
from .._model import Model
from ._compat import tokenizer_info_of
from ._config import ServerConfig, model_fingerprint
from ._echo import joined, prompt_logprobs
from ._errors import ApiError, error_body
from ._metrics import CONTENT_TYPE, Metrics
from ._openapi import model_ids, openapi_schema
from ._protocol import (chat_logprobs, completion_logprobs, engine_error, json_logprob, openai_finish_reason,
                        reported_steps, usage)
from ._requests import chat_request, completion_request, detokenize_request, tokenize_request
from ._state import Server
from ._streaming import ClientGone, EventStream, stream_chat, stream_completion, stream_tool_chat, unless_disconnected
from ._tools import reply_message
from ._tools import finish_reason as tool_finish_reason
from ._webui import page_response

__all__ = ["ServerConfig", "Server", "create_app", "model_fingerprint"]

log = logging.getLogger("reprolm.server")

_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
              "/detokenize", "/tokenizer_info", "/openapi.json")


def _json(data: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(json.dumps(data, ensure_ascii=False), status_code=status, headers=headers,
                    media_type="application/json")


def _error_response(e: ApiError) -> Response:
    return _json(e.body(), e.status, e.headers)


def create_app(config: ServerConfig, model: Optional[Model] = None) -> Starlette:
    """The ASGI application for ``config``. With ``model`` it serves that model at once;
    otherwise it loads ``config.model_path`` in a thread at startup, answering 503 meanwhile."""
    server = Server(config, model)

    def endpoint(fn: Callable[[HttpRequest], Awaitable[Response]], *, auth: bool = True
                 ) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def handle(request: HttpRequest) -> Response:
            try:
                if auth:
                    server.check_auth(request)
                return await fn(request)
            except ApiError as e:
                return _error_response(e)
            except ClientGone:
                return _json(error_body("the client closed the connection", type="invalid_request_error"), 499)
            except errors.ReprolmError as e:  # the engine failed a request it had accepted
                return _error_response(engine_error(e, "prompt"))
            except Exception as e:  # a bug: answered as one, never a dropped connection
                log.exception("reprolm: internal error")
                return _error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                                code="internal_error"))
        return handle

    async def health(request: HttpRequest) -> Response:
        if server.model is not None:
            return _json({"status": "ok"})
        if server.load_error is not None:
            return _json({"status": "error", "error": server.load_error}, 503)
        return _json({"status": "loading"}, 503, {"Retry-After": "1"})

    schema = openapi_schema(model_ids=model_ids(config.model_id, config.model_path.name),
                            api_key=config.api_key is not None)

    async def openapi(request: HttpRequest) -> Response:
        return _json(schema)

    async def metrics(request: HttpRequest) -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    def model_card() -> dict[str, Any]:
        return {"id": config.model_id, "object": "model", "created": server.created, "owned_by": "reprolm"}

    async def models(request: HttpRequest) -> Response:
        server.ready_model()
        return _json({"object": "list", "data": [model_card()]})

    async def retrieve_model(request: HttpRequest) -> Response:
        server.ready_model()
        server.check_model_name(request.path_params["model"])
        return _json(model_card())

    async def tokenize(request: HttpRequest) -> Response:
        return _json({"tokens": tokenize_request(server, await server.read_json(request))})

    async def tokenizer_info(request: HttpRequest) -> Response:
        return _json(tokenizer_info_of(server.ready_model(), server.context_length))

    async def detokenize(request: HttpRequest) -> Response:
        model, ids = detokenize_request(server, await server.read_json(request))
        return _json({"content": model.detokenize(ids)})

    async def completions(request: HttpRequest) -> Response:
        req = completion_request(server, await server.read_json(request))
        model, body, prompts, texts, params = req.model, req.body, req.prompts, req.texts, req.params
        prefixes = texts if body.echo else ["" for _ in texts]
        echoed: list[Optional[dict[str, Any]]] = [None for _ in prompts]
        if body.echo and body.logprobs is not None:
            top = body.logprobs
            echoed = list(await unless_disconnected(request.receive, asyncio.gather(
                *(asyncio.to_thread(prompt_logprobs, model, p, top, json_logprob) for p in prompts))))
        choices = server.submit(model, prompts, params, prompt_param="prompt", prefixes=prefixes)
        rid = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": config.model_id,
                "system_fingerprint": server.fingerprint}
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return EventStream(stream_completion(server, model, head, choices, prompts, body.logprobs,
                                                   include_usage, echoed), lambda: server.release(choices))
        outcomes = await unless_disconnected(request.receive, server.collect(choices))
        out_choices = []
        generated = 0
        for c, o in zip(choices, outcomes):
            generated += len(o.token_ids)
            lp = None
            if body.logprobs is not None:
                steps = o.steps if body.echo else reported_steps(o.steps, o.finish_reason)
                lp = completion_logprobs(model, steps, len(c.prefix))
                prompt_lp = echoed[c.prompt_index]
                if prompt_lp is not None:
                    lp = joined(prompt_lp, lp)
            out_choices.append({"index": c.index, "text": c.prefix + o.text, "logprobs": lp,
                                "finish_reason": openai_finish_reason(o.finish_reason)})
        server.count_tokens(prompts, generated)
        return _json({**head, "choices": out_choices, "usage": usage(prompts, generated, choices)})

    async def chat(request: HttpRequest) -> Response:
        req = chat_request(server, await server.read_json(request))
        model, body, prompt, params = req.model, req.body, req.prompt, req.params
        ids = prompt.ids
        try:
            choices = server.submit(model, [ids], params, prompt_param="messages", prefixes=[""])
        except ApiError as e:
            if e.param == "response_format" and prompt.tools is not None and prompt.tools.grammar is not None:
                e.param = "tools"
                e.message = e.message.replace("'response_format'", "'tools'")
            raise
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": config.model_id,
                "system_fingerprint": server.fingerprint}
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunk_head = {**head, "object": "chat.completion.chunk"}
            events = (stream_tool_chat(server, chunk_head, choices, [ids], prompt, include_usage)
                      if prompt.tools is not None and prompt.tools.choice != "none"
                      else stream_chat(server, model, chunk_head, choices, [ids], body.logprobs, include_usage))
            return EventStream(events, lambda: server.release(choices))
        outcomes = await unless_disconnected(request.receive, server.collect(choices))
        out_choices = []
        generated = 0
        for c, o in zip(choices, outcomes):
            generated += len(o.token_ids)
            lp = chat_logprobs(model, reported_steps(o.steps, o.finish_reason)) if body.logprobs else None
            content, calls = prompt.parse(o.text, c.index)
            out_choices.append({"index": c.index, "message": reply_message(content, calls), "logprobs": lp,
                                "finish_reason": tool_finish_reason(calls, o.finish_reason)})
        server.count_tokens([ids], generated)
        return _json({**head, "choices": out_choices, "usage": usage([ids], generated, choices)})

    async def chat_page(request: HttpRequest) -> Response:
        return page_response()

    async def not_found(request: HttpRequest, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        message = (f"no endpoint {request.method} {request.url.path}" if status == 404
                   else f"method {request.method} is not allowed on {request.url.path}")
        # (a 405 keeps Starlette's Allow header, naming the methods the endpoint takes)
        headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
        return _error_response(ApiError(status, message, code="not_found" if status == 404 else "method_not_allowed",
                                        headers=headers))

    routes = [
        Route("/health", endpoint(health, auth=False), methods=["GET"]),
        Route("/openapi.json", endpoint(openapi, auth=False), methods=["GET"]),
        Route("/metrics", endpoint(metrics), methods=["GET"]),
        Route("/v1/models", endpoint(models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint(retrieve_model), methods=["GET"]),
        Route("/v1/completions", endpoint(completions), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(chat), methods=["POST"]),
        Route("/tokenize", endpoint(tokenize), methods=["POST"]),
        Route("/detokenize", endpoint(detokenize), methods=["POST"]),
        Route("/tokenizer_info", endpoint(tokenizer_info), methods=["GET"]),
    ]
    if config.webui:
        routes.append(Route("/", endpoint(chat_page, auth=False), methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.start_loading()
        yield

    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)
    app.state.reprolm = server
    app.add_middleware(_CountRequests, metrics=server.metrics)
    return app


class _CountRequests:
    """ASGI middleware counting answered HTTP requests by endpoint and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else ("/v1/models" if path.startswith("/v1/models/") else "other")
        status = "500"

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=status).inc()
