"""The `request` fuzz target: server request bodies through the server's own parsing,
validation and request -> engine conversion, with a real model, stopping before anything is
submitted to the engine (the server is Python, so this target is driven by atheris, the
coverage-guided fuzzer for Python, rather than libFuzzer).

An input is one byte choosing the endpoint (its value mod 4: completions, chat completions,
tokenize, detokenize), then the request body as sent. Each input must end in an answer the
server would send: a conversion that succeeds, or an :class:`ApiError` with a 4xx status and
an OpenAI error body. Any other exception, an engine error the server would answer with a
5xx, or a malformed error is a failure.

    pip install atheris                                   # once (not a test dependency)
    PYTHONPATH=python python fuzz/python/request_fuzz.py fuzz/corpus/request [libFuzzer flags]
    python fuzz/python/request_fuzz.py --replay fuzz/corpus/request       # no atheris needed
    python fuzz/python/request_fuzz.py --smoke SECONDS fuzz/corpus/request

``bash fuzz/fuzz.sh run request SECONDS`` runs the first form. ``--smoke`` replays the corpus,
then mutates its files at random for SECONDS (as ``tests/fuzz_corpora.rs`` does for the Rust
targets; ``fuzz/smoke.sh`` runs it). The model is ``REPROLM_MODEL``, else the default one in
``~/.cache/reprolm``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

# Fuzzing (not --replay or --smoke): reprolm's Python modules are instrumented for coverage
# as they are imported (only they: instrumenting every loaded module takes minutes).
_FUZZING = __name__ == "__main__" and not (len(sys.argv) > 1 and sys.argv[1] in ("--replay", "--smoke"))
if _FUZZING:
    import atheris  # type: ignore[import-not-found]

with atheris.instrument_imports(include=["reprolm"]) if _FUZZING else contextlib.nullcontext():
    from reprolm import Model, errors
    from reprolm.server._config import ServerConfig
    from reprolm.server._errors import ApiError
    from reprolm.server._protocol import engine_error
    from reprolm.server._requests import chat_request, completion_request, detokenize_request, tokenize_request
    from reprolm.server._schema import parse_json
    from reprolm.server._state import Server

ALIAS = "reprolm"
"""The model name the seeds use."""


def _model_path() -> Path:
    if "REPROLM_MODEL" in os.environ:
        return Path(os.environ["REPROLM_MODEL"])
    cache = Path(os.environ.get("REPROLM_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reprolm"))
    return cache / "SmolLM2-135M-Instruct.Q4_1.gguf"


_SERVER: Optional[Server] = None


def _server() -> Server:
    """One server state over the default model (loaded once, one thread), as ``reprolm serve
    --alias reprolm --max-concurrent 4 --max-queue 12`` would hold it."""
    global _SERVER
    if _SERVER is None:
        config = ServerConfig(_model_path(), alias=ALIAS, threads=1, max_concurrent=4, max_queue=12)
        model = Model.load(config.model_path, threads=1, max_concurrent=config.max_concurrent)
        _SERVER = Server(config, model)
    return _SERVER


def _sequences(server: Server, count: int, param: str) -> None:
    """The server's check of the sequences a request asks for (undone: nothing is submitted)."""
    server.reserve(count, param)
    server.in_flight -= count


def _completions(server: Server, data: dict[str, Any]) -> None:
    """``POST /v1/completions`` up to the engine."""
    req = completion_request(server, data)
    context = server.context_length
    assert len(req.params) == len(req.prompts) == len(req.texts)
    assert all(len(row) == req.body.n for row in req.params)
    assert all(0 <= p.max_tokens <= context - len(ids) for row, ids in zip(req.params, req.prompts) for p in row)
    _sequences(server, len(req.prompts) * req.body.n, "prompt")


def _chat(server: Server, data: dict[str, Any]) -> None:
    """``POST /v1/chat/completions`` up to the engine."""
    req = chat_request(server, data)
    ids = req.prompt.ids
    assert all(0 <= t < req.model.config.vocab_size for t in ids)
    assert len(req.params) == 1 and len(req.params[0]) == req.body.n
    assert all(0 <= p.max_tokens <= server.context_length - len(ids) for p in req.params[0])
    _sequences(server, req.body.n, "messages")


