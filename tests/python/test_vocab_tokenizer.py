"""reprolm.Tokenizer on llama.cpp's vocabulary-only GGUF files (tests/data/vocab/): every test
pair llama.cpp ships, the 334-text set tokenized by llama.cpp itself (plain and with special
tokens parsed), decoding, and vocabulary-only files in inspect and Model.load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

import reprolm

VOCAB = Path(__file__).resolve().parent.parent / "data" / "vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"
KINDS = {
    "llama-spm": "sentencepiece",
    "phi-3": "sentencepiece",
    "llama-bpe": "bpe:llama-bpe",
    "qwen2": "bpe:qwen2",
    "gpt-2": "bpe:gpt-2",
    "gemma-3": "sentencepiece",
}
LLAMA_CPP_PAIRS = sorted(set(KINDS) - {"gemma-3"})  # llama.cpp ships no .inp/.out for Gemma 3


def _texts(name: str) -> list[str]:
    texts = (VOCAB / name).read_bytes().decode("utf-8").split(SEPARATOR)  # keeps "\r\n" as is
    assert texts.pop() == ""
    return texts


def _ids(name: str) -> list[list[int]]:
    return [[int(i) for i in line.split()] for line in (VOCAB / name).read_text("utf-8").splitlines()]


@pytest.fixture(scope="module", params=sorted(KINDS))
def family(request: pytest.FixtureRequest) -> tuple[str, reprolm.Tokenizer]:
    return request.param, reprolm.Tokenizer.from_gguf(VOCAB / f"ggml-vocab-{request.param}.gguf")


def test_llama_cpp_test_pairs(family: tuple[str, reprolm.Tokenizer]) -> None:
    name, tok = family
    assert tok.kind == KINDS[name]
    if name not in LLAMA_CPP_PAIRS:
        return
    texts, expected = _texts(f"ggml-vocab-{name}.gguf.inp"), _ids(f"ggml-vocab-{name}.gguf.out")
    assert len(texts) == len(expected) >= 45
    for text, want in zip(texts, expected):
        assert tok.encode(text, add_special=False) == want, text
        assert tok.encode(text, special=True, add_special=False) == want, text


def test_llama_cpp_ids_with_special_tokens(family: tuple[str, reprolm.Tokenizer]) -> None:
    name, tok = family
    texts = _texts("cases.inp")
    plain, parsed = _ids(f"ggml-vocab-{name}.gguf.cases.out"), _ids(f"ggml-vocab-{name}.gguf.cases-special.out")
    assert len(texts) == len(plain) == len(parsed) == 334
    for text, want_plain, want_parsed in zip(texts, plain, parsed):
        assert tok.encode(text) == want_plain, text
        assert tok.encode(text, special=True) == want_parsed, text
        if "\u2581" not in text:  # SentencePiece decodes its space marker as a space
            prefix = " " if name in ("llama-spm", "phi-3") and text else ""
            assert tok.decode(tok.encode(text, add_special=False)) == prefix + text


def test_special_tokens_and_framing() -> None:
    phi3 = reprolm.Tokenizer.from_gguf(VOCAB / "ggml-vocab-phi-3.gguf")
    ids = phi3.encode("<|user|>\nHi<|end|>\n", special=True)
    assert ids[0] == phi3.bos_id == 1 and ids[1] == 32010
    assert phi3.is_special(32010) and not phi3.is_special(ids[2])
    assert phi3.decode(ids) == "<s><|user|> Hi<|end|>"  # the whitespace after <|user|> / <|end|> is stripped
    assert phi3.token_bytes(0x0A + 3) == b"\n"  # <0x0A>
    llama3 = reprolm.Tokenizer.from_gguf(VOCAB / "ggml-vocab-llama-bpe.gguf")
    assert llama3.encode("Hi")[0] == llama3.bos_id == 128000  # llama.cpp's default for llama-bpe
    assert llama3.encode("Hi", add_special=False) == [13347]
    qwen2 = reprolm.Tokenizer.from_gguf(VOCAB / "ggml-vocab-qwen2.gguf")
    assert qwen2.encode("<|im_start|>user", special=True) == [151644, 872]
    assert qwen2.encode("<|im_start|>user")[0] != 151644
    assert repr(qwen2) == "Tokenizer(kind='bpe:qwen2', vocab_size=151936)"


def test_bad_arguments_are_typed() -> None:
    tok = reprolm.Tokenizer.from_gguf(VOCAB / "ggml-vocab-llama-spm.gguf")
    with pytest.raises(reprolm.TokenOutOfRangeError):
        tok.decode([1, 32000])
    with pytest.raises(reprolm.TokenOutOfRangeError):
        tok.token_bytes(-1)
    with pytest.raises(reprolm.InvalidTypeError):
        tok.decode("hello")  # type: ignore[arg-type]
    with pytest.raises(reprolm.InvalidTypeError):
        tok.encode(b"hello")  # type: ignore[arg-type]
    assert not tok.is_special(32000)
    with pytest.raises(FileNotFoundError):
        reprolm.Tokenizer.from_gguf(VOCAB / "missing.gguf")


def test_unsupported_tokenizer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bert-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[PAD]", "[UNK]", "hello"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(reprolm.UnsupportedError, match=r"'bert'.*'gpt2'.*'llama'"):
        reprolm.Tokenizer.from_gguf(path)


def test_vocabulary_only_files_in_inspect_and_load() -> None:
    path = VOCAB / "ggml-vocab-llama-bpe.gguf"
    with pytest.raises(reprolm.InvalidModelError, match="no tensors.*vocabulary-only"):
        reprolm.Model.load(path)
    assert reprolm.inspect(path).tensors == []
    out = subprocess.run([sys.executable, "-m", "reprolm", "inspect", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "0 tensors" in out.stdout
    assert "tokenizer: bpe:llama-bpe, 128256 tokens, BOS 128000, EOS 128001" in out.stdout
    assert "no tensors: a vocabulary-only file" in out.stdout
