"""Aggregate throughput of reprolm's batch engine against llama.cpp's batched decoding.

    python benches/batch_throughput.py [--model PATH] [--threads 2] [--concurrency 1 4 16 64]
                                       [--precision float32 int8] [--kv-dtype f32 f16] [--rounds 1]
                                       [--new-tokens 128] [--llamacpp-batched-bench PATH]

For each concurrency N, N requests with different 128-token prompts are submitted at once
and each generates 128 tokens (``--new-tokens``; the end-of-sequence token is banned, so every request runs to
its length), greedy and sampled (temperature 0.8, top-p 0.95, a seed per request). Reported:

- total tok/s: N x 128 generated tokens over the wall time from submission to the last token
  (prompt processing included);
- decode tok/s: tokens generated after every request had its first token, over that window
  (pure batched decoding, comparable to llama-batched-bench's S_TG);
- TTFT p50 / p99 (ms) over the requests, and inter-token latency p50 / p99 (ms) over every
  gap between consecutive tokens of a request.

llama.cpp: ``llama-batched-bench`` (``--llamacpp-batched-bench PATH``; by default looked for in
``~/.cache/llamacpp-tools/build/bin`` and ``~/.cache/llamacpp-tools/bin``, where
``scripts/llamacpp-tools.sh`` builds it) on the same file in the same run, before
reprolm, with ``-npp 128 -ntg 128 -npl N`` (the same token counts) and the same thread count: its S_TG (batched decode of N
sequences, tokens/s) and S (prompt processing and decoding together, all tokens/s) per N. It
decodes without sampling, so compare its S_TG with reprolm's decode tok/s. Its KV cache is
f16 (llama.cpp's default); reprolm's is f32 unless ``--kv-dtype f16`` (each listed type is
measured with each precision). Its command and table are printed and kept in the record.

Each reprolm measurement runs after a warm-up run at the same concurrency, in the same process
(one model per precision). With ``--rounds R`` every concurrency is measured R times, the
rounds going through all concurrencies in turn (so a slow period of a shared machine falls on
all of them, the single sequence included), and each column is the median of its R values.
Name the CPU with the numbers: the script prints it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from _machine import machine
from _record import write as write_record

PROMPT_TOKENS = 128
NEW_TOKENS = 128  # the default of --new-tokens


def prompts(n: int, vocab: int) -> list[list[int]]:
    """n different deterministic prompts of ordinary tokens."""
    return [[100 + (i * 7919 + j * 104729) % (vocab - 200) for j in range(PROMPT_TOKENS)] for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_reprolm(model: "reprolm.Model", n: int, sampled: bool, new_tokens: int) -> dict[str, float]:
    import reprolm

    eos = model.config.eos_id
    banned = [eos] if eos is not None else []
    times: list[list[float]] = [[] for _ in range(n)]
    submitted: list[float] = [0.0] * n

    def read(i: int, request: reprolm.Request) -> None:
        for _ in request:
            times[i].append(time.perf_counter())

    readers = []
    start = time.perf_counter()
    for i, ids in enumerate(prompts(n, model.config.vocab_size)):
        sampler = (reprolm.Sampler(temperature=0.8, top_p=0.95, seed=i, banned_token_ids=banned) if sampled
                   else reprolm.Sampler(temperature=0.0, banned_token_ids=banned))
        submitted[i] = time.perf_counter()
        request = model.submit(ids, max_tokens=new_tokens, sampler=sampler)
        reader = threading.Thread(target=read, args=(i, request))
        reader.start()
        readers.append(reader)
    for reader in readers:
        reader.join()
    end = max(t[-1] for t in times)
    assert all(len(t) == new_tokens for t in times)
    all_started = max(t[0] for t in times)
    after = sum(1 for t in times for x in t if x > all_started)
    gaps = [b - a for t in times for a, b in zip(t, t[1:])]
    ttft = [t[0] - s for t, s in zip(times, submitted)]
    return {
        "total": n * new_tokens / (end - start),
        "decode": after / (end - all_started) if end > all_started else float("nan"),
        "ttft50": percentile(ttft, 0.5) * 1e3,
        "ttft99": percentile(ttft, 0.99) * 1e3,
        "itl50": percentile(gaps, 0.5) * 1e3 if gaps else float("nan"),
        "itl99": percentile(gaps, 0.99) * 1e3 if gaps else float("nan"),
    }


def batched_bench_binary(explicit: Optional[str]) -> Optional[Path]:
    """The ``llama-batched-bench`` to run: ``explicit``, else the first one found where
    ``scripts/llamacpp-tools.sh`` puts it."""
    if explicit:
        return Path(explicit).expanduser()
    tools = Path.home() / ".cache" / "llamacpp-tools"
    found = [p for p in (tools / "build" / "bin" / "llama-batched-bench", tools / "bin" / "llama-batched-bench")
             if p.is_file()]
    return found[0] if found else None


def run_llamacpp(exe: Path, model_path: str, threads: int, concurrency: Sequence[int],
                 new_tokens: int) -> tuple[dict[int, dict[str, float]], list[str], str]:
    """llama-batched-bench's S_PP, S_TG and S per N, its command line and its printed table."""
    ctx = max(concurrency) * (PROMPT_TOKENS + new_tokens) + 64
    cmd = [str(exe), "-m", model_path, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(PROMPT_TOKENS),
           "-ntg", str(new_tokens), "-npl", ",".join(map(str, concurrency)), "-t", str(threads), "-tb", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows: dict[int, dict[str, float]] = {}
    table = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|"):
            table.append(line.rstrip())
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[0]):
            pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
            if pp == PROMPT_TOKENS and tg == new_tokens:
                rows[b] = {"s_pp": float(cells[5]), "s_tg": float(cells[7]), "s": float(cells[9])}
    missing = [n for n in concurrency if n not in rows]
    if missing:
        raise SystemExit(f"no row for N={missing} in the output of {' '.join(cmd)}:\n{out}")
    return rows, cmd, "\n".join(table)


