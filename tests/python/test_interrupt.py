"""The GIL is released during generation, and Ctrl-C stops it (issue 6, item 5)."""

from __future__ import annotations

import _thread
import threading
import time

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
