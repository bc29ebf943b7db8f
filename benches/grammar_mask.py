"""Constrained decoding cost: the grammar mask per step on the model's
real vocabulary, and constrained against unconstrained decode speed.

For a JSON Schema, a regular expression and a Lark grammar, the script generates a few
completions (greedy and seeded sampling) with the grammar, then replays each one through a
fresh :class:`reprolm.GrammarMatcher` (five times, in turns across the completions, keeping
each step's least time), timing
the computation of the allowed set S before every token (``allowed_count``: S computed in
Rust, only its size returned; the time includes one Python-to-Rust call). It reports p50 / p99 microseconds per step, the same runs' decode
speed (tokens/s between the first and the last token of a stream) with and without the grammar,
and p99 mask time as a share of an unconstrained decode step (target: under 5%).

    .venv/bin/python benches/grammar_mask.py [--model PATH] [--threads N] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reprolm  # noqa: E402
from _machine import cpu_name, machine  # noqa: E402
from _record import write as write_record  # noqa: E402
from reprolm import Grammar, Sampler  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "tags", "address"],
}
GRAMMARS = {
    "json_schema": (Grammar.json_schema(SCHEMA), "A customer record as JSON:\n"),
    "regex": (Grammar.regex(r"(?:[A-Z][a-z]{0,12},? ){3,30}[a-z]{1,12}\."), "Write A Title Case Sentence: "),
    "lark": (Grammar.lark('start: item (", " item)*\nitem: NAME ": " NUMBER\nNAME: /[a-z]{1,10}/\nNUMBER: /[0-9]{1,5}/\n'),
             "An inventory: "),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def mask_times(model: reprolm.Model, grammar: Grammar, completions: list[list[int]], replays: int) -> list[float]:
    """Microseconds to compute S before each token of each completion: the least of
    ``replays`` replays through fresh matchers (the work per step is fixed; the minimum
    filters out the preemptions of a shared machine). Replays take turns across the
    completions, so that one step's replays are tens of milliseconds apart rather than a few:
    a busy spell of the machine then rarely covers all of them."""
    best = [[float("inf")] * len(ids) for ids in completions]
    for _ in range(replays):
        for ids, times in zip(completions, best):
            matcher = grammar.matcher(model)
            for t, token in enumerate(ids):
                start = time.perf_counter()
                matcher.allowed_count()
                times[t] = min(times[t], (time.perf_counter() - start) * 1e6)
                if token != model.config.eos_id:
                    matcher.accept(token)
    return [t for times in best for t in times]


def decode_rate(model: reprolm.Model, prompt: str, sampler: Sampler, max_tokens: int,
                grammar: Optional[Grammar]) -> tuple[list[int], float, int]:
    """(ids, tokens/s between the first and the last token, number of tokens)."""
    stamps: list[float] = []
    ids: list[int] = []
    for chunk in model.stream(prompt, max_tokens=max_tokens, sampler=sampler, grammar=grammar):
        stamps.append(time.perf_counter())
        ids.extend(chunk.token_ids)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    return ids, rate, len(ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--runs", type=int, default=4, help="completions per grammar (1 greedy, the rest sampled)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--replays", type=int, default=5, help="replays per completion; each step's least time is kept")
    args = parser.parse_args()
    model = reprolm.Model.load(args.model) if args.model else reprolm.Model.default(threads=args.threads)
    samplers = [Sampler.greedy()] + [Sampler(temperature=1.0, top_p=0.95, seed=s) for s in range(1, args.runs)]
    model.generate("warm up", max_tokens=4, grammar=Grammar.regex("[a-z]+"))  # builds the token trie
    print(f"CPU: {machine()}; threads: {model.threads}; vocabulary: {model.config.vocab_size} tokens; "
          f"model: {model.path.name}")

    results = {}
    plain_rates = []
    for name, (grammar, prompt) in GRAMMARS.items():
        completions = []
        rates = []
        for sampler in samplers:
            ids, rate, n = decode_rate(model, prompt, sampler, args.max_tokens, grammar)
            rates.append(rate)
            completions.append(ids)
            _, plain, _ = decode_rate(model, prompt, sampler, n, None)
            plain_rates.append(plain)
        mask_us = mask_times(model, grammar, completions, args.replays)
        results[name] = {
            "steps": len(mask_us),
            "mask_p50_us": round(statistics.median(mask_us), 1),
            "mask_p99_us": round(percentile(mask_us, 0.99), 1),
            "mask_max_us": round(max(mask_us), 1),
            "constrained_tokens_per_s": round(statistics.median(rates), 1),
        }
    step_us = 1e6 / statistics.median(plain_rates)
    print(f"unconstrained decode: {statistics.median(plain_rates):.1f} tokens/s ({step_us:.0f} us per step)")
    print(f"{'grammar':<12} {'steps':>6} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'p99/step':>9} {'tokens/s':>9}")
    for name, r in results.items():
        share = r["mask_p99_us"] / step_us
        r["p99_share_of_step"] = round(share, 4)
        print(f"{name:<12} {r['steps']:>6} {r['mask_p50_us']:>8} {r['mask_p99_us']:>8} {r['mask_max_us']:>8} "
              f"{share:>8.2%} {r['constrained_tokens_per_s']:>9}")
    summary = {"cpu": cpu_name(), "threads": model.threads, "unconstrained_tokens_per_s":
               round(statistics.median(plain_rates), 1), "unconstrained_step_us": round(step_us), "grammars": results}
    print(json.dumps(summary))
    write_record("grammar_mask", {k: v for k, v in summary.items() if k != "cpu"}, model=model.path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
