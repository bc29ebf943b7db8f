"""Soak and fault test of ``reprolm serve``: minutes of mixed concurrent traffic with faults.

    python benches/soak.py [--model PATH] [--minutes 10] [--clients 6] [--json out.json]

One real server (a subprocess on a free loopback port, 2 threads, ``--max-concurrent 8
--max-queue 8``) gets rounds of traffic until the time is up. A round is:

- mixed traffic: ``--clients`` threads sending requests from a fixed catalog (completions and
  chats, streamed and not, greedy and seeded sampling, ``n`` > 1, stop strings, JSON grammars
  through ``response_format``) for a few seconds;
- faults, alongside: clients that disconnect mid-stream and before the first byte of the
  answer, a slow reader (pauses between reads), oversized bodies (413), malformed bodies (not
  JSON, not UTF-8, wrong types: 400), and a burst of more requests than ``max_concurrent +
  max_queue`` at once (the excess answered 429);
- a drain check: ``/metrics`` back to 0 running, 0 waiting, 0 sequences in flight and 0 KV
  bytes; the server's RSS, thread count and open file descriptors read from ``/proc/<pid>``.

Checked throughout: no status but the one documented for the request's kind (200; 429 in the
burst; 400 and 413 for bad bodies), so no 5xx at all; every completed answer identical (text
and finish reason of every choice) to the same request sent alone to the idle server before
the load; after the first round, RSS grows by less than ``RSS_SLACK`` and threads and fds not
at all (within a small slack). At the end the server gets SIGTERM with streams in flight:
each must finish whole and identical to its reference, and the process must exit within its
grace period.

:func:`run` is what ``tests/python/test_soak.py`` calls with a one-minute budget.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

MAX_CONCURRENT = 8
MAX_QUEUE = 8
MAX_BODY = 64 * 1024
GRACE = 30
RSS_SLACK = 64 * 1024 * 1024
"""Bytes RSS may grow from the end of the first round to the end of the last."""
THREAD_SLACK = 2
FD_SLACK = 8


def _catalog(model: str) -> list[dict[str, Any]]:
    """The requests of the mixed traffic: (endpoint, body) pairs, each small."""
    chat = "/v1/chat/completions"
    comp = "/v1/completions"
    out: list[dict[str, Any]] = []
    for stream in (False, True):
        out += [
            {"path": comp, "body": {"model": model, "prompt": "The capital of France is", "max_tokens": 12,
                                    "temperature": 0, "stream": stream}},
            {"path": comp, "body": {"model": model, "prompt": "Once upon a time", "max_tokens": 16, "n": 3,
                                    "temperature": 0.9, "top_p": 0.95, "seed": 7, "stream": stream}},
            {"path": comp, "body": {"model": model, "prompt": "1, 2, 3, 4,", "max_tokens": 16, "stop": ["8"],
                                    "temperature": 0, "stream": stream}},
            {"path": chat, "body": {"model": model, "messages": [{"role": "user", "content": "Name a planet."}],
                                    "max_tokens": 12, "temperature": 0, "stream": stream}},
            {"path": chat, "body": {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                                    "max_tokens": 12, "n": 2, "temperature": 1.0, "seed": 11, "stream": stream}},
            {"path": chat, "body": {"model": model,
                                    "messages": [{"role": "user", "content": "A JSON object with a name."}],
                                    "max_tokens": 16, "temperature": 0, "stream": stream,
                                    "response_format": {"type": "json_object"}}},
            {"path": comp, "body": {"model": model, "prompt": "A colour:", "max_tokens": 8, "temperature": 0.7,
                                    "seed": 3, "stream": stream, "response_format": {
                                        "type": "json_schema", "json_schema": {"name": "c", "schema": {
                                            "type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
                                            "required": ["colour"]}}}}},
        ]
    return out


@dataclass
class Stats:
    requests: Counter[str] = field(default_factory=Counter)
    """Requests sent, by kind."""
    statuses: Counter[str] = field(default_factory=Counter)
    """Answers, by kind and status."""
    faults: Counter[str] = field(default_factory=Counter)
    """Faults injected, by kind."""
    compared: int = 0
    """Completed answers compared with their reference."""
    compared_bytes: int = 0
    """Bytes of generated text compared."""
    failures: list[str] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    """Per round: RSS, threads, fds after the drain, and the drain time."""
    shutdown: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail(self, message: str) -> None:
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(message)

    def count(self, counter: str, key: str) -> None:
        with self.lock:
            getattr(self, counter)[key] += 1


class Server:
    """``python -m reprolm serve`` on 127.0.0.1 (a free port); ``stop()`` always ends it."""

    def __init__(self, model_path: Path, log_path: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reprolm", "serve", "-m", str(model_path), "--host", "127.0.0.1",
             "--port", str(self.port), "--threads", "2", "--max-concurrent", str(MAX_CONCURRENT),
             "--max-queue", str(MAX_QUEUE), "--max-body-bytes", str(MAX_BODY), "--grace-period", str(GRACE)],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the server did not become healthy")

    def proc_status(self) -> dict[str, int]:
        """RSS bytes, threads and open file descriptors of the server process."""
        pid = self.proc.pid
        fields = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return {"rss": int(fields["VmRSS"].split()[0]) * 1024, "threads": int(fields["Threads"]),
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=GRACE + 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


# ---- answers ----------------------------------------------------------------------------------


def _choices_of(body: dict[str, Any], data: Any) -> list[tuple[str, Optional[str]]]:
    """(text, finish_reason) of every choice of a non-streamed answer."""
    chat = "messages" in body
    out = sorted(data["choices"], key=lambda c: c["index"])
    return [((c["message"]["content"] if chat else c["text"]), c["finish_reason"]) for c in out]


def _choices_of_stream(body: dict[str, Any], text: str) -> Optional[list[tuple[str, Optional[str]]]]:
    """The same from a server-sent event stream, or None if it did not end with [DONE]."""
    chat = "messages" in body
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return None
    parts: dict[int, list[str]] = {}
    reasons: dict[int, Optional[str]] = {}
    for e in events[:-1]:
        data = json.loads(e)
        for c in data.get("choices", []):
            piece = c["delta"].get("content") if chat else c["text"]
            parts.setdefault(c["index"], []).append(piece or "")
            if c["finish_reason"] is not None:
                reasons[c["index"]] = c["finish_reason"]
    return [("".join(parts[i]), reasons.get(i)) for i in sorted(parts)]


def _send(client: httpx.Client, case: dict[str, Any]) -> tuple[int, Optional[list[tuple[str, Optional[str]]]]]:
    """Status and choices of one request of the catalog (choices None unless 200)."""
    body = case["body"]
    if body.get("stream"):
        with client.stream("POST", case["path"], json=body) as r:
            text = r.read().decode()
            if r.status_code != 200:
                return r.status_code, None
            return 200, _choices_of_stream(body, text)
    r = client.post(case["path"], json=body)
    return r.status_code, (_choices_of(body, r.json()) if r.status_code == 200 else None)


def references(server: Server, catalog: list[dict[str, Any]]) -> list[list[tuple[str, Optional[str]]]]:
    """Every catalog request's answer, each sent alone to the idle server."""
    out = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for case in catalog:
            status, choices = _send(client, case)
            if status != 200 or choices is None:
                raise RuntimeError(f"reference request failed: {status} {case}")
            out.append(choices)
    return out


