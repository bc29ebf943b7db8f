"""Shared fixtures: the default model (fetched once into the cache) and reference data."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import reprolm

DATA = Path(__file__).resolve().parent.parent / "data"

# ray.init() in the tests (and in the docs examples they run) starts a Ray instance of its
# own: never join a cluster that happens to run on this machine.
os.environ["RAY_ADDRESS"] = "local"

# The Ctrl-C tests send real SIGINTs, to this process and to the processes it starts. A shell
# that starts the suite in the background (`cmd &`) sets SIGINT to ignored, Python then keeps
# it ignored, and children inherit that: restore Python's own handler, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def model_path() -> Path:
    return reprolm.default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> reprolm.Model:
    return reprolm.Model.load(model_path)


@pytest.fixture(scope="session")
def generations() -> list[dict[str, Any]]:
    return json.loads((DATA / "generations.json").read_text())


@pytest.fixture(scope="session")
def tokenizer_cases() -> list[dict[str, Any]]:
    return json.loads((DATA / "tokenizer.json").read_text())


@pytest.fixture(scope="session")
def last_logits() -> np.ndarray:
    return np.load(DATA / "last_logits.npy")


@pytest.fixture(scope="session")
def all_positions_prompt2() -> np.ndarray:
    return np.load(DATA / "all_positions_prompt2.npy")


@pytest.fixture(scope="session")
def server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ``reprolm serve`` (2 threads, an API key) shared by the server tests; always stopped."""
    from _serving import ServerProcess

    proc = ServerProcess(model_path, tmp_path_factory.mktemp("server") / "server.log", "--max-concurrent", "32",
                         "--grace-period", "2")
    try:
        yield proc
    finally:
        proc.stop()
