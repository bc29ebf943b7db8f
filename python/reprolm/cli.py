"""The ``reprolm`` command line (also ``python -m reprolm``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ._download import default_model_path
from ._gguf import inspect
from ._model import Model
from ._quantize import SAMPLE_TEXT, convert, quantize
from .errors import ReprolmError
from .sampling import Sampler


def _load(args: argparse.Namespace) -> Model:
    path = Path(args.model) if args.model else default_model_path()
    return Model.load(path, threads=args.threads)


def _cmd_generate(args: argparse.Namespace) -> int:
    model = _load(args)
    sampler = (
        Sampler.greedy()
        if args.temperature == 0
        else Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    )
    completion = model.generate(args.prompt, max_tokens=args.max_tokens, sampler=sampler)
    sys.stdout.write(args.prompt + completion.text + "\n")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    print(default_model_path())
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.model) if args.model else default_model_path()
    info = inspect(path)
    print(f"{path}: GGUF version {info.version}, {len(info.metadata)} metadata keys, {len(info.tensors)} tensors")
    for key, value in info.metadata.items():
        print(f"  {key} = {value}")
    print(f"  {'name':<32} {'type':<6} {'shape':<16} {'bytes':>12}")
    for t in info.tensors:
        print(f"  {t.name:<32} {t.type:<6} {'x'.join(map(str, t.shape)):<16} {t.n_bytes:>12,}")
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
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
        prog="reprolm", description="Bitwise-reproducible CPU inference for Llama-family GGUF models."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add_model_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct, fetched on first use)")
        p.add_argument("--threads", "-t", type=int, default=None, help="worker threads (default: all cores)")

    g = sub.add_parser("generate", help="continue a prompt")
    g.add_argument("prompt", help="the prompt text (special-token strings such as <|im_start|> are parsed)")
    add_model_options(g)
    g.add_argument("--max-tokens", "-n", type=int, default=128, help="most tokens to generate (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most probable tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (1 = off)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.set_defaults(run=_cmd_generate)

    d = sub.add_parser("download", help="fetch the default model into the cache and print its path")
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
        help="minmax (default: ggml's rules, bit-exact with llama-quantize) or uniform "
        "(the chapter's definition 8.1 per block of 32, range [-a, a]; q4_1 only)",
    )
    q.add_argument("--clip", type=float, default=None, metavar="P",
                   help="uniform scheme: a = the P-th percentile of |w| in each block, 0 < P <= 100")
    q.add_argument("--output-type", default=None,
                   help="type of the embedding/output matrix: q8_0 (default), q4_0, q4_1, f16, bf16, f32")
    q.add_argument("--report", action="store_true",
                   help="print the per-tensor error against proposition 8.2 and the mean KL divergence "
                   "of next-token distributions versus SRC on a sample text")
    q.add_argument("--report-text", default=None, metavar="TEXT",
                   help="measure the KL divergence on TEXT instead of the sample text (implies --report)")
    q.set_defaults(run=_cmd_quantize)

    c = sub.add_parser("convert", help="write a dequantized (F32 or F16) copy of a GGUF file")
    c.add_argument("src", help="source GGUF file")
    c.add_argument("dst", help="output GGUF file")
    c.add_argument("--to", default="f32", help="f32 (default) or f16; norm vectors stay F32")
    c.set_defaults(run=_cmd_convert)

    i = sub.add_parser("inspect", help="print a GGUF file's metadata and tensor table")
    i.add_argument("--model", "-m", help="GGUF file (default: the default model)")
    i.set_defaults(run=_cmd_inspect)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ReprolmError, OSError, ValueError) as e:
        print(f"reprolm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("reprolm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
