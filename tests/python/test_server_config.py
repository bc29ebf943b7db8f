"""ServerConfig takes the model path as a ``str`` or any ``os.PathLike``, checks every other
field when it is built (a typed error naming the field), and a model that fails to load is
reported (``/health`` 503 with the error, every endpoint 503, ``serve`` returns 1), never
answered with a 500."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from reprolm import errors
from reprolm.server import ServerConfig, running, serve
from reprolm.server._app import create_app


class _Fspath:
    """An os.PathLike that is neither str nor Path."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return self._path


@pytest.mark.parametrize("kind", [str, Path, _Fspath])
def test_model_path_as_str_or_pathlike_serves(model_path: Path, kind: Any) -> None:
    config = ServerConfig(kind(str(model_path)), port=0, threads=2, max_concurrent=2, max_queue=2)
    assert config.model_path == model_path and isinstance(config.model_path, Path)
    assert config.model_id == model_path.name.removesuffix(".gguf")
    with running(config) as url:
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
        models = httpx.get(f"{url}/v1/models", timeout=10)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == config.model_id
        r = httpx.post(f"{url}/v1/completions", json={"model": config.model_id, "prompt": "Hi", "max_tokens": 2,
                                                      "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 2


BAD_FIELDS = [
    ({"model_path": 3}, errors.InvalidTypeError, "model_path"),
    ({"model_path": b"model.gguf"}, errors.InvalidTypeError, "model_path"),
    ({"model_path": None}, errors.InvalidTypeError, "model_path"),
    ({"host": ""}, errors.InvalidArgumentError, "host"),
    ({"host": 127}, errors.InvalidTypeError, "host"),
    ({"port": -1}, errors.InvalidArgumentError, "port"),
    ({"port": 65536}, errors.InvalidArgumentError, "port"),
    ({"port": "8000"}, errors.InvalidTypeError, "port"),
    ({"port": True}, errors.InvalidTypeError, "port"),
    ({"threads": 0}, errors.InvalidArgumentError, "threads"),
    ({"threads": 2.0}, errors.InvalidTypeError, "threads"),
    ({"precision": "float16"}, errors.InvalidArgumentError, "precision"),
    ({"kv_dtype": "bf16"}, errors.InvalidArgumentError, "kv_dtype"),
    ({"kv_dtype": ["f32"]}, errors.InvalidArgumentError, "kv_dtype"),
    ({"max_concurrent": 0}, errors.InvalidArgumentError, "max_concurrent"),
    ({"max_queue": -1}, errors.InvalidArgumentError, "max_queue"),
    ({"context_length": 0}, errors.InvalidArgumentError, "context_length"),
    ({"max_batch_tokens": 0}, errors.InvalidArgumentError, "max_batch_tokens"),
    ({"api_key": ""}, errors.InvalidArgumentError, "api_key"),
    ({"api_key": 5}, errors.InvalidTypeError, "api_key"),
    ({"alias": ""}, errors.InvalidArgumentError, "alias"),
    ({"max_body_bytes": -1}, errors.InvalidArgumentError, "max_body_bytes"),
    ({"grace_period": -0.5}, errors.InvalidArgumentError, "grace_period"),
    ({"grace_period": float("nan")}, errors.InvalidArgumentError, "grace_period"),
    ({"grace_period": float("inf")}, errors.InvalidArgumentError, "grace_period"),
    ({"grace_period": "30"}, errors.InvalidTypeError, "grace_period"),
]


@pytest.mark.parametrize(("fields", "error", "name"), BAD_FIELDS)
def test_bad_field_is_a_typed_error_naming_it(fields: dict[str, Any], error: type, name: str) -> None:
    kwargs: dict[str, Any] = {"model_path": "model.gguf", **fields}
    with pytest.raises(error, match=rf"ServerConfig\.{name}\b"):
        ServerConfig(**kwargs)


def test_bytes_fspath_is_a_typed_error() -> None:
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"model.gguf"

    with pytest.raises(errors.InvalidTypeError, match="model_path"):
        ServerConfig(BytesPath())  # type: ignore[arg-type]


def test_good_values_are_kept() -> None:
    config = ServerConfig("m.gguf", host="0.0.0.0", port=0, threads=1, precision="int8", kv_dtype="f16",
                          max_concurrent=1, max_queue=0, context_length=1, max_batch_tokens=1, api_key="k",
                          alias="a", max_body_bytes=0, grace_period=0)
    assert config.model_path == Path("m.gguf") and config.model_id == "a" and config.grace_period == 0


def test_missing_model_serve_returns_1(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(serve(ServerConfig(missing, port=0))), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and result == [1]


def test_missing_model_running_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="missing.gguf"):
        with running(ServerConfig(str(tmp_path / "missing.gguf"), port=0), timeout=60):
            pass


def test_failed_load_answers_503_never_500(tmp_path: Path) -> None:
    """An application embedded in another ASGI server keeps running after a failed load: it
    reports the error on /health and answers 503 on every endpoint."""
    not_gguf = tmp_path / "not-a-model.gguf"
    not_gguf.write_bytes(b"this is not a GGUF file" * 10)
    app = create_app(ServerConfig(os.fspath(not_gguf)))
    state = app.state.reprolm
    state.start_loading()
    state._loader.join(timeout=60)
    assert state.load_error is not None and "GgufFormatError" in state.load_error

    import asyncio

    async def probe() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [
                await client.get("/health"),
                await client.get("/v1/models"),
                await client.get("/v1/models/not-a-model"),
                await client.post("/v1/completions", json={"model": "not-a-model", "prompt": "x"}),
                await client.post("/v1/chat/completions",
                                  json={"model": "not-a-model", "messages": [{"role": "user", "content": "x"}]}),
                await client.post("/tokenize", json={"content": "x"}),
                await client.post("/detokenize", json={"tokens": [1]}),
            ]

    answers = asyncio.run(probe())
    health = answers[0]
    assert health.status_code == 503 and health.json()["status"] == "error"
    assert "GgufFormatError" in health.json()["error"]
    for r in answers[1:]:
        assert r.status_code == 503, (r.request.url, r.text)
        assert r.json()["error"]["code"] == "model_load_failed"
