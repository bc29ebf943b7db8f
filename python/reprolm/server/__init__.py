"""``reprolm serve``: an OpenAI-compatible HTTP server on the batch engine.

Needs the ``server`` extra (``pip install 'reprolm[server]'``: Starlette, uvicorn, pydantic,
prometheus-client). :func:`serve` runs it in this process until SIGTERM or Ctrl-C;
:func:`create_app` returns the ASGI application for another server to run.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import uvicorn

from .._model import Model
from ._app import ServerConfig, create_app, model_fingerprint

__all__ = ["ServerConfig", "create_app", "serve", "model_fingerprint"]


def serve(config: ServerConfig, model: Optional[Model] = None) -> int:
    """Serves ``config`` (or the already loaded ``model``) until SIGTERM or Ctrl-C: then stops
    accepting connections, lets in-flight requests finish for up to ``config.grace_period``
    seconds, cancels what is left and returns. Returns 0, or 1 if the model failed to load."""
    if not logging.getLogger("reprolm.server").handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(config, model)
    server = uvicorn.Server(uvicorn.Config(
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

