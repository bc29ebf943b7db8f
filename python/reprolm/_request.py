"""A generation request running on a model's batch engine: :class:`Request`, read as chunks
from threads (blocking) or from asyncio (awaiting), cancellable."""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterator, Optional

from . import _core
from ._decoding import StepInfo
from ._results import Chunk, Completion

if TYPE_CHECKING:
    from ._core import _ChunkTuple

__all__ = ["Request"]

# How long an awaiting task sleeps at most before looking again (a safety net: the dispatcher
# normally wakes it as soon as a chunk arrives).
_POLL_SECONDS = 0.25


class Request:
    """A request submitted with :meth:`reprolm.Model.submit`: it runs on the model's batch
    engine together with every other request, and its results are the same bits as if it ran
    alone.

    Iterate it for :class:`Chunk` s as they are generated (``for chunk in request``, or
    ``async for chunk in request`` in asyncio), or wait for the whole :class:`Completion` with
    :meth:`result` / ``await request.aresult()``. Its chunks can be read once. :meth:`cancel`
    (or leaving a ``with`` block, or dropping the last reference) stops it and frees its KV
    cache before the engine's next pass.
    """

    def __init__(self, core: _core.Request, prompt_ids: list[int], dispatcher: "_Dispatcher") -> None:
        self._core = core
        self._prompt_ids = prompt_ids
        self._dispatcher = dispatcher
        self._completion: Optional[Completion] = None

    @property
    def id(self) -> int:
        """Unique among the requests of one model."""
        return self._core.id

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(self._prompt_ids)

    @property
    def finished(self) -> bool:
        """Whether the request has produced its last chunk (or failed, or was cancelled)."""
        return self._core.finished

    def cancel(self) -> None:
        """Stops the request. Reading it afterwards raises :class:`RequestCancelledError`
        unless it had already finished."""
        self._core.cancel()

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __iter__(self) -> Iterator[Chunk]:
        """The chunks as they are generated (blocking; the GIL is released while waiting, and
        Ctrl-C raises KeyboardInterrupt without stopping the request)."""
        while (item := self._core.next()) is not None:
            yield _chunk(item)

    def result(self) -> Completion:
        """Waits for the request to finish and returns its :class:`Completion` (reading the
        chunks not yet read)."""
        if self._completion is None:
            self._completion = _collect(self._prompt_ids, iter(self._core.next, None))
        return self._completion

    async def _items(self) -> AsyncIterator["_ChunkTuple"]:
        waiter = self._dispatcher.watch(self._core)
        try:
            while True:
                ready, item = self._core.try_next()
                if ready:
                    if item is None:
                        return
                    yield item
                    continue
                try:
                    await asyncio.wait_for(waiter.wait(), _POLL_SECONDS)
                except asyncio.TimeoutError:
                    pass
                waiter.clear()
        finally:
            self._dispatcher.unwatch(self._core.id)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        """The chunks as they are generated, awaited without blocking the event loop."""
        async for item in self._items():
            yield _chunk(item)

    async def aresult(self) -> Completion:
        """:meth:`result`, awaited without blocking the event loop."""
        if self._completion is None:
            items = [item async for item in self._items()]
            self._completion = _collect(self._prompt_ids, iter(items))
        return self._completion

    def __repr__(self) -> str:
        return f"Request(id={self.id}, finished={self.finished})"


def _chunk(item: "_ChunkTuple") -> Chunk:
    text, token_ids, reason, logprobs, step = item
    return Chunk(text, token_ids, reason, logprobs, None if step is None else StepInfo._from_core(step))


def _collect(prompt_ids: list[int], items: Iterator["_ChunkTuple"]) -> Completion:
    texts: list[str] = []
    ids: list[int] = []
    logprobs: list[float] = []
    steps: list[StepInfo] = []
    reason = None
    for text, token_ids, finish, lps, step in items:
        texts.append(text)
        ids.extend(token_ids)
        logprobs.extend(lps)
        if step is not None:
            steps.append(StepInfo._from_core(step))
        reason = finish or reason
    assert reason is not None, "a finished request has a finish reason"
    return Completion("".join(texts), ids, reason, list(prompt_ids), logprobs, steps)


class _Dispatcher:
    """Wakes the asyncio tasks awaiting a model's requests: one thread waits (GIL released)
    for the engine to announce watched requests with new chunks and sets their tasks'
    events on their own loops. It runs while some request is watched."""

    def __init__(self, wait_ready: Callable[[float], list[int]]) -> None:
        self._wait_ready = wait_ready
        self._lock = threading.Lock()
        self._waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        _DISPATCHERS.add(self)

    def stop(self) -> None:
        """Ends the thread and waits for it (at interpreter exit: a daemon thread still inside
        the engine's wait when the interpreter finalizes would be ended inside native code)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=4 * _POLL_SECONDS)

    def watch(self, core: _core.Request) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiters[core.id] = (asyncio.get_running_loop(), event)
            if self._thread is None or not self._thread.is_alive():  # (not alive: a forked child)
                self._thread = threading.Thread(target=self._run, name="reprolm-async", daemon=True)
                self._thread.start()
        core.watch()
        return event

    def unwatch(self, request_id: int) -> None:
        with self._lock:
            self._waiters.pop(request_id, None)

    def _run(self) -> None:
        while True:
            ids = self._wait_ready(_POLL_SECONDS)
            with self._lock:
                targets = [self._waiters[i] for i in set(ids) if i in self._waiters]
                if self._stopping or (not targets and not self._waiters):
                    self._thread = None
                    return
            for loop, event in targets:
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:  # the loop was closed
                    pass


_DISPATCHERS: "weakref.WeakSet[_Dispatcher]" = weakref.WeakSet()


@atexit.register
def _stop_dispatchers() -> None:
    for dispatcher in list(_DISPATCHERS):
        dispatcher.stop()
