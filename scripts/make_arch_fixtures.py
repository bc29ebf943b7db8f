"""Makes the tiny-architecture test fixtures in tests/data/arch/ (run once; not part of CI).

For each architecture: a tiny randomly initialized model made with transformers (fixed seed,
a few layers, small widths), a SentencePiece tokenizer trained on a short text, converted to
GGUF in F32, F16 and Q8_0 by llama.cpp's own convert_hf_to_gguf.py; then transformers'
float32 forward of the model *loaded from each GGUF file* (transformers dequantizes GGUF
itself, so the reference sees exactly the stored weights and never reprolm's reader) gives
the reference logits, for all positions of a few prompts (`<arch>-<type>.logits.f32`,
[positions of all prompts][vocab] little-endian f32; prompts in `references.json`).

Needs (outside the project's venv): torch, transformers, sentencepiece, safetensors, and the
gguf package from the llama.cpp sources. Usage:

    python scripts/make_arch_fixtures.py LLAMA_CPP_DIR [OUT_DIR]

LLAMA_CPP_DIR is the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
(scripts/llamacpp-tools.sh unpacks it to ~/.cache/llamacpp-tools/src/vendor/llama.cpp).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import transformers

SEED = 1234
VOCAB = 384
TYPES = ("f32", "f16", "q8_0")

# Widths are multiples of 32 (the quantization block and reprolm's head-dimension step);
# `head_dim * n_heads != hidden_size` where the architecture allows it.
COMMON = dict(hidden_size=64, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)

ARCHS = {
    # Llama 3: grouped-query attention 2:1, separate output matrix, llama3 RoPE frequency
    # factors (written as rope_freqs.weight by the converter).
    "llama3": (transformers.LlamaConfig, dict(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32))),
    # Mistral / Llama 2 / TinyLlama shape: GQA 4:1 (n_heads * head_dim = hidden), linear RoPE
    # scaling, untied output. (convert_hf_to_gguf writes no sliding window for it, as llama.cpp
    # runs Mistral with full attention.)
    "mistral": (transformers.MistralConfig, dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        hidden_size=128, tie_word_embeddings=False, sliding_window=None,
        rope_scaling=dict(rope_type="linear", factor=2.0))),
    # Qwen2: QKV bias, tied output, NEOX-style RoPE.
    "qwen2": (transformers.Qwen2Config, dict(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        rope_theta=1000000.0, use_sliding_window=False)),
    # Qwen3: per-head RMSNorm of queries and keys, head width independent of the model width.
    "qwen3": (transformers.Qwen3Config, dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False)),
    # Phi-3: fused QKV and gate/up matrices.
    "phi3": (transformers.Phi3Config, dict(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
        sliding_window=None, pad_token_id=0)),
    # Gemma 3: sandwich norms (1 + w), GELU-tanh GLU, embedding scale sqrt(d), QK norm,
    # sliding window 8 on five layers of six (local RoPE base 10000, global 1e6).
    "gemma3": (transformers.Gemma3TextConfig, dict(
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        query_pre_attn_scalar=32, sliding_window=8, tie_word_embeddings=True,
        rope_theta=1000000.0, rope_local_base_freq=10000.0)),
}

ARCH_CLASS = {
    "llama3": transformers.LlamaForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "phi3": transformers.Phi3ForCausalLM,
    "gemma3": transformers.Gemma3ForCausalLM,
}

CORPUS = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!
def add(a, b):\n    return a + b\nfor i in range(10): print(i * i)
Numbers 0123456789 and symbols ()[]{}<>+-*/=_.,;:!?'" are all here.
""" * 20


def train_tokenizer(dir: Path) -> Path:
    text = dir / "corpus.txt"
    text.write_text(CORPUS)
    prefix = dir / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2, unk_id=3, pad_id=0,
        num_threads=1, minloglevel=2)
    return prefix.with_suffix(".model")


def perturb(model: torch.nn.Module) -> None:
    """Random weights with a logit scale worth testing: norms and biases away from 1 and 0."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def load_gguf_weights(arch: str, config, dir: Path, name: str) -> torch.nn.Module:
    if arch != "mistral":
        return transformers.AutoModelForCausalLM.from_pretrained(
            dir, gguf_file=name, config=config, dtype=torch.float32).eval()
    # A Mistral file is a `llama` GGUF: transformers maps it through the Llama classes.
    fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
    loaded = transformers.LlamaForCausalLM.from_pretrained(
        dir, gguf_file=name, config=transformers.LlamaConfig(**fields), dtype=torch.float32)
    model = transformers.MistralForCausalLM(config).float().eval()
    model.load_state_dict(loaded.state_dict())
    return model


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, VOCAB, size=n).tolist() for n in (1, 5, 13, 40)]


def main() -> None:
    llama_cpp = Path(sys.argv[1]).expanduser()
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "tests/data/arch")
    out.mkdir(parents=True, exist_ok=True)
    converter = llama_cpp / "convert_hf_to_gguf.py"
    refs = {"prompts": prompts(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer_model = train_tokenizer(tmp)
        for arch, (config_cls, extra) in ARCHS.items():
            torch.manual_seed(SEED)
            config = config_cls(**{**COMMON, **extra})
            model = ARCH_CLASS[arch](config).float().eval()
            perturb(model)
            hf_dir = tmp / arch
            model.save_pretrained(hf_dir, safe_serialization=True)
            shutil.copy(tokenizer_model, hf_dir / "tokenizer.model")
            for ty in TYPES:
                gguf_path = out / f"{arch}-{ty}.gguf"
                subprocess.run([sys.executable, str(converter), str(hf_dir), "--outtype", ty,
                                "--outfile", str(gguf_path)], check=True, capture_output=True)
                # The reference: the weights as transformers' own GGUF loader dequantizes them,
                # into a model of the original config (the config it would derive from the
                # file drops settings such as llama3 RoPE factors and Qwen3's head width),
                # and transformers' float32 forward.
                ref_model = load_gguf_weights(arch, config, out, gguf_path.name)
                logits = []
                with torch.no_grad():
                    for ids in refs["prompts"]:
                        logits.append(ref_model(torch.tensor([ids])).logits[0].numpy().astype(np.float32))
                # [all positions of every prompt, in order][vocab] little-endian f32.
                np.concatenate(logits).astype("<f4").tofile(out / f"{arch}-{ty}.logits.f32")
                if ty == "f32":
                    # The GGUF round trip is lossless in F32: the original model agrees.
                    with torch.no_grad():
                        direct = model(torch.tensor([refs["prompts"][-1]])).logits[0].numpy()
                    diff = float(np.abs(direct - logits[-1]).max())
                    assert diff < 1e-5, (arch, diff)
                scale = float(np.abs(logits[-1]).max())
                refs["models"][f"{arch}-{ty}"] = {"max_abs_logit": scale}
                print(f"{arch}-{ty}: {gguf_path.stat().st_size} bytes, max |logit| {scale:.3f}")
    (out / "references.json").write_text(json.dumps(refs, indent=1) + "\n")


if __name__ == "__main__":
    main()
