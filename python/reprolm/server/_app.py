"""The OpenAI-compatible HTTP server: a Starlette application over a model's batch engine.

The web layer only validates, queues and streams: each choice of a request is one
:meth:`Model.submit`, awaited on the event loop (``async for`` over the request, woken by the
engine's dispatcher thread), so the engine's results, and so the server's, are the same bits
whatever else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from pathlib import Path
from typing import (Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Optional, Sequence,
                    TypeVar, Union, cast)

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import errors
from .._core import __version__
from .._decoding import StepInfo
from .._model import EngineStats, KvDtype, Model, Precision
from ..grammar import Grammar
from ..tools import strict_schema
from .._request import Request
from .._results import Chunk
from ..sampling import Sampler
from ._compat import max_tokens_of, repetition_of, tokenizer_info_of
from ._echo import joined, prompt_logprobs
from ._errors import ApiError, error_body
from ._metrics import CONTENT_TYPE, Metrics
from ._tools import ChatPrompt, chat_prompt, reply_message, tool_deltas
from ._tools import finish_reason as tool_finish_reason
from ._openapi import model_ids, openapi_schema
from ._schema import ChatBody, CompletionBody, DetokenizeBody, TokenizeBody, parse_json, validate
from ._webui import page_response

__all__ = ["ServerConfig", "create_app", "model_fingerprint"]

log = logging.getLogger("reprolm.server")

T = TypeVar("T")

_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
              "/detokenize", "/tokenizer_info", "/openapi.json")
_SEED_MODULUS = 2**64
# What JSON can carry for a log-probability of -inf (a token q gives no mass), as OpenAI does.
_NEG_INF_LOGPROB = -9999.0


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """How ``reprolm serve`` runs (the command's options)."""

    model_path: Path
    """The GGUF file (a ``str`` or any ``os.PathLike`` is accepted and stored as a
    :class:`~pathlib.Path`)."""
    host: str = "127.0.0.1"
    """Loopback by default: other machines cannot connect unless told (``0.0.0.0``)."""
    port: int = 8000
    threads: Optional[int] = None
    """Engine worker threads (default: all cores)."""
    precision: Precision = "float32"
    kv_dtype: KvDtype = "f32"
    """The number type of the engine's KV caches (``"f16"`` halves their memory)."""
    prefix_cache_bytes: Optional[int] = None
    """Bound of the prefix cache shared by requests (default: the engine's; 0: off)."""
    max_concurrent: int = 64
    """Sequences computed together by the batch engine (each choice of a request is one)."""
    max_queue: int = 256
    """Sequences waiting for the engine; beyond ``max_concurrent + max_queue`` the server answers 429."""
    context_length: Optional[int] = None
    """Most positions (prompt + generated) per sequence (default: the model's)."""
    max_batch_tokens: Optional[int] = None
    """Rows per forward pass (the engine's default, 512, if None): smaller keeps long prompts
    from stalling the other sequences' next tokens, at some cost in prefill speed."""
    api_key: Optional[str] = None
    """When set, every endpoint but ``/health`` and the chat page asks for ``Authorization: Bearer <api_key>``."""
    alias: Optional[str] = None
    """The model id clients name (default: the file name without ``.gguf``)."""
    max_body_bytes: int = 2 * 1024 * 1024
    """Larger request bodies are answered 413."""
    grace_period: float = 30.0
    """Seconds in-flight requests get to finish after SIGTERM."""
    webui: bool = True
    """Serve the chat page at ``/`` (without the API key: the page asks for it); False answers 404 there."""

    def __post_init__(self) -> None:
        """Checks every field when the config is built, so a bad value is an
        :class:`~reprolm.errors.InvalidArgumentError` (or :class:`~reprolm.errors.InvalidTypeError`)
        naming the field here, never a failure of the serving threads later."""
        path: Any = self.model_path
        if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
            raise errors.InvalidTypeError(f"ServerConfig.model_path must be a str or os.PathLike, "
                                          f"got {type(path).__name__}")
        try:
            resolved = Path(os.fspath(path))
        except TypeError as e:  # an os.PathLike whose __fspath__ gives bytes
            raise errors.InvalidTypeError(f"ServerConfig.model_path must name a file as text: {e}") from None
        object.__setattr__(self, "model_path", resolved)
        _check_text("host", self.host, optional=False)
        _check_int("port", self.port, 0, 65535)
        _check_int("threads", self.threads, 1, None, optional=True)
        _check_choice("precision", self.precision, ("float32", "int8"))
        _check_choice("kv_dtype", self.kv_dtype, ("f32", "f16"))
        _check_int("max_concurrent", self.max_concurrent, 1, None)
        _check_int("max_queue", self.max_queue, 0, None)
        _check_int("context_length", self.context_length, 1, None, optional=True)
        _check_int("max_batch_tokens", self.max_batch_tokens, 1, None, optional=True)
        _check_text("api_key", self.api_key, optional=True)
        _check_text("alias", self.alias, optional=True)
        _check_int("max_body_bytes", self.max_body_bytes, 0, None)
        _check_int("prefix_cache_bytes", self.prefix_cache_bytes, 0, None, optional=True)
        if not isinstance(self.webui, bool):
            raise errors.InvalidTypeError(f"ServerConfig.webui must be a bool, got {type(self.webui).__name__}")
        grace: Any = self.grace_period
        if isinstance(grace, bool) or not isinstance(grace, (int, float)):
            raise errors.InvalidTypeError(f"ServerConfig.grace_period must be a number of seconds, "
                                          f"got {type(grace).__name__}")
        if not (math.isfinite(grace) and grace >= 0):
            raise errors.InvalidArgumentError(f"ServerConfig.grace_period must be finite and >= 0, got {grace}")

    @property
    def model_id(self) -> str:
        return self.alias or self.model_path.name.removesuffix(".gguf")


def _check_int(name: str, value: Any, least: int, most: Optional[int], *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidTypeError(f"ServerConfig.{name} must be an int{' or None' if optional else ''}, "
                                      f"got {type(value).__name__}")
    if value < least or (most is not None and value > most):
        bound = f">= {least}" if most is None else f"between {least} and {most}"
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must be {bound}, got {value}")


def _check_text(name: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise errors.InvalidTypeError(f"ServerConfig.{name} must be a str{' or None' if optional else ''}, "
                                      f"got {type(value).__name__}")
    if not value:
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must not be empty")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices or not isinstance(value, str):
        raise errors.InvalidArgumentError(f"ServerConfig.{name} must be one of {', '.join(map(repr, choices))}, "
                                          f"got {value!r}")


def model_fingerprint(path: Union[str, "os.PathLike[str]"]) -> str:
    """``reprolm-<version>-<first 12 hex digits of the file's SHA-256>``: the same bits are
    promised for the same fingerprint."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return f"reprolm-{__version__}-{digest.hexdigest()[:12]}"


@dataclasses.dataclass
class _Choice:
    """One sequence of a request: choice ``index`` of prompt ``prompt_index``."""

    index: int
    prompt_index: int
    request: Request
    prefix: str = ""
    """Text put before the generated text (the prompt, with ``echo``)."""
    finished: bool = False
    """Its last chunk has arrived."""
    released: bool = False
    """No longer counted in flight."""


@dataclasses.dataclass
class _Event:
    """One chunk of a choice, with its per-token statistics when they were asked for."""

    text: str
    token_ids: list[int]
    finish_reason: Optional[str]
    step: Optional[StepInfo]


@dataclasses.dataclass
class _Outcome:
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: Optional[str] = None
    steps: list[StepInfo] = dataclasses.field(default_factory=list)


class _ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


class _Server:
    """The state behind one application: the model (None while loading), its fingerprint,
    the sequences in flight and the metrics."""

    def __init__(self, config: ServerConfig, model: Optional[Model]) -> None:
        self.config = config
        self.model = model
        self.fingerprint = ""
        self.load_error: Optional[str] = None
        self.in_flight = 0
        self.created = int(time.time())
        self.metrics = Metrics(self._engine_stats, lambda: self.in_flight)
        self.on_load_failure: Optional[Callable[[], None]] = None
        self._loader: Optional[threading.Thread] = None
        if model is not None:
            self.fingerprint = model_fingerprint(model.path)

    # ---- loading -------------------------------------------------------------------------

    def start_loading(self) -> None:
        if self.model is not None or self._loader is not None:
            return
        self._loader = threading.Thread(target=self._load, name="reprolm-server-load", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        c = self.config
        try:
            fingerprint = model_fingerprint(c.model_path)
            model = Model.load(c.model_path, threads=c.threads, precision=c.precision, kv_dtype=c.kv_dtype,
                               max_concurrent=c.max_concurrent, max_batch_tokens=c.max_batch_tokens,
                               prefix_cache_bytes=c.prefix_cache_bytes)
            log.info("reprolm: loaded %s (%s, %d threads, %s); serving it as %r", model.path.name, model.isa,
                     model.threads, fingerprint, c.model_id)
        except BaseException as e:  # reported by /health and the log; the server then exits
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("reprolm: could not load %s: %s", c.model_path, self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure()
            return
        self.fingerprint = fingerprint
        self.model = model

    def _engine_stats(self) -> Optional[EngineStats]:
        return None if self.model is None else self.model.engine_stats()

    def ready_model(self) -> Model:
        if self.model is None:
            if self.load_error is not None:
                raise ApiError(503, f"the model failed to load: {self.load_error}", code="model_load_failed")
            raise ApiError(503, "the model is loading; try again shortly", code="model_loading",
                           headers={"Retry-After": "1"})
        return self.model

    @property
    def context_length(self) -> int:
        model_ctx = self.ready_model().config.context_length
        return min(self.config.context_length or model_ctx, model_ctx)

    # ---- requests ------------------------------------------------------------------------

    def check_auth(self, request: HttpRequest) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def read_json(self, request: HttpRequest) -> dict[str, Any]:
        cap = self.config.max_body_bytes
        too_large = ApiError(413, f"the request body is larger than the server's limit of {cap} bytes",
                             code="request_too_large")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise too_large
        parts: list[bytes] = []
        size = 0
        async for part in request.stream():
            size += len(part)
            if size > cap:
                raise too_large
            parts.append(part)
        return parse_json(b"".join(parts))

    def check_model_name(self, name: Optional[str]) -> None:
        if name is None:
            return
        if name not in model_ids(self.config.model_id, self.config.model_path.name):
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{self.config.model_id}'",
                           param="model", code="model_not_found")

    def reserve(self, sequences: int, prompt_param: str) -> None:
        """Counts ``sequences`` in flight, or answers 429 if they would exceed the limits now
        (400 if they always would)."""
        limit = self.config.max_concurrent + self.config.max_queue
        if sequences > limit:
            raise ApiError(400, f"the request asks for {sequences} sequences (prompts x n) but the server runs or "
                                f"queues at most {limit}", param=prompt_param, code="invalid_value")
        if self.in_flight + sequences > limit:
            raise ApiError(429, f"the server is at capacity ({self.in_flight} sequences running or queued, limit "
                                f"{limit}); retry later", code="server_overloaded", headers={"Retry-After": "1"})
        self.in_flight += sequences

    def submit(
        self, model: Model, prompts: Sequence[list[int]], samplers: Sequence[Sampler], *, n: int,
        max_tokens: Sequence[int], stop: list[str], logprobs: Optional[int], prompt_param: str,
        prefixes: Sequence[str], grammar: Optional[Grammar] = None,
    ) -> list[_Choice]:
        """Submits choice ``i`` of every prompt (with ``samplers[i]``): ``len(prompts) * n``
        sequences, all or none."""
        self.reserve(len(prompts) * n, prompt_param)
        choices: list[_Choice] = []
        try:
            for p, ids in enumerate(prompts):
                for i in range(n):
                    request = model.submit(ids, max_tokens=max_tokens[p], sampler=samplers[i], stop=stop,
                                           logprobs=logprobs, grammar=grammar)
                    choices.append(_Choice(p * n + i, p, request, prefixes[p]))
        except BaseException as e:
            for c in choices:
                c.request.cancel()
            self.in_flight -= len(prompts) * n
            if isinstance(e, errors.ReprolmError):
                raise _engine_error(e, prompt_param) from None
            raise
        return choices

    def release(self, choices: Sequence[_Choice]) -> None:
        """Cancels the choices not finished and stops counting them in flight (idempotent)."""
        for c in choices:
            if c.released:
                continue
            c.released = True
            self.in_flight -= 1
            if not c.finished:
                c.request.cancel()
                self.metrics.cancelled.inc()

    async def events(self, choice: _Choice) -> AsyncGenerator[_Event, None]:
        """A choice's chunks; records the latencies; releases the choice when it ends."""
        start = time.perf_counter()
        last: Optional[float] = None
        # (an async generator, typed as the iterator it is used as)
        chunks = cast("AsyncGenerator[Chunk, None]", choice.request.__aiter__())
        try:
            async for chunk in chunks:
                now = time.perf_counter()
                if chunk.token_ids:
                    (self.metrics.ttft if last is None else self.metrics.itl).observe(now - (last or start))
                    last = now
                choice.finished = chunk.finish_reason is not None
                yield _Event(chunk.text, list(chunk.token_ids), chunk.finish_reason, chunk.step)
        finally:
            await chunks.aclose()
            self.release([choice])

    async def merged(self, choices: list[_Choice]) -> AsyncGenerator[tuple[_Choice, _Event], None]:
        """The events of every choice, as they come; cancels whatever is left on exit."""
        queue: asyncio.Queue[tuple[_Choice, Union[_Event, BaseException, None]]] = asyncio.Queue()

        async def pump(choice: _Choice) -> None:
            events = self.events(choice)
            try:
                async for event in events:
                    queue.put_nowait((choice, event))
                queue.put_nowait((choice, None))
            except Exception as e:
                queue.put_nowait((choice, e))
            finally:
                await events.aclose()

        tasks = [asyncio.ensure_future(pump(c)) for c in choices]
        try:
            remaining = len(choices)
            while remaining:
                choice, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield choice, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.release(choices)

    async def collect(self, choices: list[_Choice]) -> list[_Outcome]:
        outcomes = [_Outcome() for _ in choices]
        parts: list[list[str]] = [[] for _ in choices]
        position = {id(c): k for k, c in enumerate(choices)}
        merged = self.merged(choices)
        try:
            await self._collect_into(merged, position, outcomes, parts)
        finally:
            await merged.aclose()
        for k, o in enumerate(outcomes):
            o.text = "".join(parts[k])
        return outcomes

    @staticmethod
    async def _collect_into(merged: AsyncGenerator[tuple[_Choice, _Event], None], position: dict[int, int],
                            outcomes: list[_Outcome], parts: list[list[str]]) -> None:
        async for choice, event in merged:
            k = position[id(choice)]
            parts[k].append(event.text)
            outcomes[k].token_ids.extend(event.token_ids)
            if event.step is not None:
                outcomes[k].steps.append(event.step)
            outcomes[k].finish_reason = event.finish_reason or outcomes[k].finish_reason


def _engine_error(e: errors.ReprolmError, prompt_param: str) -> ApiError:
    """The HTTP answer to an engine error raised by ``submit``."""
    if isinstance(e, errors.EngineOverloadedError):
        return ApiError(429, f"the engine's queue is full: {e}", code="server_overloaded",
                        headers={"Retry-After": "1"})
    if isinstance(e, errors.ContextOverflowError):
        return ApiError(400, f"the prompt plus max_tokens do not fit the context: {e}", param="max_tokens",
                        code="context_length_exceeded")
    if isinstance(e, (errors.TokenOutOfRangeError, errors.EmptyPromptError)):
        return ApiError(400, f"invalid value for '{prompt_param}': {e}", param=prompt_param, code="invalid_value")
    if isinstance(e, errors.EngineStoppedError):
        return ApiError(503, f"the engine stopped: {e}", code="engine_stopped")
    if isinstance(e, errors.GrammarError):
        return ApiError(400, f"invalid value for 'response_format': {e}", param="response_format", code="invalid_value")
    if isinstance(e, (errors.InvalidInputError, errors.ChatTemplateError)):
        return ApiError(400, str(e), code="invalid_value")
    return ApiError(500, f"{type(e).__name__}: {e}", code="internal_error")


# ---- request -> engine ------------------------------------------------------------------------


def _seed(seed: Optional[int], i: int) -> int:
    """Choice i samples with ``(seed + i) mod 2**64`` (seed 0 when not given)."""
    return ((seed or 0) + i) % _SEED_MODULUS


def _grammar(body: Union[CompletionBody, ChatBody]) -> Optional[Grammar]:
    """The grammar of ``response_format``: none for text, any JSON object for
    ``json_object``, the given schema for ``json_schema`` (with ``"strict": true``, as
    OpenAI's strict mode, objects hold only their declared properties: :func:`strict_schema`)."""
    fmt = body.response_format
    if fmt is None or fmt["type"] == "text":
        return None
    schema = {"type": "object"} if fmt["type"] == "json_object" else fmt["json_schema"].get("schema", {})
    if fmt["type"] == "json_schema" and fmt["json_schema"].get("strict") is True:
        schema = strict_schema(schema)
    try:
        return Grammar.json_schema(schema)
    except errors.GrammarError as e:
        raise ApiError(400, f"invalid value for 'response_format': {e}", param="response_format",
                       code="invalid_value") from None


def _samplers(body: Union[CompletionBody, ChatBody], vocab_size: int) -> list[Sampler]:
    bias: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        token = int(key)
        if token >= vocab_size:
            raise ApiError(400, f"invalid value for 'logit_bias': token {token} is outside the vocabulary "
                                f"(0..{vocab_size - 1})", param="logit_bias", code="invalid_value")
        bias[token] = value
    repetition_penalty, penalty_window = repetition_of(body.repetition_penalty, body.repeat_penalty,
                                                       body.repeat_last_n)
    out = []
    for i in range(body.n):
        try:
            out.append(Sampler(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=body.top_k or 0,
                min_p=body.min_p or 0.0,
                repetition_penalty=repetition_penalty,
                penalty_window=penalty_window,
                presence_penalty=body.presence_penalty or 0.0,
                frequency_penalty=body.frequency_penalty or 0.0,
                logit_bias=bias,
                seed=_seed(body.seed, i),
                logprobs_mode=body.logprobs_mode or "raw",
            ))
        except errors.InvalidArgumentError as e:
            raise ApiError(400, str(e), code="invalid_value") from None
    return out


def _stops(stop: Optional[Union[str, list[str]]]) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _max_tokens(requested: Optional[int], prompt_len: int, context: int, prompt_param: str) -> int:
    """``requested``, or what is left of the context when it is None; 400 if it does not fit."""
    if prompt_len > context:
        raise ApiError(400, f"the prompt has {prompt_len} tokens but the context holds {context}",
                       param=prompt_param, code="context_length_exceeded")
    if requested is None:
        return context - prompt_len
    if prompt_len + requested > context:
        raise ApiError(400, f"the prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceed the context "
                            f"length ({context})", param="max_tokens", code="context_length_exceeded")
    return requested


def _limit(requested: Optional[int], prompt_len: int, context: int, prompt_param: str, param: str) -> int:
    """:func:`_max_tokens`, its errors naming ``param``, the field that set the limit."""
    try:
        return _max_tokens(requested, prompt_len, context, prompt_param)
    except ApiError as e:
        if e.param == "max_tokens":
            e.param = param
            if param == "n_predict":
                e.message = e.message.replace("max_tokens", param)
        raise


def _prompts(model: Model, prompt: Union[str, list[str], list[int], list[list[int]]]) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of the prompt field's prompts."""
    if isinstance(prompt, str):
        items: list[Union[str, list[int]]] = [prompt]
    elif all(isinstance(p, int) for p in prompt):
        items = [[int(p) for p in prompt]]  # type: ignore[arg-type]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    ids: list[list[int]] = []
    texts: list[str] = []
    vocab = model.config.vocab_size
    for k, item in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{k}]"
        if isinstance(item, str):
            ids.append(model.tokenize(item, special=True))
            texts.append(item)
        else:
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"invalid value for '{param}': token id {bad} is outside the vocabulary "
                                    f"(0..{vocab - 1})", param=param, code="invalid_value")
            ids.append(item)
            texts.append(model.detokenize(item))
        if not ids[-1]:
            raise ApiError(400, f"invalid value for '{param}': the prompt is empty", param=param,
                           code="invalid_value")
    return ids, texts


def _logprob(x: float) -> float:
    return x if x > _NEG_INF_LOGPROB else _NEG_INF_LOGPROB


def _token_text(model: Model, token: int) -> str:
    return model.token_bytes(token).decode("utf-8", errors="replace")


def _reported_steps(steps: list[StepInfo], finish_reason: Optional[str]) -> list[StepInfo]:
    """The steps whose tokens are reported: all but the end-of-sequence token, which adds no text."""
    return steps[:-1] if finish_reason == "eos" and steps else steps


def _finish(reason: Optional[str]) -> Optional[str]:
    """OpenAI's finish_reason: the engine's "eos" and "stop" are both "stop"."""
    return None if reason is None else ("length" if reason == "length" else "stop")


def _completion_logprobs(model: Model, steps: list[StepInfo], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object for ``steps``, text offsets from ``offset``."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for s in steps:
        text = _token_text(model, s.token_id)
        tokens.append(text)
        token_logprobs.append(_logprob(s.logprob))
        top.append({_token_text(model, t): _logprob(lp) for t, lp in s.alternatives})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _chat_logprobs(model: Model, steps: list[StepInfo]) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        raw = model.token_bytes(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": _logprob(logprob), "bytes": list(raw)}

    return {"content": [{**entry(s.token_id, s.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in s.alternatives]} for s in steps],
            "refusal": None}


def _usage(prompts: Sequence[list[int]], completion_tokens: int, choices: Sequence[_Choice]) -> dict[str, Any]:
    prompt_tokens = sum(len(p) for p in prompts)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": _cached_tokens(choices)}}


def _cached_tokens(choices: Sequence[_Choice]) -> int:
    """Prompt tokens read from the prefix cache, counted like ``prompt_tokens`` (once per
    prompt): those of each prompt's first choice."""
    first: dict[int, int] = {}
    for c in choices:
        first.setdefault(c.prompt_index, c.request.cached_tokens)
    return sum(first.values())


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled (and with it
    its engine requests) and :class:`_ClientGone` raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise _ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _EventStream(Response):
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
            await _unless_disconnected(receive, stream())
        except (_ClientGone, OSError):
            pass
        finally:
            await self._events.aclose()
            self._on_close()


# ---- the application --------------------------------------------------------------------------


def _json(data: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(json.dumps(data, ensure_ascii=False), status_code=status, headers=headers,
                    media_type="application/json")


def _error_response(e: ApiError) -> Response:
    return _json(e.body(), e.status, e.headers)


def create_app(config: ServerConfig, model: Optional[Model] = None) -> Starlette:
    """The ASGI application for ``config``. With ``model`` it serves that model at once;
    otherwise it loads ``config.model_path`` in a thread at startup, answering 503 meanwhile."""
    server = _Server(config, model)

    def endpoint(fn: Callable[[HttpRequest], Awaitable[Response]], *, auth: bool = True
                 ) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def handle(request: HttpRequest) -> Response:
            try:
                if auth:
                    server.check_auth(request)
                return await fn(request)
            except ApiError as e:
                return _error_response(e)
            except _ClientGone:
                return _json(error_body("the client closed the connection", type="invalid_request_error"), 499)
            except errors.ReprolmError as e:  # the engine failed a request it had accepted
                return _error_response(_engine_error(e, "prompt"))
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
        data = await server.read_json(request)
        model = server.ready_model()
        body: TokenizeBody = validate(TokenizeBody, data)
        server.check_model_name(body.model)
        return _json({"tokens": model.tokenize(body.text(), special=body.parse_special)})

    async def tokenizer_info(request: HttpRequest) -> Response:
        return _json(tokenizer_info_of(server.ready_model(), server.context_length))

    async def detokenize(request: HttpRequest) -> Response:
        data = await server.read_json(request)
        model = server.ready_model()
        body: DetokenizeBody = validate(DetokenizeBody, data)
        server.check_model_name(body.model)
        vocab = model.config.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"invalid value for 'tokens': token id {bad} is outside the vocabulary "
                                f"(0..{vocab - 1})", param="tokens", code="invalid_value")
        return _json({"content": model.detokenize(body.tokens)})

    async def completions(request: HttpRequest) -> Response:
        data = await server.read_json(request)
        model = server.ready_model()
        body: CompletionBody = validate(CompletionBody, data)
        server.check_model_name(body.model)
        if body.best_of is not None and body.best_of != body.n:
            raise ApiError(400, "invalid value for 'best_of': only best_of = n is supported", param="best_of",
                           code="invalid_value")
        prompts, texts = _prompts(model, body.prompt)
        context = server.context_length
        requested, param = max_tokens_of(body.max_tokens, body.model_fields_set, body.n_predict)
        limits = [_limit(requested, len(p), context, "prompt", param) for p in prompts]
        samplers = _samplers(body, model.config.vocab_size)
        prefixes = texts if body.echo else ["" for _ in texts]
        echoed: list[Optional[dict[str, Any]]] = [None for _ in prompts]
        if body.echo and body.logprobs is not None:
            top = body.logprobs
            echoed = list(await _unless_disconnected(request.receive, asyncio.gather(
                *(asyncio.to_thread(prompt_logprobs, model, p, top, _logprob) for p in prompts))))
        choices = server.submit(model, prompts, samplers, n=body.n, max_tokens=limits, stop=_stops(body.stop),
                                logprobs=body.logprobs, prompt_param="prompt", prefixes=prefixes,
                                grammar=_grammar(body))
        rid = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": config.model_id,
                "system_fingerprint": server.fingerprint}
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return _EventStream(_stream_completion(server, model, head, choices, prompts, body.logprobs,
                                                   include_usage, echoed), lambda: server.release(choices))
        outcomes = await _unless_disconnected(request.receive, server.collect(choices))
        out_choices = []
        generated = 0
        for c, o in zip(choices, outcomes):
            generated += len(o.token_ids)
            lp = None
            if body.logprobs is not None:
                steps = o.steps if body.echo else _reported_steps(o.steps, o.finish_reason)
                lp = _completion_logprobs(model, steps, len(c.prefix))
                prompt_lp = echoed[c.prompt_index]
                if prompt_lp is not None:
                    lp = joined(prompt_lp, lp)
            out_choices.append({"index": c.index, "text": c.prefix + o.text, "logprobs": lp,
                                "finish_reason": _finish(o.finish_reason)})
        _count_tokens(server, prompts, generated)
        return _json({**head, "choices": out_choices, "usage": _usage(prompts, generated, choices)})

    async def chat(request: HttpRequest) -> Response:
        data = await server.read_json(request)
        model = server.ready_model()
        body: ChatBody = validate(ChatBody, data)
        server.check_model_name(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "invalid value for 'top_logprobs': it needs 'logprobs': true", param="top_logprobs",
                           code="invalid_value")
        prompt = chat_prompt(model, body, data, lambda: _grammar(body))
        ids = prompt.ids
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        requested, param = max_tokens_of(requested, body.model_fields_set, body.n_predict, param)
        limit = _limit(requested, len(ids), server.context_length, "messages", param)
        samplers = _samplers(body, model.config.vocab_size)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        try:
            choices = server.submit(model, [ids], samplers, n=body.n, max_tokens=[limit], stop=_stops(body.stop),
                                    logprobs=logprobs, prompt_param="messages", prefixes=[""], grammar=prompt.grammar)
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
            events = (_stream_tool_chat(server, chunk_head, choices, [ids], prompt, include_usage)
                      if prompt.tools is not None and prompt.tools.choice != "none"
                      else _stream_chat(server, model, chunk_head, choices, [ids], body.logprobs, include_usage))
            return _EventStream(events, lambda: server.release(choices))
        outcomes = await _unless_disconnected(request.receive, server.collect(choices))
        out_choices = []
        generated = 0
        for c, o in zip(choices, outcomes):
            generated += len(o.token_ids)
            lp = _chat_logprobs(model, _reported_steps(o.steps, o.finish_reason)) if body.logprobs else None
            content, calls = prompt.parse(o.text, c.index)
            out_choices.append({"index": c.index, "message": reply_message(content, calls), "logprobs": lp,
                                "finish_reason": tool_finish_reason(calls, o.finish_reason)})
        _count_tokens(server, [ids], generated)
        return _json({**head, "choices": out_choices, "usage": _usage([ids], generated, choices)})

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


def _count_tokens(server: _Server, prompts: Sequence[list[int]], generated: int) -> None:
    server.metrics.prompt_tokens.inc(sum(len(p) for p in prompts))
    server.metrics.completion_tokens.inc(generated)


def _stream_end(server: _Server, head: dict[str, Any], prompts: Sequence[list[int]], generated: int,
                choices: Sequence[_Choice], include_usage: bool) -> Iterator[bytes]:
    """The events after a stream's last chunk: its usage if asked for, then [DONE] (its tokens
    counted in the metrics)."""
    _count_tokens(server, prompts, generated)
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(prompts, generated, choices)})
    yield b"data: [DONE]\n\n"