def _tokenize(server: Server, data: dict[str, Any]) -> None:
    ids = tokenize_request(server, data)
    vocab = server.ready_model().config.vocab_size
    assert all(0 <= t < vocab for t in ids)


def _detokenize(server: Server, data: dict[str, Any]) -> None:
    model, ids = detokenize_request(server, data)
    model.detokenize(ids)


ENDPOINTS: list[Callable[[Server, dict[str, Any]], None]] = [_completions, _chat, _tokenize, _detokenize]


def one_input(data: bytes) -> None:
    """One request: a conversion that succeeds or a well-formed 4xx (see the module docs)."""
    if not data:
        return
    server = _server()
    endpoint = ENDPOINTS[data[0] % len(ENDPOINTS)]
    in_flight = server.in_flight
    try:
        try:
            endpoint(server, parse_json(data[1:]))
        except errors.ReprolmError as e:  # what the server's handler does with one
            raise engine_error(e, "prompt") from None
    except ApiError as e:
        assert e.status == 400 or (e.status == 404 and e.code == "model_not_found"), (e.status, e.message)
        body = e.body()["error"]
        assert isinstance(body["message"], str) and body["message"], body
        assert body["param"] is None or isinstance(body["param"], str), body
        json.dumps(e.body())  # the error is sent as JSON
    assert server.in_flight == in_flight, "a request left sequences counted in flight"


def _corpus(dirs: list[str]) -> list[bytes]:
    files = sorted(p for d in dirs for p in Path(d).iterdir() if p.is_file())
    if not files:
        raise SystemExit(f"no corpus files in {dirs}")
    return [p.read_bytes() for p in files]


def _mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One to four random edits (the byte-level ones of tests/fuzz_corpora.rs, plus JSON tokens)."""
    tokens = [b"null", b"true", b"-1", b"1e309", b"0.5", b'""', b"[]", b"{}", b'"\\ud800"', b"18446744073709551616",
              b'"model"', b'"n"', b'"prompt"', b'"messages"', b'"tools"', b'"logit_bias"', b'"response_format"']
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(out))
        kind = rng.randrange(6)
        if kind == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            out[at:at] = rng.choice(tokens)
        elif kind == 2 and out:
            end = min(len(out), at + rng.randint(1, 32))
            del out[at:end]
        elif kind == 3 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randint(1, 64)]
        elif kind == 4 and other:
            start = rng.randrange(len(other))
            out[at:at] = other[start:start + rng.randint(1, 128)]
        else:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(out)


def _save_failure(data: bytes) -> Path:
    out = Path("target/fuzz-smoke")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"crash-request-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    return path


def _run(data: bytes, origin: str) -> None:
    try:
        one_input(data)
    except BaseException:
        print(f"request: input from {origin} failed; saved as {_save_failure(data)}", file=sys.stderr)
        raise


def smoke(seconds: float, dirs: list[str]) -> None:
    """The corpus replayed, then ``seconds`` of random mutations of it (seeded)."""
    corpus = _corpus(dirs)
    for i, data in enumerate(corpus):
        _run(data, f"corpus file {i}")
    rng = random.Random(0x5EED)
    start, runs = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        _run(_mutate(rng, rng.choice(corpus), rng.choice(corpus)), "a mutation")
        runs += 1
    print(f"request: {len(corpus)} corpus files and {runs} mutated inputs in "
          f"{time.monotonic() - start:.1f} s, no failure", file=sys.stderr)


def main(argv: list[str]) -> None:
    if len(argv) > 1 and argv[1] == "--replay":
        smoke(0, argv[2:])
    elif len(argv) > 2 and argv[1] == "--smoke":
        smoke(float(argv[2]), argv[3:])
    else:
        _server()  # loaded before the fuzzing starts
        # libFuzzer runs argv[0] again for a merge: fuzz.sh passes a script that runs this one.
        atheris.Setup([os.environ.get("REPROLM_FUZZ_SELF", argv[0])] + argv[1:], one_input)
        atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
