"""Renders the documentation's benchmark page from the benchmark records.

    python scripts/render_benchmarks.py [--records DIR] [--page docs/benchmarks.md]
                                        [--images docs/images/benchmarks] [--check]

Every ``benches/*.py`` script writes a JSON record of its run (``benches/_record.py``: command,
CPU, commit, numbers) into ``benches/records/``. This script keeps the latest record of each
configuration (a benchmark, its model and the settings that make two runs comparable) and
writes, into ``docs/benchmarks.md``, the tables between the markers

    <!-- records: NAME [KEY=VALUE ...] -->
    ...
    <!-- /records: NAME -->

(NAME is a benchmark's name; KEY=VALUE pairs keep the records whose model or setting has that
value; the prose around the markers is left alone), and three plots
(matplotlib PNG) into ``docs/images/benchmarks/``: throughput against concurrency, speed
against model size, and reprolm beside llama.cpp. ``--check`` writes nothing and exits 1 if
the page's tables differ from what the records give.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
Record = dict[str, Any]

# ---------------------------------------------------------------------------------------------
# Which records are the latest: one per configuration.


def load(directory: Path) -> list[Record]:
    """Every record in `directory`, oldest first (by the time the run finished, then name;
    transcribed records, which have no time, first)."""
    records = []
    for path in sorted(directory.glob("*.json")):
        record = json.loads(path.read_text())
        record["_file"] = path.name
        records.append(record)
    return sorted(records, key=lambda r: (r["finished"] or "", r["_file"]))


def configuration(record: Record) -> tuple[Any, ...]:
    """What makes two runs of a benchmark measure the same thing (the later one replaces the
    earlier): the model and the settings, not the numbers."""
    r = record["results"]
    name = record["benchmark"]
    if name == "compare_llamacpp":
        engines = tuple(sorted({e for t in r["by_threads"] for e in t["medians"]}))
        return (record["model"], r["precision"], tuple(t["threads"] for t in r["by_threads"]), engines)
    if name == "batch_throughput":
        return (record["model"], r["threads"],
                tuple((c["precision"], c["kv_dtype"], tuple(row["n"] for row in c["rows"]))
                      for c in r["configurations"]))
    if name == "server_throughput":
        return (record["model"], r["threads"], r["precision"], tuple(sorted(r["servers"])))
    if name == "speculative":
        return (record["model"], tuple(s["section"] for s in r["sections"]))
    return (record["model"],)


def latest(records: Iterable[Record]) -> dict[str, list[Record]]:
    """For each benchmark, the latest record of each configuration, in the order the
    configurations first appeared."""
    chosen: dict[tuple[Any, ...], Record] = {}
    for record in records:
        chosen[(record["benchmark"], vendor(record), record.get("simd"), *configuration(record))] = record
    by_benchmark: dict[str, list[Record]] = {}
    for record in chosen.values():
        by_benchmark.setdefault(record["benchmark"], []).append(record)
    return by_benchmark


# ---------------------------------------------------------------------------------------------
# Tables.


def provenance(record: Record) -> str:
    commit = record.get("commit")
    if record.get("transcribed"):
        source = "figures transcribed from the tables printed by the run (no commit recorded)"
    elif commit:
        source = f"commit {commit[:12]}" + (" with local changes" if record.get("dirty") else "")
    else:
        source = "commit unknown"
    when = record["finished"] or "date not recorded"
    model = f"{record['cpu_model']}, " if record.get("cpu_model") else ""
    simd = f"{record['simd']}, " if record.get("simd") else ""
    return f"`{record['command']}` on {record['cpu']} ({model}{simd}{record['cpus']} CPUs); {source}; {when}"


def compare_llamacpp(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, precision {r['precision']}, medians of {r['rounds']} rounds"]
    for t in r["by_threads"]:
        engines = list(t["medians"])
        others = list(t["reprolm_over"])
        lines.append("")
        read_loop = f": read loop {t['read_gbps']:.2f} GB/s" if "read_gbps" in t else ""
        lines.append(f"threads = {t['threads']}{read_loop}")
        lines.append(f"  {'metric':<14}" + "".join(f" {e:>10}" for e in engines)
                     + "".join(f" {'vs ' + ('base' if e == 'baseline' else e):>12}" for e in others))
        for metric in t["medians"]["reprolm"]:
            line = f"  {metric:<14}" + "".join(f" {t['medians'][e][metric]:>10.1f}" for e in engines)
            line += "".join(f" {t['reprolm_over'][e][metric]:>11.3f}x" for e in others)
            lines.append(line)
    return "\n".join(lines)


def batch_throughput(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, {r['threads']} threads, {r['prompt_tokens']}-token prompts, "
             f"{r['new_tokens']} new tokens each, medians of {r['rounds']} rounds"]
    for c in r["configurations"]:
        llama = any(row["llamacpp"] for row in c["rows"])
        lines.append("")
        lines.append(f"reprolm precision={c['precision']} kv_dtype={c['kv_dtype']}")
        lines.append("  N  sampler   total tok/s  decode tok/s  x single  ttft p50/p99 ms   itl p50/p99 ms"
                     + ("   llama.cpp S_TG    S   decode ratio" if llama else ""))
        for row in c["rows"]:
            x_single = row["x_single"] if row["x_single"] is not None else float("nan")
            line = (f"{row['n']:3d}  {row['sampler']:8s} {row['total']:11.1f}  {row['decode']:12.1f}"
                    f"  {x_single:7.2f}x  {row['ttft50']:7.1f}/{row['ttft99']:<7.1f}  "
                    f"{row['itl50']:6.2f}/{row['itl99']:<6.2f}")
            if row["llamacpp"]:
                lr = row["llamacpp"]
                line += f"   {lr['s_tg']:13.1f} {lr['s']:6.1f}   {row['llamacpp_decode_ratio']:5.2f}x"
            lines.append(line.rstrip())
    return "\n".join(lines)


def server_throughput(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, {r['threads']} threads, {r['max_tokens']} streamed tokens per request, "
             f"precision {r['precision']}", "",
             f"  {'server':<13}{'C':>4} {'req/s':>8} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8}"]
    for name, rows in r["servers"].items():
        for row in rows:
            lines.append(f"  {name:<13}{row['concurrency']:>4} {row['req/s']:8.2f} {row['tok/s']:8.1f} "
                         f"{row['ttft50']:8.1f}ms {row['ttft99']:6.1f}ms {row['itl50']:6.1f}ms {row['itl99']:6.1f}ms")
    if r["reprolm_over_llama_server"]:
        lines.append("")
    for q in r["reprolm_over_llama_server"]:
        lines.append(f"  C={q['concurrency']:<3} reprolm / llama-server: tok/s {q['tok/s']:.2f}x, "
                     f"ITL p99 {q['itl99']:.2f}x, TTFT p50 {q['ttft50']:.2f}x")
    return "\n".join(lines)


def ray_throughput(record: Record) -> str:
    r = record["results"]
    lines = [f"{r['rows']} rows, prompts of {r['mean_prompt_tokens']:.1f} tokens on average, {r['max_tokens']} "
             f"generated tokens each, batch size {r['batch_size']} (Ray)",
             f"  {'configuration':<24} {'seconds':>8} {'rows/s':>8} {'tok/s':>8}"]
    for c in r["configurations"]:
        lines.append(f"  {c['configuration']:<24} {c['seconds']:8.2f} {c['rows_per_s']:8.2f} {c['tokens_per_s']:8.1f}")
    lines.append(f"every configuration gave the same tokens: {'yes' if r['same_tokens'] else 'NO'}")
    return "\n".join(lines)


def grammar_mask(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, {r['threads']} threads",
             f"unconstrained decode: {r['unconstrained_tokens_per_s']:.1f} tokens/s "
             f"({r['unconstrained_step_us']} us per step)",
             f"{'grammar':<12} {'steps':>6} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'p99/step':>9} {'tokens/s':>9}"]
    for name, g in r["grammars"].items():
        lines.append(f"{name:<12} {g['steps']:>6} {g['mask_p50_us']:>8} {g['mask_p99_us']:>8} {g['mask_max_us']:>8} "
                     f"{g['p99_share_of_step']:>8.2%} {g['constrained_tokens_per_s']:>9}")
    return "\n".join(lines)


def speculative(record: Record) -> str:
    r = record["results"]
    lines = [f"{r['threads']} threads, {r['max_tokens']} tokens, best of {r['repeats']}, "
             f"adaptive k up to {r['draft_tokens']}"]
    for s in r["sections"]:
        lines += ["", s["section"],
                  f"  {'prompt':<17} {'mode':<7} {'toks':>4} {'toks':>4} {'plain':>8} {'spec':>8} {'speedup':>7} "
                  f"{'accept':>7} {'len':>6} {'same':>5}",
                  f"  {'':<17} {'':<7} {'plain':>4} {'spec':>4} {'tok/s':>8} {'tok/s':>8}"]
        for row in s["rows"]:
            lines.append(f"  {row['prompt']:<17} {row['mode']:<7} {row['tokens_plain']:>4} {row['tokens_spec']:>4} "
                         f"{row['plain_tokens_per_s']:>8.1f} {row['spec_tokens_per_s']:>8.1f} {row['speedup']:>6.2f}x "
                         f"{row['acceptance_rate']:>7.1%} {row['mean_accepted_length']:>6.2f} "
                         f"{'yes' if row['same_tokens'] else 'no':>5}")
        for mode, ratio in s["mean_speedup"].items():
            lines.append(f"  mean speed-up, {mode}: {ratio:.2f}x")
    if r["llamacpp_python"]:
        lines += ["", r["llamacpp_python"]["title"]]
        for row in r["llamacpp_python"]["rows"]:
            lines.append(f"  {row['prompt']:<17} plain {row['plain_tokens_per_s']:8.1f} tok/s, lookup "
                         f"{row['lookup_tokens_per_s']:8.1f} tok/s, {row['speedup']:.2f}x, same text: "
                         f"{'yes' if row['same_text'] else 'no'}")
    return "\n".join(lines)


def kl_vs_reference(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, last position of {r['prompts']} reference prompts",
             f"{'engine':<22} {'mean KL':>10} {'max |diff|':>11}"]
    for name, e in r["engines"].items():
        lines.append(f"{name:<22} {e['mean_kl']:>10.3e} {e['max_abs_diff']:>11.3e}")
    return "\n".join(lines)


def kv_decode(record: Record) -> str:
    r = record["results"]
    lines = [f"{record['model']}, {r['threads']} thread(s), {r['steps']} timed steps per position, clock {r['clock']}"]
    for e in r["engines"]:
        lines += ["", e["engine"], f"  {'position':>8} {'f32 tok/s':>10} {'(ms)':>7} {'f16 tok/s':>10} {'(ms)':>7}"]
        for a, b in zip(e["f32"], e["f16"]):
            lines.append(f"  {a['position']:>8} {a['tokens_per_s']:>10.1f} {a['ms_per_token']:>7.1f} "
                         f"{b['tokens_per_s']:>10.1f} {b['ms_per_token']:>7.1f}")
    return "\n".join(lines)


def key_values(record: Record) -> str:
    """A record's results as indented ``key: value`` lines (nested objects indented further)."""
    lines = [f"{record['model']}"]

    def walk(value: Any, indent: int) -> None:
        pad = "  " * indent
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (dict, list)):
                    lines.append(f"{pad}{k}:")
                    walk(v, indent + 1)
                else:
                    lines.append(f"{pad}{k}: {v:.4g}" if isinstance(v, float) else f"{pad}{k}: {v}")
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    lines.append(pad + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in item.items()))
                else:
                    lines.append(f"{pad}{item}")

    walk(record["results"], 1)
    return "\n".join(lines)