def _stream_completion(
    server: _Server, model: Model, head: dict[str, Any], choices: list[_Choice], prompts: list[list[int]],
    logprobs: Optional[int], include_usage: bool, echoed: list[Optional[dict[str, Any]]],
) -> AsyncGenerator[bytes, None]:
    offsets = {id(c): len(c.prefix) for c in choices}
    echo = any(e is not None for e in echoed)

    def piece(c: _Choice, text: str, steps: list[StepInfo]) -> dict[str, Any]:
        lp = None if logprobs is None else _completion_logprobs(model, steps, offsets[id(c)])
        offsets[id(c)] += len(text)
        return {"text": text, "logprobs": lp}

    return _stream_choices(server, head, choices, prompts, include_usage,
                           opening=lambda c: {"text": c.prefix, "logprobs": echoed[c.prompt_index]} if c.prefix else None,
                           piece=piece, ending={"text": "", "logprobs": None}, keep_eos=echo)


def _stream_chat(
    server: _Server, model: Model, head: dict[str, Any], choices: list[_Choice], prompts: list[list[int]],
    logprobs: bool, include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    def piece(c: _Choice, text: str, steps: list[StepInfo]) -> dict[str, Any]:
        return {"delta": {"content": text}, "logprobs": _chat_logprobs(model, steps) if logprobs else None}

    return _stream_choices(server, head, choices, prompts, include_usage,
                           opening=lambda c: {"delta": {"role": "assistant", "content": ""}, "logprobs": None},
                           piece=piece, ending={"delta": {}, "logprobs": None})


async def _stream_tool_chat(
    server: _Server, head: dict[str, Any], choices: list[_Choice], prompts: list[list[int]], prompt: ChatPrompt,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a chat offering tools: each choice's reply is parsed when it
    ends (a call is known to be one only once complete), then sent as its deltas
    (:func:`_tools.tool_deltas`) and its finish reason; then the usage and [DONE]."""
    def chunk(index: int, delta: dict[str, Any], reason: Optional[str]) -> bytes:
        data = {**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        if include_usage:
            data["usage"] = None
        return _sse(data)

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
        yield _sse(error_body(f"{type(e).__name__}: {e}", type="server_error", code="engine_error"))
        return
    finally:
        await merged.aclose()
    for end in _stream_end(server, head, prompts, generated, choices, include_usage):
        yield end


async def _stream_choices(
    server: _Server, head: dict[str, Any], choices: list[_Choice], prompts: list[list[int]], include_usage: bool,
    *,
    opening: Callable[[_Choice], Optional[dict[str, Any]]],
    piece: Callable[[_Choice, str, list[StepInfo]], dict[str, Any]],
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
        return _sse(data)

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
                [event.step] if keep_eos else _reported_steps([event.step], event.finish_reason))
            if event.text or steps:
                yield chunk(c.index, piece(c, event.text, steps), None)
            if event.finish_reason is not None:
                yield chunk(c.index, ending, _finish(event.finish_reason))
    except errors.ReprolmError as e:
        yield _sse(error_body(f"{type(e).__name__}: {e}", type="server_error", code="engine_error"))
        return
    finally:
        await merged.aclose()
    for end in _stream_end(server, head, prompts, generated, choices, include_usage):
        yield end


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
