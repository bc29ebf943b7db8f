"""Fork safety (issue 17): a model loaded, and used, before os.fork() keeps working in the
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