def _compare(stats: Stats, kind: str, k: int, got: Optional[list[tuple[str, Optional[str]]]],
             refs: list[list[tuple[str, Optional[str]]]]) -> None:
    if got is None:
        stats.fail(f"{kind}: case {k} answered 200 without a complete answer")
        return
    with stats.lock:
        stats.compared += 1
        stats.compared_bytes += sum(len(t.encode()) for t, _ in got)
    if got != refs[k]:
        stats.fail(f"{kind}: case {k} differs from its reference: {got!r} != {refs[k]!r}")


# ---- traffic and faults -----------------------------------------------------------------------


def _mixed(server: Server, catalog: list[dict[str, Any]], refs: list[Any], stats: Stats, until: float,
           seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        while time.monotonic() < until:
            k = rng.randrange(len(catalog))
            stats.count("requests", "mixed")
            try:
                status, choices = _send(client, catalog[k])
            except httpx.HTTPError as e:
                stats.fail(f"mixed: case {k}: {type(e).__name__}: {e}")
                continue
            stats.count("statuses", f"mixed {status}")
            if status == 429:  # the mixed clients may meet a burst's backlog
                continue
            if status != 200:
                stats.fail(f"mixed: case {k} answered {status}")
                continue
            _compare(stats, "mixed", k, choices, refs)


def _raw_request(server: Server, path: str, body: bytes, content_type: str = "application/json") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def _faults(server: Server, catalog: list[dict[str, Any]], refs: list[Any], stats: Stats, seed: int) -> None:
    """One of each fault, in a random order."""
    rng = random.Random(seed)
    streamed = [k for k, c in enumerate(catalog) if c["body"].get("stream")]

    def disconnect_mid_stream() -> None:
        k = rng.choice(streamed)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", catalog[k]["path"], json=catalog[k]["body"]) as r:
                if r.status_code not in (200, 429):
                    stats.fail(f"mid-stream: answered {r.status_code}")
                for _ in r.iter_lines():
                    break  # one event, then the connection closes

    def disconnect_before_first_byte() -> None:
        k = rng.randrange(len(catalog))
        sock = _raw_request(server, catalog[k]["path"], json.dumps(catalog[k]["body"]).encode())
        sock.close()

    def slow_reader() -> None:
        k = rng.choice(streamed)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", catalog[k]["path"], json=catalog[k]["body"]) as r:
                parts = []
                for chunk in r.iter_raw(64):
                    parts.append(chunk)
                    time.sleep(0.05)
                status = r.status_code
        stats.count("statuses", f"slow {status}")
        if status == 200:
            _compare(stats, "slow reader", k, _choices_of_stream(catalog[k]["body"], b"".join(parts).decode()), refs)
        elif status != 429:
            stats.fail(f"slow reader: answered {status}")

    def oversized() -> None:
        body = json.dumps({"model": "m", "prompt": "x" * (MAX_BODY + 1)}).encode()
        r = httpx.post(f"{server.url}/v1/completions", content=body,
                       headers={"content-type": "application/json"}, timeout=30)
        stats.count("statuses", f"oversized {r.status_code}")
        if r.status_code != 413:
            stats.fail(f"oversized: answered {r.status_code}")

    def malformed() -> None:
        bodies = [b"{", b"\xff\xfe{}", b"[1, 2]", json.dumps({"model": 3, "prompt": "x"}).encode(),
                  json.dumps({"model": "m", "prompt": "x", "max_tokens": "many"}).encode(),
                  json.dumps({"model": "m", "messages": [{"role": "wizard"}]}).encode()]
        body = rng.choice(bodies)
        path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize"])
        r = httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"},
                       timeout=30)
        stats.count("statuses", f"malformed {r.status_code}")
        if r.status_code != 400:
            stats.fail(f"malformed: {body!r} to {path} answered {r.status_code}")

    faults: list[tuple[str, Callable[[], None]]] = [
        ("disconnect mid-stream", disconnect_mid_stream), ("disconnect before first byte", disconnect_before_first_byte),
        ("slow reader", slow_reader), ("oversized body", oversized), ("malformed body", malformed)]
    rng.shuffle(faults)
    for name, fault in faults:
        stats.count("faults", name)
        try:
            fault()
        except (httpx.HTTPError, OSError) as e:
            stats.fail(f"{name}: {type(e).__name__}: {e}")


