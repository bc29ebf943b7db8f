"""Serving throughput and latency: ``reprolm serve`` beside llama.cpp's ``llama-server``.

    python benches/server_throughput.py [--model PATH] [--threads 2] [--concurrency 1 8 32]
                                        [--max-tokens 64] [--requests-per-client 4]
                                        [--llama-server PATH | --no-llama]

For each concurrency C, C client threads each send requests one after another (R x C
requests in all with R = --requests-per-client, at least 8) to ``POST /v1/completions`` with ``stream: true``, over the same
prompts (16 texts of 10 to 60 tokens, cycled) and the same sampling (temperature 0.8, top-p
0.95, seed = request number), generating ``--max-tokens`` tokens each (the end-of-sequence
token is banned, so every request runs to its length). Reported per server and C:

- req/s and output tok/s: requests and generated tokens over the wall time of the run;
- TTFT p50 / p99 (ms): from sending a request to its first streamed token;
- ITL p50 / p99 (ms): every gap between consecutive streamed tokens of a request.

Each server runs in its own process with the same thread count, on a free loopback port,
after one warm-up request per client thread. reprolm serves every C from one process
(``--max-concurrent`` >= C); llama-server is restarted for each C with ``-np C`` (one slot
per client) and ``-c`` = C x 512. llama-server is used when its binary exists (default
``~/.cache/llamacpp-tools/bin/llama-server``); the GGUF file is the same
(``reprolm.default_model_path()`` unless ``--model``). Name the CPU with the numbers: the
script prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from _machine import machine
from _record import write as write_record

TEXTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Here is a list of ten things to do on a rainy afternoon:",
    "The history of the printing press begins",
    "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
    "Dear hiring manager, I am writing to apply for the position of",
    "The three laws of thermodynamics state that",
    "Q: Why is the sky blue?\nA:",
    "In the year 2050, cities will",
    "A recipe for a simple tomato soup: first,",
    "The best way to learn a new language is",
    "Chapter 1. The storm had been building over the mountains for three days when the",
    "Photosynthesis is the process by which",
    "The main differences between TCP and UDP are",
    "My favourite book is",
    "Summary of the meeting: the team agreed that the next release should focus on performance, and that",
]
EOS_ID = 2  # SmolLM2's <|im_end|>; --eos-id for other models


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


@dataclass
class Timing:
    sent: float
    tokens: list[float] = field(default_factory=list)
    finish_reason: Optional[str] = None


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, extra: dict[str, Any]) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.extra = extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: {' '.join(cmd)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def one_request(http: httpx.Client, server: Server, model: str, i: int, max_tokens: int) -> Timing:
    body = {"model": model, "prompt": TEXTS[i % len(TEXTS)], "max_tokens": max_tokens, "stream": True,
            "temperature": 0.8, "top_p": 0.95, "seed": i, "logit_bias": {str(EOS_ID): -100}, **server.extra}
    timing = Timing(time.perf_counter())
    with http.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.name}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices", []):
                if choice.get("text"):
                    timing.tokens.append(time.perf_counter())
                if choice.get("finish_reason"):
                    timing.finish_reason = choice["finish_reason"]
    return timing


def run(server: Server, model: str, concurrency: int, max_tokens: int, per_client: int) -> dict[str, float]:
    total = max(8, per_client * concurrency)
    counter = iter(range(total))
    lock = threading.Lock()
    timings: list[Timing] = []
    errors: list[BaseException] = []

    def client(warm: bool) -> None:
        # a new connection per request: llama-server may close idle keep-alive connections
        with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as http:
            if warm:
                one_request(http, server, model, 10_000, 8)
                return
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                try:
                    t = one_request(http, server, model, i, max_tokens)
                except BaseException as e:  # reported after the run
                    errors.append(e)
                    return
                with lock:
                    timings.append(t)

    for warm in (True, False):
        threads = [threading.Thread(target=client, args=(warm,)) for _ in range(concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{server.name}: {len(errors)} requests failed: {errors[0]}")
    tokens = sum(max_tokens if t.finish_reason == "length" else len(t.tokens) for t in timings)
    ttft = [(t.tokens[0] - t.sent) * 1000 for t in timings if t.tokens]
    itl = [(b - a) * 1000 for t in timings for a, b in zip(t.tokens, t.tokens[1:])]
    return {"req/s": len(timings) / wall, "tok/s": tokens / wall, "ttft50": percentile(ttft, 0.5),
            "ttft99": percentile(ttft, 0.99), "itl50": percentile(itl, 0.5), "itl99": percentile(itl, 0.99),
            "short": sum(t.finish_reason != "length" for t in timings)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--precision", default="float32")
    p.add_argument("--llama-server", type=Path,
                   default=Path.home() / ".cache" / "llamacpp-tools" / "bin" / "llama-server")
    p.add_argument("--no-llama", action="store_true", help="measure reprolm only")
    args = p.parse_args()

    if args.model is None:
        import reprolm
        args.model = reprolm.default_model_path()
    model_id = args.model.name.removesuffix(".gguf")
    use_llama = not args.no_llama and args.llama_server.is_file() and os.access(args.llama_server, os.X_OK)
    print(f"{machine()}, {os.cpu_count()} cores; {args.model.name}; {args.threads} threads; "
          f"{args.max_tokens} tokens per request, streamed; concurrency {args.concurrency}")
    if not use_llama:
        print(f"(llama-server not found at {args.llama_server}: reprolm only)")

    results: dict[str, dict[int, dict[str, float]]] = {"reprolm": {}, "llama-server": {}}
    port = free_port()
    reprolm_server = Server("reprolm", [sys.executable, "-m", "reprolm", "serve", "-m", str(args.model), "--port",
                                        str(port), "-t", str(args.threads), "--precision", args.precision,
                                        "--max-concurrent", str(max(64, max(args.concurrency))),
                                        "--grace-period", "1"], port, {})
    try:
        for c in args.concurrency:
            results["reprolm"][c] = run(reprolm_server, model_id, c, args.max_tokens, args.requests_per_client)
            print(f"  reprolm      C={c:<3} {fmt(results['reprolm'][c])}", flush=True)
    finally:
        reprolm_server.stop()
    if use_llama:
        for c in args.concurrency:
            port = free_port()
            llama = Server("llama-server", [str(args.llama_server), "-m", str(args.model), "--host", "127.0.0.1",
                                            "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
                                            "-np", str(c), "-c", str(512 * c), "--no-webui"],
                           port, {"ignore_eos": True})
            try:
                results["llama-server"][c] = run(llama, model_id, c, args.max_tokens, args.requests_per_client)
                print(f"  llama-server C={c:<3} {fmt(results['llama-server'][c])}", flush=True)
            finally:
                llama.stop()

    print()
    print(f"  {'server':<13}{'C':>4} {'req/s':>8} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8}")
    for name, by_c in results.items():
        for c, r in by_c.items():
            print(f"  {name:<13}{c:>4} {fmt(r)}")
    if use_llama:
        print()
        for c in args.concurrency:
            a, b = results["reprolm"].get(c), results["llama-server"].get(c)
            if a and b:
                print(f"  C={c:<3} reprolm / llama-server: tok/s {a['tok/s'] / b['tok/s']:.2f}x, "
                      f"ITL p99 {a['itl99'] / b['itl99']:.2f}x, TTFT p50 {a['ttft50'] / b['ttft50']:.2f}x")
    write_record("server_throughput", {
        "threads": args.threads, "max_tokens": args.max_tokens, "precision": args.precision,
        "servers": {name: [{"concurrency": c, **r} for c, r in by_c.items()] for name, by_c in results.items() if by_c},
        "reprolm_over_llama_server": [
            {"concurrency": c, "tok/s": a["tok/s"] / b["tok/s"], "itl99": a["itl99"] / b["itl99"],
             "ttft50": a["ttft50"] / b["ttft50"]}
            for c in args.concurrency
            for a, b in [(results["reprolm"].get(c), results["llama-server"].get(c))] if a and b],
    }, model=args.model.name)
    return 0


def fmt(r: dict[str, float]) -> str:
    short = f"  ({int(r['short'])} ended early)" if r["short"] else ""
    return (f"{r['req/s']:8.2f} {r['tok/s']:8.1f} {r['ttft50']:8.1f}ms {r['ttft99']:6.1f}ms {r['itl50']:6.1f}ms "
            f"{r['itl99']:6.1f}ms{short}")


if __name__ == "__main__":
    sys.exit(main())
