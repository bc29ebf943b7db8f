"""The ``reprolm`` command line (also ``python -m reprolm``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ._download import default_model_path
from ._gguf import inspect
from ._model import Model
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
