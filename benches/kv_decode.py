"""Decode speed against context position, f32 and f16 KV cache.

For each cache type, one session (context 8192) is prefilled to each position P in turn;
at P it decodes ``--steps`` single tokens (after one warm-up), records the median time per
token, then truncates back to P and prefills on to the next position. The attention part
of a step grows linearly with P (docs/theory.md, "The KV cache": 2 t d multiplications per layer at
position t), so ms/token should be an affine function of P.

The same token ids run through llama-cpp-python (which has to be importable by the
interpreter given with ``--llama-cpp-python``), with its cache in the same type:

    .venv/bin/python benches/kv_decode.py --threads 1 --llama-cpp-python /path/to/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from _record import write as write_record

POSITIONS = [128, 1024, 4096, 8000]
CONTEXT = 8192
TEXT = (
    "The key and value vectors of every processed position stay in the cache, so each new "
    "token costs one row of every projection and one pass over the cached keys and values. "
    "Ring buffers, attention sinks and careful numerics make long contexts predictable. "
)


def token_ids(tokenize: Callable[[str], list[int]]) -> list[int]:
    one = tokenize(TEXT)
    ids = (one * (POSITIONS[-1] // len(one) + 2))[: POSITIONS[-1] + 64]
    return ids


CLOCK: Callable[[], float] = time.perf_counter


def measure(prefill: Callable[[list[int]], None], step: Callable[[int], None], rewind: Callable[[int], None],
            ids: list[int], steps: int) -> list[dict[str, float]]:
    rows = []
    done = 0
    for p in POSITIONS:
        for i in range(done, p, 512):
            prefill(ids[i : min(i + 512, p)])
        done = p
        times = []
        for k in range(steps + 1):
            start = CLOCK()
            step(ids[p + k])
            times.append(CLOCK() - start)
        rewind(p)
        ms = statistics.median(times[1:]) * 1e3
        rows.append({"position": p, "ms_per_token": ms, "tokens_per_s": 1e3 / ms})
    return rows


def run_reprolm(model_path: Path, threads: int, steps: int) -> dict[str, Any]:
    import reprolm

    model = reprolm.Model.load(model_path, threads=threads)
    ids = token_ids(model.tokenize)
    out: dict[str, Any] = {"engine": f"reprolm {reprolm.__version__} ({model.isa})", "threads": threads,
                           "clock": CLOCK.__name__}
    for kv in ("f32", "f16"):
        s = model.session(context_length=CONTEXT, kv_dtype=kv)  # type: ignore[arg-type]
        out[kv] = measure(s.prefill, s.step, s.truncate, ids, steps)
    return out


def run_llama_cpp(model_path: Path, threads: int, steps: int) -> dict[str, Any]:
    import llama_cpp

    out: dict[str, Any] = {"engine": f"llama-cpp-python {llama_cpp.__version__}", "threads": threads,
                           "clock": CLOCK.__name__}
    for kv, ggml_type in (("f32", 0), ("f16", 1)):
        llm = llama_cpp.Llama(str(model_path), n_ctx=CONTEXT, n_batch=512, n_threads=threads,
                              n_threads_batch=threads, type_k=ggml_type, type_v=ggml_type, verbose=False)
        ids = token_ids(lambda t: llm.tokenize(t.encode(), add_bos=False, special=False))

        def rewind(p: int) -> None:
            llm.n_tokens = p  # eval() drops cached positions from n_tokens on

        out[kv] = measure(llm.eval, lambda t: llm.eval([t]), rewind, ids, steps)
        del llm
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['engine']}, {result['threads']} thread(s), clock {result['clock']}",
             "position | f32 tok/s (ms) | f16 tok/s (ms)", "---|---|---"]
    for a, b in zip(result["f32"], result["f16"]):
        lines.append(f"{a['position']} | {a['tokens_per_s']:.1f} ({a['ms_per_token']:.1f}) | "
                     f"{b['tokens_per_s']:.1f} ({b['ms_per_token']:.1f})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: reprolm's default model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per position")
    ap.add_argument("--engine", choices=["reprolm", "llama-cpp"], default="reprolm")
    ap.add_argument("--llama-cpp-python", metavar="PYTHON", help="also run llama-cpp-python with this interpreter")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the process's CPU time, which a busy machine does not inflate "
                         "(meaningful with --threads 1 only)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    model_path = args.model
    if model_path is None:
        import reprolm

        model_path = reprolm.default_model_path()
    run = run_reprolm if args.engine == "reprolm" else run_llama_cpp
    result = run(model_path, args.threads, args.steps)
    if args.json:
        print(json.dumps(result))
        return
    print(table(result))
    engines = [result]
    if args.llama_cpp_python:
        cmd = [args.llama_cpp_python, __file__, "--engine", "llama-cpp", "--json", "--model", str(model_path),
               "--threads", str(args.threads), "--steps", str(args.steps), "--clock", args.clock]
        other = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print()
        print(table(other))
        engines.append(other)
    write_record("kv_decode", {"threads": args.threads, "steps": args.steps, "clock": args.clock, "engines": engines},
                 model=Path(model_path).name)


if __name__ == "__main__":
    sys.exit(main())
