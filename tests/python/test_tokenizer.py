"""Tokenizer against llama.cpp's ids for 158 texts."""

from __future__ import annotations

from typing import Any

import reprolm


def test_reference_ids(model: reprolm.Model, tokenizer_cases: list[dict[str, Any]]) -> None:
    assert len(tokenizer_cases) == 158
    for case in tokenizer_cases:
        text = case["text"]
        assert model.tokenize(text) == case["ids"], text
        assert model.tokenize(text, special=True) == case["ids_special"], text
        assert model.detokenize(model.tokenize(text)) == text


def test_characters_split_across_tokens_detokenize_whole(model: reprolm.Model) -> None:
    text = "確率分布 🦀👨‍👩‍👧 naïve"
    ids = model.tokenize(text)
    pieces = [model.token_bytes(i) for i in ids]
    assert any(_invalid_utf8(p) for p in pieces), "expected a token holding part of a character"
    assert model.detokenize(ids) == text


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
