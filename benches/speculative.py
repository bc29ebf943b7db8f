"""Speculative decoding speed: tokens/s with and without speculation, side by side in one run.

    python benches/speculative.py [--threads 2] [--max-tokens 192] [--repeats 3] [--draft-tokens 8]

(a) Prompt lookup on input-grounded prompts (a text and code of 300+ tokens that the answer
    copies), greedy and at temperature 0.7, on the default model (Q4_1, float32).
(b) A draft model: the F16 conversion of the default model as the target (written once with
    ``reprolm.convert(..., to="f16")`` next to the cached model), the default Q4_1 file at
    ``precision="int8"`` as the drafter; greedy and at temperature 0.7.

For every row: decode tokens/s of plain decoding and of speculative decoding (generated tokens
over the wall time of ``Session.generate`` after the prompt but its last token was prefilled
untimed; a draft model's own prompt processing is measured apart and subtracted; best of
``--repeats``), the tokens each generated, the speed-up, the
acceptance (accepted / drafted, mean accepted drafts per pass) and whether the output is the
plain output (greedy: always; sampled with lookup: always, the drafts are point masses; sampled
with a draft model: the same distribution, other tokens).

llama.cpp's prompt lookup on the same prompts: llama-cpp-python's ``LlamaPromptLookupDecoding``
when ``llama_cpp`` is importable, else the prebuilt ``llama-lookup`` tool if found (``--llamacpp-bin``,
default ``~/.cache/llamacpp-tools/bin``), greedy, with its own acceptance counters and decode speed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reprolm  # noqa: E402
from _machine import machine  # noqa: E402
from _record import write as write_record  # noqa: E402
from reprolm import Model, Sampler, Speculative  # noqa: E402

ARTICLE = (
    "The history of the lighthouse at Cape Verity begins in 1851, when the harbour board agreed that the "
    "rocks off the northern point had claimed too many ships. The first tower was built of local granite, "
    "forty metres tall, with a lamp that burned whale oil and could be seen from twenty kilometres away on a "
    "clear night. In 1894 the oil lamp was replaced by a kerosene burner and a rotating Fresnel lens, which "
    "gave the light its famous pattern of two short flashes every ten seconds. During the storm of 1907 a "
    "wave broke the lantern glass, and the keeper, Margaret Hale, kept the light burning for three nights "
    "by hand while her husband repaired the frame. The light was electrified in 1936 and automated in 1978, "
    "when the last keepers left the island. Today the tower is a museum, open from April to October, and "
    "the keepers' cottage has been restored with the furniture, logbooks and tools the Hale family used. "
    "Visitors can climb the one hundred and twelve steps to the gallery, where the original lens still "
    "turns, and on a clear day they can see the coast of the mainland and the three smaller islands to the "
    "west. The harbour board still maintains a modern beacon on the point, because ships continue to pass "
    "the rocks every day on their way to the northern ports."
)

CODE = '''import json
from pathlib import Path


def load_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def filter_records(records, min_score):
    kept = []
    for record in records:
        if record["score"] >= min_score:
            kept.append(record)
    return kept


def summarize(records):
    total = sum(record["score"] for record in records)
    count = len(records)
    mean = total / count if count else 0.0
    best = max(records, key=lambda record: record["score"]) if records else None
    return {"count": count, "total": total, "mean": mean, "best": best}


def count_by_label(records):
    counts = {}
    for record in records:
        counts[record["label"]] = counts.get(record["label"], 0) + 1
    return counts


def save_summary(summary, path):
    Path(path).write_text(json.dumps(summary, indent=2))


def main(source, target, min_score=0.5):
    records = load_records(source)
    kept = filter_records(records, min_score)
    summary = summarize(kept)
    save_summary(summary, target)
    return summary
'''


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


GROUNDED = {
    "quote article": chat("Quote the following article exactly as written, from the first word to the last.\n\n"
                          + ARTICLE),
    "rename in code": chat("Rewrite this Python module, renaming the variable `records` to `rows` everywhere. "
                           "Output only the code.\n\n" + CODE),
    "continue article": ARTICLE + "\n\n" + ARTICLE[:400],
    "continue code": CODE + "\n\n# The same module again, unchanged:\n" + CODE[:300],
}
GENERAL = {
    "explain": chat("Explain why the sky is blue in a few paragraphs."),
    "story": chat("Write a short story about a lighthouse keeper."),
    "recipe": chat("Give me a simple recipe for pancakes, step by step."),
}


def timed(model: Model, prompt: str, max_tokens: int, sampler: Sampler, speculative: Optional[Speculative],
          repeats: int) -> tuple[float, reprolm.Completion]:
    """Best decode tokens/s over ``repeats`` runs, and the completion. Each run prefills all
    of the prompt but its last token on a fresh session first (not timed, the same for both
    ways), then times ``Session.generate``, which computes the last prompt token and decodes.
    A draft model processes the prompt inside that call (its own cache starts empty): the time
    of that prefill, measured apart on a fresh session of the drafter, is subtracted."""
    ids = model.tokenize(prompt, special=True)
    best, completion = 0.0, None
    for _ in range(repeats):
        drafter_prompt = 0.0
        if speculative is not None and isinstance(speculative.drafter, Model):
            warm = speculative.drafter.session(context_length=len(ids))
            t0 = time.perf_counter()
            warm.prefill(ids)
            drafter_prompt = time.perf_counter() - t0
        session = model.session(context_length=len(ids) + max_tokens)
        session.prefill(ids[:-1])
        t0 = time.perf_counter()
        completion = session.generate(ids, max_tokens=max_tokens, sampler=sampler, speculative=speculative)
        elapsed = time.perf_counter() - t0 - drafter_prompt
        best = max(best, len(completion.token_ids) / elapsed)
    assert completion is not None
    return best, completion


def row(name: str, mode: str, plain: tuple[float, reprolm.Completion], fast: tuple[float, reprolm.Completion],
        rows: list[dict[str, Any]]) -> float:
    stats = fast[1].speculation
    assert stats is not None
    same = fast[1].token_ids == plain[1].token_ids
    rows.append({"prompt": name, "mode": mode, "tokens_plain": len(plain[1].token_ids),
                 "tokens_spec": len(fast[1].token_ids), "plain_tokens_per_s": plain[0], "spec_tokens_per_s": fast[0],
                 "speedup": fast[0] / plain[0], "acceptance_rate": stats.acceptance_rate,
                 "mean_accepted_length": stats.mean_accepted_length, "same_tokens": same})
    print(f"  {name:<17} {mode:<7} {len(plain[1].token_ids):>4} {len(fast[1].token_ids):>4} {plain[0]:>8.1f} "
          f"{fast[0]:>8.1f} {fast[0] / plain[0]:>6.2f}x {stats.acceptance_rate:>7.1%} "
          f"{stats.mean_accepted_length:>6.2f} {'yes' if same else 'no':>5}")
    return fast[0] / plain[0]


HEADER = (f"  {'prompt':<17} {'mode':<7} {'toks':>4} {'toks':>4} {'plain':>8} {'spec':>8} {'speedup':>7} "
          f"{'accept':>7} {'len':>6} {'same':>5}\n  {'':<17} {'':<7} {'plain':>4} {'spec':>4} {'tok/s':>8} {'tok/s':>8}")


def section(title: str, target: Model, prompts: dict[str, str], speculative: Speculative,
            args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n{title}")
    rows: list[dict[str, Any]] = []
    print(HEADER)
    ratios: dict[str, list[float]] = {"greedy": [], "T=0.7": []}
    for name, prompt in prompts.items():
        for mode, sampler in [("greedy", Sampler.greedy()), ("T=0.7", Sampler(temperature=0.7, seed=1))]:
            plain = timed(target, prompt, args.max_tokens, sampler, None, args.repeats)
            fast = timed(target, prompt, args.max_tokens, sampler, speculative, args.repeats)
            ratios[mode].append(row(name, mode, plain, fast, rows))
            if mode == "greedy":
                assert fast[1].token_ids == plain[1].token_ids, "greedy speculative output differs"
    for mode, r in ratios.items():
        print(f"  mean speed-up, {mode}: {sum(r) / len(r):.2f}x")
    return {"section": title, "rows": rows, "mean_speedup": {mode: sum(r) / len(r) for mode, r in ratios.items()}}


def f16_path(source: Path) -> Path:
    dst = source.with_name(source.name.replace(".Q4_1.gguf", ".F16.gguf"))
    if not dst.exists():
        print(f"writing {dst} (reprolm.convert to f16) ...", flush=True)
        reprolm.convert(source, dst, to="f16")
    return dst


def llamacpp_python(model_path: Path, prompts: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    title = (f"llama-cpp-python {llama_cpp.__version__}, LlamaPromptLookupDecoding(num_pred_tokens={args.draft_tokens}),"
             " greedy")
    print(f"\n{title}")
    rows: list[dict[str, Any]] = []
    for name, prompt in prompts.items():
        speeds, texts = [], []
        for draft in [None, LlamaPromptLookupDecoding(num_pred_tokens=args.draft_tokens)]:
            # A draft model needs the logits of every row (llama-cpp-python's scores buffer holds
            # only n_batch rows otherwise, and a long prompt overruns it).
            llm = llama_cpp.Llama(str(model_path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                                  draft_model=draft, logits_all=draft is not None, verbose=False)
            t0 = time.perf_counter()
            out: Any = llm(prompt, max_tokens=args.max_tokens, temperature=0.0, top_k=1)
            n = out["usage"]["completion_tokens"]
            speeds.append(n / (time.perf_counter() - t0))
            texts.append(out["choices"][0]["text"])
        print(f"  {name:<17} plain {speeds[0]:8.1f} tok/s, lookup {speeds[1]:8.1f} tok/s, "
              f"{speeds[1] / speeds[0]:.2f}x, same text: {'yes' if texts[0] == texts[1] else 'no'}")
        rows.append({"prompt": name, "plain_tokens_per_s": speeds[0], "lookup_tokens_per_s": speeds[1],
                     "speedup": speeds[1] / speeds[0], "same_text": texts[0] == texts[1]})
    return {"title": title, "rows": rows}


def llama_lookup_tool(binary: Path, model_path: Path, prompts: dict[str, str], args: argparse.Namespace) -> None:
    print(f"\nllama.cpp's llama-lookup ({binary}), greedy, --spec-draft-n-max {args.draft_tokens}"
          " (its decode speed counts generated tokens over its decode time; prompt excluded)")
    for name, prompt in prompts.items():
        outputs = []
        for k in [args.draft_tokens, 2]:
            cmd = [str(binary), "-m", str(model_path), "-p", prompt, "-n", str(args.max_tokens), "--temp", "0",
                   "-t", str(args.threads), "--spec-draft-n-max", str(k), "-c", "2048"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            log = done.stdout + done.stderr
            outputs.append(done.stdout)
            if k != args.draft_tokens:
                continue
            speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
            drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
            accepted = re.search(r"n_accept\s+=\s+(\d+)", log)
            if not (speed and drafted and accepted):
                print(f"  {name:<17} (could not parse llama-lookup's output; exit {done.returncode})")
                break
            rate = int(accepted.group(1)) / max(1, int(drafted.group(1)))
            print(f"  {name:<17} {speed.group(1)} tokens at {float(speed.group(3)):8.1f} tok/s, "
                  f"accepted {accepted.group(1)}/{drafted.group(1)} ({rate:.1%})", end="")
        else:
            print(f", same text with --spec-draft-n-max 2: {'yes' if outputs[0] == outputs[1] else 'no'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is reported")
    parser.add_argument("--draft-tokens", type=int, default=8, help="most drafts per pass (adaptive below it)")
    parser.add_argument("--skip", choices=["lookup", "draft-model", "llamacpp"], nargs="*", default=[])
    parser.add_argument("--llamacpp-bin", type=Path, default=Path.home() / ".cache/llamacpp-tools/bin")
    args = parser.parse_args()

    source = reprolm.default_model_path()
    print(f"{machine()}; {args.threads} threads; max_tokens {args.max_tokens}; best of {args.repeats}; "
          f"draft_tokens {args.draft_tokens} (adaptive)")
    sections: list[dict[str, Any]] = []
    llamacpp: Optional[dict[str, Any]] = None
    if "lookup" not in args.skip:
        target = Model.load(source, threads=args.threads)
        for name, prompt in GROUNDED.items():
            assert len(target.tokenize(prompt, special=True)) >= 300, name
        sections.append(section(f"(a) prompt lookup, {source.name} (float32)", target, GROUNDED,
                Speculative("lookup", draft_tokens=args.draft_tokens), args))
    if "draft-model" not in args.skip:
        target = Model.load(f16_path(source), threads=args.threads)
        drafter = Model.load(source, threads=args.threads, precision="int8")
        sections.append(section(f"(b) draft model: target {target.path.name} (float32), drafter {source.name} (int8)",
                                target, {**GENERAL, **GROUNDED}, Speculative(drafter, draft_tokens=args.draft_tokens),
                                args))
    if "llamacpp" not in args.skip:
        try:
            import llama_cpp  # noqa: F401
            llamacpp = llamacpp_python(source, GROUNDED, args)
        except ImportError:
            binary = args.llamacpp_bin / "llama-lookup"
            if binary.exists():
                print("\n(llama-cpp-python is not installed: comparing with the llama-lookup tool instead)")
                llama_lookup_tool(binary, source, GROUNDED, args)
            else:
                print("\nllama.cpp comparison skipped: neither llama-cpp-python nor llama-lookup found")
    write_record("speculative", {"threads": args.threads, "max_tokens": args.max_tokens, "repeats": args.repeats,
                                 "draft_tokens": args.draft_tokens, "sections": sections, "llamacpp_python": llamacpp},
                 model=source.name)


if __name__ == "__main__":
    main()
