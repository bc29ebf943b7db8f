"""The state behind one server application (:class:`Server`): loading the model, readiness,
authentication, reading bodies, and admission: the sequences in flight, counted against the
configured limits, submitted to the model's batch engine all or none, read back as events and
released."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import threading
import time
from typing import Any, AsyncGenerator, Callable, Optional, Sequence, Union, cast

from starlette.requests import Request as HttpRequest

from .. import errors
from .._decoding import StepInfo
from .._model import EngineStats, Model
from .._params import GenerationParams
from .._request import Request
from .._results import Chunk
from ._config import ServerConfig, model_fingerprint
from ._errors import ApiError
from ._metrics import Metrics
from ._openapi import model_ids
from ._protocol import engine_error
from ._schema import parse_json

__all__ = ["Server", "Choice", "Event", "Outcome"]

log = logging.getLogger("reprolm.server")


@dataclasses.dataclass
class Choice:
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
class Event:
    """One chunk of a choice, with its per-token statistics when they were asked for."""

    text: str
    token_ids: list[int]
    finish_reason: Optional[str]
    step: Optional[StepInfo]


@dataclasses.dataclass
class Outcome:
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: Optional[str] = None
    steps: list[StepInfo] = dataclasses.field(default_factory=list)


class Server:
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
        self, model: Model, prompts: Sequence[list[int]], params: Sequence[Sequence[GenerationParams]], *,
        prompt_param: str, prefixes: Sequence[str],
    ) -> list[Choice]:
        """Submits choice ``i`` of every prompt ``p`` with ``params[p][i]``: every choice of
        every prompt, all or none."""
        sequences = sum(len(per_prompt) for per_prompt in params)
        self.reserve(sequences, prompt_param)
        choices: list[Choice] = []
        try:
            for p, ids in enumerate(prompts):
                for i, settings in enumerate(params[p]):
                    request = model.submit(ids, params=settings)
                    choices.append(Choice(p * len(params[p]) + i, p, request, prefixes[p]))
        except BaseException as e:
            for c in choices:
                c.request.cancel()
            self.in_flight -= sequences
            if isinstance(e, errors.ReprolmError):
                raise engine_error(e, prompt_param) from None
            raise
        return choices

    def count_tokens(self, prompts: Sequence[list[int]], generated: int) -> None:
        """Adds a finished request's prompt and generated tokens to the metrics."""
        self.metrics.prompt_tokens.inc(sum(len(p) for p in prompts))
        self.metrics.completion_tokens.inc(generated)

    def release(self, choices: Sequence[Choice]) -> None:
        """Cancels the choices not finished and stops counting them in flight (idempotent)."""
        for c in choices:
            if c.released:
                continue
            c.released = True
            self.in_flight -= 1
            if not c.finished:
                c.request.cancel()
                self.metrics.cancelled.inc()

    async def events(self, choice: Choice) -> AsyncGenerator[Event, None]:
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
                yield Event(chunk.text, list(chunk.token_ids), chunk.finish_reason, chunk.step)
        finally:
            await chunks.aclose()
            self.release([choice])

    async def merged(self, choices: list[Choice]) -> AsyncGenerator[tuple[Choice, Event], None]:
        """The events of every choice, as they come; cancels whatever is left on exit."""
        queue: asyncio.Queue[tuple[Choice, Union[Event, BaseException, None]]] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
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

    async def collect(self, choices: list[Choice]) -> list[Outcome]:
        outcomes = [Outcome() for _ in choices]
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
    async def _collect_into(merged: AsyncGenerator[tuple[Choice, Event], None], position: dict[int, int],
                            outcomes: list[Outcome], parts: list[list[str]]) -> None:
        async for choice, event in merged:
            k = position[id(choice)]
            parts[k].append(event.text)
            outcomes[k].token_ids.extend(event.token_ids)
            if event.step is not None:
                outcomes[k].steps.append(event.step)
            outcomes[k].finish_reason = event.finish_reason or outcomes[k].finish_reason
