"""Mean KL(reference || engine) of the next-token distribution at the last position of the
six reference prompts (tests/data), for reprolm at both precisions and, if installed,
llama.cpp (llama-cpp-python) on the same GGUF file.

    python benches/kl_vs_reference.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from _record import write as write_record

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def mean_kl(reference: np.ndarray, logits: list[np.ndarray]) -> tuple[float, float]:
    kls, diffs = [], []
    for ref, got in zip(reference, logits):
        lp, lq = log_softmax(ref), log_softmax(got)
        kls.append(float(np.sum(np.exp(lp) * (lp - lq))))
        diffs.append(float(np.abs(ref.astype(np.float64) - got).max()))
    return float(np.mean(kls)), max(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: reprolm's default model)")
    args = parser.parse_args()
    import reprolm

    path = args.model or str(reprolm.default_model_path())
    prompts = [g["prompt_ids"] for g in json.loads((DATA / "generations.json").read_text())]
    reference = np.load(DATA / "last_logits.npy")
    print(f"{'engine':<22} {'mean KL':>10} {'max |diff|':>11}")
    engines: dict[str, dict[str, float]] = {}
    for precision in ("float32", "int8"):
        model = reprolm.Model.load(path, precision=precision)
        kl, diff = mean_kl(reference, [model.logits(p)[-1] for p in prompts])
        engines[f"reprolm {precision}"] = {"mean_kl": kl, "max_abs_diff": diff}
        print(f"{'reprolm ' + precision:<22} {kl:>10.3e} {diff:>11.3e}")
    try:
        import llama_cpp
    except ImportError:
        print("llama.cpp: not installed (pip install llama-cpp-python)")
        write_record("kl_vs_reference", {"prompts": len(prompts), "engines": engines}, model=Path(path).name)
        return
    llm = llama_cpp.Llama(path, n_ctx=512, logits_all=True, verbose=False)
    logits = []
    for p in prompts:
        llm.reset()
        llm.eval(p)
        logits.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
    kl, diff = mean_kl(reference, logits)
    engines["llama.cpp"] = {"mean_kl": kl, "max_abs_diff": diff}
    print(f"{'llama.cpp':<22} {kl:>10.3e} {diff:>11.3e}")
    write_record("kl_vs_reference", {"prompts": len(prompts), "engines": engines}, model=Path(path).name)


if __name__ == "__main__":
    main()