TABLES: dict[str, Callable[[Record], str]] = {
    "chat_turns": key_values,
    "tool_calls": key_values,
    "soak": key_values,
    "compare_llamacpp": compare_llamacpp,
    "batch_throughput": batch_throughput,
    "server_throughput": server_throughput,
    "ray_throughput": ray_throughput,
    "grammar_mask": grammar_mask,
    "speculative": speculative,
    "kl_vs_reference": kl_vs_reference,
    "kv_decode": kv_decode,
}


def section(records: list[Record]) -> str:
    """The Markdown between one benchmark's markers: each latest record's provenance and table."""
    parts = []
    for record in records:
        parts.append(provenance(record) + ":\n\n```\n" + TABLES[record["benchmark"]](record) + "\n```")
    return "\n\n".join(parts)


MARKER = re.compile(r"(<!-- records: (\w+)((?: \w+=[\w.-]+)*) -->\n)(.*?)(<!-- /records: \2 -->)", re.DOTALL)


def vendor(record: Record) -> str:
    """The leading letters of the record's CPU name (``AMD``, ``Intel``): with its SIMD level,
    the kind of machine a run stands for."""
    m = re.match(r"[A-Za-z]+", record.get("cpu") or "")
    return m.group(0) if m else ""


def matches(record: Record, filters: dict[str, str]) -> bool:
    """Whether the record's model, machine (``cpu``: the CPU's vendor, ``simd``) or settings (a
    key of its results) are those the filters name."""
    for key, value in filters.items():
        if key == "cpu":
            actual: Any = vendor(record)
        else:
            actual = record.get(key) if key in ("model", "simd") else record["results"].get(key)
        if str(actual) != value:
            return False
    return True


