"""Multi-turn chat through ``reprolm serve``: time to first token per turn with the prefix cache
on and off.

    python benches/chat_turns.py [--model PATH] [--threads 2] [--conversations 4] [--turns 6]
                                 [--max-tokens 32] [--llama-server PATH]

Several conversations run at once, each in its own client thread, through
``POST /v1/chat/completions`` with ``stream: true``: every conversation starts with the same
system prompt of about 800 tokens, then sends its turns one after another, each turn the
whole conversation so far (system prompt, earlier questions and replies) plus a new
question of about 40 tokens; replies are sampled (temperature 0.7, a seed per conversation
and turn) up to ``--max-tokens`` tokens. The same workload runs on two servers started in
turn with the same thread count: the prefix cache on (the default) and off
(``--prefix-cache-bytes 0``). Reported per turn: the median time to first token over the
conversations (from sending the request to the first streamed text), the median
``usage.prompt_tokens_details.cached_tokens`` and prompt tokens; then the aggregate
completion tokens/s of each run, and whether every reply was the same text on both servers
(it must be: the cache changes no bits). Each server gets one warm-up request first. Name the
CPU with the numbers: the script prints it.

With ``--llama-server`` (default: ``~/.cache/llamacpp-tools/build/bin/llama-server`` when it
exists), the same workload also runs on llama.cpp's server with the same model file and
threads, one slot per conversation (``-np``) of 4,096 positions each, and its default prompt
cache; its time to first token and throughput are printed beside reprolm's (its replies are
its own, so they are not compared).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from _machine import machine
from _record import write as write_record

SYSTEM_PARAGRAPHS = [
    "You are the assistant of the Lindenhof municipal library. You answer questions from visitors "
    "about opening hours, membership, borrowing rules, events, the reading rooms and the local history "
    "collection. Keep every answer short, friendly and precise, and say so when you do not know.",
    "Opening hours: Monday to Friday from nine in the morning to eight in the evening, Saturday from ten "
    "to four, closed on Sundays and public holidays. The children's floor closes one hour earlier. The "
    "local history room opens on Tuesday and Thursday afternoons only, or by appointment.",
    "Membership is free for residents; visitors from other towns pay twelve euros a year. A library card "
    "needs an identity document and a proof of address. Children under fourteen need a parent's "
    "signature. Lost cards are replaced for three euros.",
    "Borrowing: up to twenty items at once; books for four weeks, films and games for one week, "
    "magazines for two weeks. Every loan can be renewed twice online unless someone reserved the item. "
    "Late returns cost twenty cents a day per item, capped at five euros per item.",
    "Reservations are free. A reserved item waits at the front desk for seven days. Interlibrary loans "
    "cost two euros and take about two weeks. The library can scan up to fifty pages of an out-of-print "
    "book for personal study.",
    "Events: a reading club on the first Monday of every month, a coding workshop for teenagers on "
    "Wednesday afternoons, story time for small children on Saturday mornings, and a lecture series on "
    "local history in the winter months. Events are free but some need registration.",
    "The reading rooms have forty desks, power sockets, free wireless internet and four computers. Quiet "
    "is expected in the upper reading room. Food is not allowed, drinks in closed bottles are. Group "
    "rooms can be booked for two hours a day.",
    "Accessibility: the building has a lift, an accessible toilet, a hearing loop at the front desk and "
    "large-print books on the ground floor. Guide dogs are welcome. Staff can bring items from the upper "
    "floors on request.",
    "Printing and copying cost ten cents a page in black and white and fifty cents in colour. Payment is "
    "by card or with the library card's credit. Scanning to a memory stick or to e-mail is free.",
    "The local history collection holds newspapers since 1870, maps, photographs, parish records and the "
    "archive of the old textile factory. Originals stay in the room; copies can be ordered. Researchers "
    "should book a desk a day ahead.",
    "Donations of books in good condition are accepted on Fridays, up to one box per visitor. Textbooks "
    "older than five years, encyclopedias and magazines are not accepted. The friends of the library run a "
    "book sale every spring.",
    "Lost and found: items left in the library are kept at the front desk for one month, then given to the "
    "town's lost property office. Umbrellas and water bottles are kept for one week. Staff do not look "
    "after bags or children; lockers on the ground floor take a one euro coin that is returned.",
    "Digital services: members can borrow e-books and audiobooks through the library's app, up to five "
    "titles at a time for three weeks, and read two national newspapers online. The app needs the card "
    "number and a four-digit code that the front desk sets up. Help with the app is given on Thursdays.",
    "Volunteers read to residents of the care home on Fridays and help with homework on Monday and "
    "Wednesday afternoons. New volunteers meet the coordinator first and need a certificate of good "
    "conduct for work with children. The library thanks its volunteers with a dinner every December.",
    "If a question is about something else, such as the town hall, the swimming pool or bus times, say "
    "that the library cannot answer it and point to the town's information office next door.",
]
SYSTEM = "\n\n".join(SYSTEM_PARAGRAPHS)

QUESTIONS = [
    "I just moved here from another town and would like to borrow some novels for my holiday next month. "
    "What do I need to bring to get a card, and how long can I keep the books?",
    "My daughter is nine years old and loves comics and stories about animals. Is there something on "
    "Saturday mornings for her, and can she get her own card?",
    "I am researching the history of the old textile factory for a school project about the town. Where "
    "can I find material, and when is the room with the old newspapers open?",
    "One of the films I borrowed is three days late because I was ill. How much will that cost, and can I "
    "still renew the books I borrowed at the same time?",
    "Our reading group has six people and we would like a quiet room on Thursday evenings for about two "
    "hours. Is that possible, and do we have to pay anything?",
    "I have two boxes of old novels and some cookbooks from my grandmother. Can I give them to the "
    "library, and on which day should I bring them?",
    "My father uses a wheelchair and cannot read small print well. Can he get to the upper floor, and do "
    "you have books he could read more easily?",
    "I need to print a twenty page document in colour and scan a few pages of a book. What does that "
    "cost, and can I pay with my bank card?",
    "Is there a workshop where my teenage son could learn programming, and does he need to register "
    "before he comes for the first time?",
    "Can you tell me when the next bus to the train station leaves from the stop in front of the "
    "library, and whether the swimming pool is open today?",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``reprolm serve`` (or, with ``llama_server``, llama.cpp's server) on a free loopback port;
    ``stop()`` ends it."""

    def __init__(self, model: Path, threads: int, concurrency: int, extra: list[str],
                 llama_server: Optional[Path] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        slots = max(concurrency, 1)
        if llama_server is None:
            cmd = [sys.executable, "-m", "reprolm", "serve", "-m", str(model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--threads", str(threads), "--max-concurrent", str(slots), *extra]
        else:
            cmd = [str(llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(4096 * slots), *extra]
        # The server's own log, kept for a failed run (named in the error).
        self.log = tempfile.NamedTemporaryFile(prefix="chat_turns-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.model_id = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"]
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the server did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def chat_turn(http: httpx.Client, server: Server, messages: list[dict[str, str]], seed: int,
              max_tokens: int) -> tuple[float, str, dict[str, Any]]:
    """One streamed turn: (seconds to the first text, the reply, the usage)."""
    body = {"model": server.model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first: Optional[float] = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    with http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - start
                    text.append(piece)
    return (first if first is not None else time.perf_counter() - start), "".join(text), usage


def run(server: Server, conversations: int, turns: int, max_tokens: int) -> dict[str, Any]:
    """Every conversation's turns; returns per-turn TTFTs, cached and prompt tokens, the replies,
    and completion tokens per second over the whole run."""
    ttft = [[0.0] * conversations for _ in range(turns)]
    cached = [[0] * conversations for _ in range(turns)]
    prompt = [[0] * conversations for _ in range(turns)]
    replies = [[""] * turns for _ in range(conversations)]
    completion_tokens = [0] * conversations
    errors: list[BaseException] = []

    def conversation(c: int) -> None:
        try:
            messages = [{"role": "system", "content": SYSTEM}]
            for t in range(turns):
                messages.append({"role": "user", "content": QUESTIONS[(c + t) % len(QUESTIONS)]})
                # A connection per turn, for both servers: llama-server at times closed a
                # kept-alive connection without answering the next request on it (seen on a
                # connection's sixth request: "Server disconnected without sending a response").
                with httpx.Client(timeout=600) as http:
                    seconds, reply, usage = chat_turn(http, server, messages, 1000 * c + t, max_tokens)
                messages.append({"role": "assistant", "content": reply})
                ttft[t][c] = seconds
                cached[t][c] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                prompt[t][c] = usage.get("prompt_tokens", 0)
                replies[c][t] = reply
                completion_tokens[c] += usage.get("completion_tokens", 0)
        except BaseException as e:  # reported after the threads end
            errors.append(e)

    with httpx.Client(timeout=600) as http:  # warm-up
        chat_turn(http, server, [{"role": "user", "content": "Hello"}], 0, 4)
    start = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(conversations)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} conversations failed: {errors[0]!r}; server log {server.log.name}")
    return {"ttft": ttft, "cached": cached, "prompt": prompt, "replies": replies,
            "tok/s": sum(completion_tokens) / wall, "wall": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=32)
    default_llama = Path.home() / ".cache/llamacpp-tools/build/bin/llama-server"
    p.add_argument("--llama-server", type=lambda s: Path(s) if s else None,
                   default=default_llama if default_llama.exists() else None,
                   help="llama.cpp's server binary ('' to leave it out)")
    args = p.parse_args()
    if args.model is None:
        import reprolm

        args.model = reprolm.default_model_path()
    print(f"CPU: {machine()}; {os.cpu_count()} logical CPUs; {args.threads} threads; model {args.model.name}; "
          f"{args.conversations} conversations x {args.turns} turns, max_tokens {args.max_tokens}")
    results = {}
    runs: list[tuple[str, list[str], Optional[Path]]] = [("cache on", [], None),
                                                         ("cache off", ["--prefix-cache-bytes", "0"], None)]
    if args.llama_server is not None:
        runs.append(("llama-server", [], args.llama_server))
    for name, extra, llama_server in runs:
        server = Server(args.model, args.threads, args.conversations, extra, llama_server)
        try:
            results[name] = run(server, args.conversations, args.turns, args.max_tokens)
        finally:
            server.stop()
    on, off = results["cache on"], results["cache off"]
    print(f"{'turn':>4} {'prompt tok':>10} {'cached':>7} {'TTFT on (ms)':>13} {'TTFT off (ms)':>14} {'off/on':>7}")
    for t in range(args.turns):
        a, b = statistics.median(on["ttft"][t]) * 1e3, statistics.median(off["ttft"][t]) * 1e3
        print(f"{t + 1:>4} {statistics.median(on['prompt'][t]):>10.0f} {statistics.median(on['cached'][t]):>7.0f} "
              f"{a:>13.0f} {b:>14.0f} {b / a:>6.2f}x")
    later_on = statistics.median([x for t in range(1, args.turns) for x in on["ttft"][t]])
    later_off = statistics.median([x for t in range(1, args.turns) for x in off["ttft"][t]])
    print(f"turns 2-{args.turns}: median TTFT {later_on * 1e3:.0f} ms with the cache, {later_off * 1e3:.0f} ms "
          f"without ({later_off / later_on:.2f}x)")
    print(f"completion tokens/s: {on['tok/s']:.1f} with the cache, {off['tok/s']:.1f} without "
          f"(wall {on['wall']:.1f} s vs {off['wall']:.1f} s)")
    same = on["replies"] == off["replies"]
    print(f"every reply the same text with the cache on and off: {same}")
    llama: Optional[dict[str, Any]] = None
    if "llama-server" in results:
        ls = results["llama-server"]
        later_ls = statistics.median([x for t in range(1, args.turns) for x in ls["ttft"][t]])
        print("llama-server TTFT by turn (ms): "
              + ", ".join(f"{statistics.median(ls['ttft'][t]) * 1e3:.0f}" for t in range(args.turns)))
        print(f"llama-server: turns 2-{args.turns} median TTFT {later_ls * 1e3:.0f} ms "
              f"(reprolm with the cache: {later_ls / later_on:.2f}x lower); completion tokens/s {ls['tok/s']:.1f} "
              f"(reprolm with the cache: {on['tok/s'] / ls['tok/s']:.2f}x), wall {ls['wall']:.1f} s")
        llama = {"ttft_ms_by_turn": [statistics.median(ls["ttft"][t]) * 1e3 for t in range(args.turns)],
                 "later_turns_ttft_ms": later_ls * 1e3, "completion_tok_s": ls["tok/s"],
                 "cached_tokens_by_turn": [statistics.median(ls["cached"][t]) for t in range(args.turns)]}
    write_record("chat_turns", {
        "threads": args.threads, "conversations": args.conversations, "turns": args.turns,
        "max_tokens": args.max_tokens,
        "by_turn": [{"turn": t + 1, "prompt_tokens": statistics.median(on["prompt"][t]),
                     "cached_tokens": statistics.median(on["cached"][t]),
                     "ttft_ms_on": statistics.median(on["ttft"][t]) * 1e3,
                     "ttft_ms_off": statistics.median(off["ttft"][t]) * 1e3} for t in range(args.turns)],
        "later_turns_ttft_ms": {"on": later_on * 1e3, "off": later_off * 1e3},
        "completion_tok_s": {"on": on["tok/s"], "off": off["tok/s"]},
        "same_replies": same,
        "llama_server": llama,
    }, model=args.model.name)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