def _burst(server: Server, catalog: list[dict[str, Any]], refs: list[Any], stats: Stats) -> None:
    """More single-choice requests at once than the server runs and queues: the excess is
    answered 429, the rest completes identical to its reference."""
    singles = [k for k, c in enumerate(catalog) if c["body"].get("n", 1) == 1 and not c["body"].get("stream")]
    count = MAX_CONCURRENT + MAX_QUEUE + 8
    stats.count("faults", "burst beyond max-queue")
    results: list[tuple[int, int, Any]] = []
    lock = threading.Lock()
    gate = threading.Barrier(count)

    def one(i: int) -> None:
        k = singles[i % len(singles)]
        with httpx.Client(base_url=server.url, timeout=120) as client:
            gate.wait()
            try:
                status, choices = _send(client, catalog[k])
            except httpx.HTTPError as e:
                stats.fail(f"burst: {type(e).__name__}: {e}")
                return
        with lock:
            results.append((k, status, choices))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, status, choices in results:
        stats.count("requests", "burst")
        stats.count("statuses", f"burst {status}")
        if status == 200:
            _compare(stats, "burst", k, choices, refs)
        elif status != 429:
            stats.fail(f"burst: answered {status}")
    if not any(status == 429 for _, status, _ in results):
        stats.fail("burst: no request was answered 429 beyond max-concurrent + max-queue")


def _drain(server: Server, stats: Stats, timeout: float = 60) -> dict[str, Any]:
    """Waits until the engine is idle; the process's figures then."""
    start = time.monotonic()
    names = ("reprolm_running_sequences", "reprolm_queue_depth", "reprolm_sequences_in_flight",
             "reprolm_kv_cache_bytes")
    while True:
        m = server.metrics()
        if all(m[n] == 0 for n in names):
            break
        if time.monotonic() - start > timeout:
            stats.fail(f"drain: not idle after {timeout} s: {[(n, m[n]) for n in names]}")
            break
        time.sleep(0.1)
    return {**server.proc_status(), "drain_s": round(time.monotonic() - start, 2)}


