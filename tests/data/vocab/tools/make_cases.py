"""Writes the extra tokenizer reference data in tests/data/vocab/ with llama.cpp's own tokenizer.

Run at data-generation time (not in CI), from the repository root:

    bash scripts/llamacpp-tools.sh                  # builds llama.cpp (libllama) once
    python3 tests/data/vocab/tools/make_cases.py ~/.cache/llamacpp-tools

It compiles tools/vocab_tokenize.c against that libllama, then for every vocabulary here
tokenizes each text of `cases.inp` twice with `add_special = true` (BOS/EOS as the file asks):
special tokens not parsed (`ggml-vocab-NAME.gguf.cases.out`) and parsed
(`ggml-vocab-NAME.gguf.cases-special.out`). `cases.inp` is the 158 texts of
tests/data/tokenizer.json, the llama.cpp test inputs, chat markup of every family and short
edge cases (below). `ggml-vocab-gemma-3.gguf` is made by `extract_vocab.py` from Gemma 3
270M's GGUF (`gemma-3-270m-q4_k_m.gguf`, the file `reprolm download gemma3-270m` fetches).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SEPARATOR = "\n__ggml_vocab_test__\n"
VOCABS = ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "gemma-3", "qwen35"]
# ggml-vocab-qwen35.gguf is ggml-vocab-qwen2.gguf with tokenizer.ggml.pre = "qwen35" (checked
# below), so it is not copied: the tests use the qwen2 file with that key changed.
REF = Path(os.environ.get("REPROLM_REFERENCE", "/work/shared/reference/llamacpp-vocab"))

# Chat markup and special-token edge cases of every family; each vocabulary sees all of them,
# so one family's markup is ordinary text (or user-defined tokens) for the others.
SPECIAL_TEXTS = [
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHello  there<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello!</s><s>[INST] again [/INST]",
    "<|system|>\nYou are helpful.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n",
    "<|user|> \n\t x<|end|>   \n<|endoftext|>  tail </s>  after",
    "<|endoftext|>Once upon a time<|endoftext|>",
    "<unk><s></s> <s>  x</s>\n",
    "text<s>more<s> ",
    " <s> leading space",
    "<|im_start|><|im_start|>user<|im_end|><|im_end|>",
    "<|im_start <s <|eot_id <|reserved_special_token_0|> <|reserved_special_token_250|>",
    "[PAD151646]x[PAD151935] <|placeholder1|>",
    "<0x41><0x0A> byte tokens as text",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<|im_end|>",
    "<s>",
    "a<|endoftext|>b<|im_end|>c<|eot_id|>d</s>e<|end|>f",
    # Gemma's markup and special tokens.
    "<bos><start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\nLeaves fall<end_of_turn>\n",
    " <start_of_turn>", "<start_of_turn> ", "<end_of_turn>\n\n", "<bos>text<eos>", "<pad><mask>x",
    "<unused0><unused99>", "[multimodal]<start_of_image>", "<start_of_turn><start_of_turn>",
]

# Short texts at the edges: leading and trailing whitespace, numbers, code, scripts, marks,
# control characters, the space marker itself.
EDGE_TEXTS = [
    " x", "  x", "   x", "\nx", "\n\n x", "\t x", "x ", "x  ", "x\n", "x\n\n", " ", "\u3000x", "\u00a0x", "x\u00a0y",
    "\r\n", "a\r\nb", "\r", "\v\f", "\x00", "a\x00b", "\x01\x7f", "\ufeffBOM", "\u200bzero\u200bwidth",
    "1", "12", "123", "1234", "12345", "123456789012", "3.14159", "-42", "1,000,000", "0x1F", "2024-11-30",
    "v1.2.3", "1e-10", "½ ⅓ ¼", "٣٤٥", "१२३", "①②③", "Ⅻ",
    "def f(x):\n    return x ** 2\n", "fn main() { println!(\"{}\", 1); }", "for (int i = 0; i < n; ++i) {}",
    "<div class=\"a\">&amp;</div>", "{\"key\": [1, 2, null]}", "SELECT * FROM t WHERE a = 'b';",
    "#include <stdio.h>", "    indented\n\tmixed", "snake_case camelCase PascalCase kebab-case",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
    "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!",
    "Γειά σου Κόσμε", "こんにちは世界", "你好，世界！", "Xin chào thế giới", "Cześć świecie",
    "e\u0301 vs \u00e9", "n\u0303", "N\u0303andu\u0301", "Tie\u0302\u0301ng Vie\u0323\u0302t", "مَرْحَبًا",
    "שָׁלוֹם", "Z\u0336\u0317a\u0335l\u0334g\u0338o\u0337", "x\u0301\u0302\u0303 y", "\u0915\u094d\u0937", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇫🇷🇯🇵",
    "\u2581", "\u2581\u2581x", "a\u2581b", "▁▁▁", "\U0001F600\U0001F601", "\U00020BB7\U0002A6B2",
    "I'm", "I'M", "we'll've", "'s 't 're", "don't  won't", "O'Neil", "rock 'n' roll",
    "!!!", "???", "...", "—", "–-", "“quotes”", "«guillemets»", "(parens) [brackets] {braces}",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ab" * 30, "Hello" * 10, " " * 33, "\n" * 17, "\t" * 9,
    "MiXeD CaSe TeXt", "ALL CAPS SENTENCE.", "tab\tseparated\tvalues", "trailing spaces   \n",
]


def build_tool(llama_dir: Path) -> Path:
    src = llama_dir / "src" / "vendor" / "llama.cpp"
    lib = llama_dir / "build" / "bin"
    exe = HERE / "tools" / "vocab_tokenize"
    subprocess.run(
        ["gcc", "-O1", "-o", str(exe), str(HERE / "tools" / "vocab_tokenize.c"),
         f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-L{lib}", "-lllama",
         f"-Wl,-rpath,{lib}"],
        check=True,
    )
    return exe


def check_only_pre_differs(a: Path, b: Path) -> None:
    import gguf

    fa, fb = gguf.GGUFReader(a).fields, gguf.GGUFReader(b).fields
    differ = {k for k in set(fa) | set(fb) if k not in fa or k not in fb
              or [bytes(fa[k].parts[i]) for i in fa[k].data] != [bytes(fb[k].parts[i]) for i in fb[k].data]}
    assert differ == {"tokenizer.ggml.pre"}, differ


def main() -> None:
    exe = build_tool(Path(sys.argv[1]).expanduser())
    texts: list[str] = [c["text"] for c in json.loads((HERE.parent / "tokenizer.json").read_text("utf-8"))]
    llama_inputs = (HERE / "ggml-vocab-llama-spm.gguf.inp").read_bytes().decode("utf-8").split(SEPARATOR)[:-1]
    for text in llama_inputs + SPECIAL_TEXTS + EDGE_TEXTS:
        if text not in texts:
            texts.append(text)
    assert all(SEPARATOR not in t for t in texts)
    inp = HERE / "cases.inp"
    inp.write_text("".join(t + SEPARATOR for t in texts), "utf-8")
    qwen35 = REF / "ggml-vocab-qwen35.gguf"
    check_only_pre_differs(qwen35, HERE / "ggml-vocab-qwen2.gguf")
    for name in VOCABS:
        vocab = qwen35 if name == "qwen35" else HERE / f"ggml-vocab-{name}.gguf"
        for parse_special, suffix in [(0, "cases.out"), (1, "cases-special.out")]:
            out = subprocess.run([str(exe), str(vocab), str(inp), "1", str(parse_special)],
                                 check=True, capture_output=True, text=True).stdout
            assert out.count("\n") == len(texts), name
            (HERE / f"ggml-vocab-{name}.gguf.{suffix}").write_text(out, "utf-8")
    exe.unlink()
    print(f"{len(texts)} texts x {len(VOCABS)} vocabularies")


if __name__ == "__main__":
    main()
