"""``reprolm serve``: an OpenAI-compatible HTTP server on the batch engine.

Needs the ``server`` extra (``pip install 'reprolm[server]'``: Starlette, uvicorn, pydantic,
prometheus-client). :func:`serve` runs it in this process until SIGTERM or Ctrl-C;
:func:`create_app` returns the ASGI application for another server to run.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator, Optional

import uvicorn

from .._model import Model
from ._app import ServerConfig, create_app, model_fingerprint

__all__ = ["ServerConfig", "create_app", "serve", "model_fingerprint"]


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, but after a graceful stop on SIGTERM or SIGINT it returns instead of
    raising the signal again (which would end the process that called :func:`serve`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # the first signal stops gracefully, a second one at once (uvicorn's handle_exit)
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
    if not logging.getLogger("reprolm.server").handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(config, model)
    server = _Uvicorn(uvicorn.Config(
        app, host=config.host, port=config.port, timeout_graceful_shutdown=max(0, round(config.grace_period)),
        log_level="info", lifespan="on",
    ))
    state = app.state.reprolm
    failed = threading.Event()

    def on_load_failure() -> None:
        failed.set()
        server.should_exit = True

    state.on_load_failure = on_load_failure
    server.run()
    return 1 if failed.is_set() else 0