def render_page(page: str, chosen: dict[str, list[Record]]) -> str:
    """`page` with the text between each pair of markers replaced by its benchmark's tables: the
    latest records of that benchmark, those matching the marker's filters (``model=FILE``,
    ``precision=int8``, ...). A marker no record matches keeps a line saying so."""

    def fill(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"unknown benchmark in a marker: {name}")
        filters = dict(f.split("=", 1) for f in m.group(3).split())
        records = [r for r in chosen.get(name, []) if matches(r, filters)]
        body = section(records) if records else f"(no record of `benches/{name}.py` yet)"
        return f"{m.group(1)}{body}\n{m.group(5)}"

    return MARKER.sub(fill, page)


# ---------------------------------------------------------------------------------------------
# Plots.


def _figure(ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 3.8), squeeze=False)
    return fig, axes[0]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # A legend beside the panels (``fig.legend``) lies outside the figure: widen it to hold it.
    fig.savefig(path, dpi=110, bbox_inches="tight" if fig.legends else None, metadata={"Software": None})
    plt.close(fig)
    return path


def plot_concurrency(chosen: dict[str, list[Record]], path: Path) -> Path:
    """Decode tokens/s of the batch engine (and llama.cpp's batched decoding) and of the server
    (and llama-server) against the number of concurrent requests."""
    fig, (batch, server) = _figure(2)
    # One line per precision and cache type: the record with the most concurrencies for it.
    series: dict[str, list[tuple[int, float]]] = {}
    llama: dict[int, float] = {}
    for record in chosen.get("batch_throughput", []):
        for c in record["results"]["configurations"]:
            rows = [(row["n"], row["decode"]) for row in c["rows"] if row["sampler"] == "greedy"]
            label = f"reprolm {c['precision']}, {c['kv_dtype']} cache"
            if len(rows) > len(series.get(label, [])):
                series[label] = rows
            theirs = {row["n"]: row["llamacpp"]["s_tg"] for row in c["rows"] if row["llamacpp"]}
            if len(theirs) > len(llama):
                llama = theirs
    for label, rows in series.items():
        if len(rows) > 1:
            batch.plot([n for n, _ in rows], [v for _, v in rows], marker="o", label=label)
    if len(llama) > 1:
        ns = sorted(llama)
        batch.plot(ns, [llama[n] for n in ns], marker="s", linestyle="--", color="gray", label="llama.cpp")
    batch.set(xscale="log", xlabel="concurrent requests", ylabel="decode tokens/s", title="Batch engine (greedy)")
    for record in chosen.get("server_throughput", []):
        for name, rows in record["results"]["servers"].items():
            server.plot([row["concurrency"] for row in rows], [row["tok/s"] for row in rows], marker="o",
                        linestyle="--" if name != "reprolm" else "-", label=name)
    server.set(xscale="log", xlabel="concurrent clients", ylabel="streamed tokens/s", title="Server")
    for ax in (batch, server):
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    return _save(fig, path)


