"""``reprolm serve``: an OpenAI-compatible HTTP server on the batch engine.

Needs the ``server`` extra (``pip install 'reprolm[server]'``: Starlette, uvicorn, pydantic,
prometheus-client). :func:`serve` runs it in this process until SIGTERM or Ctrl-C;
:func:`running` runs it on a background thread for the duration of a ``with`` block;
:func:`create_app` returns the ASGI application for another server to run.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from typing import Iterator, Optional

import uvicorn

from .._model import Model
from ._app import create_app
from ._config import ServerConfig, model_fingerprint
from ._state import Server

__all__ = ["ServerConfig", "create_app", "serve", "running", "model_fingerprint"]


class _Uvicorn(uvicorn.Server):
    """uvicorn's server for ``config``, except that after a graceful stop on SIGTERM or SIGINT
    it returns instead of raising the signal again (which would end the process that called
    :func:`serve`)."""

    def __init__(self, config: ServerConfig, model: Optional[Model], *, own_logging: bool) -> None:
        app = create_app(config, model)
        self.reprolm: Server = app.state.reprolm
        # own_logging: uvicorn's log configuration (access log on stdout); else the caller's
        super().__init__(uvicorn.Config(
            app, host=config.host, port=config.port, log_level="info", lifespan="on",
            timeout_graceful_shutdown=max(0, round(config.grace_period)),
            log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None, access_log=own_logging,
        ))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # the first signal stops gracefully, a second SIGINT at once (uvicorn's handle_exit)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(config: ServerConfig, model: Optional[Model] = None) -> int:
    """Serves ``config`` (or the already loaded ``model``) until SIGTERM or Ctrl-C: then stops
    accepting connections, lets in-flight requests finish for up to ``config.grace_period``
    seconds, cancels what is left and returns. Returns 0, or 1 if the model failed to load."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = _Uvicorn(config, model, own_logging=True)
    failed = threading.Event()

    def on_load_failure() -> None:
        failed.set()
        server.should_exit = True

    server.reprolm.on_load_failure = on_load_failure
    server.run()
    return 1 if failed.is_set() else 0


@contextlib.contextmanager
def running(config: ServerConfig, model: Optional[Model] = None, *, timeout: float = 300.0) -> Iterator[str]:
    """Runs the server on a background thread and yields its base URL (``http://host:port``)
    once the model is loaded; leaving the block stops it as SIGTERM does. ``port=0`` picks a
    free port. Raises :class:`RuntimeError` if it has not started within ``timeout`` seconds
    or the model fails to load."""
    server = _Uvicorn(config, model, own_logging=False)
    state = server.reprolm
    thread = threading.Thread(target=server.run, name="reprolm-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not (server.started and state.model is not None):
            if state.load_error is not None or not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {state.load_error or 'it exited or timed out'}")
            time.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join()