def _shutdown(server: Server, catalog: list[dict[str, Any]], refs: list[Any], stats: Stats) -> None:
    """SIGTERM with streams in flight: each finishes whole; the process exits in time."""
    streamed = [k for k, c in enumerate(catalog) if c["body"].get("stream")][:4]
    started = threading.Barrier(len(streamed) + 1)
    outcomes: list[Any] = []

    def one(k: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            with client.stream("POST", catalog[k]["path"], json=catalog[k]["body"]) as r:
                lines = r.iter_lines()
                first = next(lines)
                started.wait()
                text = first + "\n" + "\n".join(lines)
                outcomes.append((k, r.status_code, _choices_of_stream(catalog[k]["body"], text)))

    threads = [threading.Thread(target=one, args=(k,)) for k in streamed]
    for t in threads:
        t.start()
    started.wait()
    stats.count("faults", "SIGTERM with streams in flight")
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join()
    try:
        code = server.proc.wait(timeout=GRACE + 10)
    except subprocess.TimeoutExpired:
        code = None
        stats.fail("shutdown: the server did not exit within its grace period")
    stats.shutdown = {"in_flight": len(streamed), "finished": len(outcomes), "exit_code": code,
                      "exit_s": round(time.monotonic() - t0, 2)}
    for k, status, choices in outcomes:
        stats.count("requests", "in flight at SIGTERM")
        if status != 200:
            stats.fail(f"shutdown: stream answered {status}")
        else:
            _compare(stats, "in flight at SIGTERM", k, choices, refs)
    if code not in (0, None):
        stats.fail(f"shutdown: the server exited with {code}")
    if len(outcomes) != len(streamed):
        stats.fail(f"shutdown: {len(streamed) - len(outcomes)} in-flight streams did not finish")


def _leaks(stats: Stats) -> None:
    """No growth from the first round to the last beyond the slack."""
    if len(stats.rounds) < 2:
        return
    first, last = stats.rounds[0], stats.rounds[-1]
    if last["rss"] - first["rss"] > RSS_SLACK:
        stats.fail(f"RSS grew by {(last['rss'] - first['rss']) >> 20} MiB over {len(stats.rounds)} rounds")
    if last["threads"] > first["threads"] + THREAD_SLACK:
        stats.fail(f"threads grew from {first['threads']} to {last['threads']}")
    if last["fds"] > first["fds"] + FD_SLACK:
        stats.fail(f"file descriptors grew from {first['fds']} to {last['fds']}")


def run(model_path: Path, seconds: float, log_path: Path, *, clients: int = 6, round_seconds: float = 8.0,
        model_id: Optional[str] = None) -> Stats:
    """Rounds of traffic and faults for about ``seconds``, then the shutdown test."""
    stats = Stats()
    server = Server(model_path, log_path)
    try:
        model = model_id or model_path.name.removesuffix(".gguf")
        catalog = _catalog(model)
        refs = references(server, catalog)
        end = time.monotonic() + seconds
        n = 0
        while n == 0 or time.monotonic() + round_seconds < end:
            until = time.monotonic() + round_seconds
            workers = [threading.Thread(target=_mixed, args=(server, catalog, refs, stats, until, 1000 * n + i))
                       for i in range(clients)]
            for w in workers:
                w.start()
            _faults(server, catalog, refs, stats, n)
            _burst(server, catalog, refs, stats)
            for w in workers:
                w.join()
            stats.rounds.append(_drain(server, stats))
            n += 1
        _leaks(stats)
        _shutdown(server, catalog, refs, stats)
    finally:
        server.stop()
    return stats


def report(stats: Stats) -> dict[str, Any]:
    return {"requests": dict(stats.requests), "statuses": dict(stats.statuses), "faults": dict(stats.faults),
            "compared_answers": stats.compared, "compared_bytes": stats.compared_bytes,
            "failures": stats.failures, "rounds": stats.rounds, "shutdown": stats.shutdown}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--log", default="soak-server.log")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args()
    if args.model:
        path = Path(args.model)
    else:
        import reprolm
        path = reprolm.default_model_path()
    t0 = time.monotonic()
    stats = run(path, args.minutes * 60, Path(args.log), clients=args.clients)
    out = report(stats)
    out["seconds"] = round(time.monotonic() - t0, 1)
    try:
        out["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                          if line.startswith("model name"))
    except (OSError, StopIteration):
        out["cpu"] = "unknown"
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _record import write as write_record

    write_record("soak", {k: v for k, v in out.items() if k != "cpu"} | {"minutes": args.minutes,
                                                                          "clients": args.clients},
                 model=path.name)
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