def _model_label(model: str) -> str:
    """A file name shortened to its model and type: ``llama-1b-...-s0.Q4_K_M.gguf`` is
    ``llama-1b Q4_K_M``, ``gemma-3-270m-q4_k_m.gguf`` is ``gemma-3-270m Q4_K_M``."""
    stem = model.removesuffix(".gguf")
    m = re.match(r"(.+?)[.-]((?:q|Q)\d\w*|[fF]16|[fF]32|BF16)$", stem)
    name, qtype = (m.group(1), m.group(2).upper()) if m else (stem, "")
    name = re.sub(r"-smollm2-135m-instruct-s\d+$|-Instruct$", "", name)
    return f"{name} {qtype}".strip()


def _cpu_label(record: Record) -> str:
    """The machine of a record: CPU vendor and SIMD level, and the CPUID family and model
    where the record has them (two machines of one vendor and level are then told apart)."""
    model = f" ({record['cpu_model']})" if record.get("cpu_model") else ""
    return f"{vendor(record)} {record.get('simd') or '(SIMD not recorded)'}{model}".strip()


def plot_model_size(chosen: dict[str, list[Record]], path: Path) -> Path:
    """Prefill and decode tokens/s at int8 against the model file's size, at each record's
    largest thread count: reprolm beside llama.cpp, one series per engine and machine
    (``_cpu_label``), so one machine's points are not joined to another's (records made
    before the CPUID model was recorded share a series per vendor and SIMD level)."""
    fig, (prefill, decode) = _figure(2)
    points: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for record in chosen.get("compare_llamacpp", []):
        r = record["results"]
        if r["precision"] != "int8":
            continue
        widest = max(r["by_threads"], key=lambda t: t["threads"])
        for engine, m in widest["medians"].items():
            for metric in ("prefill tok/s", "decode tok/s"):
                key = (engine, _cpu_label(record), metric)
                points.setdefault(key, []).append((r["model_bytes"] / 1e6, m[metric]))
    cpus = sorted({cpu for _, cpu, _ in points})
    colors = {cpu: f"C{i}" for i, cpu in enumerate(cpus)}
    for (engine, cpu, metric), xy in sorted(points.items()):
        xy.sort()
        ax = prefill if metric.startswith("prefill") else decode
        ax.plot([x for x, _ in xy], [y for _, y in xy], color=colors[cpu], label=f"{engine}, {cpu}",
                marker="o" if engine == "reprolm" else "s", linestyle="-" if engine == "reprolm" else "--")
    for ax, title in ((prefill, "Prefill"), (decode, "Decode")):
        ax.set(xscale="log", yscale="log", xlabel="model file (MB)", ylabel="tokens/s",
               title=f"{title} (int8, most threads of the run)")
        ax.grid(alpha=0.3, which="both")
    if prefill.get_lines():
        # One legend for both panels (the same series), beside them rather than over the points.
        fig.legend(*prefill.get_legend_handles_labels(), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, path)


