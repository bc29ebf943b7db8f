"""Side-by-side speed of reprolm and llama.cpp (llama-cpp-python) on the same GGUF file.

    python benches/compare_llamacpp.py [--model PATH|NAME] [--rounds 5] [--threads 1 2] [--precision int8]
                                       [--baseline DIR] [--no-llamacpp]

``--model`` takes a GGUF path or a known model's name (``reprolm.known_models()``, e.g.
``gemma3-270m``), fetched into the cache like ``Model.load`` does.

Installs nothing. llama-cpp-python must already be importable, e.g.
``pip install llama-cpp-python`` (it compiles llama.cpp; set ``CMAKE_ARGS=-DGGML_NATIVE=ON``;
on a CPU with AMX, name the instruction sets without AMX instead, as docs/benchmarks.md shows).

Every measurement runs in a fresh subprocess, alternating reprolm and llama.cpp (A B A B ...)
for ``--rounds`` rounds after one warm-up round, at each thread count. Both decode greedily
(argmax of the logits) so the work is the same:

- prefill: a 512-token prompt, logits for the last position only;
- decode: 128 single-token steps after an 8-token prompt (end-of-sequence ignored);
- first token: from the start of loading to the first token of a 64-token prompt (load,
  prefill, argmax), measured first in the worker;
- ttft: time to first token for a 64-token prompt (prefill plus the argmax), model warm;
- load: constructing the model from the file;
- peak_rss: the worker process's peak resident memory after all of the above (MiB).

The model file is read from the page cache (the warm-up round reads it): load times are warm
for both engines.

Beside the engines, each round measures the memory-read roofline at each thread count:
``read GB/s``, the bandwidth a plain read loop reaches on this machine (every thread sums its
own part of a buffer far larger than the last-level cache, in its own worker process), and
``bytes/token``, the weight bytes one decoded token reads as each engine holds them (reprolm:
its packed or mapped matrices; llama.cpp: the file's tensors, the embedding matrix but one row
unless it is also the output). ``roofline tok/s`` is their quotient, and ``decode % roof`` the
decode speed as a percentage of it.

Prints the median of each, and the median of the per-round ratios reprolm / llama.cpp
(speeds: higher is better for reprolm; load and RSS: lower is better for reprolm).
``--precision int8`` runs reprolm with int8 activations (the default is float32).

``--baseline DIR`` adds another build of reprolm to the same rounds (A B C ...): DIR holds its
``reprolm`` package (with its ``_core`` extension), imported through ``PYTHONPATH``. Its
column is "baseline", and "vs base" is the median per-round ratio reprolm / baseline: an A/B of
two commits in one run. ``--no-llamacpp`` leaves llama.cpp out (no llama-cpp-python needed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from _machine import machine
from _record import write as write_record

PREFILL_TOKENS = 512
DECODE_TOKENS = 128
TTFT_TOKENS = 64
# The read loop's buffer: far larger than any last-level cache.
READ_BYTES = 1 << 30


def prompt_ids(n: int, vocab: int) -> list[int]:
    """A deterministic prompt of ordinary tokens (ids 100..)."""
    return [100 + (i * 7919) % (vocab - 200) for i in range(n)]


def run_reprolm(model_path: str, threads: int, precision: str) -> dict[str, float]:
    import numpy as np

    import reprolm

    t0 = time.perf_counter()
    model = reprolm.Model.load(model_path, threads=threads, precision=precision)
    load = time.perf_counter() - t0
    vocab = model.config.vocab_size
    session = model.session(context_length=1024)
    int(np.argmax(session.prefill(prompt_ids(TTFT_TOKENS, vocab))))
    first_token = time.perf_counter() - t0

    session = model.session(context_length=1024)
    t0 = time.perf_counter()
    session.prefill(prompt_ids(PREFILL_TOKENS, vocab))
    prefill = time.perf_counter() - t0

    session = model.session(context_length=1024)
    logits = session.prefill(prompt_ids(8, vocab))
    t0 = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        logits = session.step(int(np.argmax(logits)))
    decode = time.perf_counter() - t0

    session = model.session(context_length=1024)
    t0 = time.perf_counter()
    int(np.argmax(session.prefill(prompt_ids(TTFT_TOKENS, vocab))))
    ttft = time.perf_counter() - t0
    return {"load": load, "first_token": first_token, "prefill": prefill, "decode": decode, "ttft": ttft,
            # An older build (--baseline) may not tell, or hold its loaded model as `_engine`.
            "bytes_per_token": getattr(getattr(model, "_loaded", None) or getattr(model, "_engine", None),
                                       "weight_bytes_per_token", float("nan"))}


def run_llamacpp(model_path: str, threads: int, precision: str) -> dict[str, float]:
    import llama_cpp
    import numpy as np

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False)
    load = time.perf_counter() - t0
    vocab = llm.n_vocab()
    llm.eval(prompt_ids(TTFT_TOKENS, vocab))
    int(np.argmax(llm.scores[llm.n_tokens - 1]))
    first_token = time.perf_counter() - t0

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids(PREFILL_TOKENS, vocab))
    prefill = time.perf_counter() - t0

    llm.reset()
    llm.eval(prompt_ids(8, vocab))
    t0 = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([token])
    decode = time.perf_counter() - t0

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids(TTFT_TOKENS, vocab))
    int(np.argmax(llm.scores[llm.n_tokens - 1]))
    ttft = time.perf_counter() - t0
    return {"load": load, "first_token": first_token, "prefill": prefill, "decode": decode, "ttft": ttft,
            "bytes_per_token": llamacpp_bytes_per_token(model_path)}


def llamacpp_bytes_per_token(model_path: str) -> int:
    """Weight bytes llama.cpp reads per decoded token: every tensor of the file as stored, the
    embedding matrix but one row unless it is also the output matrix (tied)."""
    from reprolm._gguf import inspect

    tensors = {t.name: t for t in inspect(model_path).tensors}
    total = sum(t.n_bytes for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    if embd is not None and "output.weight" in tensors:
        rows = embd.shape[1] if len(embd.shape) > 1 else 1
        total -= embd.n_bytes - embd.n_bytes // rows
    return total


def run_read_loop(model_path: str, threads: int, precision: str) -> dict[str, float]:
    """The bandwidth of a plain read loop on `threads` threads: each sums its own part of a
    READ_BYTES buffer (numpy releases the GIL in the sum); the best of 5 passes."""
    import threading

    import numpy as np

    buffer = np.ones(READ_BYTES // 8, dtype=np.int64)  # [READ_BYTES / 8], every page touched
    parts = np.array_split(buffer, threads)
    best = float("inf")
    for _ in range(5):
        barrier = threading.Barrier(threads + 1)
        sums = [0] * threads

        def read(i: int) -> None:
            barrier.wait()
            sums[i] = int(parts[i].sum())

        workers = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        barrier.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
        assert sum(sums) == buffer.size
    return {"read_gbps": READ_BYTES / best / 1e9}


ENGINES: dict[str, Callable[[str, int, str], dict[str, float]]] = {
    "reprolm": run_reprolm,
    "baseline": run_reprolm,  # another build, from --baseline's directory
    "llama.cpp": run_llamacpp,
    "read loop": run_read_loop,
}


def worker(engine: str, model_path: str, threads: int, precision: str) -> None:
    result: dict[str, Any] = ENGINES[engine](model_path, threads, precision)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(engine: str, model_path: str, threads: int, precision: str, baseline: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if engine == "baseline":
        env["PYTHONPATH"] = os.pathsep.join(p for p in [baseline, env.get("PYTHONPATH")] if p)
    out = subprocess.run(
        [sys.executable, __file__, "--worker", engine, "--model", model_path, "--threads", str(threads),
         "--precision", precision],
        check=True, capture_output=True, text=True, env=env,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if engine == "read loop":
        return {"read GB/s": r["read_gbps"]}
    return {
        "prefill tok/s": PREFILL_TOKENS / r["prefill"],
        "decode tok/s": DECODE_TOKENS / r["decode"],
        "ttft ms": 1000 * r["ttft"],
        "load ms": 1000 * r["load"],
        "1st token ms": 1000 * r["first_token"],
        "peak RSS MiB": r["peak_rss"],
        "MB/token": r["bytes_per_token"] / 1e6,
    }


def add_roofline(rounds: list[dict[str, float]], read_gbps: list[float]) -> None:
    """Adds each round's roofline (tok/s the read loop's bandwidth allows at the engine's
    bytes per token) and decode speed as a percentage of it, with the same round's bandwidth."""
    for r, gbps in zip(rounds, read_gbps):
        r["roofline tok/s"] = gbps * 1e3 / r["MB/token"]
        r["decode % roof"] = 100 * r["decode tok/s"] / r["roofline tok/s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file or known model name (default: reprolm's default model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--precision", choices=["float32", "int8"], default="float32", help="reprolm's precision")
    parser.add_argument("--baseline", metavar="DIR", help="another reprolm build to compare with (see above)")
    parser.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--worker", choices=list(ENGINES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None or not os.path.exists(args.model):
        import reprolm

        args.model = str(reprolm.model_path(args.model) if args.model else reprolm.default_model_path())
    if args.worker:
        worker(args.worker, args.model, args.threads[0], args.precision)
        return
    engines = ["reprolm"] + ["baseline"] * bool(args.baseline) + ["llama.cpp"] * (not args.no_llamacpp)
    if "llama.cpp" in engines:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python "
                     "(builds llama.cpp; CMAKE_ARGS=-DGGML_NATIVE=ON for this CPU), or pass --no-llamacpp")
    print(f"model: {args.model}; {machine()}, {os.cpu_count()} CPUs; {args.rounds} rounds after a warm-up, {' '.join(engines)}"
          f" alternating; reprolm precision {args.precision}")
    by_threads: list[dict[str, Any]] = []
    for threads in args.threads:
        results: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
        read_gbps: list[float] = []
        for round_ in range(args.rounds + 1):
            for engine in engines:
                r = measure(engine, args.model, threads, args.precision, args.baseline)
                if round_ > 0:
                    results[engine].append(r)
            if round_ > 0:
                read_gbps.append(measure("read loop", args.model, threads, args.precision, None)["read GB/s"])
        for engine in engines:
            add_roofline(results[engine], read_gbps)
        print(f"\nthreads = {threads}: read loop {statistics.median(read_gbps):.2f} GB/s "
              f"(rounds: {' '.join(f'{g:.2f}' for g in read_gbps)})")
        others = engines[1:]
        print(f"  {'metric':<14}" + "".join(f" {e:>10}" for e in engines)
              + "".join(f" {'vs ' + ('base' if e == 'baseline' else e):>12}" for e in others))
        medians: dict[str, dict[str, float]] = {e: {} for e in engines}
        ratios: dict[str, dict[str, float]] = {e: {} for e in others}
        for metric in results["reprolm"][0]:
            line = f"  {metric:<14}"
            for e in engines:
                medians[e][metric] = statistics.median(r[metric] for r in results[e])
                line += f" {medians[e][metric]:>10.1f}"
            a = [r[metric] for r in results["reprolm"]]
            for e in others:
                b = [r[metric] for r in results[e]]
                ratios[e][metric] = statistics.median(x / y for x, y in zip(a, b))
                line += f" {ratios[e][metric]:>11.3f}x"
            print(line)
        by_threads.append({"threads": threads, "read_gbps": statistics.median(read_gbps), "medians": medians,
                           "reprolm_over": ratios})
    write_record("compare_llamacpp", {"precision": args.precision, "rounds": args.rounds,
                                      "model_bytes": os.path.getsize(args.model), "by_threads": by_threads},
                 model=os.path.basename(args.model))


if __name__ == "__main__":
    main()
