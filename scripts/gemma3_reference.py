"""Makes tests/data/gemma3/reference.json: transformers' float32 reference for the real
Gemma 3 270M file (Q4_K_M), for reprolm's fidelity tests (run once; not part of CI).

The weights are the GGUF file's, dequantized by the `gguf` package inside transformers'
GGUF loader, in a Gemma3ForCausalLM built from the model's published configuration (the
config transformers derives from a GGUF leaves out the local RoPE base and the window
pattern). Token ids come from llama.cpp's own tokenizer (`llama-tokenize`, BOS added).

The vocabulary has 262,144 entries, so rows are stored at a subset of ids: 8,192 ids drawn
once with a fixed seed (`sampled_ids`, the same for every row) and the row's 256 largest
logits; plus, per prompt, the greedy continuation of 32 tokens (transformers' `generate`,
do_sample=False).

Usage: python scripts/gemma3_reference.py GGUF LLAMA_TOKENIZE [OUT_JSON]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5, 6,",
    "Les chats sont des animaux",
    "Water boils at a temperature of 100 degrees Celsius, which is equal to",
]
# All positions of this prompt are checked too.
ALL_POSITIONS = 2
N_TOP = 256
N_SAMPLED = 8192
N_GREEDY = 32


def config() -> transformers.Gemma3TextConfig:
    # google/gemma-3-270m's config.json; every value is also read off the GGUF by reprolm.
    return transformers.Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, attn_implementation="eager")


def tokenize(tool: str, gguf: Path, text: str) -> list[int]:
    out = subprocess.run([tool, "-m", str(gguf), "-p", text, "--ids", "--log-disable"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    gguf, tool = Path(sys.argv[1]), sys.argv[2]
    out = Path(sys.argv[3] if len(sys.argv) > 3 else "tests/data/gemma3/reference.json")
    model = transformers.Gemma3ForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, config=config(), dtype=torch.float32).eval()
    sampled = np.sort(np.random.default_rng(7).choice(262144, N_SAMPLED, replace=False))

    def floats(v: np.ndarray) -> list[float]:
        # 9 significant digits identify an f32 exactly.
        return [float(f"{x:.9g}") for x in v.astype(np.float32)]

    def row(logits: np.ndarray) -> dict:
        top = np.argsort(-logits, kind="stable")[:N_TOP]
        return {"sampled": floats(logits[sampled]), "top_ids": top.tolist(), "top": floats(logits[top])}

    prompts = []
    with torch.no_grad():
        for i, text in enumerate(PROMPTS):
            ids = tokenize(tool, gguf, text)
            logits = model(torch.tensor([ids])).logits[0].numpy()
            greedy = model.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                                    min_new_tokens=N_GREEDY)[0, len(ids):].tolist()
            entry = {"text": text, "ids": ids, "last": row(logits[-1]), "greedy": greedy}
            if i == ALL_POSITIONS:
                entry["all_positions"] = [row(l) for l in logits]
            prompts.append(entry)
            print(f"prompt {i}: {len(ids)} ids, max |logit| {np.abs(logits[-1]).max():.2f}, greedy {greedy[:8]}...")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sampled_ids": sampled.tolist(), "prompts": prompts}) + "\n")


if __name__ == "__main__":
    main()
