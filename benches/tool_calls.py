"""Tool-call overhead: decode speed of a constrained tool call against
unconstrained generation of the same length, and time to first token with 10 tools in the
prompt.

The call is the generic format's forced call (``tool_choice="required"``) on the default
model; the unconstrained run generates the same number of tokens from the same prompt with the
end-of-sequence token banned. Decode speed is tokens/s between the first and the last token of
a stream, the best of ``--runs``; time to first token is the least of ``--runs`` streams of
one token, with and without the call's grammar.

    .venv/bin/python benches/tool_calls.py [--model PATH] [--threads N] [--runs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reprolm  # noqa: E402
from _machine import machine  # noqa: E402
from _record import write as write_record  # noqa: E402
from reprolm import Grammar, Sampler  # noqa: E402
from reprolm import tools as T  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TEN_TOOLS = [{"type": "function", "function": {
    "name": f"lookup_{i}", "description": f"Looks up item {i} of catalogue {i}",
    "parameters": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                    "mode": {"type": "string", "enum": ["fast", "full"]}},
                   "required": ["id", "mode"]}}} for i in range(10)]


def decode_rate(model: reprolm.Model, ids: list[int], n: int, grammar: Optional[Grammar], sampler: Sampler,
                runs: int) -> tuple[int, float]:
    best = 0.0
    count = 0
    for _ in range(runs):
        first: Optional[float] = None
        count = 0
        for chunk in model.stream(ids, max_tokens=n, grammar=grammar, sampler=sampler):
            if chunk.token_ids and first is None:
                first = time.perf_counter()
            count += len(chunk.token_ids)
        end = time.perf_counter()
        if first is not None and count > 1:
            best = max(best, (count - 1) / (end - first))
    return count, best


def first_token(model: reprolm.Model, ids: list[int], grammar: Optional[Grammar], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _chunk in model.stream(ids, max_tokens=1, grammar=grammar):
            break
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    model = (reprolm.Model.load(args.model, threads=args.threads) if args.model
             else reprolm.Model.default(threads=args.threads))
    print(f"{machine()}, {model.threads} threads, {model.isa}, {model.path.name}")
    question = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    plan = T.plan(model.chat_template, question, T.tools_from_openai([WEATHER]), "required")
    ids = model.chat_text_ids(model.apply_chat_template(plan.messages))
    sampler = Sampler(temperature=1.0, seed=1)
    call = model.generate(ids, max_tokens=200, grammar=plan.grammar, sampler=sampler)
    n = len(call.token_ids)
    got, constrained = decode_rate(model, ids, n, plan.grammar, sampler, args.runs)
    eos = model.config.eos_id
    banned = Sampler(temperature=1.0, seed=1, logit_bias={} if eos is None else {eos: -100.0})
    plain_n, plain = decode_rate(model, ids, n, None, banned, args.runs)
    print(f"tool call: {got} tokens {call.text!r}")
    print(f"decode tok/s: constrained {constrained:.1f}, unconstrained {plain:.1f} ({plain_n} tokens), "
          f"ratio {constrained / plain:.3f}")
    results: dict[str, object] = {"threads": model.threads, "call_tokens": got,
                                  "decode_tok_s": {"constrained": constrained, "unconstrained": plain}}
    for choice in ("auto", "required"):
        ten = T.plan(model.chat_template, [{"role": "user", "content": "Look up item 7 of catalogue 7."}],
                     T.tools_from_openai(TEN_TOOLS), choice)
        ten_ids = model.chat_text_ids(model.apply_chat_template(ten.messages))
        with_grammar = first_token(model, ten_ids, ten.grammar, args.runs)
        without = first_token(model, ten_ids, None, args.runs)
        print(f"10 tools, {choice}: prompt {len(ten_ids)} tokens, time to first token {with_grammar * 1000:.0f} ms "
              f"with the grammar, {without * 1000:.0f} ms without")
        results[f"ten_tools_{choice}"] = {"prompt_tokens": len(ten_ids), "ttft_ms_grammar": with_grammar * 1000,
                                          "ttft_ms_plain": without * 1000}
    write_record("tool_calls", results, model=model.path.name)


if __name__ == "__main__":
    main()