def main() -> None:
    import reprolm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--precision", nargs="+", default=["float32", "int8"])
    parser.add_argument("--kv-dtype", nargs="+", default=["f32"], choices=["f32", "f16"])
    parser.add_argument("--rounds", type=int, default=1, help="measurements per concurrency (medians reported)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens generated per request")
    parser.add_argument("--llamacpp-batched-bench", metavar="PATH", default=None,
                        help="llama.cpp's llama-batched-bench (default: looked for in ~/.cache/llamacpp-tools)")
    parser.add_argument("--llamacpp-bin", metavar="DIR", default=None,
                        help="a directory holding llama-batched-bench (the older spelling of the option above)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.new_tokens < 2:
        parser.error("--new-tokens: at least 2")
    model_path = args.model or str(reprolm.default_model_path())
    print(f"{machine()}, {os.cpu_count()} cores; {args.threads} threads; {Path(model_path).name}; "
          f"{PROMPT_TOKENS}-token prompts, {args.new_tokens} new tokens each")

    llama: Optional[dict[int, dict[str, float]]] = None
    llama_cmd: Optional[list[str]] = None
    llama_table: Optional[str] = None
    exe = batched_bench_binary(args.llamacpp_batched_bench
                               or (str(Path(args.llamacpp_bin) / "llama-batched-bench") if args.llamacpp_bin else None))
    if exe is not None and exe.is_file():
        llama, llama_cmd, llama_table = run_llamacpp(exe, model_path, args.threads, args.concurrency, args.new_tokens)
        print(f"\nllama.cpp: {' '.join(llama_cmd)}\n{llama_table}")
    else:
        print(f"(no llama-batched-bench{f' at {exe}' if exe else ''}: llama.cpp columns left out)")

    configurations: list[dict[str, object]] = []
    for precision, kv_dtype in [(p, k) for p in args.precision for k in args.kv_dtype]:
        model = reprolm.Model.load(model_path, threads=args.threads, precision=precision,
                                   max_concurrent=max(args.concurrency), kv_dtype=kv_dtype)
        print(f"\nreprolm precision={precision} kv_dtype={kv_dtype}"
              + (f" (medians of {args.rounds} rounds)" if args.rounds > 1 else ""))
        print("  N  sampler   total tok/s  decode tok/s  x single  ttft p50/p99 ms   itl p50/p99 ms"
              + ("   llama.cpp S_TG    S   decode ratio" if llama else ""))
        cases = [(n, sampled) for n in args.concurrency for sampled in (False, True)]
        runs: dict[tuple[int, bool], list[dict[str, float]]] = {case: [] for case in cases}
        for round_ in range(args.rounds):
            for n, sampled in cases:
                if round_ == 0:
                    run_reprolm(model, n, sampled, args.new_tokens)  # warm-up
                runs[(n, sampled)].append(run_reprolm(model, n, sampled, args.new_tokens))
        median = {case: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for case, rs in runs.items()}
        single = median[(1, False)]["decode"] if (1, False) in median else None
        rows: list[dict[str, object]] = []
        for n, sampled in cases:
            r = median[(n, sampled)]
            rows.append({"n": n, "sampler": "sampled" if sampled else "greedy", **r,
                         "x_single": r["decode"] / single if single else None,
                         "llamacpp": llama.get(n) if llama else None,
                         "llamacpp_decode_ratio": r["decode"] / llama[n]["s_tg"] if llama and n in llama else None})
            line = (f"{n:3d}  {'sampled' if sampled else 'greedy ':8s} {r['total']:11.1f}  {r['decode']:12.1f}"
                    f"  {r['decode'] / single if single else float('nan'):7.2f}x"
                    f"  {r['ttft50']:7.1f}/{r['ttft99']:<7.1f}  {r['itl50']:6.2f}/{r['itl99']:<6.2f}")
            if llama and n in llama:
                lr = llama[n]
                line += f"   {lr['s_tg']:13.1f} {lr['s']:6.1f}   {r['decode'] / lr['s_tg']:5.2f}x"
            print(line, flush=True)
        configurations.append({"precision": precision, "kv_dtype": kv_dtype, "rows": rows})
    write_record("batch_throughput", {"threads": args.threads, "rounds": args.rounds, "prompt_tokens": PROMPT_TOKENS,
                                      "new_tokens": args.new_tokens, "configurations": configurations,
                                      "llamacpp_command": llama_cmd, "llamacpp_table": llama_table},
                 model=Path(model_path).name)


if __name__ == "__main__":
    main()
