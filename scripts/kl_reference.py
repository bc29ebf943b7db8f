"""Records llama.cpp's int8-activation quality on GGUF files: the mean KL divergence of its
next-token distribution from reprolm's ``precision="float32"`` one (the reference: exactly
dequantized weights, float32 activations) at every position of the texts in
``tests/data/kl_prompts.json``, written to ``tests/data/kl_llamacpp.json``.

``tests/python/test_int8_quality.py`` holds reprolm's ``precision="int8"`` to these values on
the same token ids, without llama.cpp installed. Needs llama-cpp-python::

    python scripts/kl_reference.py                      # the default files
    python scripts/kl_reference.py --files PATH [PATH ...] --out OTHER.json

llama.cpp runs with its defaults (f16 KV cache; activations quantized to Q8_0/Q8_K in the CPU
dot products of quantized weights) and once more with a float32 KV cache, which leaves the
activation quantization as the only approximation of its own; both figures are recorded.
KL is computed in float64 from the float32 logits: KL(p || q) = sum p (log p - log q), with p
reprolm float32's distribution.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
# The machine's name as every benchmark prints it, and the KL of the quality test itself.
sys.path[:0] = [str(ROOT / "benches"), str(ROOT / "tests" / "python")]
from _llama_f64 import next_token_kl  # noqa: E402
from _machine import cpu_name  # noqa: E402

DATA = ROOT / "tests" / "data"
CACHE = Path.home() / ".cache" / "reprolm"
DEFAULT_FILES = [
    CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf",
    CACHE / "gemma-3-270m-q4_k_m.gguf",
    *sorted((DATA / "synthetic").glob("tiny.*.gguf")),
]
THREADS = 2
GGML_TYPE_F32 = 0


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def display(path: Path) -> str:
    """The path as the record names it: repository-relative, or ``~/...`` for the cache."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        try:
            return "~/" + str(path.resolve().relative_to(Path.home()))
        except ValueError:
            return str(path)


def llama_logits(llm: Any, ids: list[int]) -> npt.NDArray[np.float32]:
    """llama.cpp's logits at every position of one fresh evaluation of ``ids``."""
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)  # [positions][vocab]


def measure(path: Path, texts: list[dict[str, str]]) -> dict[str, Any]:
    import llama_cpp
    import reprolm

    reference = reprolm.Model.load(path, precision="float32", threads=THREADS)
    int8 = reprolm.Model.load(path, precision="int8", threads=THREADS)
    ids = [reference.tokenize(t["text"]) for t in texts]
    n_ctx = max(len(i) for i in ids) + 1
    engines = {
        "llama.cpp": llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=THREADS,
                                     logits_all=True, verbose=False),
        "llama.cpp f32 KV": llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=THREADS,
                                            logits_all=True, verbose=False,
                                            type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32),
    }
    llm = engines["llama.cpp"]
    same_tokens = [llm.tokenize(t["text"].encode(), add_bos=True, special=False) == i for t, i in zip(texts, ids)]
    kls: dict[str, list[npt.NDArray[np.float64]]] = {name: [] for name in [*engines, "reprolm int8"]}
    for prompt in ids:
        want = reference.logits(prompt)  # [positions][vocab]
        kls["reprolm int8"].append(next_token_kl(want, int8.logits(prompt)))
        for name, engine in engines.items():
            got = llama_logits(engine, prompt)
            assert got.shape == want.shape, (got.shape, want.shape)
            kls[name].append(next_token_kl(want, got))
    del engines, llm
    info = reprolm.inspect(path)
    summary = {name: {"mean_kl": float(np.concatenate(v).mean()), "max_kl": float(np.concatenate(v).max())}
               for name, v in kls.items()}
    return {
        "file": display(path),
        "bytes": path.stat().st_size,
        "sha256": sha256(path),
        "tensor_types": dict(sorted(Counter(t.type for t in info.tensors).items())),
        "vocab_size": reference.config.vocab_size,
        "positions": sum(len(i) for i in ids),
        "llama_cpp_tokenizes_the_same": all(same_tokens),
        "ids": ids,
        "llama_cpp_mean_kl": summary["llama.cpp"]["mean_kl"],
        "engines": summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--files", nargs="+", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--prompts", type=Path, default=DATA / "kl_prompts.json")
    parser.add_argument("--out", type=Path, default=DATA / "kl_llamacpp.json")
    args = parser.parse_args(argv)
    import llama_cpp

    texts = json.loads(args.prompts.read_text())["texts"]
    files = []
    for path in args.files:
        row = measure(path, texts)
        e = row["engines"]
        print(f"{row['file']}: {row['positions']} positions, "
              + ", ".join(f"{k} {v['mean_kl']:.3e}" for k, v in e.items()), flush=True)
        files.append(row)
    record = {
        "description": "Mean KL(reprolm float32 || engine) of the next-token distribution over every position "
                       "of tests/data/kl_prompts.json's texts, in float64 from float32 logits. 'llama.cpp' is "
                       "llama-cpp-python with its defaults (f16 KV cache); 'llama.cpp f32 KV' the same with a "
                       "float32 KV cache. 'reprolm int8' is informative (the test recomputes it).",
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "cpu": cpu_name(),
        "threads": THREADS,
        "command": shlex.join(["python", "scripts/kl_reference.py", *(sys.argv[1:] if argv is None else argv)]),
        "prompts": display(args.prompts),
        "files": files,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {display(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
