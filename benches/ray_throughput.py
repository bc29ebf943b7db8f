"""Rows per second of batch generation over Ray Data (reprolm.ray) against a plain local loop.

    python benches/ray_throughput.py [--rows 128] [--max-tokens 32] [--batch-size 32]
                                     [--model default|PATH]

Every row is a different prompt (about 20 tokens) generating exactly ``--max-tokens`` tokens
(the end-of-sequence token is banned), sampled at temperature 0.8, top-p 0.95 with a seed
derived from the row id. Measured, each once, wall time from the start to the last row:

- local loop: ``model.generate(prompt)`` for one row after another, 1 thread;
- local batch: every row submitted at once to one model's batch engine, 1 thread;
- ray N x T: ``reprolm.ray.generate`` on a local Ray instance with N actors of T threads
  (T CPUs reserved each), batches of ``--batch-size`` rows; the time includes starting the
  actors and loading the model in each (as a real job pays it once).

Every configuration must give the same rows, bit for bit: the script checks it. Name the CPU
with the numbers: the script prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import ray
import ray.data

import reprolm
import reprolm.ray as rray

from _machine import machine
from _record import write as write_record


WORDS = ["river", "number", "castle", "theorem", "bread", "orbit", "violin", "glacier", "market", "engine"]


def rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "prompt": f"Write one sentence about a {WORDS[i % 10]}, a {WORDS[(i * 3 + 1) % 10]} "
                                f"and the number {i}. Sentence {i}:"} for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="default")
    args = parser.parse_args()

    data = rows(args.rows)
    probe = rray.Predictor(args.model, threads=1, max_tokens=0)
    eos = probe.model.config.eos_id
    base = reprolm.Sampler(temperature=0.8, top_p=0.95, banned_token_ids=[] if eos is None else [eos], seed=1)
    n_prompt = sum(len(probe.model.tokenize(r["prompt"])) for r in data) / len(data)
    print(f"CPU: {machine()}")
    print(f"{args.rows} rows, prompts of {n_prompt:.1f} tokens on average, {args.max_tokens} generated tokens each, "
          f"batch size {args.batch_size} (Ray)")
    print(f"  {'configuration':<24} {'seconds':>8} {'rows/s':>8} {'tok/s':>8}")

    results: dict[str, dict[int, list[int]]] = {}
    measured: list[dict[str, Any]] = []

    def report(name: str, seconds: float, out: dict[int, list[int]]) -> None:
        results[name] = out
        measured.append({"configuration": name, "seconds": seconds, "rows_per_s": args.rows / seconds,
                         "tokens_per_s": args.rows * args.max_tokens / seconds})
        print(f"  {name:<24} {seconds:8.2f} {args.rows / seconds:8.2f} {args.rows * args.max_tokens / seconds:8.1f}",
              flush=True)

    model_file = probe.model.path.name
    model = reprolm.Model.load(probe.model.path, threads=1)
    # The seeds reprolm.ray derives from the row ids (key_column="id").
    samplers = {r["id"]: dataclasses.replace(base, seed=rray.row_seed(base.seed, r["id"])) for r in data}
    start = time.perf_counter()
    out = {r["id"]: model.generate(r["prompt"], max_tokens=args.max_tokens, sampler=samplers[r["id"]]).token_ids
           for r in data}
    report("local loop 1 thread", time.perf_counter() - start, out)

    start = time.perf_counter()
    requests = {r["id"]: model.submit(r["prompt"], max_tokens=args.max_tokens, sampler=samplers[r["id"]]) for r in data}
    out = {i: req.result().token_ids for i, req in requests.items()}
    report("local batch 1 thread", time.perf_counter() - start, out)
    del model, probe

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        for actors, threads in [(1, 1), (2, 1), (1, 2)]:
            start = time.perf_counter()
            done = rray.generate(ray.data.from_items(data), model=args.model, actors=actors, threads=threads,
                                 batch_size=args.batch_size, max_tokens=args.max_tokens, sampler=base,
                                 key_column="id").take_all()
            out = {r["id"]: list(r["token_ids"]) for r in done}
            report(f"ray {actors} actor{'s' if actors > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}",
                   time.perf_counter() - start, out)
    finally:
        ray.shutdown()
    first = next(iter(results.values()))
    same = all(r == first for r in results.values())
    print(f"every configuration gave the same tokens: {'yes' if same else 'NO'}")
    write_record("ray_throughput", {"rows": args.rows, "mean_prompt_tokens": n_prompt, "max_tokens": args.max_tokens,
                                    "batch_size": args.batch_size, "configurations": measured,
                                    "same_tokens": same}, model=model_file)
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
