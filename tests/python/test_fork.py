"""Fork safety: a model loaded, and used, before os.fork() keeps working in the
child, with the same bits: the child has none of the parent's worker or engine threads, so its
pool runs on the calling thread and it starts a batch engine of its own."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
from pathlib import Path
from typing import Any

import numpy as np

import reprolm

_MODEL: dict[str, reprolm.Model] = {}


def work(model: reprolm.Model) -> dict[str, Any]:
    sampled = model.generate("Once upon a time", max_tokens=8, sampler=reprolm.Sampler(temperature=0.9, seed=3))
    session = model.session(context_length=64)
    return {
        "greedy": model.generate("The capital of France is", max_tokens=8).token_ids,
        "sampled": (sampled.token_ids, sampled.logprobs),
        "logits": model.logits([1, 2, 3, 4, 5]).tobytes(),
        "session": session.prefill([10, 20, 30]).tobytes(),
        "stream": "".join(c.text for c in model.stream("1, 2, 3,", max_tokens=6)),
    }


def child(conn: multiprocessing.connection.Connection) -> None:
    conn.send(work(_MODEL["m"]))
    conn.close()


def test_a_forked_child_keeps_working(model_path: Path) -> None:
    model = reprolm.Model.load(model_path, threads=2)
    _MODEL["m"] = model
    expected = work(model)  # the pool's workers and the engine thread are running now
    # Fork while a request is still being computed, too.
    busy = model.submit("Tell me a long story.", max_tokens=400)
    next(iter(busy))
    ctx = multiprocessing.get_context("fork")
    for _ in range(2):
        receive, send = ctx.Pipe(duplex=False)
        process = ctx.Process(target=child, args=(send,))
        process.start()
        send.close()
        try:
            assert receive.poll(120), "the forked child hung"
            got = receive.recv()
        finally:
            process.join(10)
            if process.is_alive():
                process.kill()
        assert process.exitcode == 0
        assert got == expected
    busy.cancel()
    # The parent is unaffected.
    assert work(model) == expected
    assert np.frombuffer(expected["logits"], dtype=np.float32).shape == (5 * model.config.vocab_size,)


def quantize_child(src: str, dst: str, conn: multiprocessing.connection.Connection) -> None:
    reprolm.quantize(src, dst, type="q8_0")
    conn.send(Path(dst).read_bytes() == Path(dst + ".parent").read_bytes())
    conn.close()


def test_quantize_works_in_a_forked_child(model_path: Path, tmp_path: Path) -> None:
    # The parent's quantize used worker threads; the child must not wait for them.
    dst = tmp_path / "q8.gguf"
    reprolm.quantize(model_path, str(dst) + ".parent", type="q8_0")
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=quantize_child, args=(str(model_path), str(dst), send))
    process.start()
    send.close()
    try:
        assert receive.poll(300), "quantize hung in the forked child"
        assert receive.recv() is True  # the same file, byte for byte
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