def plot_llamacpp_ratio(chosen: dict[str, list[Record]], path: Path) -> Path:
    """reprolm's speed over llama.cpp's (1 = as fast) for each model, precision, thread count
    and SIMD level: one labelled row each."""
    rows: list[tuple[str, float, float]] = []
    for record in chosen.get("compare_llamacpp", []):
        r = record["results"]
        for t in sorted(r["by_threads"], key=lambda t: -t["threads"]):
            if "llama.cpp" in t["reprolm_over"]:
                ratio = t["reprolm_over"]["llama.cpp"]
                threads = f"{t['threads']} thread{'s' if t['threads'] > 1 else ''}"
                label = f"{_model_label(record['model'])}, {r['precision']}, {threads}, {_cpu_label(record)}"
                rows.append((label, ratio["prefill tok/s"], ratio["decode tok/s"]))
    fig, (ax,) = _figure(1)
    fig.set_size_inches(9.5, 1.2 + 0.28 * max(len(rows), 1))
    ys = list(range(len(rows)))[::-1]
    ax.barh([y + 0.2 for y in ys], [p for _, p, _ in rows], height=0.4, label="prefill")
    ax.barh([y - 0.2 for y in ys], [d for _, _, d in rows], height=0.4, label="decode")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [label for label, _, _ in rows], fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set(xlabel="reprolm / llama.cpp (above 1: faster)", title="Speed beside llama.cpp (same file, same threads)")
    ax.grid(alpha=0.3, axis="x")
    if rows:
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


PLOTS: dict[str, Callable[[dict[str, list[Record]], Path], Path]] = {
    "throughput-vs-concurrency.png": plot_concurrency,
    "speed-vs-model-size.png": plot_model_size,
    "reprolm-vs-llamacpp.png": plot_llamacpp_ratio,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=ROOT / "benches" / "records")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images" / "benchmarks")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's tables are not the records'")
    args = parser.parse_args(argv)
    chosen = latest(load(args.records))
    page = args.page.read_text()
    rendered = render_page(page, chosen)
    if args.check:
        if rendered != page:
            print(f"{args.page} differs from the records: run python scripts/render_benchmarks.py", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(rendered)
    for name, plot in PLOTS.items():
        plot(chosen, args.images / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
