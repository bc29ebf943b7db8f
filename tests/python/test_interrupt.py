"""The GIL is released during generation, and Ctrl-C stops it, also during
long prompt processing and at the first array a call returns."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import reprolm


def test_other_threads_run_during_generation(model: reprolm.Model) -> None:
    result: list[reprolm.Completion] = []
    worker = threading.Thread(target=lambda: result.append(model.generate("Once upon a time", max_tokens=24)))
    gaps = []
    last = time.perf_counter()
    start = last
    worker.start()
    while worker.is_alive():
        sum(range(2000))  # pure Python work, needs the GIL
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    elapsed = time.perf_counter() - start
    assert len(result) == 1 and len(result[0].token_ids) == 24
    # Holding the GIL for the whole call would stall this loop for all of `elapsed`; released
    # per token, it is held only between tokens.
    assert max(gaps) < elapsed / 4, (max(gaps), elapsed)
    assert len(gaps) > 100


def interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_keyboard_interrupt_stops_generation(model: reprolm.Model, how: str) -> None:
    prompt = "Once upon a time"
    per_token = _time_per_token(model)
    n_max = 2000
    timer = interrupt_after(0.3)
    produced: list[int] = []
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        if how == "generate":
            model.generate(prompt, max_tokens=n_max)
        else:
            for chunk in model.stream(prompt, max_tokens=n_max):
                produced.extend(chunk.token_ids)
    stopped_after = time.perf_counter() - start
    timer.join()
    # Stopped within about one token of the interrupt, far before max_tokens.
    assert stopped_after < 0.3 + 5 * per_token + 0.5, (stopped_after, per_token)
    assert len(produced) < n_max
    # The model is usable, and gives the same result as before.
    again = model.generate(prompt, max_tokens=8)
    assert again == model.generate(prompt, max_tokens=8)
    assert len(again.token_ids) == 8


def _time_per_token(model: reprolm.Model) -> float:
    start = time.perf_counter()
    model.generate("Once upon a time", max_tokens=8)
    return (time.perf_counter() - start) / 8


def _interrupt_soon(seconds: float) -> threading.Timer:
    """A real SIGINT (as Ctrl-C sends), delivered to the main thread after `seconds`."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_keyboard_interrupt_stops_logits_of_a_long_input(model: reprolm.Model) -> None:
    # One forward pass over 6,000 ids takes far longer than a block: Ctrl-C must not wait for it.
    ids = (model.tokenize("The quick brown fox jumps over the lazy dog. ") * 600)[:6000]
    short = ids[:40]
    before = model.logits(short)
    timer = _interrupt_soon(0.5)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        model.logits(ids)
    stopped_after = time.perf_counter() - start
    timer.join()
    assert stopped_after < 10, stopped_after  # a liveness bound, not a speed claim
    # Nothing changed: the same bits as before.
    assert np.array_equal(model.logits(short), before)


def test_keyboard_interrupt_stops_prefill_and_keeps_the_blocks_computed(model: reprolm.Model) -> None:
    ids = (model.tokenize("Once upon a time, in a land far away, there lived a fox. ") * 400)[:5000]
    session = model.session(context_length=len(ids))
    timer = _interrupt_soon(0.5)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        session.prefill(ids)
    stopped_after = time.perf_counter() - start
    timer.join()
    assert stopped_after < 10, stopped_after
    # What was computed stays: whole blocks of the input, and the session goes on from there
    # with the same bits as a fresh one.
    kept = len(session.tokens)
    assert kept % 256 == 0 and kept < len(ids) and session.tokens == ids[:kept]
    n = min(kept, 300)
    session.truncate(n)
    fresh = model.session(context_length=len(ids))
    assert np.array_equal(session.prefill(ids[n:n + 8]), fresh.prefill(ids[:n + 8]))


@pytest.mark.parametrize("how", ["Model.generate", "Session.generate", "Session.stream"])
def test_keyboard_interrupt_stops_a_long_prompt(model: reprolm.Model, how: str) -> None:
    # A long prompt must stop promptly on Ctrl-C, not after the whole prompt. Model.generate
    # waits on the batch engine (prompts in passes of 512 rows at most); a session computes a
    # long prompt in blocks of 256 with Ctrl-C checked between them.
    ids = (model.tokenize("Once upon a time, in a land far away, there lived a fox. ") * 400)[:5000]
    session = model.session(context_length=len(ids) + 4)
    timer = _interrupt_soon(0.5)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        if how == "Model.generate":
            model.generate(ids, max_tokens=4)
        elif how == "Session.generate":
            session.generate(ids, max_tokens=4)
        else:
            list(session.stream(ids, max_tokens=4))
    stopped_after = time.perf_counter() - start
    timer.join()
    assert stopped_after < 10, stopped_after  # a liveness bound, not a speed claim
    # The model and the session stay usable, with the same bits.
    prompt = ids[:20]
    expected = model.session().generate(prompt, max_tokens=4)
    assert model.generate(prompt, max_tokens=4) == expected
    assert session.generate(prompt, max_tokens=4) == expected


def test_blocks_give_the_bits_of_one_pass(model: reprolm.Model) -> None:
    # logits and prefill run inputs longer than a block in blocks: any split gives the same bits.
    ids = (model.tokenize("Reproducible inference computes every number one way. ") * 60)[:600]
    all_rows = model.logits(ids)
    assert all_rows.shape == (600, model.config.vocab_size)
    session = model.session(context_length=600)
    assert np.array_equal(session.prefill(ids), all_rows[-1])
    stepped = model.session(context_length=600)
    stepped.prefill(ids[:255])
    assert np.array_equal(stepped.prefill(ids[255:300]), all_rows[299])
    assert np.array_equal(model.logits(ids[:300]), all_rows[:300])


def test_context_overflow_is_checked_before_any_block(model: reprolm.Model) -> None:
    session = model.session(context_length=300)
    with pytest.raises(reprolm.ContextOverflowError):
        session.prefill(list(range(1, 302)))
    assert session.tokens == []


_FIRST_ARRAY_CALL = """
import os, signal, sys, threading, time
import reprolm

model = reprolm.Model.load(sys.argv[1], threads=1)
ids = model.tokenize("The quick brown fox jumps over the lazy dog. " * 30)[:250]
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.perf_counter()
try:
    model.{call}
except KeyboardInterrupt:
    print("interrupted", time.perf_counter() - start > 0.2)
"""


@pytest.mark.parametrize("call", ["logits(ids)", "session().prefill(ids)"])
def test_ctrl_c_at_the_first_array_is_a_keyboard_interrupt(model_path: Path, call: str) -> None:
    # A Ctrl-C pending when the first array is made (here: arriving while the only block
    # computes) must not make rust-numpy's lazy import of NumPy's C API fail and panic.
    code = _FIRST_ARRAY_CALL.replace("{call}", call)
    out = subprocess.run([sys.executable, "-c", code, str(model_path)], capture_output=True, text=True, timeout=120)
    assert "PanicException" not in out.stderr and "panicked" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
    assert out.stdout == "interrupted True\n"


def test_bench_exits_130_on_ctrl_c(model_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "reprolm", "bench", "-m", str(model_path), "-t", "1",
                                "-p", "250", "-n", "0", "-r", "50"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    process.stderr.readline()  # the header: the model is loaded, the first prefill starts
    time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.endswith("reprolm: interrupted\n"), err
